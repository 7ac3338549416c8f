//! The contract of the built-in `generate` kind: actors that keep an LLM resident (a
//! Llama-family GGUF file) and complete batches of prompts with continuous batching.
//!
//! ```
//! use resident_actor::Kind;
//! use resident_actor::generate::{Generate, GenerateParams, GenerateRequest, PromptParts};
//!
//! let request = GenerateRequest {
//!     prompts: vec![PromptParts::new("doc-1", "Summarise: ", "The council met on Tuesday.", "")],
//!     params: GenerateParams { max_new_tokens: 64, ..GenerateParams::default() },
//! };
//! assert_eq!(resident_actor::kind_id::<Generate>(), "generate@1");
//! # let _ = request;
//! ```

use serde::{Deserialize, Serialize};

use crate::Kind;

/// The `generate` kind: `pool.typed::<Generate>()`.
pub struct Generate;

impl Kind for Generate {
    const NAME: &'static str = "generate";
    const VERSION: u32 = 1;
    type Config = GenerateConfig;
    type Request = GenerateRequest;
    type Response = GenerateResponse;
    type Error = String;
}

/// Sequences an actor decodes at once when its config does not say (CPU: enough rows to
/// batch the weights' reads, few enough to keep a step's latency low).
pub const DEFAULT_MAX_SEQUENCES: u32 = 32;

/// What each actor of a `generate` pool loads.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GenerateConfig {
    /// A GGUF file, a directory holding one, or a Hugging Face safetensors directory
    /// (`config.json`, `*.safetensors`, `tokenizer.json`); local, `s3://` or a Hugging Face
    /// id.
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// The commit or content digest `model` is pinned to (set by jobs; `None` resolves it).
    pub model_revision: Option<String>,
    /// Sequences decoded at once (KV slots); the kind's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_sequences: Option<u32>,
    /// Tokens in one forward step, decode and prefill together; the kind's default when
    /// absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_step_tokens: Option<u32>,
    /// Caps each sequence's context (prompt and completion) below the model's, bounding
    /// its KV cache; the model's own when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_context: Option<u32>,
    /// The weights' precision: `auto` (absent: a GGUF file's quantised blocks on the CPU,
    /// bf16 on a GPU, f32 for a safetensors checkpoint on the CPU), `quantised`, `f32`,
    /// `f16` or `bf16`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<String>,
    /// Threads an actor's forward steps use on the CPU; every core of the node when
    /// absent (a job runs one generation actor per CPU node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<u32>,
}

/// One record's prompt: `before + text + after`. Only `text` (the record's own text) is
/// cut, from its middle, when the prompt would not leave room for the answer in the
/// model's context; the instruction around it never is.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PromptParts {
    /// The record's id: seeds its sampler.
    pub id: String,
    /// Text before the record's (the instruction's head); never cut.
    pub before: String,
    /// The record's own text: the part cut, from its middle, when the prompt is too long.
    pub text: String,
    /// Text after the record's (the instruction's tail); never cut.
    pub after: String,
}

impl PromptParts {
    /// A prompt of `before + text + after` for the record `id`.
    pub fn new(id: &str, before: &str, text: &str, after: &str) -> Self {
        Self {
            id: id.into(),
            before: before.into(),
            text: text.into(),
            after: after.into(),
        }
    }
}

/// How the prompt is fed to the model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Template {
    /// As the single user turn of the model's chat template, with the generation prompt.
    #[default]
    Chat,
    /// As it is, after BOS if the model's metadata asks for one.
    None,
}

/// Decoding parameters, the same for every prompt of a request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GenerateParams {
    /// How the prompt is fed to the model.
    pub template: Template,
    /// The most tokens to generate.
    pub max_new_tokens: u32,
    /// 0 is greedy.
    pub temperature: f32,
    /// Nucleus sampling: draw from the likeliest tokens whose probabilities sum to this (1 keeps every token).
    pub top_p: f32,
    /// 0 keeps every token.
    pub top_k: u32,
    /// With the record's id, seeds its sampler: the same text on any agent and chunking.
    pub seed: u64,
    /// Generation stops before the first of these.
    pub stop: Vec<String>,
}

impl Default for GenerateParams {
    fn default() -> Self {
        Self {
            template: Template::Chat,
            max_new_tokens: 128,
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            seed: 0,
            stop: Vec::new(),
        }
    }
}

/// A batch of prompts to complete.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GenerateRequest {
    /// The prompts, completed together with continuous batching.
    pub prompts: Vec<PromptParts>,
    /// Decoding parameters for every prompt.
    pub params: GenerateParams,
}

/// Why a completion ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FinishReason {
    /// The model's end-of-sequence token, or a stop string.
    Stop,
    /// `max_new_tokens`, or the model's context.
    Length,
}

impl FinishReason {
    /// As `generations.jsonl` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// One prompt's completion.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Completion {
    /// The prompt's record id.
    pub id: String,
    /// The generated text, without the end token or the stop string.
    pub text: String,
    /// Tokens of the prompt as fed (after any cut).
    pub prompt_tokens: u32,
    /// Tokens generated, the end token left out.
    pub generated_tokens: u32,
    /// Why generation ended.
    pub finish_reason: FinishReason,
    /// The record's text was cut to fit the context.
    pub truncated: bool,
}

/// The completions, in the order of the request's prompts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GenerateResponse {
    /// One per prompt, in the request's order.
    pub completions: Vec<Completion>,
}
