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
pub use crate::reasoning::ReasoningParser;

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

/// Sequences a CPU actor decodes at once when its config does not say: enough rows to
/// batch the weights' reads, few enough to keep a step's latency low (a CPU step costs in
/// proportion to its rows).
pub const DEFAULT_MAX_SEQUENCES: u32 = 32;

/// Sequences a GPU actor decodes at once when its config does not say: a GPU's decode step
/// costs far less than in proportion to its rows (it reads the weights and launches its
/// kernels once either way; an H100 took 13.3 ms a step at 64 rows and 24.9 at 256 before
/// CUDA graphs, BENCHMARKS.md), so 32 would leave most of its throughput unused. vLLM's default
/// (`max_num_seqs`) too; the paged KV cache makes sequences wait for blocks where 256 whole
/// contexts do not fit.
pub const DEFAULT_GPU_MAX_SEQUENCES: u32 = 256;

/// Rows in a CPU actor's forward step (decode rows and prefill rows together) when its
/// config does not say.
pub const DEFAULT_MAX_STEP_TOKENS: u32 = 512;

/// Rows in a GPU actor's forward step when its config does not say. Each step's decode rows
/// (up to [`DEFAULT_GPU_MAX_SEQUENCES`]) come first, and the rest prefill new prompts: with
/// 256 sequences decoding, 512 rows would leave 256 a step for prompts of hundreds of tokens
/// while about two sequences finish a step, and the batch would starve; 4,096 rows also keep
/// a prefill step's matrix products large enough for tensor cores.
pub const DEFAULT_GPU_MAX_STEP_TOKENS: u32 = 4096;

/// What each actor of a `generate` pool loads.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GenerateConfig {
    /// A GGUF file, a directory holding one, or a Hugging Face safetensors directory
    /// (`config.json`, `*.safetensors`, `tokenizer.json`); local, `s3://` or a Hugging Face
    /// id.
    pub model: String,
    #[serde(default)]
    /// The commit or content digest `model` is pinned to (set by jobs; `None` resolves it).
    pub model_revision: Option<String>,
    /// Sequences decoded at once (KV slots); the kind's default when absent.
    #[serde(default)]
    pub max_sequences: Option<u32>,
    /// Tokens in one forward step, decode and prefill together; the kind's default when
    /// absent.
    #[serde(default)]
    pub max_step_tokens: Option<u32>,
    /// Caps each sequence's context (prompt and completion) below the model's, bounding
    /// its KV cache; the model's own when absent.
    #[serde(default)]
    pub max_context: Option<u32>,
    /// The weights' precision: `auto` (absent: a GGUF file's quantised blocks on the CPU,
    /// bf16 on a GPU, f32 for a safetensors checkpoint on the CPU), `quantised`, `f32`,
    /// `f16` or `bf16`.
    #[serde(default)]
    pub dtype: Option<String>,
    /// Threads an actor's forward steps use on the CPU; every core of the node when
    /// absent (a job runs one generation actor per CPU node).
    #[serde(default)]
    pub threads: Option<u32>,
    /// Run every decode step eagerly on a GPU instead of replaying CUDA graphs (vLLM's
    /// `enforce_eager`): slower, for a driver that misbehaves under graphs.
    #[serde(default)]
    pub enforce_eager: bool,
    /// The paged attention's kernel on a GPU: `auto` (absent: tensor cores for f16 and bf16
    /// heads of 32, 64 or 128, else the scalar kernel), `tensor-cores` or `scalar` (for a
    /// GPU or driver where the tensor-core kernel misbehaves). CPU actors ignore it.
    #[serde(default)]
    pub attention: Option<String>,
    /// A Jinja chat template (its source) that renders conversations in place of the
    /// model's own, or for a model that has none (vLLM's and transformers'
    /// `chat_template`); the model's own when absent.
    #[serde(default)]
    pub chat_template: Option<String>,
    /// Variables the chat template is rendered with besides the conversation (vLLM's and
    /// transformers' `chat_template_kwargs`: `{"enable_thinking": false}` turns a Qwen3
    /// template's thinking off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
}

/// The variables a chat template is given by the renderer itself, which
/// `chat_template_kwargs` cannot set.
pub const RENDERER_VARIABLES: [&str; 4] = [
    "messages",
    "add_generation_prompt",
    "bos_token",
    "eos_token",
];

/// Why `kwargs` cannot be a chat template's extra variables (one names a variable the
/// renderer sets), in words to follow their name; `None` when they can.
pub fn chat_template_kwargs_problem(
    kwargs: &serde_json::Map<String, serde_json::Value>,
) -> Option<String> {
    let taken = kwargs
        .keys()
        .find(|key| RENDERER_VARIABLES.contains(&key.as_str()))?;
    Some(format!(
        "cannot set `{taken}`: the renderer sets it (messages, add_generation_prompt, \
         bos_token, eos_token); give the template's own variables, e.g. \
         {{\"enable_thinking\": false}}"
    ))
}

impl GenerateConfig {
    /// The sequences an actor decodes at once: the config's, else its device's default
    /// ([`DEFAULT_GPU_MAX_SEQUENCES`] on a GPU, [`DEFAULT_MAX_SEQUENCES`] on the CPU).
    pub fn max_sequences_on(&self, gpu: bool) -> u32 {
        self.max_sequences.unwrap_or(match gpu {
            true => DEFAULT_GPU_MAX_SEQUENCES,
            false => DEFAULT_MAX_SEQUENCES,
        })
    }

    /// The fewest records a task for this actor should hold so that its continuous batch
    /// stays full: an actor's next task joins the running batch only once the last one's
    /// records all have slots, so a task of fewer records than the batch leaves it part
    /// empty (a job cutting 16-record tasks for a CPU batch of 32 took 793 s where the
    /// engine alone takes 463). Four batches on the CPU, as measured then; two on a GPU,
    /// whose default batch of 256 would otherwise make tasks of 1,024 records, too few of
    /// them for a mid-sized job to keep every GPU busy to its end.
    pub fn records_per_task_on(&self, gpu: bool) -> usize {
        let batch = self.max_sequences_on(gpu) as usize;
        match gpu {
            true => 2 * batch,
            false => 4 * batch,
        }
    }

    /// The rows of one forward step: the config's, else its device's default
    /// ([`DEFAULT_GPU_MAX_STEP_TOKENS`] on a GPU, [`DEFAULT_MAX_STEP_TOKENS`] on the CPU).
    pub fn max_step_tokens_on(&self, gpu: bool) -> u32 {
        self.max_step_tokens.unwrap_or(match gpu {
            true => DEFAULT_GPU_MAX_STEP_TOKENS,
            false => DEFAULT_MAX_STEP_TOKENS,
        })
    }
}

