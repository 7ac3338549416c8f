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
    /// The grammar holds from the end of the model's thinking on (`</think>`, vLLM's
    /// structured output under a reasoning parser): until then every token may be drawn.
    /// A prompt whose last think tag closes a thinking has none left to wait for.
    pub grammar_after_thinking: bool,
    /// Which of the prompt's own tokens to score (`None`: none are).
    pub score: Option<PromptScoring>,
}

/// The prompt tokens a request scores: each one's log-probability given the tokens before
/// it, read from the logits of the position before it while the prompt is prefilled (vLLM's
/// `prompt_logprobs`, lm-evaluation-harness's `loglikelihood`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PromptScoring {
    /// The first prompt position scored (at least 1: the first token has nothing before it).
    pub from: usize,
    /// One past the last (at most the prompt's length).
    pub to: usize,
    /// With each scored token, the log-probabilities of this many likeliest tokens there.
    pub top: usize,
}

impl PromptScoring {
    /// Whether the row at `pos` gives a score, for a sequence that has scored `done` tokens:
    /// its next token is the next one to score. Rows run in order, so a sequence computed
    /// again after preemption scores no token twice.
    pub fn wants_row(scoring: Option<Self>, done: usize, pos: usize) -> bool {
        scoring.is_some_and(|s| {
            let target = pos + 1;
            target >= s.from.max(1) + done && target < s.to
        })
    }

    /// How many of a prompt's first tokens a sequence may take from the prefix cache when it
    /// has scored `done`: the row before the next token to score must be computed.
    pub fn shareable(scoring: Option<Self>, done: usize, prompt: usize) -> usize {
        match scoring {
            Some(s) if s.from.max(1) + done < s.to => s.from.max(1) + done,
            _ => prompt,
        }
    }
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
    /// One per scored prompt token ([`GenerationRequest::score`]), in order; else empty.
    pub prompt_logprobs: Vec<TokenLogprob>,
    /// Every scored prompt token was the likeliest at its position (greedy decoding would
    /// have written them); true when none was scored.
    pub prompt_greedy: bool,
}
