//! A tokenizer and chat template built from a GGUF file's metadata, for models that ship
//! no `tokenizer.json`.
//!
//! GGUF keeps the vocabulary (`tokenizer.ggml.tokens`), the BPE merges, each token's type and
//! the special ids. For `gpt2`-style vocabularies (byte-level BPE: Llama 3, Qwen, SmolLM2)
//! this builds the same `tokenizers` pipeline a `tokenizer.json` would describe: digits split
//! one by one where the pre-tokenizer name says so, then byte-level pre-tokenisation,
//! the BPE model, and byte-level decoding. Control and user-defined tokens (`<|im_start|>`)
//! are special tokens: matched whole in text, skipped when decoding.

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::{AddedToken, Tokenizer};

use crate::ModelError;

/// GGUF token types (`tokenizer.ggml.token_type`).
const TOKEN_TYPE_CONTROL: i32 = 3;
const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// Pre-tokenizer names (`tokenizer.ggml.pre`) whose regex splits digits one by one.
const PRE_WITH_SINGLE_DIGITS: &[&str] = &["smollm", "starcoder", "refact", "codeshell"];

/// What a generation model needs of its vocabulary.
pub struct Vocab {
    /// Byte-level BPE, the file's tokens and merges.
    pub tokenizer: Tokenizer,
    /// The beginning-of-sequence token, when the model has one.
    pub bos: Option<u32>,
    /// The end-of-sequence token.
    pub eos: u32,
    /// Tokens that end a sequence: `eos`, and an end-of-turn token where the model has one
    /// (Llama 3's `<|eot_id|>`).
    pub end_tokens: Vec<u32>,
    /// Whether a raw prompt (`--template none`) starts with BOS.
    pub add_bos: bool,
    /// The Jinja chat template, if the file has one.
    pub chat_template: Option<String>,
}

fn load_error(what: impl std::fmt::Display) -> ModelError {
    ModelError::Load(format!("GGUF tokenizer: {what}"))
}

fn field<'a>(metadata: &'a HashMap<String, Value>, key: &str) -> Result<&'a Value, ModelError> {
    metadata
        .get(key)
        .ok_or_else(|| load_error(format!("the file has no `{key}`")))
}

fn strings(value: &Value, key: &str) -> Result<Vec<String>, ModelError> {
    value
        .to_vec()
        .map_err(|e| load_error(format!("`{key}`: {e}")))?
        .iter()
        .map(|v| v.to_string().cloned())
        .collect::<Result<_, _>>()
        .map_err(|e| load_error(format!("`{key}`: {e}")))
}

fn optional_u32(metadata: &HashMap<String, Value>, key: &str) -> Option<u32> {
    metadata.get(key).and_then(|v| v.to_u32().ok())
}

/// Merges as pairs of tokens.
fn merges(metadata: &HashMap<String, Value>) -> Result<Vec<(String, String)>, ModelError> {
    strings(
        field(metadata, "tokenizer.ggml.merges")?,
        "tokenizer.ggml.merges",
    )?
    .into_iter()
    .map(|merge| {
        merge
            .split_once(' ')
            .map(|(a, b)| (a.to_owned(), b.to_owned()))
            .ok_or_else(|| load_error(format!("merge `{merge}` is not two tokens")))
    })
    .collect()
}

/// The byte-level BPE tokenizer of `tokens` and the file's merges: its pre-tokenizer as
/// `tokenizer.ggml.pre` names it, control and user-defined tokens special.
fn bpe_tokenizer(
    metadata: &HashMap<String, Value>,
    tokens: &[String],
) -> Result<Tokenizer, ModelError> {
    let types: Vec<i32> = match metadata.get("tokenizer.ggml.token_type") {
        Some(value) => value
            .to_vec()
            .map_err(load_error)?
            .iter()
            .map(|v| v.to_i32())
            .collect::<Result<_, _>>()
            .map_err(load_error)?,
        None => vec![1; tokens.len()],
    };
    let vocab: tokenizers::models::bpe::Vocab = tokens
        .iter()
        .enumerate()
        .map(|(id, token)| (token.clone(), id as u32))
        .collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges(metadata)?)
        .build()
        .map_err(load_error)?;
    let mut tokenizer = Tokenizer::new(bpe);
    let pre = metadata
        .get("tokenizer.ggml.pre")
        .and_then(|v| v.to_string().ok())
        .map(String::as_str)
        .unwrap_or("default");
    let byte_level = PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true));
    let pre_tokenizer = if PRE_WITH_SINGLE_DIGITS.contains(&pre) {
        PreTokenizerWrapper::Sequence(Sequence::new(vec![
            PreTokenizerWrapper::Digits(Digits::new(true)),
            byte_level,
        ]))
    } else {
        byte_level
    };
    tokenizer.with_pre_tokenizer(Some(pre_tokenizer));
    tokenizer.with_decoder(Some(ByteLevelDecoder::default()));
    let special: Vec<AddedToken> = tokens
        .iter()
        .zip(&types)
        .filter(|(_, kind)| matches!(**kind, TOKEN_TYPE_CONTROL | TOKEN_TYPE_USER_DEFINED))
        .map(|(token, _)| AddedToken::from(token.clone(), true))
        .collect();
    tokenizer.add_special_tokens(special).map_err(load_error)?;
    Ok(tokenizer)
}

impl Vocab {
    /// Builds the tokenizer from `metadata`; only byte-level BPE (`gpt2`) is supported.
    pub fn from_metadata(metadata: &HashMap<String, Value>) -> Result<Self, ModelError> {
        let model = field(metadata, "tokenizer.ggml.model")?
            .to_string()
            .map_err(load_error)?;
        if model != "gpt2" {
            return Err(load_error(format!(
                "vocabulary type `{model}` is not supported (byte-level BPE, `gpt2`, is: Llama 3, \
                 Qwen, SmolLM2); give the model's tokenizer.json beside it instead"
            )));
        }
        let tokens = strings(
            field(metadata, "tokenizer.ggml.tokens")?,
            "tokenizer.ggml.tokens",
        )?;
        let tokenizer = bpe_tokenizer(metadata, &tokens)?;
        let eos = optional_u32(metadata, "tokenizer.ggml.eos_token_id")
            .ok_or_else(|| load_error("the file has no `tokenizer.ggml.eos_token_id`"))?;
        let mut end_tokens = vec![eos];
        end_tokens.extend(optional_u32(metadata, "tokenizer.ggml.eot_token_id"));
        end_tokens.dedup();
        Ok(Self {
            tokenizer,
            bos: optional_u32(metadata, "tokenizer.ggml.bos_token_id"),
            eos,
            end_tokens,
            add_bos: metadata
                .get("tokenizer.ggml.add_bos_token")
                .and_then(|v| v.to_bool().ok())
                .unwrap_or(false),
            chat_template: metadata
                .get("tokenizer.chat_template")
                .and_then(|v| v.to_string().ok())
                .cloned(),
        })
    }

    /// The token text of `id` (for errors and tests).
    pub fn token(&self, id: u32) -> Option<String> {
        self.tokenizer.id_to_token(id)
    }
}