/// One record's prompt: `before + text + after`, or a conversation (`messages`). Only
/// `text` (the record's own text; in a conversation, its longest user message) is cut, from
/// its middle, when the prompt would not leave room for the answer in the model's context;
/// the instruction around it never is.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PromptParts {
    /// The record's id: seeds its sampler.
    pub id: String,
    /// Text before the record's (the instruction's head); never cut.
    pub before: String,
    /// The record's own text: the part cut, from its middle, when the prompt is too long.
    pub text: String,
    /// Text after the record's (the instruction's tail); never cut.
    pub after: String,
    /// A conversation in place of `before + text + after` (which are then empty): the
    /// chat template renders it; a last assistant message is continued.
    #[serde(default)]
    pub messages: Vec<ChatMessage>,
    /// This record's own decoding parameters, over the request's.
    #[serde(default)]
    pub params: Option<ParamsOverride>,
    /// Why this record cannot run (an OpenAI batch line whose request is invalid): it is
    /// answered with this error, without the model.
    #[serde(default)]
    pub error: Option<String>,
    /// Continuations to score after the prompt, each on its own (a multiple-choice
    /// question's answers, a preference pair's chosen and rejected replies): with
    /// [`GenerateParams::score`], each is scored given the whole prompt (`before + text +
    /// after`, or the conversation, where each is the assistant's reply with its end of
    /// turn; under the chat template, the text that follows the rendered prompt and its
    /// generation prompt, as lm-evaluation-harness's `--apply_chat_template` scores) and
    /// nothing is generated; [`Completion::choice_scores`] holds their scores in this order. With
    /// [`GenerateParams::choices_as_contexts`], each is a context instead: `text + after`
    /// is scored after `before + choice`.
    #[serde(default)]
    pub choices: Vec<String>,
    /// The right ones of [`PromptParts::choices`], when the record names them (their
    /// indexes, in order; one for most tasks, several for TruthfulQA's MC2): answered back
    /// in [`ChoiceScores::answers`] to mark whether the choice the model prefers is right.
    #[serde(default)]
    pub answers: Vec<u32>,
    /// This text prompt's own system message, over the request's
    /// ([`GenerateParams::system`]): the job's description (after the job's system message)
    /// under the chat template, as lm-evaluation-harness's `--apply_chat_template` places
    /// it, or written as text before the prompt under template none.
    #[serde(default)]
    pub system: Option<String>,
    /// How many of the conversation's first exchanges after its system message are
    /// few-shot examples (a user turn and the assistant's answer each; `--fewshot-as-
    /// multiturn`): when the prompt is too long for the context, the oldest are left out
    /// whole before any text is cut, and a scored choice's context likewise.
    #[serde(default)]
    pub example_turns: u32,
    /// Where the few-shot examples written as text lie in `before`: each one's start, then
    /// the last one's end (byte offsets, ascending; empty: none). When the prompt is too
    /// long for the context the oldest are left out whole before the record's text is
    /// cut, and a scored choice's context likewise.
    #[serde(default)]
    pub example_bounds: Vec<u32>,
    /// Text the answer starts with, after `before + text + after` (lm-evaluation-
    /// harness's `gen_prefix`): under the chat template the assistant's reply, which the
    /// model continues (or a choice follows); under template none, text right after the
    /// prompt. What is generated is what follows it.
    #[serde(default)]
    pub reply_start: String,
}

impl PromptParts {
    /// A prompt of `before + text + after` for the record `id`.
    pub fn new(id: &str, before: &str, text: &str, after: &str) -> Self {
        Self {
            id: id.into(),
            before: before.into(),
            text: text.into(),
            after: after.into(),
            ..Self::default()
        }
    }

    /// A conversation for the record `id`.
    pub fn chat(id: &str, messages: Vec<ChatMessage>) -> Self {
        Self {
            id: id.into(),
            messages,
            ..Self::default()
        }
    }
}

/// One turn of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The turn's text.
    pub content: String,
}

