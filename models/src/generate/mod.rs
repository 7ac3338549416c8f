//! Text generation with an LLM kept resident: a Llama-family GGUF model, its tokenizer and
//! chat template from the file's metadata, and continuous batching over many prompts.
//!
//! [`GenerateModel::generate`] takes a list of prompts and runs them through a fixed number
//! of KV slots: each step decodes one token of every sequence in flight and prefills
//! waiting prompts with the rest of the step's token budget ([`batcher`]). A sequence that
//! ends (end-of-sequence token, a stop string, its token limit, the context) leaves at once
//! and the next prompt takes its slot.

mod attention;
pub mod batcher;
pub mod chat;
pub mod checkpoint;
pub mod dense;
pub mod export;
mod gguf_shapes;
pub mod gguf_vocab;
mod lanes;
pub mod llama;
mod quantised;
pub mod sampling;

use std::collections::VecDeque;
use std::path::Path;

use candle_core::{DType, Device};

use crate::ModelError;
use attention::KvArena;
use batcher::{SeqProgress, StepLimits, plan_step};
use chat::ChatTemplate;
use dense::{DenseKv, DenseLlama};
use gguf_vocab::Vocab;
use llama::{LlamaConfig, LlamaModel, QUANTISED_ARCHITECTURES, Row, StepBuffers};
use sampling::{Sampler, SamplingParams};

/// Tokens the ` … ` of a cut text may take.
const CUT_MARKER_TOKENS: usize = 3;

/// How a record's text becomes the prompt.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PromptTemplate {
    /// The model's chat template, the text as its single user turn, generation prompt added.
    #[default]
    Chat,
    /// The text as it is, after BOS if the model's metadata asks for it.
    None,
}

/// Why a sequence ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// The end-of-sequence token, or a stop string.
    Stop,
    /// Its token limit, or the model's context.
    Length,
}

/// One prompt to complete.
#[derive(Clone, Debug)]
pub struct GenerationRequest {
    /// The record's id: seeds its sampler.
    pub id: String,
    pub prompt: Vec<u32>,
    pub max_new_tokens: usize,
    pub sampling: SamplingParams,
    /// Generation stops before the first of these in the text.
    pub stop: Vec<String>,
}

/// One completed prompt.
#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    pub text: String,
    /// Generated tokens, without the end-of-sequence token.
    pub tokens: Vec<u32>,
    pub prompt_tokens: usize,
    pub finish_reason: FinishReason,
}

/// The weights' precision, as an actor's config names it (`dtype`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WeightDtype {
    /// A GGUF file's quantised blocks on the CPU (our kernels); bf16 on a GPU; a
    /// safetensors checkpoint in f32 on the CPU.
    #[default]
    Auto,
    /// A GGUF file's blocks as they are, on any device.
    Quantised,
    F32,
    F16,
    Bf16,
}

impl WeightDtype {
    /// Parses a config's `dtype`: `auto` (or absent), `quantised`, `f32`, `f16`, `bf16`.
    pub fn parse(name: Option<&str>) -> Result<Self, ModelError> {
        match name.map(str::to_ascii_lowercase).as_deref() {
            None | Some("auto") => Ok(Self::Auto),
            Some("quantised" | "quantized" | "q") => Ok(Self::Quantised),
            Some("f32") => Ok(Self::F32),
            Some("f16") => Ok(Self::F16),
            Some("bf16") => Ok(Self::Bf16),
            Some(other) => Err(ModelError::InvalidConfig(format!(
                "dtype `{other}` is not one of auto, quantised, f32, f16, bf16"
            ))),
        }
    }

    /// The dense dtype on `device` (`None`: keep a GGUF file's quantised blocks).
    fn dense(self, device: &Device) -> Option<DType> {
        match self {
            Self::Auto if device.is_cuda() => Some(DType::BF16),
            Self::Auto | Self::F32 => Some(DType::F32),
            Self::Quantised => None,
            Self::F16 => Some(DType::F16),
            Self::Bf16 => Some(DType::BF16),
        }
    }
}

/// The forward pass a model runs on.
enum Engine {
    /// Quantised weights on our CPU kernels (`llama.rs`).
    Quantised(LlamaModel),
    /// Tensors on a candle device (`dense.rs`).
    Dense(DenseLlama),
}

/// The KV caches of one `generate` call, of the engine's kind.
enum Cache {
    Quantised(KvArena, Box<StepBuffers>),
    Dense(DenseKv),
}

impl Engine {
    fn config(&self) -> &LlamaConfig {
        match self {
            Self::Quantised(model) => &model.config,
            Self::Dense(model) => &model.config,
        }
    }

