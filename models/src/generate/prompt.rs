//! From a record's prompt to the model's tokens: the vocabulary and chat template of a model
//! ([`PromptFormat`], loadable without the weights, for `resident generate --dry-run`), a
//! prompt as instruction parts or a conversation ([`Prompt`]), and the cut that makes a
//! prompt fit the context: its oldest few-shot examples go whole first, then the middle of
//! the record's own text, never the instruction.

use std::borrow::Cow;
use std::path::Path;
use std::sync::OnceLock;

use super::chat::{ChatTemplate, Message};
use super::example_text::ExampleText;
use super::example_turns::ExampleTurns;
use super::gguf_vocab::Vocab;
use super::score_windows::{self, WindowSettings};
use super::{checkpoint, decoder};
use crate::ModelError;

/// How a record's text becomes the prompt.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PromptTemplate {
    /// The model's chat template, the text as its single user turn, generation prompt added.
    #[default]
    Chat,
    /// The text as it is, after BOS if the model's metadata asks for it.
    None,
}

/// Tokens the ` … ` of a cut text may take.
const CUT_MARKER_TOKENS: usize = 3;

/// What a prompt is made of.
#[derive(Clone, Copy, Debug)]
pub enum Prompt<'a> {
    /// `before + text + after` as one user turn after a system message where one is
    /// given, the reply started with `reply_start` where it is not empty; without the chat
    /// template, as it is, the system message written as text directly before it
    /// (lm-evaluation-harness's system instruction without `--apply_chat_template`) and
    /// `reply_start` after it. When it is too long, the few-shot examples in `before` are
    /// left out oldest first, whole; then `text` is cut.
    Parts {
        /// A system message, when there is one.
        system: Option<&'a str>,
        /// Text before the record's.
        before: &'a str,
        /// The record's text.
        text: &'a str,
        /// Text after the record's.
        after: &'a str,
        /// The start of the answer (lm-evaluation-harness's `gen_prefix`): the assistant's
        /// reply under the chat template, continued; text after `after` without it.
        reply_start: &'a str,
        /// Where few-shot examples written as text lie in `before`: each one's start, then
        /// the last one's end (byte offsets; empty: none; `example_text.rs`).
        examples: &'a [u32],
    },
    /// A conversation (the chat template only). Its first `examples` exchanges after its
    /// system message are few-shot examples (`--fewshot-as-multiturn`): the oldest are
    /// left out first, whole; then the longest user message is the one cut.
    Messages {
        /// The turns.
        messages: &'a [Message],
        /// How many exchanges are examples (`example_turns.rs`).
        examples: usize,
    },
}

impl<'a> Prompt<'a> {
    /// `before + text + after`, no system message.
    pub fn parts(before: &'a str, text: &'a str, after: &'a str) -> Self {
        Self::Parts {
            system: None,
            before,
            text,
            after,
            reply_start: "",
            examples: &[],
        }
    }

    /// A conversation without examples.
    pub fn conversation(messages: &'a [Message]) -> Self {
        Self::Messages {
            messages,
            examples: 0,
        }
    }

    /// The template this prompt is read with when `asked` is the job's: a conversation has
    /// no raw form, so it is always the chat template's; text parts take the one asked.
    pub fn template(&self, asked: PromptTemplate) -> PromptTemplate {
        match self {
            Self::Parts { .. } => asked,
            Self::Messages { .. } => PromptTemplate::Chat,
        }
    }

    /// How many few-shot examples it has that may be left out whole (turns or text).
    pub fn example_count(&self) -> usize {
        match *self {
            Self::Parts {
                before, examples, ..
            } => ExampleText::of(before, examples).count(),
            Self::Messages { messages, examples } => ExampleTurns::of(messages, examples).count(),
        }
    }

    /// Its own parts without its `dropped` oldest examples.
    fn without_oldest(&self, dropped: usize) -> KeptExamples {
        match *self {
            Self::Parts {
                before, examples, ..
            } => KeptExamples {
                before: (ExampleText::of(before, examples).without_oldest(before, dropped))
                    .into_owned(),
                messages: Vec::new(),
            },
            Self::Messages { messages, examples } => KeptExamples {
                before: String::new(),
                messages: ExampleTurns::of(messages, examples).without_oldest(messages, dropped),
            },
        }
    }