impl ChatMessage {
    /// A turn of `role` saying `content`.
    pub fn new(role: &str, content: &str) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A record's own decoding parameters (an OpenAI batch line's body, a Python call's per
/// prompt dict): each one set replaces the request's.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ParamsOverride {
    /// [`GenerateParams::max_new_tokens`] (OpenAI's `max_tokens`).
    pub max_new_tokens: Option<u32>,
    /// [`GenerateParams::temperature`].
    pub temperature: Option<f32>,
    /// [`GenerateParams::top_p`].
    pub top_p: Option<f32>,
    /// [`GenerateParams::top_k`].
    pub top_k: Option<u32>,
    /// [`GenerateParams::min_p`].
    pub min_p: Option<f32>,
    /// [`GenerateParams::seed`].
    pub seed: Option<u64>,
    /// [`GenerateParams::stop`].
    pub stop: Option<Vec<String>>,
    /// [`GenerateParams::repetition_penalty`].
    pub repetition_penalty: Option<f32>,
    /// [`GenerateParams::presence_penalty`].
    pub presence_penalty: Option<f32>,
    /// [`GenerateParams::frequency_penalty`].
    pub frequency_penalty: Option<f32>,
    /// [`GenerateParams::min_tokens`].
    pub min_tokens: Option<u32>,
    /// [`GenerateParams::stop_token_ids`].
    pub stop_token_ids: Option<Vec<u32>>,
    /// [`GenerateParams::n`].
    pub n: Option<u32>,
    /// [`GenerateParams::logprobs`].
    pub logprobs: Option<bool>,
    /// [`GenerateParams::top_logprobs`].
    pub top_logprobs: Option<u32>,
    /// [`GenerateParams::ignore_eos`].
    pub ignore_eos: Option<bool>,
    /// [`GenerateParams::response_format`].
    pub response_format: Option<ResponseFormat>,
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

fn one_u32() -> u32 {
    1
}

fn one_f32() -> f32 {
    1.0
}

/// Decoding parameters, the same for every prompt of a request unless a prompt's own
/// [`ParamsOverride`] says otherwise. Semantics as vLLM's `SamplingParams`; in JSON a
/// parameter left out takes its default.
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
    /// A system message before each text prompt's user turn; under template none, text
    /// directly before the prompt (lm-evaluation-harness's system instruction).
    #[serde(default)]
    pub system: Option<String>,
    /// Drop tokens less likely than this fraction of the likeliest (0 keeps all).
    #[serde(default)]
    pub min_p: f32,
    /// Above 1 discourages tokens already in the prompt or the output (1 is off).
    #[serde(default = "one_f32")]
    pub repetition_penalty: f32,
    /// Subtracted once from the logit of each token the output holds (0 is off).
    #[serde(default)]
    pub presence_penalty: f32,
    /// Subtracted from a token's logit per time the output holds it (0 is off).
    #[serde(default)]
    pub frequency_penalty: f32,
    /// No end token, stop token or stop string ends a completion before this many tokens.
    #[serde(default)]
    pub min_tokens: u32,
    /// A completion ends after any of these tokens (left out of its text).
    #[serde(default)]
    pub stop_token_ids: Vec<u32>,
    /// Completions per prompt, each sampled with its own stream.
    #[serde(default = "one_u32")]
    pub n: u32,
    /// Each generated token's log-probability.
    #[serde(default)]
    pub logprobs: bool,
    /// With `logprobs`, this many likeliest tokens' log-probabilities at each step (0-20).
    #[serde(default)]
    pub top_logprobs: u32,
    /// The model's end token does not end a completion (it runs to `max_new_tokens`).
    #[serde(default)]
    pub ignore_eos: bool,
    /// What each completion must be, as OpenAI's `response_format` says it: JSON valid
    /// under a schema, or any JSON object; or, beyond OpenAI's types, text a regular
    /// expression matches, one of a list of texts, or text a grammar derives. Decoding is
    /// masked by the grammar, so every completion that ends with `stop` is of that form.
    #[serde(default)]
    pub response_format: Option<ResponseFormat>,
    /// Score each record's text: the log-probability of each of its tokens given everything
    /// before it in the prompt ([`Completion::score`]): a perplexity for corpus filtering,
    /// lm-evaluation-harness's `loglikelihood` for evaluation. A text is scored raw
    /// (`template` none); under the chat template only choices are, each after the
    /// rendered prompt ([`PromptParts::choices`]). With `max_new_tokens` 0 nothing is
    /// generated.
    #[serde(default)]
    pub score: bool,
    /// With `score`, each scored token's log-probability, with this many likeliest tokens'
    /// at its position (vLLM's `prompt_logprobs`; 0 lists the token's own alone, 0-20).
    #[serde(default)]
    pub prompt_logprobs: Option<u32>,
    /// With `score`, a text longer than the model's window goes on in more windows, each
    /// scoring this many tokens after the last one's with the window's other tokens before
    /// them as context. `None`: all the window's tokens but one (each token computed once, as
    /// lm-evaluation-harness's `loglikelihood_rolling`); shorter gives each token more
    /// context at more compute (Hugging Face's strided perplexity).
    #[serde(default)]
    pub score_stride: Option<u32>,
    /// With `score`, at most this many windows a text (`None`: as many as it takes); the
    /// rest of a longer text goes unscored and the text counts as truncated. 1 scores the
    /// head alone.
    #[serde(default)]
    pub max_score_windows: Option<u32>,
    /// With `score`, a text with nothing before it (no BOS, no prompt text before it) is
    /// scored from its first token, given the model's BOS token (its end-of-text token
    /// where it has none), as lm-evaluation-harness's `loglikelihood_rolling` scores a
    /// document; otherwise its first token is context only, as llama.cpp's perplexity
    /// reads it.
    #[serde(default)]
    pub score_first_token: bool,
    /// With `score`, each of a prompt's [`PromptParts::choices`] is a context that takes the
    /// place of the prompt before the record's text, and the text (with what follows it)
    /// is scored after each: the choice after which it is likeliest wins (Winogrande's
    /// partial scoring, lm-evaluation-harness's multiple-input multiple choice). Under the
    /// chat template each context is the user's turn, and the text the reply's start.
    #[serde(default)]
    pub choices_as_contexts: bool,
    /// Split each completion's thinking (`<think>...</think>`) from its answer as this
    /// parser reads it (vLLM's `--reasoning-parser`): [`Completion::text`] is the answer,
    /// [`Completion::reasoning`] the thinking. `None` leaves the text whole.
    #[serde(default)]
    pub reasoning_parser: Option<ReasoningParser>,
}

/// OpenAI's `response_format`. In JSON it reads and writes as OpenAI spells it; in a
/// task's binary encoding (postcard, which cannot hold a free-form JSON value) as that
/// JSON's text.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[serde(remote = "Self")]
pub enum ResponseFormat {
    /// Free text (no constraint).
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON valid under `json_schema.schema`.
    JsonSchema {
        /// The schema and its name.
        json_schema: JsonSchemaFormat,
    },
    /// Text the regular expression matches whole (Rust's `regex` syntax; vLLM's
    /// `guided_regex`). Not one of OpenAI's types: Resident's own.
    Regex {
        /// The expression.
        regex: String,
    },
    /// Exactly one of these texts (vLLM's `guided_choice`: a label from a fixed set).
    Choice {
        /// The texts allowed, at least one, none empty.
        choice: Vec<String>,
    },
    /// Text the context-free grammar derives (llguidance's Lark syntax, as vLLM's
    /// `guided_grammar` takes it under its guidance backend).
    Grammar {
        /// The grammar, its start rule `start`.
        grammar: String,
    },
}

/// A named JSON schema (`response_format.json_schema`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JsonSchemaFormat {
    /// The schema's name (informational).
    #[serde(default)]
    pub name: String,
    /// The JSON schema every completion must satisfy.
    pub schema: serde_json::Value,
    /// OpenAI's flag; completions are always held to the schema here.
    #[serde(default)]
    pub strict: Option<bool>,
}

impl Serialize for ResponseFormat {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if serializer.is_human_readable() {
            return ResponseFormat::serialize(self, serializer);
        }
        let json = ResponseFormat::serialize(self, serde_json::value::Serializer)
            .map_err(serde::ser::Error::custom)?;
        serializer.serialize_str(&json.to_string())
    }
}

impl<'de> Deserialize<'de> for ResponseFormat {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        if deserializer.is_human_readable() {
            return ResponseFormat::deserialize(deserializer);
        }
        let text = String::deserialize(deserializer)?;
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(serde::de::Error::custom)?;
        ResponseFormat::deserialize(json).map_err(serde::de::Error::custom)
    }
}