    fn config_mut(&mut self) -> &mut LlamaConfig {
        match self {
            Self::Quantised(model) => &mut model.config,
            Self::Dense(model) => &mut model.config,
        }
    }

    fn cache(&self, slots: usize) -> Cache {
        match self {
            Self::Quantised(model) => Cache::Quantised(
                KvArena::new(model.config.layers, model.config.kv_dim(), slots),
                Box::default(),
            ),
            Self::Dense(model) => Cache::Dense(DenseKv::new(model, slots)),
        }
    }

    fn forward(&self, rows: &[Row], cache: &mut Cache) -> Result<Vec<Vec<f32>>, ModelError> {
        match (self, cache) {
            (Self::Quantised(model), Cache::Quantised(kv, buffers)) => {
                model.forward(rows, kv, buffers)
            }
            (Self::Dense(model), Cache::Dense(kv)) => model.forward(rows, kv),
            _ => unreachable!("a cache comes from its own engine"),
        }
    }
}

/// A generation model, loaded once.
pub struct GenerateModel {
    engine: Engine,
    vocab: Vocab,
    chat: Option<ChatTemplate>,
}

/// One sequence in flight.
struct InFlight {
    request: usize,
    slot: usize,
    tokens: Vec<u32>,
    prompt_len: usize,
    cached: usize,
    sampler: Sampler,
}

impl GenerateModel {
    /// Loads a GGUF model file on the CPU, quantised weights on our kernels (or, for
    /// architectures they do not take, dequantised to f32).
    pub fn load(path: &Path) -> Result<Self, ModelError> {
        Self::load_on(path, &Device::Cpu, WeightDtype::Auto)
    }

    /// Loads a GGUF file or a Hugging Face safetensors directory onto `device`, its weights
    /// in `dtype` ([`WeightDtype`] says what `Auto` picks).
    pub fn load_on(path: &Path, device: &Device, dtype: WeightDtype) -> Result<Self, ModelError> {
        if checkpoint::is_safetensors_dir(path) {
            return Self::load_safetensors(path, device, dtype);
        }
        let (mut file, content) = llama::read_gguf(path)?;
        let vocab = Vocab::from_metadata(&content.metadata)?;
        let arch = LlamaConfig::architecture(&content.metadata);
        let our_kernels = device.is_cpu()
            && matches!(dtype, WeightDtype::Auto | WeightDtype::Quantised)
            && QUANTISED_ARCHITECTURES.contains(&arch.as_str())
            && !content.tensor_infos.contains_key("rope_freqs.weight");
        let engine = if our_kernels {
            drop(file);
            Engine::Quantised(LlamaModel::load(path)?.0)
        } else {
            let mut config = LlamaConfig::from_metadata(&content.metadata)?;
            gguf_shapes::check_tensor_shapes(&content, &config)?;
            config.rope_freq_factors = checkpoint::gguf_rope_factors(&content, &mut file)?;
            // `None`: the file's blocks stay quantised, activations in f32. On the CPU,
            // `auto` for a file our kernels do not take means f32.
            let dense_dtype = dtype.dense(device);
            let activations = dense_dtype.unwrap_or(DType::F32);
            let mut weights = checkpoint::GgufWeights {
                content: &content,
                file: &mut file,
                device,
                dtype: activations,
                keep_quantised: dense_dtype.is_none(),
            };
            Engine::Dense(dense::build(
                config,
                &mut weights,
                device.clone(),
                activations,
            )?)
        };
        Self::with_vocab(engine, vocab)
    }

    fn load_safetensors(
        dir: &Path,
        device: &Device,
        dtype: WeightDtype,
    ) -> Result<Self, ModelError> {
        let dtype = dtype.dense(device).ok_or_else(|| {
            ModelError::InvalidConfig(format!(
                "{} is a safetensors checkpoint, not quantised; use dtype f32, f16 or bf16",
                dir.display()
            ))
        })?;
        let config = checkpoint::hf_config(dir)?;
        let vocab = checkpoint::hf_vocab(dir)?;
        let tensors = checkpoint::open_safetensors(dir)?;
        let mut weights = checkpoint::SafetensorsWeights {
            tensors: &tensors,
            device,
            dtype,
        };
        let model = dense::build(config, &mut weights, device.clone(), dtype)?;
        Self::with_vocab(Engine::Dense(model), vocab)
    }

    fn with_vocab(engine: Engine, vocab: Vocab) -> Result<Self, ModelError> {
        let special = |id: Option<u32>| id.and_then(|id| vocab.token(id)).unwrap_or_default();
        let chat = match &vocab.chat_template {
            Some(source) => Some(ChatTemplate::new(
                source,
                &special(vocab.bos),
                &special(Some(vocab.eos)),
            )?),
            None => None,
        };
        Ok(Self {
            engine,
            vocab,
            chat,
        })
    }

