//! What the engine is asked and what it answers: a prompt to complete
//! ([`GenerationRequest`]) and its completion ([`Generation`]). A leaf of `generate`.

use super::grammar::OutputGrammar;
use super::sampling::{SamplingParams, TokenLogprob};

/// Why a sequence ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// The end-of-sequence token, or a stop string.
    Stop,
    /// Its token limit, or the model's context.
    Length,
}

/// One prompt to complete.
#[derive(Clone, Debug, Default)]
pub struct GenerationRequest {
    /// The record's id: seeds its sampler.
    pub id: String,
    /// Which of the record's completions this is (0 for the first): seeds its sampler
    /// apart from the others'.
    pub choice: u32,
    /// The prompt's tokens.
    pub prompt: Vec<u32>,
    /// The most tokens to generate.
    pub max_new_tokens: usize,
    /// How each next token is drawn.
    pub sampling: SamplingParams,
    /// Generation stops before the first of these in the text.
    pub stop: Vec<String>,
    /// Generation stops after any of these tokens (left out of the text, as the end token
    /// is).
    pub stop_token_ids: Vec<u32>,
    /// Until this many tokens are generated, the end tokens and `stop_token_ids` are never
    /// chosen and stop strings do not end the text.
    pub min_tokens: usize,
    /// The model's end tokens do not end the sequence (they are generated and kept in
    /// `tokens`; their text is left out).
    pub ignore_eos: bool,
    /// Each generated token's log-probability, with this many of the likeliest tokens'
    /// (`None`: none are computed).
    pub logprobs: Option<usize>,
    /// What the completion must be (a JSON schema): each step draws only from the tokens
    /// that keep it valid, and it ends when the document is complete.
    pub grammar: Option<std::sync::Arc<OutputGrammar>>,
}

/// One completed prompt.
#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    /// The generated text (stop strings and end tokens left out).
    pub text: String,
    /// Generated tokens, without the end-of-sequence token.
    pub tokens: Vec<u32>,
    /// Tokens of the prompt as run (after any cut).
    pub prompt_tokens: usize,
    /// Why generation ended.
    pub finish_reason: FinishReason,
    /// One per generated token (the ending end token or stop token id included) when the
    /// request asked for log-probabilities; else empty.
    pub logprobs: Vec<TokenLogprob>,
}
