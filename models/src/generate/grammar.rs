//! Structured output: decoding masked by a grammar, so that every completion parses as the
//! JSON a schema describes, matches a regular expression, is one of a list of texts, or is
//! derived by a context-free grammar. The grammar engine is llguidance (what vLLM, SGLang and
//! llama.cpp use): at each step it gives the set of tokens that keep the text a prefix of
//! some valid document, the sampler draws only from that set, and the end token is allowed
//! only once the document is complete.
//!
//! llguidance works on token bytes. Its token trie is built here from the model's own
//! vocabulary (each token's bytes; special tokens marked as llguidance marks them), not
//! through its Hugging Face tokenizers adapter, which pins another major version of
//! `tokenizers` than the one the models use.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{self, SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};

use super::prompt::PromptFormat;
use crate::ModelError;

/// What a completion must be.
#[derive(Clone, Debug, PartialEq)]
pub enum OutputGrammar {
    /// A JSON document valid under this JSON schema.
    JsonSchema(serde_json::Value),
    /// Any JSON object (OpenAI's `json_object`).
    JsonObject,
    /// Text this regular expression (Rust's `regex` syntax) matches whole.
    Regex(String),
    /// Exactly one of these texts.
    Choice(Vec<String>),
    /// Text this grammar (llguidance's Lark syntax, start rule `start`) derives.
    Lark(String),
}

impl OutputGrammar {
    /// The grammar llguidance compiles. Unless the schema sets its own (`x-guidance`), the
    /// JSON is written with `", "` and `": "` between items and keys and no other
    /// whitespace: the separators models saw most in training, and no room for a small
    /// model to loop on blank space until its token limit.
    fn top_level(&self) -> TopLevelGrammar {
        let mut schema = match self {
            Self::JsonSchema(schema) => schema.clone(),
            Self::JsonObject => serde_json::json!({"type": "object"}),
            Self::Regex(regex) => return TopLevelGrammar::from_regex(regex),
            Self::Choice(texts) => return TopLevelGrammar::from_lark(choice_grammar(texts)),
            Self::Lark(grammar) => return TopLevelGrammar::from_lark(grammar.clone()),
        };
        if let Some(object) = schema.as_object_mut()
            && !object.contains_key("x-guidance")
        {
            object.insert(
                "x-guidance".into(),
                serde_json::json!({
                    "whitespace_flexible": false,
                    "item_separator": ", ",
                    "key_separator": ": ",
                }),
            );
        }
        TopLevelGrammar::from_json_schema(schema)
    }

    /// What this grammar is, in a refusal's words.
    fn kind(&self) -> &'static str {
        match self {
            Self::JsonSchema(_) | Self::JsonObject => "the JSON schema",
            Self::Regex(_) => "the regular expression",
            Self::Choice(_) => "the choices",
            Self::Lark(_) => "the grammar",
        }
    }
}

/// A Lark grammar whose only sentences are `texts`: one literal each (Lark's string
/// literals are JSON strings), so no text needs escaping as a pattern would.
fn choice_grammar(texts: &[String]) -> String {
    let literals: Vec<String> = texts
        .iter()
        .map(|text| serde_json::Value::from(text.as_str()).to_string())
        .collect();
    format!("start: {}", literals.join(" | "))
}

/// The model's vocabulary as llguidance sees it, and its parser factory (built once per
/// model: the factory precomputes how the vocabulary splits across lexer states).
pub struct GrammarEngine {
    factory: ParserFactory,
}

/// The model's vocabulary for llguidance: the token trie, and the tokenizer for the
/// strings a grammar holds.
struct ModelTokens {
    trie: TokTrie,
    tokenizer: tokenizers::Tokenizer,
}

impl TokenizerEnv for ModelTokens {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, bytes: &[u8]) -> Vec<TokenId> {
        let text = String::from_utf8_lossy(bytes);
        self.tokenizer
            .encode(text.as_ref(), false)
            .map(|encoding| encoding.get_ids().to_vec())
            .unwrap_or_default()
    }
}