    /// The model's shape.
    pub fn config(&self) -> &LlamaConfig {
        self.engine.config()
    }

    /// Which forward pass runs, in words: the quantised CPU kernels, or the dense path's
    /// weights and device (`bf16 weights on cuda`).
    pub fn engine_name(&self) -> String {
        match &self.engine {
            Engine::Quantised(_) => "quantised weights on the CPU kernels".into(),
            Engine::Dense(model) => {
                let device = if model.device.is_cuda() {
                    "cuda"
                } else {
                    "cpu"
                };
                let quantised = matches!(model.lm_head, dense::DenseLinear::Quantised(_));
                let weights = if quantised {
                    "quantised".to_owned()
                } else {
                    format!("{:?}", model.dtype).to_ascii_lowercase()
                };
                format!("{weights} weights on {device}")
            }
        }
    }

    /// The context length in tokens: the model's, or less after [`Self::limit_context`].
    pub fn context(&self) -> usize {
        self.config().context
    }

    /// Caps the context at `tokens` (when below the model's): prompts are cut to fit it and
    /// generation stops at it, which bounds each sequence's KV cache.
    pub fn limit_context(&mut self, tokens: usize) {
        let config = self.engine.config_mut();
        config.context = config.context.min(tokens.max(2));
    }

    /// The prompt's tokens for `text`.
    pub fn prompt_tokens(
        &self,
        text: &str,
        template: PromptTemplate,
    ) -> Result<Vec<u32>, ModelError> {
        let (text, add_bos) = match template {
            PromptTemplate::Chat => {
                let chat = self.chat.as_ref().ok_or_else(|| {
                    ModelError::InvalidConfig(
                        "the model has no chat template; use --template none".into(),
                    )
                })?;
                (chat.render_user_turn(text)?, false)
            }
            PromptTemplate::None => (text.to_owned(), self.vocab.add_bos),
        };
        let encoding = self
            .vocab
            .tokenizer
            .encode(text.as_str(), false)
            .map_err(|e| ModelError::Task(format!("tokenizer: {e}")))?;
        let mut tokens = Vec::with_capacity(encoding.len() + 1);
        if let (true, Some(bos)) = (add_bos, self.vocab.bos) {
            tokens.push(bos);
        }
        tokens.extend_from_slice(encoding.get_ids());
        Ok(tokens)
    }