    /// The text that may be cut.
    fn cuttable(&self) -> &'a str {
        match *self {
            Self::Parts { text, .. } => text,
            Self::Messages { messages, .. } => messages
                .iter()
                .filter(|m| m.role == "user")
                .map(|m| m.content.as_str())
                .max_by_key(|content| content.len())
                .unwrap_or(""),
        }
    }
}

/// What is left of a prompt's own parts once some of its oldest few-shot examples are left
/// out ([`PromptFormat::without_oldest_examples`]).
#[derive(Clone, Debug)]
pub struct KeptExamples {
    /// A text prompt's text before the record's.
    before: String,
    /// A conversation's messages.
    messages: Vec<Message>,
}

impl KeptExamples {
    /// `prompt` with what is kept in place of its own, and no examples left to leave out.
    pub fn prompt<'a>(&'a self, prompt: &Prompt<'a>) -> Prompt<'a> {
        match *prompt {
            Prompt::Parts {
                system,
                text,
                after,
                reply_start,
                ..
            } => Prompt::Parts {
                system,
                before: &self.before,
                text,
                after,
                reply_start,
                examples: &[],
            },
            Prompt::Messages { .. } => Prompt::conversation(&self.messages),
        }
    }
}

/// The chat template `source` for a model of `vocab`, given its BOS and EOS tokens' text.
fn chat_template(vocab: &Vocab, source: &str) -> Result<ChatTemplate, ModelError> {
    let special = |id: Option<u32>| id.and_then(|id| vocab.token(id)).unwrap_or_default();
    ChatTemplate::new(source, &special(vocab.bos), &special(Some(vocab.eos)))
}

/// A model's vocabulary and chat template: how prompts become tokens and tokens text.
pub struct PromptFormat {
    /// The model's tokens.
    pub vocab: Vocab,
    chat: Option<ChatTemplate>,
    /// Each token's text as [`PromptFormat::decode`] gives it alone, once asked
    /// ([`PromptFormat::token_text`]).
    token_texts: Vec<OnceLock<String>>,
}

impl PromptFormat {
    /// The format of `vocab`, with its chat template where the model has one.
    pub fn new(vocab: Vocab) -> Result<Self, ModelError> {
        let chat = match &vocab.chat_template {
            Some(source) => Some(chat_template(&vocab, source)?),
            None => None,
        };
        let tokens = vocab.tokenizer.get_vocab_size(true);
        Ok(Self {
            vocab,
            chat,
            token_texts: std::iter::repeat_with(OnceLock::new).take(tokens).collect(),
        })
    }

    /// Renders conversations with `source` (a Jinja chat template, as transformers' and
    /// vLLM's `chat_template` take it) in place of the model's own, or the model's lack of
    /// one; an error, naming it, where it does not compile.
    pub fn use_chat_template(&mut self, source: &str) -> Result<(), ModelError> {
        let template = chat_template(&self.vocab, source).map_err(|error| match error {
            ModelError::Load(why) => ModelError::Load(why.replace("the model's", "the given")),
            other => other,
        })?;
        self.chat = Some(template);
        Ok(())
    }