impl GrammarEngine {
    /// The engine for `format`'s vocabulary.
    pub fn new(format: &PromptFormat) -> Result<Self, ModelError> {
        let vocab = &format.vocab;
        let size = vocab.tokenizer.get_vocab_size(true);
        let special: std::collections::HashSet<u32> = vocab
            .tokenizer
            .get_added_tokens_decoder()
            .iter()
            .filter(|(_, token)| token.special)
            .map(|(&id, _)| id)
            .chain(vocab.end_tokens.iter().copied())
            .chain(vocab.bos)
            .collect();
        let words: Vec<Vec<u8>> = (0..size as u32)
            .map(|id| match special.contains(&id) {
                // llguidance's mark for a special token: 0xFF, then its name.
                true => {
                    let mut word = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    word.extend(format.token_piece(id).0.into_bytes());
                    word
                }
                false => format.token_piece(id).1,
            })
            .collect();
        let mut info = TokRxInfo::new(size as u32, vocab.eos);
        info.tok_bos = vocab.bos;
        info.tok_end_of_turn = vocab.end_tokens.iter().copied().find(|&t| t != vocab.eos);
        let tokens = ModelTokens {
            trie: TokTrie::from(&info, &words),
            tokenizer: vocab.tokenizer.clone(),
        };
        let env: TokEnv = Arc::new(tokens);
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| ModelError::Load(format!("the grammar engine: {e}")))?;
        factory.quiet();
        Ok(Self { factory })
    }

    /// A fresh constraint for one completion; a schema, expression or grammar llguidance
    /// cannot compile is an error that names what it refused.
    pub fn constraint(&self, grammar: &OutputGrammar) -> Result<Constraint, ModelError> {
        matcher(&self.factory, grammar).map(|matcher| Constraint { matcher })
    }
}

/// `grammar` compiled by `factory` into a fresh matcher, or why it does not compile.
fn matcher(factory: &ParserFactory, grammar: &OutputGrammar) -> Result<Matcher, ModelError> {
    let refused = |e: &dyn std::fmt::Display| {
        ModelError::Task(format!("{} cannot be used: {e}", grammar.kind()))
    };
    let parser = factory
        .create_parser(grammar.top_level())
        .map_err(|e| refused(&e))?;
    let matcher = Matcher::new(Ok(parser));
    match matcher.get_error() {
        Some(error) => Err(refused(&error)),
        None => Ok(matcher),
    }
}

/// Whether `grammar` compiles, with no model at hand (a job checks its constraint before
/// any actor starts): against a vocabulary of the 256 single bytes. What fails here fails
/// on every model; a model's own vocabulary is checked again when it compiles.
pub fn check_without_model(grammar: &OutputGrammar) -> Result<(), ModelError> {
    let env = toktrie::ApproximateTokEnv::single_byte_env();
    let mut factory = ParserFactory::new_simple(&env)
        .map_err(|e| ModelError::Load(format!("the grammar engine: {e}")))?;
    factory.quiet();
    matcher(&factory, grammar).map(drop)
}

/// One completion's grammar state.
pub struct Constraint {
    matcher: Matcher,
}

impl Constraint {
    /// The tokens allowed next (the end tokens only when the document is complete).
    pub fn allowed(&mut self) -> Result<SimpleVob, ModelError> {
        self.matcher
            .compute_mask_or_eos()
            .map_err(|e| ModelError::Task(format!("the grammar: {e}")))
    }

    /// Moves past `token` (one the mask allowed).
    pub fn accept(&mut self, token: u32) -> Result<(), ModelError> {
        self.matcher
            .consume_token(token)
            .map_err(|e| ModelError::Task(format!("the grammar: {e}")))
    }

    /// Whether the document is complete and nothing more may follow.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }
}

/// Whether `mask` allows `token`.
pub fn allows(mask: &SimpleVob, token: u32) -> bool {
    mask.is_allowed(token as toktrie::TokenId)
}