    /// The prompt `before + text + after`, leaving at least `reserve` tokens of the context
    /// for the answer: when it would not, the middle of `text` (the record's own text) is
    /// cut and marked with ` … `; `before` and `after` (the instruction) never are. Returns
    /// the tokens and whether `text` was cut. An instruction that alone leaves no room is
    /// returned whole (the sequence then ends at the context, `length`).
    pub fn fit_prompt(
        &self,
        (before, text, after): (&str, &str, &str),
        template: PromptTemplate,
        reserve: usize,
    ) -> Result<(Vec<u32>, bool), ModelError> {
        let limit = self.context().saturating_sub(reserve).max(1);
        let whole = self.prompt_tokens(&format!("{before}{text}{after}"), template)?;
        if whole.len() <= limit {
            return Ok((whole, false));
        }
        let text_tokens = self
            .vocab
            .tokenizer
            .encode(text, false)
            .map_err(|e| ModelError::Task(format!("tokenizer: {e}")))?
            .get_ids()
            .to_vec();
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
            fitted = self.prompt_tokens(&format!("{before}{cut}{after}"), template)?;
            if fitted.len() <= limit || keep == 0 {
                break;
            }
            over += fitted.len() - limit;
        }
        Ok((fitted, true))
    }

    /// The logits of the token after `prompt` (one prefill, on a fresh cache): for checks
    /// against other implementations.
    pub fn next_token_logits(&self, prompt: &[u32]) -> Result<Vec<f32>, ModelError> {
        let mut kv = self.engine.cache(1);
        let rows: Vec<Row> = prompt
            .iter()
            .enumerate()
            .map(|(pos, &token)| Row {
                slot: 0,
                pos,
                token,
                logits: pos + 1 == prompt.len(),
            })
            .collect();
        let mut logits = self.engine.forward(&rows, &mut kv)?;
        logits
            .pop()
            .ok_or_else(|| ModelError::Task("an empty prompt has no next token".into()))
    }

    /// The text of `tokens`, special tokens left out.
    pub fn decode(&self, tokens: &[u32]) -> Result<String, ModelError> {
        self.vocab
            .tokenizer
            .decode(tokens, true)
            .map_err(|e| ModelError::Task(format!("tokenizer: {e}")))
    }

    /// Completes every request with continuous batching; `on_token` hears of each token
    /// generated. Results come in request order.
    pub fn generate(
        &self,
        requests: &[GenerationRequest],
        limits: StepLimits,
        on_token: &mut dyn FnMut(),
    ) -> Result<Vec<Generation>, ModelError> {
        let mut results: Vec<Option<Generation>> = vec![None; requests.len()];
        let mut waiting: VecDeque<usize> = (0..requests.len()).collect();
        let mut free_slots: Vec<usize> = (0..limits.max_sequences).rev().collect();
        let mut kv = self.engine.cache(limits.max_sequences);
        let mut flight: Vec<InFlight> = Vec::new();
        loop {
            while let Some(&next) = waiting.front() {
                let request = &requests[next];
                if request.prompt.is_empty() || request.prompt.len() >= self.context() {
                    results[next] = Some(self.too_long_or_empty(request));
                    waiting.pop_front();
                    continue;
                }
                let Some(slot) = free_slots.pop() else { break };
                waiting.pop_front();
                flight.push(InFlight {
                    request: next,
                    slot,
                    tokens: request.prompt.clone(),
                    prompt_len: request.prompt.len(),
                    cached: 0,
                    sampler: Sampler::new(&request.sampling, &request.id),
                });
            }
            if flight.is_empty() {
                break;
            }
            let progress: Vec<SeqProgress> = flight
                .iter()
                .map(|f| SeqProgress {
                    tokens: f.tokens.len(),
                    cached: f.cached,
                })
                .collect();
            let spans = plan_step(&progress, limits);
            let rows: Vec<Row> = spans
                .iter()
                .flat_map(|span| {
                    let seq = &flight[span.seq];
                    (span.start..span.end).map(move |pos| Row {
                        slot: seq.slot,
                        pos,
                        token: seq.tokens[pos],
                        logits: span.logits && pos + 1 == span.end,
                    })
                })
                .collect();
            let mut logits = self.engine.forward(&rows, &mut kv)?.into_iter();
            let mut finished = Vec::new();
            for span in &spans {
                let seq = &mut flight[span.seq];
                seq.cached = span.end;
                if !span.logits {
                    continue;
                }
                let next = seq
                    .sampler
                    .next(&logits.next().expect("one per span with logits"));
                on_token();
                if let Some(done) = self.after_token(seq, next, &requests[seq.request])? {
                    results[seq.request] = Some(done);
                    finished.push(span.seq);
                }
            }
            finished.sort_unstable_by(|a, b| b.cmp(a));
            for index in finished {
                free_slots.push(flight.remove(index).slot);
            }
        }
        Ok(results
            .into_iter()
            .map(|r| r.expect("every request finished"))
            .collect())
    }

    /// Appends `next` to the sequence; its result if that ends it.
    fn after_token(
        &self,
        seq: &mut InFlight,
        next: u32,
        request: &GenerationRequest,
    ) -> Result<Option<Generation>, ModelError> {
        let finish = |seq: &InFlight, reason, text: String| Generation {
            text,
            tokens: seq.tokens[seq.prompt_len..].to_vec(),
            prompt_tokens: seq.prompt_len,
            finish_reason: reason,
        };
        if self.vocab.end_tokens.contains(&next) {
            let text = self.decode(&seq.tokens[seq.prompt_len..])?;
            return Ok(Some(finish(seq, FinishReason::Stop, text)));
        }
        seq.tokens.push(next);
        let generated = seq.tokens.len() - seq.prompt_len;
        if !request.stop.is_empty() {
            let text = self.decode(&seq.tokens[seq.prompt_len..])?;
            let cut = request
                .stop
                .iter()
                .filter_map(|s| text.find(s.as_str()))
                .min();
            if let Some(cut) = cut {
                return Ok(Some(finish(
                    seq,
                    FinishReason::Stop,
                    text[..cut].to_owned(),
                )));
            }
        }
        if generated >= request.max_new_tokens || seq.tokens.len() >= self.context() {
            let text = self.decode(&seq.tokens[seq.prompt_len..])?;
            return Ok(Some(finish(seq, FinishReason::Length, text)));
        }
        Ok(None)
    }

    fn too_long_or_empty(&self, request: &GenerationRequest) -> Generation {
        Generation {
            text: String::new(),
            tokens: Vec::new(),
            prompt_tokens: request.prompt.len(),
            finish_reason: FinishReason::Length,
        }
    }
}

#[cfg(test)]
mod dense_tests;
#[cfg(test)]
mod tests;