    /// Renders conversations with `kwargs` as the chat template's variables besides the
    /// conversation ([`ChatTemplate::set_kwargs`]); call after
    /// [`PromptFormat::use_chat_template`]. A model without a chat template refuses them.
    pub fn use_chat_template_kwargs(
        &mut self,
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<(), ModelError> {
        match &mut self.chat {
            Some(chat) => {
                chat.set_kwargs(kwargs);
                Ok(())
            }
            None => Err(ModelError::InvalidConfig(
                "chat_template_kwargs are a chat template's variables, and the model has no \
                 chat template; give one (--chat-template) or leave them out"
                    .into(),
            )),
        }
    }

    /// The format of a GGUF file (its metadata only) or a safetensors directory (its
    /// tokenizer files), without loading the weights.
    pub fn load(path: &Path) -> Result<Self, ModelError> {
        if checkpoint::is_safetensors_dir(path) {
            return Self::new(checkpoint::hf_vocab(path)?);
        }
        let (_, content) = decoder::read_gguf(path)?;
        Self::new(Vocab::from_metadata(&content.metadata)?)
    }

    /// The context (tokens) of the model at `path`, from the same metadata
    /// [`PromptFormat::load`] reads: its window, for showing a prompt's fit without the
    /// weights.
    pub fn model_context(path: &Path) -> Result<usize, ModelError> {
        if checkpoint::is_safetensors_dir(path) {
            return Ok(checkpoint::hf_config(path)?.context);
        }
        let (_, content) = decoder::read_gguf(path)?;
        Ok(decoder::LlamaConfig::from_metadata(&content.metadata)?.context)
    }

    /// The prompt's text as the model reads it (before tokenisation; BOS, where `None`
    /// adds one, is a token, not text), with `cut` in place of the cuttable text. A
    /// conversation is rendered by the chat template whatever `template` says
    /// ([`Prompt::template`]).
    pub fn render(
        &self,
        prompt: &Prompt,
        template: PromptTemplate,
        cut: Option<&str>,
    ) -> Result<String, ModelError> {
        let cuttable = prompt.cuttable();
        let text = cut.unwrap_or(cuttable);
        match (prompt.template(template), prompt) {
            (
                PromptTemplate::None,
                Prompt::Parts {
                    system,
                    before,
                    after,
                    reply_start,
                    ..
                },
            ) => Ok(format!(
                "{}{before}{text}{after}{reply_start}",
                system.unwrap_or_default()
            )),
            // A conversation's template is always the chat template's.
            _ => {
                let chat = self.chat()?;
                let messages = match *prompt {
                    Prompt::Parts {
                        system,
                        before,
                        after,
                        reply_start,
                        ..
                    } => {
                        let asked = Message::new("user", &format!("{before}{text}{after}"));
                        let reply = (!reply_start.is_empty())
                            .then(|| Message::new("assistant", reply_start));
                        (system
                            .map(|system| Message::new("system", system))
                            .into_iter())
                        .chain([asked])
                        .chain(reply)
                        .collect()
                    }
                    Prompt::Messages { messages, .. } => {
                        let mut messages = messages.to_vec();
                        let longest = messages
                            .iter_mut()
                            .rfind(|m| m.role == "user" && m.content == cuttable);
                        if let (Some(message), Some(cut)) = (longest, cut) {
                            message.content = cut.to_owned();
                        }
                        messages
                    }
                };
                chat.render(&messages)
            }
        }
    }

    /// The tokens of a rendered prompt: BOS first for a raw prompt when the model's
    /// metadata asks for it (a chat template writes its own).
    pub fn tokens(&self, rendered: &str, template: PromptTemplate) -> Result<Vec<u32>, ModelError> {
        let encoded = self.encode(rendered)?;
        Ok(match (template, self.vocab.add_bos, self.vocab.bos) {
            (PromptTemplate::None, true, Some(bos)) => {
                std::iter::once(bos).chain(encoded).collect()
            }
            _ => encoded,
        })
    }

    /// The prompt's tokens, leaving at least `reserve` tokens of a `context`-token window
    /// for the answer: when it would not, its oldest few-shot examples are left out first
    /// ([`PromptFormat::without_oldest_examples`]), then the middle of the cuttable text
    /// (the record's own) is cut and marked with ` … `; the instruction never is. Returns
    /// the tokens and whether the prompt was cut. An instruction that alone leaves no room
    /// is returned whole (the sequence then ends at the context, `length`).
    pub fn fit(
        &self,
        prompt: &Prompt,
        template: PromptTemplate,
        context: usize,
        reserve: usize,
    ) -> Result<(Vec<u32>, bool), ModelError> {
        let template = prompt.template(template);
        let limit = context.saturating_sub(reserve).max(1);
        let whole = self.tokens(&self.render(prompt, template, None)?, template)?;
        if whole.len() <= limit {
            return Ok((whole, false));
        }
        if let Some(kept) = self.without_oldest_examples(prompt, template, limit)? {
            let (tokens, _) = self.fit(&kept.prompt(prompt), template, context, reserve)?;
            return Ok((tokens, true));
        }
        let text_tokens = self.encode(prompt.cuttable())?;
        let mut over = whole.len() - limit;
        let mut fitted = whole;
        // Token boundaries move a little when the cut text is tokenised again.
        for _ in 0..4 {
            let keep = text_tokens.len().saturating_sub(over + CUT_MARKER_TOKENS);
            let head = keep / 2;
            let tail = keep - head;
            let cut = format!(
                "{} … {}",
                self.decode(&text_tokens[..head])?,
                self.decode(&text_tokens[text_tokens.len() - tail..])?
            );
            fitted = self.tokens(&self.render(prompt, template, Some(&cut))?, template)?;
            if fitted.len() <= limit || keep == 0 {
                break;
            }
            over += fitted.len() - limit;
        }
        Ok((fitted, true))
    }

    /// A prompt too long for `limit` tokens (as `template` renders it) with the fewest of
    /// its oldest few-shot examples left out that make it fit (at least one; all of them
    /// where none does): a conversation's example exchanges after its system message, or
    /// the examples written as text before the record's. `None` for a prompt without
    /// examples.
    pub fn without_oldest_examples(
        &self,
        prompt: &Prompt,
        template: PromptTemplate,
        limit: usize,
    ) -> Result<Option<KeptExamples>, ModelError> {
        let count = prompt.example_count();
        if count == 0 {
            return Ok(None);
        }
        let template = prompt.template(template);
        let fits = |dropped: usize| -> Result<bool, ModelError> {
            let kept = prompt.without_oldest(dropped);
            let rendered = self.render(&kept.prompt(prompt), template, None)?;
            Ok(self.tokens(&rendered, template)?.len() <= limit)
        };
        // The fewest that fit: the prompt shrinks as more go, so halve the range.
        let (mut low, mut high) = (1, count);
        while low < high {
            let middle = (low + high) / 2;
            match fits(middle)? {
                true => high = middle,
                false => low = middle + 1,
            }
        }
        Ok(Some(prompt.without_oldest(high)))
    }

    /// A prompt whose record text is scored ([`super::PromptScoring`]): `before + text +
    /// after` as the raw model reads it (BOS first where the model asks for one), each part
    /// tokenised on its own so that the scored tokens are exactly the text's
    /// (lm-evaluation-harness encodes its context and continuation apart too). Each window
    /// is at most `limit` tokens: a text too long for one goes on in more
    /// ([`score_windows`]), each after BOS alone, and `after` follows the last where it
    /// fits. An instruction that alone fills `limit` is refused. With
    /// [`WindowSettings::score_first_token`], a text with nothing before it gets
    /// [`PromptFormat::start_token`] first, so that its first token is scored too.
    pub fn scored_text(
        &self,
        (before, text, after): (&str, &str, &str),
        limit: usize,
        settings: WindowSettings,
    ) -> Result<ScoredText, ModelError> {
        let mut head = self.tokens(before, PromptTemplate::None)?;
        if head.is_empty() && settings.score_first_token {
            head.push(self.start_token());
        }
        let text = (self.encode(text)?, self.encode(after)?);
        let named = ["the prompt's text before the record's", "the prompt"];
        self.windows(head, text, limit, settings, named)
    }

    /// The token a text with nothing before it is scored after: BOS, or the end-of-text
    /// token where the model has none (lm-evaluation-harness's `prefix_token_id`).
    pub fn start_token(&self) -> u32 {
        self.vocab.bos.unwrap_or(self.vocab.eos)
    }

    /// A conversation whose last message, the assistant's reply, is scored given the turns
    /// before it ([`ChatTemplate::render_reply`]: the reply with its end-of-turn marker),
    /// the two tokenised apart, in windows as [`PromptFormat::scored_text`]'s.
    pub fn scored_reply(
        &self,
        messages: &[Message],
        limit: usize,
        settings: WindowSettings,
    ) -> Result<ScoredText, ModelError> {
        let (asked, reply) = self.reply_parts(messages)?;
        let head = self.tokens(&asked, PromptTemplate::Chat)?;
        let text = (self.encode(&reply)?, Vec::new());
        let named = ["the conversation before the reply", "the conversation"];
        self.windows(head, text, limit, settings, named)
    }

    /// A continuation (`choice`: a multiple-choice answer, a preference pair's reply)
    /// scored after `context`, as lm-evaluation-harness scores one: the two tokenised
    /// apart, the context's trailing whitespace moved to the front of the choice (`"Answer:
    /// "` and `"Paris"` are read as `"Answer:"` and `" Paris"`, as a tokenizer writes a
    /// word after a space). `template` says what the context is: raw text (BOS first where
    /// the model asks for one), or a prompt the chat template rendered (which writes its
    /// own). A context that leaves the choice no room in the window loses its start (it
    /// keeps at least half the window, the end nearest the choice; the result is marked
    /// truncated); a choice longer than what is left goes on in windows.
    pub fn scored_choice(
        &self,
        (context, choice): (&str, &str),
        template: PromptTemplate,
        limit: usize,
        settings: WindowSettings,
    ) -> Result<ScoredText, ModelError> {
        let kept = context.trim_end();
        let choice = format!("{}{choice}", &context[kept.len()..]);
        let lead = self.tokens("", template)?;
        let context_tokens = self.encode(kept)?;
        let choice_tokens = self.encode(&choice)?;
        let room = limit
            .saturating_sub(lead.len() + choice_tokens.len())
            .max(limit / 2);
        let cut = context_tokens.len().saturating_sub(room);
        let head = lead.iter().chain(&context_tokens[cut..]).copied().collect();
        let named = ["the prompt before the choice", "the prompt"];
        let mut scored = self.windows(head, (choice_tokens, Vec::new()), limit, settings, named)?;
        scored.truncated |= cut > 0;
        Ok(scored)
    }

    /// A conversation as [`PromptFormat::scored_reply`] reads it: the text before the reply
    /// and the reply's own.
    pub fn reply_parts(&self, messages: &[Message]) -> Result<(String, String), ModelError> {
        self.chat()?.render_reply(messages)
    }

    /// `head`, then the text's tokens in as many `limit`-token windows as they take, then
    /// what follows them (`after`) where it fits; `named` says what `head` is, and what to
    /// shorten, in the refusal when it alone fills a window.
    fn windows(
        &self,
        head: Vec<u32>,
        (text_tokens, after_tokens): (Vec<u32>, Vec<u32>),
        limit: usize,
        settings: WindowSettings,
        [what, shorten]: [&str; 2],
    ) -> Result<ScoredText, ModelError> {
        if head.len() >= limit {
            return Err(ModelError::Task(format!(
                "{what} is {} tokens, which leaves no room in the model's {limit}-token \
                 window for the text to score; shorten {shorten}",
                head.len()
            )));
        }
        let lead = self.tokens("", PromptTemplate::None)?;
        let plan = score_windows::plan_windows(
            text_tokens.len(),
            after_tokens.len(),
            limit - head.len(),
            limit.saturating_sub(lead.len()),
            settings,
        )
        .map_err(ModelError::Task)?;
        let last = plan.windows.len() - 1;
        let windows = plan
            .windows
            .iter()
            .enumerate()
            .map(|(i, window)| {
                let mut tokens = match i {
                    0 => head.clone(),
                    _ => lead.clone(),
                };
                let start = tokens.len() + window.scored.start - window.text.start;
                tokens.extend_from_slice(&text_tokens[window.text.clone()]);
                let scored = start..tokens.len();
                if i == last && plan.after {
                    tokens.extend_from_slice(&after_tokens);
                }
                ScoredWindow { tokens, scored }
            })
            .collect();
        // The engine scores a position from the row before it: a text whose first token has
        // nothing before it leaves that token unscored.
        let first_scored = !head.is_empty() || text_tokens.is_empty();
        Ok(ScoredText {
            whole: first_scored
                && plan.windows.last().map(|w| w.scored.end) == Some(text_tokens.len()),
            windows,
            truncated: plan.truncated,
        })
    }

    /// `part`'s tokens alone: no BOS, special tokens' texts read as those tokens.
    pub(crate) fn encode(&self, part: &str) -> Result<Vec<u32>, ModelError> {
        Ok(self
            .vocab
            .tokenizer
            .encode(part, false)
            .map_err(|e| ModelError::Task(format!("tokenizer: {e}")))?
            .get_ids()
            .to_vec())
    }

    /// The model's chat template, or what to do without one.
    fn chat(&self) -> Result<&ChatTemplate, ModelError> {
        self.chat.as_ref().ok_or_else(|| {
            ModelError::InvalidConfig(
                "the model has no chat template; use --template none (and a text prompt, \
                 without --system or messages)"
                    .into(),
            )
        })
    }

    /// The text of `tokens`, special tokens left out.
    pub fn decode(&self, tokens: &[u32]) -> Result<String, ModelError> {
        self.decode_skipping(tokens, true)
    }

    /// The text of `tokens`, special tokens kept: a prompt as the model reads it, chat
    /// template markers included (`--dry-run` shows a cut prompt so).
    pub fn decode_with_special(&self, tokens: &[u32]) -> Result<String, ModelError> {
        self.decode_skipping(tokens, false)
    }

    fn decode_skipping(&self, tokens: &[u32], skip_special: bool) -> Result<String, ModelError> {
        self.vocab
            .tokenizer
            .decode(tokens, skip_special)
            .map_err(|e| ModelError::Task(format!("tokenizer: {e}")))
    }

    /// `token`'s text as [`PromptFormat::decode`] gives it alone, decoded once a process: a
    /// step asks for every row's newest token (the stop strings' check, `stop_window`).
    pub fn token_text(&self, token: u32) -> Result<Cow<'_, str>, ModelError> {
        let Some(cell) = self.token_texts.get(token as usize) else {
            return self.decode(&[token]).map(Cow::Owned);
        };
        if let Some(text) = cell.get() {
            return Ok(Cow::Borrowed(text));
        }
        let text = self.decode(&[token])?;
        Ok(Cow::Borrowed(cell.get_or_init(|| text)))
    }