impl ResponseFormat {
    /// What is wrong with this format that no grammar engine is needed to see (an empty
    /// list of choices, an empty choice, expression or grammar), in words.
    pub fn problem(&self) -> Option<&'static str> {
        match self {
            Self::Regex { regex } if regex.is_empty() => Some("has an empty regular expression"),
            Self::Choice { choice } if choice.is_empty() => {
                Some("lists no choices (give at least one text)")
            }
            Self::Choice { choice } if choice.iter().any(String::is_empty) => {
                Some("has an empty choice (each must be a text of at least one character)")
            }
            Self::Grammar { grammar } if grammar.trim().is_empty() => Some("has an empty grammar"),
            _ => None,
        }
    }

    /// A schema as `--json-schema` and vLLM's `guided_json` give it.
    pub fn schema(schema: serde_json::Value) -> Self {
        Self::JsonSchema {
            json_schema: JsonSchemaFormat {
                name: "output".into(),
                schema,
                strict: Some(true),
            },
        }
    }
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
            system: None,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            min_tokens: 0,
            stop_token_ids: Vec::new(),
            n: 1,
            logprobs: false,
            top_logprobs: 0,
            ignore_eos: false,
            response_format: None,
            score: false,
            prompt_logprobs: None,
            score_stride: None,
            max_score_windows: None,
            score_first_token: false,
            choices_as_contexts: false,
            reasoning_parser: None,
        }
    }
}

/// The most completions one prompt may ask for.
pub const MAX_N: u32 = 16;

/// The most [`PromptParts::choices`] one prompt may have scored.
pub const MAX_CHOICES: u32 = 64;

/// The most `top_logprobs` a prompt may ask for (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: u32 = 20;

impl GenerateParams {
    /// These parameters with `over`'s set ones in place.
    pub fn with(&self, over: &ParamsOverride) -> Self {
        let mut params = self.clone();
        macro_rules! take {
            ($($field:ident),*) => {$(
                if let Some(value) = &over.$field {
                    params.$field = value.clone();
                }
            )*};
        }
        take!(
            max_new_tokens,
            temperature,
            top_p,
            top_k,
            min_p,
            seed,
            stop,
            repetition_penalty,
            presence_penalty,
            frequency_penalty,
            min_tokens,
            stop_token_ids,
            n,
            logprobs,
            top_logprobs,
            ignore_eos
        );
        if let Some(format) = &over.response_format {
            params.response_format = Some(format.clone());
        }
        params
    }

    /// What is wrong with these parameters: the first parameter out of its range, and the
    /// range; `None` when nothing is.
    pub fn problem(&self) -> Option<ParamProblem> {
        self.decoding_checks()
            .into_iter()
            .chain(self.scoring_checks())
            .find(|(ok, _, _)| !ok)
            .map(|(_, param, rule)| ParamProblem { param, rule })
    }

    /// Each decoding parameter's range check.
    fn decoding_checks(&self) -> [RangeCheck; 11] {
        let finite = |v: f32| v.is_finite();
        let format_problem = self
            .response_format
            .as_ref()
            .and_then(ResponseFormat::problem);
        [
            (
                format_problem.is_none(),
                "response_format",
                format_problem.unwrap_or_default().into(),
            ),
            (
                self.max_new_tokens >= 1 || self.score,
                "max_tokens",
                "must be at least 1 (0 only when scoring the text)".into(),
            ),
            (
                finite(self.temperature) && self.temperature >= 0.0,
                "temperature",
                "must be 0 (greedy) or more".into(),
            ),
            (
                self.top_p > 0.0 && self.top_p <= 1.0,
                "top_p",
                "must be above 0 and at most 1".into(),
            ),
            (
                (0.0..=1.0).contains(&self.min_p),
                "min_p",
                "must be between 0 and 1".into(),
            ),
            (
                finite(self.repetition_penalty) && self.repetition_penalty > 0.0,
                "repetition_penalty",
                "must be above 0 (1 is off)".into(),
            ),
            (
                (-2.0..=2.0).contains(&self.presence_penalty),
                "presence_penalty",
                "must be between -2 and 2".into(),
            ),
            (
                (-2.0..=2.0).contains(&self.frequency_penalty),
                "frequency_penalty",
                "must be between -2 and 2".into(),
            ),
            (
                (1..=MAX_N).contains(&self.n),
                "n",
                format!("must be between 1 and {MAX_N}"),
            ),
            (
                self.top_logprobs <= MAX_TOP_LOGPROBS,
                "top_logprobs",
                format!("must be at most {MAX_TOP_LOGPROBS}"),
            ),
            (
                self.stop.iter().all(|stop| !stop.is_empty()),
                "stop",
                "must not hold an empty string".into(),
            ),
        ]
    }

    /// Each scoring parameter's check (none applies without `score`).
    fn scoring_checks(&self) -> [RangeCheck; 9] {
        [
            (
                !self.score || self.response_format.is_none(),
                "score",
                "does not take a response format (a JSON schema, regex, choice or grammar): \
                 scored text is the record's own"
                    .into(),
            ),
            (
                self.prompt_logprobs.is_none() || self.score,
                "prompt_logprobs",
                "lists the scored tokens: it needs score (--score)".into(),
            ),
            (
                self.prompt_logprobs.is_none_or(|k| k <= MAX_TOP_LOGPROBS),
                "prompt_logprobs",
                format!("must be at most {MAX_TOP_LOGPROBS}"),
            ),
            (
                self.score_stride.is_none() || self.score,
                "score_stride",
                "sets how scoring windows move: it needs score (--score)".into(),
            ),
            (
                self.score_stride != Some(0),
                "score_stride",
                "must be at least 1 token (leave it unset for the widest)".into(),
            ),
            (
                self.max_score_windows.is_none() || self.score,
                "max_score_windows",
                "caps the scoring windows: it needs score (--score)".into(),
            ),
            (
                self.max_score_windows != Some(0),
                "max_score_windows",
                "must be at least 1 (1 scores each text's head alone)".into(),
            ),
            (
                !self.score_first_token || self.score,
                "score_first_token",
                "scores a text's first token after the model's start token: it needs score \
                 (--score)"
                    .into(),
            ),
            (
                !self.choices_as_contexts || self.score,
                "choices_as_contexts",
                "scores each record's text after each of its choices: it needs score \
                 (--score)"
                    .into(),
            ),
        ]
    }
}

/// A parameter's check: whether it holds, the parameter, and what it must be.
type RangeCheck = (bool, &'static str, String);

/// A decoding parameter out of its range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamProblem {
    /// Its name in OpenAI's and vLLM's requests (`max_tokens`, `top_p`).
    pub param: &'static str,
    /// What it must be.
    pub rule: String,
}