    /// One token as text (special tokens included) and as the bytes it stands for (a
    /// byte-level token may be part of a character; its text then holds U+FFFD).
    pub fn token_piece(&self, token: u32) -> (String, Vec<u8>) {
        let text = self
            .vocab
            .tokenizer
            .decode(&[token], false)
            .unwrap_or_default();
        let bytes = self
            .vocab
            .token(token)
            .and_then(|piece| byte_level_bytes(&piece))
            .unwrap_or_else(|| text.as_bytes().to_vec());
        (text, bytes)
    }

    /// A token id by its exact text (`<|im_end|>`), for `stop_token_ids` given as text.
    pub fn token_id(&self, piece: &str) -> Option<u32> {
        self.vocab.tokenizer.token_to_id(piece)
    }
}

/// The bytes of a byte-level BPE token (GPT-2's map of bytes to printable characters), or
/// `None` when a character of `piece` is outside that map (not a byte-level token).
fn byte_level_bytes(piece: &str) -> Option<Vec<u8>> {
    piece.chars().map(byte_of_char).collect()
}

/// GPT-2's byte-to-character map, inverted: printable Latin-1 bytes stand for themselves,
/// the other 68 bytes for U+0100 on, in byte order.
fn byte_of_char(c: char) -> Option<u8> {
    let printable = |b: u32| (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || b >= 0xae;
    let code = c as u32;
    if code < 0x100 {
        return printable(code).then_some(code as u8);
    }
    let index = code.checked_sub(0x100)? as usize;
    (0u32..0x100)
        .filter(|&b| !printable(b))
        .nth(index)
        .map(|b| b as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_characters_map_back_to_their_bytes() {
        assert_eq!(byte_level_bytes("Hello"), Some(b"Hello".to_vec()));
        // 'Ġ' (U+0120) is the space, 'Ċ' (U+010A) the newline.
        assert_eq!(byte_level_bytes("Ġa"), Some(b" a".to_vec()));
        assert_eq!(byte_level_bytes("Ċ"), Some(b"\n".to_vec()));
        // "é" as two byte-level characters: 0xC3 ('Ã') and 0xA9 ('©').
        assert_eq!(byte_level_bytes("Ã©"), Some("é".as_bytes().to_vec()));
        assert_eq!(byte_level_bytes("中"), None);
    }
}

/// A record text to score, in one window or more ([`PromptFormat::scored_text`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScoredText {
    /// At least one; each text token is scored in one of them, in order.
    pub windows: Vec<ScoredWindow>,
    /// Some of the text went unscored (`max_windows`), or what follows it was dropped.
    pub truncated: bool,
    /// Every one of the text's tokens is scored (what follows it may still have been
    /// dropped): none went unscored past `max_windows`, and the first has something before
    /// it (BOS, the prompt's text, or [`WindowSettings::score_first_token`]'s start token).
    /// Its score is then the whole text's.
    pub whole: bool,
}

/// One window of a scored text: a prompt and the positions in it that it scores.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScoredWindow {
    /// The window's tokens: the prompt before the text (the first window) or BOS (a later
    /// one), the text's tokens it holds, and what follows the text (the last window).
    pub tokens: Vec<u32>,
    /// The positions of the text tokens it scores.
    pub scored: std::ops::Range<usize>,
}