impl std::fmt::Display for ParamProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{}` {}", self.param, self.rule)
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

/// One prompt's completion (its first, when it asked for `n` of them).
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
    /// The record's text was cut to fit the context (or its oldest few-shot examples left
    /// out: [`PromptParts::example_turns`], [`PromptParts::example_bounds`]).
    pub truncated: bool,
    /// Each generated token's log-probability, when asked for.
    #[serde(default)]
    pub logprobs: Option<Vec<TokenLogprob>>,
    /// The second and later of `n` completions.
    #[serde(default)]
    pub more: Vec<Choice>,
    /// Why the prompt did not run (its request was invalid); the text is then empty.
    #[serde(default)]
    pub error: Option<String>,
    /// The record text's score, when [`GenerateParams::score`] asked for it (not for a
    /// prompt with [`PromptParts::choices`]: its choices are scored instead).
    #[serde(default)]
    pub score: Option<TextScore>,
    /// The prompt's [`PromptParts::choices`], each scored after it.
    #[serde(default)]
    pub choice_scores: Option<ChoiceScores>,
    /// The completion's thinking, when [`GenerateParams::reasoning_parser`] found one
    /// (`text` is then the answer after it).
    #[serde(default)]
    pub reasoning: Option<String>,
    /// The generated tokens the thinking took, its end tag included (OpenAI's
    /// `reasoning_tokens`; 0 without a reasoning parser).
    #[serde(default)]
    pub reasoning_tokens: u32,
}

/// A prompt's choices scored after it, and which the model prefers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChoiceScores {
    /// Each choice's score, in the prompt's order.
    pub scores: Vec<TextScore>,
    /// Each choice's length in characters, as given.
    pub chars: Vec<u32>,
    /// The right choices' indexes, in order (empty when the record names none).
    pub answers: Vec<u32>,
}

impl ChoiceScores {
    /// The choice the model finds likeliest: the highest log-probability, the first among
    /// equals (lm-evaluation-harness's `acc`).
    pub fn best(&self) -> usize {
        first_highest(self.scores.iter().map(|s| s.logprob))
    }

    /// The likeliest by log-probability per character, which does not favour short choices
    /// (lm-evaluation-harness's `acc_norm`).
    pub fn best_normalized(&self) -> usize {
        let per_char =
            |(score, chars): (&TextScore, &u32)| score.logprob / f64::from(*chars).max(1.0);
        first_highest(self.scores.iter().zip(&self.chars).map(per_char))
    }

    /// Whether [`ChoiceScores::best`] and [`ChoiceScores::best_normalized`] are a right
    /// answer; `None` without one.
    pub fn correct(&self) -> Option<(bool, bool)> {
        let right = |index: usize| self.answers.contains(&(index as u32));
        (!self.answers.is_empty()).then(|| (right(self.best()), right(self.best_normalized())))
    }

    /// The probability the model puts on the right answers when the choices' probabilities
    /// are scaled to sum to one: `sum of exp(logprob)` over the right ones over that sum over
    /// all (lm-evaluation-harness's `acc` of TruthfulQA's MC2, whatever the number of right
    /// answers). `None` without an answer, or when no choice's probability is a number
    /// above zero (NaN, or every log-probability minus infinity).
    pub fn answer_probability(&self) -> Option<f64> {
        if self.answers.is_empty() {
            return None;
        }
        let probabilities = self.probabilities()?;
        let right = (self.answers.iter()).filter_map(|&i| probabilities.get(i as usize));
        Some(right.sum())
    }

    /// How far the choices' probabilities (scaled to sum to one) lie from the right
    /// answer's certainty: the sum over the choices of `(p - 1)^2` for the right one and
    /// `p^2` for the others, 0 for a model sure of the right answer and 2 for one sure of
    /// a wrong one (lm-evaluation-harness's `brier_score`, a record's part of it: lower
    /// is better). `None` unless the record names exactly one right answer (the one-hot
    /// target it assumes), or when the probabilities are not numbers (as
    /// [`ChoiceScores::answer_probability`]).
    pub fn brier_score(&self) -> Option<f64> {
        let [answer] = self.answers[..] else {
            return None;
        };
        let probabilities = self.probabilities()?;
        let miss = |(index, p): (usize, &f64)| match index == answer as usize {
            true => (p - 1.0).powi(2),
            false => p * p,
        };
        Some(probabilities.iter().enumerate().map(miss).sum())
    }

    /// Each choice's probability when they are scaled to sum to one (the softmax of their
    /// log-probabilities); `None` when no choice's is a number above zero.
    fn probabilities(&self) -> Option<Vec<f64>> {
        // Scaled by the likeliest choice, so that no exponent underflows to zero.
        let top = (self.scores.iter().map(|s| s.logprob)).fold(f64::NEG_INFINITY, f64::max);
        let weights: Vec<f64> = (self.scores.iter())
            .map(|s| (s.logprob - top).exp())
            .collect();
        let all: f64 = weights.iter().sum();
        (all.is_finite() && all > 0.0).then(|| weights.iter().map(|w| w / all).collect())
    }
}

/// The index of the first highest of `values` (NaN never wins; 0 when all are NaN).
fn first_highest(values: impl Iterator<Item = f64>) -> usize {
    let mut best: Option<(usize, f64)> = None;
    for (index, value) in values.enumerate() {
        if best.is_none_or(|(_, top)| value > top) && !value.is_nan() {
            best = Some((index, value));
        }
    }
    best.map_or(0, |(index, _)| index)
}

/// How likely the model finds a record's text after the prompt before it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TextScore {
    /// The text's tokens scored (its first token is not, where nothing comes before it).
    pub tokens: u32,
    /// The sum of their log-probabilities (natural log).
    pub logprob: f64,
    /// Each was the likeliest token at its position: greedy decoding writes this text
    /// (lm-evaluation-harness's `is_greedy`).
    pub greedy: bool,
    /// Each scored token's log-probability, when `prompt_logprobs` asked for them.
    #[serde(default)]
    pub token_logprobs: Option<Vec<TokenLogprob>>,
    /// The text's size, when every one of its tokens was scored (none went unscored past
    /// `max_score_windows`, and the first had something before it: BOS, the prompt's text,
    /// or the start token of `score_first_token`): what bits per byte and word perplexity
    /// divide by. `None` for a scored choice.
    #[serde(default)]
    pub size: Option<TextSize>,
}

impl TextScore {
    /// `exp(-logprob / tokens)`; `None` when no token was scored.
    pub fn perplexity(&self) -> Option<f64> {
        (self.tokens > 0).then(|| (-self.logprob / f64::from(self.tokens)).exp())
    }

    /// `-logprob / bytes / ln 2`: the bits the model needs per byte of the text, which,
    /// unlike [`TextScore::perplexity`], compares models of different tokenizers; `None`
    /// without a size (or an empty text).
    pub fn bits_per_byte(&self) -> Option<f64> {
        let bytes = self.size?.bytes;
        (bytes > 0).then(|| -self.logprob / bytes as f64 / std::f64::consts::LN_2)
    }
}

/// A scored text's size in the units lm-evaluation-harness divides a text's
/// log-likelihood by (`loglikelihood_rolling`'s `word_perplexity`, `byte_perplexity` and
/// `bits_per_byte`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TextSize {
    /// Its UTF-8 bytes.
    pub bytes: u64,
    /// Its words: the pieces Python's `re.split(r"\s+", text)` cuts it into, as
    /// lm-evaluation-harness counts them (whitespace at either end adds an empty piece,
    /// and an empty text is one).
    pub words: u64,
}

impl TextSize {
    /// The size of `text`.
    pub fn of(text: &str) -> Self {
        let mut words = 1;
        let mut in_space = false;
        for c in text.chars() {
            let space = is_python_space(c);
            words += u64::from(space && !in_space);
            in_space = space;
        }
        Self {
            bytes: text.len() as u64,
            words,
        }
    }
}

/// Whether Python's `\s` (a `str` pattern) matches `c`: Unicode whitespace, and the four
/// ASCII separators (0x1C-0x1F) that `str.isspace` counts too.
fn is_python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

impl Completion {
    /// Every completion of the prompt, the first included, in order.
    pub fn choices(&self) -> Vec<Choice> {
        let first = Choice {
            text: self.text.clone(),
            generated_tokens: self.generated_tokens,
            finish_reason: self.finish_reason,
            logprobs: self.logprobs.clone(),
            reasoning: self.reasoning.clone(),
            reasoning_tokens: self.reasoning_tokens,
        };
        std::iter::once(first)
            .chain(self.more.iter().cloned())
            .collect()
    }

    /// Tokens generated over all the prompt's completions.
    pub fn all_generated_tokens(&self) -> u64 {
        u64::from(self.generated_tokens)
            + self
                .more
                .iter()
                .map(|c| u64::from(c.generated_tokens))
                .sum::<u64>()
    }
}

/// One of a prompt's `n` completions.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Choice {
    /// The generated text, without the end token or the stop string.
    pub text: String,
    /// Tokens generated, the end token left out.
    pub generated_tokens: u32,
    /// Why generation ended.
    pub finish_reason: FinishReason,
    /// Each generated token's log-probability, when asked for.
    #[serde(default)]
    pub logprobs: Option<Vec<TokenLogprob>>,
    /// The completion's thinking ([`Completion::reasoning`]).
    #[serde(default)]
    pub reasoning: Option<String>,
    /// The tokens the thinking took ([`Completion::reasoning_tokens`]).
    #[serde(default)]
    pub reasoning_tokens: u32,
}

/// A generated token's log-probability (natural log, under the model's raw distribution),
/// as OpenAI's chat completions spell it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprob {
    /// The token's text (U+FFFD where it is part of a character).
    pub token: String,
    /// Its log-probability.
    pub logprob: f32,
    /// The bytes the token stands for.
    pub bytes: Vec<u8>,
    /// The likeliest tokens at this step, most likely first (`top_logprobs` of them).
    #[serde(default)]
    pub top_logprobs: Vec<TopLogprob>,
}

/// One of the likeliest tokens at a step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TopLogprob {
    /// The token's text.
    pub token: String,
    /// Its log-probability.
    pub logprob: f32,
    /// The bytes it stands for.
    pub bytes: Vec<u8>,
}

/// The completions, in the order of the request's prompts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GenerateResponse {
    /// One per prompt, in the request's order.
    pub completions: Vec<Completion>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a setting a GPU actor runs 256 sequences in steps of 4,096 rows and a CPU
    /// actor 32 in steps of 512; a setting wins on either.
    #[test]
    fn the_step_limits_default_by_device_and_a_setting_wins() {
        let unset = GenerateConfig::default();
        assert_eq!(
            (unset.max_sequences_on(true), unset.max_step_tokens_on(true)),
            (256, 4096)
        );
        assert_eq!(
            (
                unset.max_sequences_on(false),
                unset.max_step_tokens_on(false)
            ),
            (32, 512)
        );
        let set = GenerateConfig {
            max_sequences: Some(8),
            max_step_tokens: Some(64),
            ..GenerateConfig::default()
        };
        for gpu in [true, false] {
            assert_eq!(
                (set.max_sequences_on(gpu), set.max_step_tokens_on(gpu)),
                (8, 64)
            );
        }
        // Tasks: four batches on the CPU, two on a GPU.
        assert_eq!(unset.records_per_task_on(false), 128);
        assert_eq!(unset.records_per_task_on(true), 512);
        assert_eq!(set.records_per_task_on(false), 32);
        assert_eq!(set.records_per_task_on(true), 16);
    }

    /// A request with every new field set survives the task encoding (postcard), the JSON
    /// schema included, and reads as OpenAI spells it in JSON.
    #[test]
    fn a_request_with_a_schema_and_overrides_round_trips_through_the_task_encoding() {
        let schema = serde_json::json!({"type": "object", "properties": {"a": {"enum": [1, 2]}}});
        let request = GenerateRequest {
            prompts: vec![PromptParts {
                params: Some(ParamsOverride {
                    n: Some(2),
                    response_format: Some(ResponseFormat::JsonObject),
                    ..ParamsOverride::default()
                }),
                choices: vec!["Hello.".into(), "Go away.".into()],
                answers: vec![0, 1],
                ..PromptParts::chat("r", vec![ChatMessage::new("user", "hi")])
            }],
            params: GenerateParams {
                response_format: Some(ResponseFormat::schema(schema.clone())),
                logprobs: true,
                top_logprobs: 2,
                reasoning_parser: Some(ReasoningParser::DeepseekR1),
                ..GenerateParams::default()
            },
        };
        let bytes = crate::encode_request::<Generate>(&request).unwrap();
        assert_eq!(crate::decode_request::<Generate>(&bytes).unwrap(), request);
        let json = serde_json::to_value(&request.params).unwrap();
        assert_eq!(json["response_format"]["type"], "json_schema");
        assert_eq!(json["response_format"]["json_schema"]["schema"], schema);
        assert_eq!(json["reasoning_parser"], "deepseek_r1");
        let back: GenerateParams = serde_json::from_value(json).unwrap();
        assert_eq!(back, request.params);
    }

    /// A regex, a list of choices and a grammar travel in a task as they read in JSON
    /// (`{"type": "choice", "choice": [...]}`); an empty one is a problem of the request,
    /// named.
    #[test]
    fn regex_choice_and_grammar_formats_round_trip_and_empty_ones_are_refused() {
        let formats = [
            ResponseFormat::Regex {
                regex: "[0-9]+".into(),
            },
            ResponseFormat::Choice {
                choice: vec!["yes".into(), "no, \"never\"".into()],
            },
            ResponseFormat::Grammar {
                grammar: "start: \"a\"+".into(),
            },
        ];
        for format in formats {
            let request = GenerateRequest {
                prompts: vec![PromptParts::chat("r", vec![ChatMessage::new("user", "hi")])],
                params: GenerateParams {
                    response_format: Some(format.clone()),
                    ..GenerateParams::default()
                },
            };
            let bytes = crate::encode_request::<Generate>(&request).unwrap();
            assert_eq!(crate::decode_request::<Generate>(&bytes).unwrap(), request);
            let json = serde_json::to_value(&format).unwrap();
            assert_eq!(
                serde_json::from_value::<ResponseFormat>(json).unwrap(),
                format
            );
            assert_eq!(request.params.problem(), None);
        }
        let choice = serde_json::json!({"type": "choice", "choice": ["a", "b"]});
        assert_eq!(
            serde_json::from_value::<ResponseFormat>(choice).unwrap(),
            ResponseFormat::Choice {
                choice: vec!["a".into(), "b".into()]
            }
        );
        for (format, says) in [
            (
                ResponseFormat::Regex { regex: "".into() },
                "`response_format` has an empty regular expression",
            ),
            (
                ResponseFormat::Choice { choice: vec![] },
                "`response_format` lists no choices (give at least one text)",
            ),
            (
                ResponseFormat::Choice {
                    choice: vec!["a".into(), "".into()],
                },
                "`response_format` has an empty choice",
            ),
            (
                ResponseFormat::Grammar {
                    grammar: " \n".into(),
                },
                "`response_format` has an empty grammar",
            ),
        ] {
            let params = GenerateParams {
                response_format: Some(format),
                ..GenerateParams::default()
            };
            let problem = params.problem().expect("refused").to_string();
            assert!(problem.starts_with(says), "{problem}");
        }
    }

    /// A score may generate nothing and takes no response format; choices as contexts
    /// need template none; `prompt_logprobs` needs it and is capped as `top_logprobs` is.
    #[test]
    fn scoring_parameters_are_checked_with_what_to_do() {
        let scoring = GenerateParams {
            template: Template::None,
            max_new_tokens: 0,
            score: true,
            prompt_logprobs: Some(20),
            ..GenerateParams::default()
        };
        assert_eq!(scoring.problem(), None);
        let problem = |params: GenerateParams| params.problem().map(|p| p.to_string());
        assert_eq!(
            problem(GenerateParams {
                score: false,
                prompt_logprobs: None,
                ..scoring.clone()
            }),
            Some("`max_tokens` must be at least 1 (0 only when scoring the text)".into())
        );
        // Under the chat template choices are scored after the rendered prompt, and
        // choices as contexts are user turns.
        let chat = GenerateParams {
            template: Template::Chat,
            ..scoring.clone()
        };
        assert_eq!(chat.problem(), None);
        let contexts = GenerateParams {
            choices_as_contexts: true,
            ..chat
        };
        assert_eq!(contexts.problem(), None);
        let listed = problem(GenerateParams {
            score: false,
            max_new_tokens: 1,
            ..scoring.clone()
        });
        assert!(listed.unwrap().contains("needs score (--score)"));
        let many = problem(GenerateParams {
            prompt_logprobs: Some(21),
            ..scoring.clone()
        });
        assert_eq!(many, Some("`prompt_logprobs` must be at most 20".into()));
        let schema = problem(GenerateParams {
            response_format: Some(ResponseFormat::JsonObject),
            ..scoring.clone()
        });
        assert!(schema.unwrap().contains("response format"));
        let windows = GenerateParams {
            score_stride: Some(1),
            max_score_windows: Some(1),
            ..scoring.clone()
        };
        assert_eq!(windows.problem(), None);
        for (params, wanted) in [
            (
                GenerateParams {
                    score_stride: Some(0),
                    ..windows.clone()
                },
                "`score_stride` must be at least 1 token",
            ),
            (
                GenerateParams {
                    max_score_windows: Some(0),
                    ..windows.clone()
                },
                "`max_score_windows` must be at least 1 (1 scores each text's head alone)",
            ),
            (
                GenerateParams {
                    score: false,
                    prompt_logprobs: None,
                    max_new_tokens: 1,
                    max_score_windows: None,
                    ..windows.clone()
                },
                "`score_stride` sets how scoring windows move: it needs score (--score)",
            ),
            (
                GenerateParams {
                    score: false,
                    prompt_logprobs: None,
                    max_new_tokens: 1,
                    score_stride: None,
                    ..windows
                },
                "`max_score_windows` caps the scoring windows: it needs score (--score)",
            ),
            (
                GenerateParams {
                    score_first_token: true,
                    ..GenerateParams::default()
                },
                "`score_first_token` scores a text's first token after the model's start \
                 token: it needs score (--score)",
            ),
            (
                GenerateParams {
                    choices_as_contexts: true,
                    ..GenerateParams::default()
                },
                "`choices_as_contexts` scores each record's text after each of its choices: \
                 it needs score (--score)",
            ),
        ] {
            let problem = problem(params).unwrap();
            assert!(problem.starts_with(wanted), "{problem}");
        }
    }

    /// A text's words are the pieces Python's `re.split(r"\s+", text)` gives, as
    /// lm-evaluation-harness counts them (values from Python 3.11): runs of whitespace of
    /// any kind, the separators `str.isspace` counts included, split once; whitespace at an
    /// end adds an empty piece. Bytes are UTF-8's; bits per byte divide by them.
    #[test]
    fn a_text_s_size_is_counted_as_lm_evaluation_harness_counts_it() {
        let cases = [
            ("", 0, 1),
            ("one", 3, 1),
            ("two words", 9, 2),
            ("  lead and trail \n", 18, 5),
            ("tab\tnew\nline\r\nend", 17, 4),
            ("no\u{a0}break\u{3000}ideographic\u{2028}line", 30, 4),
            ("unit\u{1f}separator", 14, 2),
            ("zero\u{200b}width", 12, 1),
            ("é à", 5, 2),
        ];
        for (text, bytes, words) in cases {
            assert_eq!(TextSize::of(text), TextSize { bytes, words }, "{text:?}");
        }
        let score = TextScore {
            tokens: 2,
            logprob: -8.0 * std::f64::consts::LN_2,
            greedy: false,
            token_logprobs: None,
            size: Some(TextSize { bytes: 4, words: 1 }),
        };
        assert!((score.bits_per_byte().unwrap() - 2.0).abs() < 1e-12);
        let unsized_score = TextScore {
            size: None,
            ..score
        };
        assert_eq!(unsized_score.bits_per_byte(), None);
    }

    /// The likeliest choice is the highest log-probability, the first among equals; per
    /// character, a long choice is not beaten by a short one for its length alone; NaN
    /// never wins; `correct` needs an answer.
    #[test]
    fn the_likeliest_choice_is_picked_plain_and_per_character() {
        let score = |logprob: f64| TextScore {
            tokens: 1,
            logprob,
            greedy: false,
            token_logprobs: None,
            size: None,
        };
        let scored = ChoiceScores {
            // -4 over 2 characters (-2 each) against -6 over 12 (-0.5 each).
            scores: vec![score(-4.0), score(-6.0), score(-4.0), score(f64::NAN)],
            chars: vec![2, 12, 2, 1],
            answers: vec![1],
        };
        assert_eq!(scored.best(), 0, "the first of two equals");
        assert_eq!(scored.best_normalized(), 1);
        assert_eq!(scored.correct(), Some((false, true)));
        let unanswered = ChoiceScores {
            answers: Vec::new(),
            ..scored.clone()
        };
        assert_eq!(unanswered.correct(), None);
        let several = ChoiceScores {
            answers: vec![1, 2],
            ..scored.clone()
        };
        assert_eq!(several.correct(), Some((false, true)), "0 is not right");
        let with_first = ChoiceScores {
            answers: vec![2, 0],
            ..scored.clone()
        };
        assert_eq!(with_first.correct(), Some((true, false)));
        let nan_first = ChoiceScores {
            scores: vec![score(f64::NAN), score(-9.0)],
            chars: vec![1, 0],
            answers: vec![1],
        };
        assert_eq!(nan_first.best(), 1, "NaN never wins");
        assert_eq!(
            nan_first.best_normalized(),
            1,
            "no division by zero characters"
        );
    }

    /// Choices of these log-probabilities (3 tokens and 5 characters each), `answers` the
    /// right ones.
    fn scored(logprobs: &[f64], answers: Vec<u32>) -> ChoiceScores {
        let score = |logprob: f64| TextScore {
            tokens: 3,
            logprob,
            greedy: false,
            token_logprobs: None,
            size: None,
        };
        ChoiceScores {
            scores: logprobs.iter().map(|&l| score(l)).collect(),
            chars: vec![5; logprobs.len()],
            answers,
        }
    }

    /// The right answers' probability among the choices, as lm-evaluation-harness's
    /// TruthfulQA MC2 computes it (`exp` of each, the right ones' sum over all), without
    /// underflow where every log-probability is far below zero; none without an answer or
    /// with a NaN.
    #[test]
    fn the_right_answers_probability_is_their_share_of_the_choices() {
        // Probabilities 0.5, 0.25, 0.125 and 0.125: the right ones hold 0.625 of 1.
        let halves = [0.5f64, 0.25, 0.125, 0.125].map(f64::ln);
        let mass = scored(&halves, vec![0, 2]).answer_probability().unwrap();
        assert!((mass - 0.625).abs() < 1e-12, "{mass}");
        let one = scored(&halves, vec![1]).answer_probability().unwrap();
        assert!((one - 0.25).abs() < 1e-12, "{one}");
        // Shifted by -2000 (each exp alone is 0.0): the same shares.
        let far = halves.map(|l| l - 2000.0);
        let far_mass = scored(&far, vec![0, 2]).answer_probability().unwrap();
        assert!((far_mass - 0.625).abs() < 1e-9, "{far_mass}");
        assert_eq!(scored(&halves, Vec::new()).answer_probability(), None);
        let nan = [-1.0, f64::NAN];
        assert_eq!(scored(&nan, vec![0]).answer_probability(), None);
        let never = [f64::NEG_INFINITY; 2];
        assert_eq!(scored(&never, vec![0]).answer_probability(), None);
    }

    /// A record's Brier score, as lm-evaluation-harness's `brier_score` sums it over the
    /// softmax of the choices' log-probabilities against the right answer's one-hot
    /// vector: 0 when sure and right, 2 when sure and wrong; none without exactly one right
    /// answer, or with a NaN.
    #[test]
    fn a_record_s_brier_score_is_its_probabilities_squared_distance_from_the_answer() {
        // Probabilities 0.5, 0.25, 0.125, 0.125, the second right:
        // 0.25 + 0.5625 + 0.015625 + 0.015625.
        let halves = [0.5f64, 0.25, 0.125, 0.125].map(f64::ln);
        let brier = scored(&halves, vec![1]).brier_score().unwrap();
        assert!((brier - 0.84375).abs() < 1e-12, "{brier}");
        let first = scored(&halves, vec![0]).brier_score().unwrap();
        assert!((first - 0.34375).abs() < 1e-12, "{first}");
        // Shifted by -2000, where each exp alone underflows: the same score.
        let far = halves.map(|l| l - 2000.0);
        let far_brier = scored(&far, vec![1]).brier_score().unwrap();
        assert!((far_brier - 0.84375).abs() < 1e-9, "{far_brier}");
        let sure = [0.0, -1e6];
        assert!(scored(&sure, vec![0]).brier_score().unwrap() < 1e-12);
        assert!((scored(&sure, vec![1]).brier_score().unwrap() - 2.0).abs() < 1e-12);
        assert_eq!(scored(&halves, Vec::new()).brier_score(), None);
        assert_eq!(scored(&halves, vec![0, 1]).brier_score(), None);
        assert_eq!(scored(&[-1.0, f64::NAN], vec![0]).brier_score(), None);
    }
}
