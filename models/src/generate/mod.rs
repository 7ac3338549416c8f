//! Text generation with an LLM kept resident: a Llama-family GGUF model, its tokenizer and
//! chat template from the file's metadata, and continuous batching over many prompts.
//!
//! [`GenerateModel::generate`] takes a list of prompts and runs them through a fixed number
//! of KV slots: each step decodes one token of every sequence in flight and prefills
//! waiting prompts with the rest of the step's token budget ([`batcher`]). A sequence that
//! ends (end-of-sequence token, a stop string, its token limit, the context) leaves at once
//! and the next prompt takes its slot.

mod admission;
mod attention;
mod attention_check;
pub mod batcher;
mod cache;
mod cache_lanes;
pub mod chat;
pub mod checkpoint;
pub mod decode_graph;
#[cfg(feature = "cuda")]
mod decode_graph_cuda;
pub(crate) mod decoder;
pub mod dense;
pub(crate) mod device_ops;
mod draw;
mod example_text;
mod example_turns;
pub mod export;
mod f16_slices;
mod gguf_shapes;
pub mod gguf_vocab;
pub mod grammar;
mod kv_arena;
pub mod kv_blocks;
pub(crate) mod lanes;
mod paged_attention;
pub mod prompt;
mod quantised;
mod quantised_llama;
mod request;
pub(crate) mod rope_heads;
mod rope_table;
pub mod running;
pub mod sampling;
pub mod score_windows;
pub mod step_profile;
mod stop_window;
mod thinking;

use std::path::Path;

use candle_core::{DType, Device};

use crate::ModelError;
use crate::device::compute_capability;
use batcher::{SeqProgress, Span, StepLimits, plan_step};
use cache::{Cache, KeptCache, SeqKv};
use decode_graph::DecodeGraphs;
use decoder::{LlamaConfig, NextToken, Pick, QUANTISED_ARCHITECTURES, Row};
use dense::{DenseKv, DenseLlama, ReserveError};
use gguf_vocab::Vocab;
use grammar::{Constraint, GrammarEngine, OutputGrammar};
use kv_arena::KvArena;
pub use paged_attention::AttentionKernel;
pub use prompt::PromptTemplate;
use prompt::{Prompt, PromptFormat};
use quantised_llama::QuantisedLlama;
pub use request::{FinishReason, Generation, GenerationRequest, PromptScoring};
use running::{Batch, GenerationFeed, InFlight, OneGroup};
use step_profile::{Phase, PhaseClock, StepKind, StepProfile};

/// The weights' precision, as an actor's config names it (`dtype`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WeightDtype {
    /// A GGUF file's quantised blocks on the CPU (our kernels); on a GPU bf16 from compute
    /// capability 8.0 (Ampere) and f16 before it (a T4 has no bf16); a safetensors
    /// checkpoint in f32 on the CPU.
    #[default]
    Auto,
    /// A GGUF file's blocks as they are, on any device.
    Quantised,
    /// 32-bit floats.
    F32,
    /// 16-bit floats.
    F16,
    /// bfloat16.
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
            Self::Auto if device.is_cuda() => Some(gpu_dtype(compute_capability(device))),
            Self::Auto | Self::F32 => Some(DType::F32),
            Self::Quantised => None,
            Self::F16 => Some(DType::F16),
            Self::Bf16 => Some(DType::BF16),
        }
    }
}

/// What `auto` runs on a GPU of this compute capability: bf16 where the tensor cores have it
/// (8.0 on), f16 before (7.x: T4, V100), which has the same speed there and the range a
/// small model's activations need; f32 never, at a fraction of the speed.
pub fn gpu_dtype(capability: Option<(u32, u32)>) -> DType {
    match capability {
        Some((major, _)) if major < 8 => DType::F16,
        _ => DType::BF16,
    }
}

/// The forward pass a model runs on.
enum Engine {
    /// Quantised weights on our CPU kernels (`llama.rs`).
    Quantised(QuantisedLlama),
    /// Tensors on a candle device (`dense.rs`).
    Dense(DenseLlama),
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

    /// The caches of `slots` sequences; a dense cache's pool of at most `kv_blocks`
    /// blocks where given (every slot's whole context otherwise).
    fn cache(&self, slots: usize, kv_blocks: Option<usize>, graphs: bool) -> Cache {
        match self {
            Self::Quantised(model) => Cache::Quantised(
                KvArena::new(model.config.layers, model.config.kv_dim(), slots),
                Box::default(),
            ),
            Self::Dense(model) => Cache::Dense(
                Box::new(match kv_blocks {
                    Some(limit) => DenseKv::with_limit(model, slots, limit),
                    None => DenseKv::new(model, slots),
                }),
                match graphs {
                    true => DecodeGraphs::new(&model.device),
                    false => DecodeGraphs::off(),
                },
            ),
        }
    }

    fn device(&self) -> &Device {
        match self {
            Self::Quantised(_) => &Device::Cpu,
            Self::Dense(model) => &model.device,
        }
    }

    fn forward(
        &self,
        rows: &[Row],
        cache: &mut Cache,
        clock: &mut PhaseClock,
    ) -> Result<Vec<NextToken>, ModelError> {
        match (self, cache) {
            (Self::Quantised(model), Cache::Quantised(kv, buffers)) => {
                let logits = model.forward(rows, kv, buffers)?;
                clock.lap(Phase::Forward).map_err(ModelError::from_candle)?;
                Ok(logits.into_iter().map(NextToken::Logits).collect())
            }
            (Self::Dense(model), Cache::Dense(kv, graphs)) => {
                graphs.forward(model, rows, kv, clock)
            }
            _ => unreachable!("a cache comes from its own engine"),
        }
    }
}

/// A generation model, loaded once.
pub struct GenerateModel {
    engine: Engine,
    format: PromptFormat,
    /// Built on the first request with a grammar (it precomputes over the vocabulary).
    grammar: std::sync::OnceLock<Result<GrammarEngine, String>>,
    /// Where [`GenerateModel::generate`]'s steps spend their time, when asked
    /// ([`GenerateModel::profile_steps`]).
    profile: Option<std::sync::Arc<StepProfile>>,
    /// Whether decode steps may replay CUDA graphs ([`decode_graph`]; on a GPU only).
    decode_graphs: bool,
    /// The paged cache between `generate` calls, with its computed prefixes.
    kept: KeptCache,
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
        let (mut file, content) = decoder::read_gguf(path)?;
        let vocab = Vocab::from_metadata(&content.metadata)?;
        let arch = LlamaConfig::architecture(&content.metadata);
        let our_kernels = device.is_cpu()
            && matches!(dtype, WeightDtype::Auto | WeightDtype::Quantised)
            && QUANTISED_ARCHITECTURES.contains(&arch.as_str())
            && !content.tensor_infos.contains_key("rope_freqs.weight");
        let engine = if our_kernels {
            drop(file);
            Engine::Quantised(QuantisedLlama::load(path)?.0)
        } else {
            let mut config = LlamaConfig::from_metadata(&content.metadata)?;
            gguf_shapes::check_tensor_shapes(&content, &config)?;
            config.rope_freq_factors = checkpoint::gguf_rope_factors(&content, &mut file)?;
            // `None`: the file's blocks stay quantised, activations in f32. On the CPU,
            // `auto` for a file our kernels do not take means f32.
            let dense_dtype = dtype.dense(device);
            let activations = dense_dtype.unwrap_or(DType::F32);
            crate::device::check_dtype(device, activations)?;
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
        crate::device::check_dtype(device, dtype)?;
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
        Ok(Self {
            engine,
            format: PromptFormat::new(vocab)?,
            grammar: std::sync::OnceLock::new(),
            profile: None,
            decode_graphs: true,
            kept: KeptCache::default(),
        })
    }

    /// The grammar engine for this model's vocabulary, built once.
    fn grammar_engine(&self) -> Result<&GrammarEngine, ModelError> {
        self.grammar
            .get_or_init(|| GrammarEngine::new(&self.format).map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| ModelError::Task(e.clone()))
    }

    /// A fresh constraint for `grammar`: checks a schema before any sequence runs.
    pub fn constraint(&self, grammar: &OutputGrammar) -> Result<Constraint, ModelError> {
        self.grammar_engine()?.constraint(grammar)
    }

    /// How prompts become this model's tokens, and tokens text.
    pub fn format(&self) -> &PromptFormat {
        &self.format
    }

    /// The model's shape.
    pub fn config(&self) -> &LlamaConfig {
        self.engine.config()
    }

    /// Whether the KV cache is paged (the dense engine): it can then hold fewer positions
    /// than every sequence's whole context ([`StepLimits::with_kv_blocks`]), sequences
    /// waiting for blocks. The quantised CPU engine keeps a whole context per slot.
    pub fn paged_kv(&self) -> bool {
        matches!(self.engine, Engine::Dense(_))
    }

    /// The bytes the dense engine's weights hold on its device (a GPU actor's memory
    /// plan subtracts them from its share); 0 for the quantised CPU engine, whose budget is
    /// the node's RAM.
    pub fn weight_bytes(&self) -> u64 {
        match &self.engine {
            Engine::Quantised(_) => 0,
            Engine::Dense(model) => model.weight_bytes(),
        }
    }

    /// Bytes of KV cache a position takes: keys and values of every layer.
    pub fn kv_bytes_per_token(&self) -> u64 {
        let element = match &self.engine {
            // The CPU kernels' cache is f16.
            Engine::Quantised(_) => 2,
            Engine::Dense(model) => model.dtype.size_in_bytes() as u64,
        };
        let c = self.config();
        2 * c.layers as u64 * c.kv_dim() as u64 * element
    }

    /// Drops the KV cache kept between [`GenerateModel::generate`] calls (the paged
    /// engine's: blocks computed for earlier prompts, which later ones with the same start
    /// take instead of computing them), giving its memory back.
    pub fn forget_cached_prefixes(&self) {
        self.kept.clear();
    }

    /// How many CUDA graphs the kept cache captured and how many decode steps it replayed
    /// from them ([`decode_graph`]), over its life: `None` where no paged cache is kept.
    pub fn decode_graph_counts(&self) -> Option<decode_graph::GraphCounts> {
        self.kept.graph_counts()
    }

    /// Records where the steps of every later [`GenerateModel::generate`] call spend their
    /// time into `profile` ([`step_profile`]); `None` stops recording.
    pub fn profile_steps(&mut self, profile: Option<std::sync::Arc<StepProfile>>) {
        self.profile = profile;
    }

    /// Whether decode steps on a GPU replay CUDA graphs ([`decode_graph`]; the default) or
    /// always run eagerly (vLLM's `enforce_eager`: slower, for a driver that misbehaves
    /// under graphs). Drops the kept cache, whose graphs were made under the old setting.
    pub fn use_decode_graphs(&mut self, on: bool) {
        if self.decode_graphs != on {
            self.decode_graphs = on;
            self.kept.clear();
        }
    }

    /// Which forward pass runs, in words: the quantised CPU kernels, or the dense path's
    /// weights and device, and on a GPU its attention kernel (`bf16 weights on cuda,
    /// attention on tensor cores`).
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
                match (model.device.is_cuda(), model.attention) {
                    (true, AttentionKernel::TensorCores) => {
                        format!("{weights} weights on {device}, attention on tensor cores")
                    }
                    (true, AttentionKernel::Scalar) => {
                        format!("{weights} weights on {device}, scalar attention")
                    }
                    (false, _) => format!("{weights} weights on {device}"),
                }
            }
        }
    }

    /// The GPU attention kernel a step runs: `None` on the CPU (which runs the reference).
    pub fn attention_kernel(&self) -> Option<AttentionKernel> {
        match &self.engine {
            Engine::Dense(model) if model.device.is_cuda() => Some(model.attention),
            _ => None,
        }
    }

    /// Which GPU kernel the dense engine's attention runs: `kernel`, or where `None`
    /// [`AttentionKernel::best`] for the model's device, dtype and head size (the default).
    /// The scalar kernel compares the two, or serves where the tensor-core one misbehaves.
    /// Refused on a GPU where the kernel does not take the model's dtype and head size; on
    /// the CPU, which runs its reference attention, accepted and changes nothing. Drops the
    /// kept cache when the kernel changes (its CUDA graphs launch the old one).
    pub fn use_attention_kernel(
        &mut self,
        kernel: Option<AttentionKernel>,
    ) -> Result<(), ModelError> {
        let Engine::Dense(model) = &mut self.engine else {
            return Ok(());
        };
        if !model.device.is_cuda() {
            return Ok(());
        }
        let (dtype, head_dim) = (model.dtype, model.config.head_dim);
        if kernel.is_some_and(|k| !k.takes(dtype, head_dim) || !k.runs_on(&model.device, dtype)) {
            return Err(ModelError::InvalidConfig(format!(
                "the tensor-core attention kernel takes f16 heads of 32, 64 or 128, and bf16 \
                 ones from compute capability 8.0, and this model has {dtype:?} heads of \
                 {head_dim}: use the scalar kernel"
            )));
        }
        let shape = attention_check::HeadShape::of(&model.config);
        let kernel = attention_check::checked_kernel(&model.device, dtype, shape, kernel)?;
        if model.attention != kernel {
            model.attention = kernel;
            self.kept.clear();
        }
        Ok(())
    }

    /// The context length in tokens: the model's, or less after [`Self::limit_context`].
    pub fn context(&self) -> usize {
        self.config().context
    }

    /// Renders conversations with the chat template `source` in place of the model's own
    /// ([`PromptFormat::use_chat_template`]).
    pub fn use_chat_template(&mut self, source: &str) -> Result<(), ModelError> {
        self.format.use_chat_template(source)
    }

    /// Renders conversations with `kwargs` as the chat template's variables
    /// ([`PromptFormat::use_chat_template_kwargs`]).
    pub fn use_chat_template_kwargs(
        &mut self,
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<(), ModelError> {
        self.format.use_chat_template_kwargs(kwargs)
    }

    /// Caps the context at `tokens` (when below the model's): prompts are cut to fit it and
    /// generation stops at it, which bounds each sequence's KV cache.
    pub fn limit_context(&mut self, tokens: usize) {
        let config = self.engine.config_mut();
        config.context = config.context.min(tokens.max(2));
    }

    /// The prompt's tokens for `text` (as one user turn with the chat template).
    pub fn prompt_tokens(
        &self,
        text: &str,
        template: PromptTemplate,
    ) -> Result<Vec<u32>, ModelError> {
        let rendered = self
            .format
            .render(&Prompt::parts("", text, ""), template, None)?;
        self.format.tokens(&rendered, template)
    }

    /// The prompt `before + text + after`, fitted as [`Self::fit`] fits it.
    pub fn fit_prompt(
        &self,
        (before, text, after): (&str, &str, &str),
        template: PromptTemplate,
        reserve: usize,
    ) -> Result<(Vec<u32>, bool), ModelError> {
        self.fit(&Prompt::parts(before, text, after), template, reserve)
    }

    /// The prompt's tokens, leaving at least `reserve` tokens of the context for the
    /// answer ([`PromptFormat::fit`]: the record's text is cut from its middle when it
    /// would not). Returns the tokens and whether the text was cut.
    pub fn fit(
        &self,
        prompt: &Prompt,
        template: PromptTemplate,
        reserve: usize,
    ) -> Result<(Vec<u32>, bool), ModelError> {
        self.format.fit(prompt, template, self.context(), reserve)
    }

    /// The logits of the token after `prompt` (one prefill, on a fresh cache): for checks
    /// against other implementations.
    pub fn next_token_logits(&self, prompt: &[u32]) -> Result<Vec<f32>, ModelError> {
        let mut kv = self.engine.cache(1, None, false);
        let rows: Vec<Row> = prompt
            .iter()
            .enumerate()
            .map(|(pos, &token)| Row {
                slot: 0,
                pos,
                token,
                logits: pos + 1 == prompt.len(),
                pick: Pick::Logits,
            })
            .collect();
        let mut clock = PhaseClock::off(self.engine.device());
        match self.engine.forward(&rows, &mut kv, &mut clock)?.pop() {
            Some(NextToken::Logits(logits)) => Ok(logits),
            Some(NextToken::Chosen(_) | NextToken::Listed { .. }) => {
                unreachable!("the row asked for its logits")
            }
            None => Err(ModelError::Task("an empty prompt has no next token".into())),
        }
    }

    /// The text of `tokens`, special tokens left out.
    pub fn decode(&self, tokens: &[u32]) -> Result<String, ModelError> {
        self.format.decode(tokens)
    }

    /// Completes every request with continuous batching; `on_token` hears of each token
    /// generated. Results come in request order.
    pub fn generate(
        &self,
        requests: &[GenerationRequest],
        limits: StepLimits,
        on_token: &mut dyn FnMut(),
    ) -> Result<Vec<Generation>, ModelError> {
        let mut feed = OneGroup::new(requests.to_vec(), on_token);
        self.generate_fed(limits, &mut feed)?;
        Ok(feed.answer.expect("the one group finished"))
    }

    /// Completes the requests `feed` gives, group after group, in one continuous batch
    /// ([`running`]): the next group is taken as soon as every request taken before has a
    /// cache slot, and each group's answers go back when its last sequence ends. Returns
    /// once nothing is in flight and the feed has nothing at hand. On an error, the groups
    /// not yet answered never will be (the caller runs them again).
    ///
    /// Each step admits waiting requests into free cache slots, runs one forward over the
    /// planned rows (prefill spans and decode tokens), then picks each sequence's next token
    /// and retires the finished ones.
    pub fn generate_fed(
        &self,
        limits: StepLimits,
        feed: &mut dyn GenerationFeed,
    ) -> Result<(), ModelError> {
        let mut batch = Batch::new(limits.max_sequences);
        let made_for = (limits.max_sequences, limits.kv_blocks);
        let mut kv = match self.kept.take(made_for) {
            Some(kept) => kept,
            None => self
                .engine
                .cache(limits.max_sequences, limits.kv_blocks, self.decode_graphs),
        };
        loop {
            let took = batch.take_from(feed);
            self.admit(&mut batch, &mut kv, feed)?;
            if batch.flight.is_empty() {
                // Every request taken was answered without a slot (empty or too long):
                // ask again while the feed had something.
                match took {
                    true => continue,
                    false => break,
                }
            }
            let spans = reserve_step(&mut batch, &mut kv, limits, self.profile.as_deref())?;
            // Decode-only: every sequence in flight has one token left to run.
            let kind = match batch.flight.iter().all(|f| f.tokens.len() - f.cached <= 1) {
                true => StepKind::Decode,
                false => StepKind::WithPrefill,
            };
            let mut clock = match &self.profile {
                Some(profile) => profile.clock(kind, self.engine.device()),
                None => PhaseClock::off(self.engine.device()),
            };
            let rows = self.step_rows(&spans, &mut batch);
            if let Some(profile) = &self.profile {
                profile.count_step(kind, rows.len());
            }
            let logits = self.engine.forward(&rows, &mut kv, &mut clock)?;
            self.take_tokens(&spans, logits, (&mut batch, &mut kv), feed)?;
            clock
                .lap(Phase::SampleAndStop)
                .map_err(ModelError::from_candle)?;
        }
        // Every sequence ended and gave its blocks back; the computed ones stay cached.
        self.kept.keep(made_for, kv);
        Ok(())
    }

    /// The forward's rows for the planned `spans`: each span's tokens at their positions,
    /// logits asked for on a span's last row when it needs them, with what is wanted of them,
    /// and on each row before a prompt token the request scores.
    fn step_rows(&self, spans: &[Span], batch: &mut Batch) -> Vec<Row> {
        let mut rows = Vec::new();
        for span in spans {
            let seq = &mut batch.flight[span.seq];
            let request = batch.requests.get(seq.request);
            let pick = match span.logits {
                true => self.pick(seq, request),
                false => Pick::Logits,
            };
            let (scoring, done) = (request.score, seq.scored.len());
            rows.extend((span.start..span.end).map(|pos| {
                let last = span.logits && pos + 1 == span.end;
                let scores = PromptScoring::wants_row(scoring, done, pos);
                Row {
                    slot: seq.slot,
                    pos,
                    token: seq.tokens[pos],
                    logits: last || scores,
                    pick: match (last, scoring) {
                        (true, _) => pick,
                        // The engine scores (and lists top tokens) where the logits are.
                        (false, Some(s)) if scores => Pick::Score {
                            target: seq.tokens[pos + 1],
                            top: s.top,
                        },
                        (false, _) => Pick::Logits,
                    },
                }
            }));
        }
        rows
    }

    /// After a forward: advances each span's cache, picks the next token of every sequence
    /// that got logits (or the engine's greedy pick), and frees the slots of those finished,
    /// handing each finished group's answers to `feed`.
    fn take_tokens(
        &self,
        spans: &[Span],
        logits: Vec<NextToken>,
        (batch, kv): (&mut Batch, &mut Cache),
        feed: &mut dyn GenerationFeed,
    ) -> Result<(), ModelError> {
        let mut logits = logits.into_iter();
        let mut finished = Vec::new();
        for span in spans {
            let seq = &mut batch.flight[span.seq];
            seq.cached = span.end;
            let (slot, tokens) = (seq.slot, &seq.tokens[..]);
            kv.computed(SeqKv { slot, tokens }, span.end);
            let request = batch.requests.get(seq.request);
            score_prompt(seq, request.score, span, &mut logits);
            if !span.logits {
                continue;
            }
            if request.max_new_tokens == 0 {
                // Scoring alone: the prompt is computed, nothing is generated.
                logits.next().expect("one per span with logits");
                finished.push((span.seq, finish(seq, FinishReason::Length, String::new())));
                continue;
            }
            let next = match logits.next().expect("one per span with logits") {
                NextToken::Logits(logits) => self.sample(seq, request, &logits)?,
                NextToken::Chosen(next) => {
                    seq.sampler.took(next);
                    next
                }
                // A request that lists logprobs, its token chosen where the logits are.
                NextToken::Listed { logprob, .. } => {
                    let next = logprob.token;
                    seq.sampler.took(next);
                    seq.logprobs.push(logprob);
                    next
                }
            };
            feed.token(batch.requests.group_of(seq.request));
            if let Some(done) = self.after_token(seq, next, request)? {
                finished.push((span.seq, done));
            }
        }
        finished.sort_unstable_by_key(|(index, _)| std::cmp::Reverse(*index));
        for (index, done) in finished {
            let seq = batch.flight.remove(index);
            kv.release(seq.slot);
            batch.free_slots.push(seq.slot);
            batch.answer(seq.request, done, feed);
        }
        Ok(())
    }

    /// Draws `seq`'s next token from `logits`: stop tokens held back until `min_tokens`,
    /// only what the grammar allows, the token's logprobs kept when asked.
    fn sample(
        &self,
        seq: &mut InFlight,
        request: &GenerationRequest,
        logits: &[f32],
    ) -> Result<u32, ModelError> {
        let generated = seq.tokens.len() - seq.prompt_len;
        // Under a grammar, the grammar alone says when the text may end; while the model
        // thinks before it holds, nothing is masked.
        let constraint = seq.constraint.as_mut().filter(|_| seq.thinking.is_none());
        let suppressed = match generated < request.min_tokens && constraint.is_none() {
            true => self.stop_tokens(request),
            false => Vec::new(),
        };
        let mask = match constraint {
            Some(constraint) => Some(constraint.allowed()?),
            None => None,
        };
        let allowed = mask
            .as_ref()
            .map(|mask| move |token: u32| grammar::allows(mask, token));
        let next = seq.sampler.next(
            logits,
            &suppressed,
            allowed.as_ref().map(|f| f as &dyn Fn(u32) -> bool),
        );
        if let Some(constraint) = &mut seq.constraint
            && seq.thinking.is_none()
            && !constraint.is_finished()
        {
            constraint.accept(next)?;
        }
        if let Some(top) = request.logprobs {
            seq.logprobs
                .push(sampling::token_logprob(logits, next, top));
        }
        Ok(next)
    }

    /// What `seq`'s next token wants of its logits: the argmax or a draw where the logits
    /// are when nothing else needs them (no penalties, no tokens suppressed (`min_tokens`
    /// reached, or nothing to suppress), no grammar), with its logprobs listed there too
    /// when the request asks for them; else the logits.
    fn pick(&self, seq: &mut InFlight, request: &GenerationRequest) -> Pick {
        let generated = seq.tokens.len() - seq.prompt_len;
        let device_may_choose = !seq.sampler.penalises()
            && (seq.constraint.is_none() || seq.thinking.is_some())
            && (generated >= request.min_tokens || self.stop_tokens(request).is_empty());
        if !device_may_choose {
            return Pick::Logits;
        }
        match (seq.sampler.device_draw(), request.logprobs) {
            (None, None) => Pick::Greedy,
            (Some(draw), None) => Pick::Draw(draw),
            (draw, Some(top)) => Pick::Listed { draw, top },
        }
    }

    /// The tokens that end `request`'s sequences: the model's end tokens (unless
    /// `ignore_eos`) and the request's stop token ids.
    fn stop_tokens(&self, request: &GenerationRequest) -> Vec<u32> {
        let ends = match request.ignore_eos {
            true => &[][..],
            false => &self.format.vocab.end_tokens[..],
        };
        ends.iter()
            .chain(&request.stop_token_ids)
            .copied()
            .collect()
    }

    /// Appends `next` to the sequence; its result if that ends it.
    fn after_token(
        &self,
        seq: &mut InFlight,
        next: u32,
        request: &GenerationRequest,
    ) -> Result<Option<Generation>, ModelError> {
        let ends = !request.ignore_eos && self.format.vocab.end_tokens.contains(&next);
        if ends || request.stop_token_ids.contains(&next) {
            let text = self.decode(&seq.tokens[seq.prompt_len..])?;
            return Ok(Some(finish(seq, FinishReason::Stop, text)));
        }
        seq.tokens.push(next);
        self.watch_thinking(seq, next)?;
        let generated = seq.tokens.len() - seq.prompt_len;
        // The whole completion is decoded only where a stop string shows in the text of its
        // last tokens (`stop_window`): decoding it every step was quadratic in its length.
        if !request.stop.is_empty()
            && generated >= request.min_tokens
            && stop_window::stop_may_end_here(
                &seq.tokens[seq.prompt_len..],
                &request.stop,
                &self.format.token_text(next)?,
                |t| self.decode(t),
            )?
        {
            let text = self.decode(&seq.tokens[seq.prompt_len..])?;
            // A stop string counts from the `min_tokens`-th token's text on.
            let floor = match request.min_tokens {
                0 | 1 => 0,
                min => {
                    let start = seq.prompt_len;
                    let before = self.decode(&seq.tokens[start..start + min - 1])?;
                    Some(before.len())
                        .filter(|&at| text.is_char_boundary(at))
                        .unwrap_or(0)
                }
            };
            let cut = request
                .stop
                .iter()
                .filter_map(|s| text[floor..].find(s.as_str()).map(|at| floor + at))
                .min();
            if let Some(cut) = cut {
                return Ok(Some(finish(
                    seq,
                    FinishReason::Stop,
                    text[..cut].to_owned(),
                )));
            }
        }
        if seq.constraint.as_ref().is_some_and(Constraint::is_finished) {
            let text = self.decode(&seq.tokens[seq.prompt_len..])?;
            return Ok(Some(finish(seq, FinishReason::Stop, text)));
        }
        if generated >= request.max_new_tokens || seq.tokens.len() >= self.context() {
            let text = self.decode(&seq.tokens[seq.prompt_len..])?;
            return Ok(Some(finish(seq, FinishReason::Length, text)));
        }
        Ok(None)
    }

    /// While `seq` thinks before its grammar holds: whether `next` ends the thinking, and
    /// then the grammar takes what the tag's token wrote after it, as far as it allows.
    fn watch_thinking(&self, seq: &mut InFlight, next: u32) -> Result<(), ModelError> {
        let Some(watch) = &mut seq.thinking else {
            return Ok(());
        };
        let Some(after) = watch.see(&self.format.token_text(next)?) else {
            return Ok(());
        };
        seq.thinking = None;
        let Some(constraint) = &mut seq.constraint else {
            return Ok(());
        };
        // Only a tag split over tokens (a vocabulary without `</think>` as one) leaves text
        // after it; what of it the grammar refuses stays in the text, unconstrained.
        for token in self.format.encode(&after)? {
            let allowed = constraint.allowed()?;
            if constraint.is_finished() || !grammar::allows(&allowed, token) {
                break;
            }
            constraint.accept(token)?;
        }
        Ok(())
    }

    fn too_long_or_empty(&self, request: &GenerationRequest) -> Generation {
        Generation {
            text: String::new(),
            tokens: Vec::new(),
            prompt_tokens: request.prompt.len(),
            finish_reason: FinishReason::Length,
            logprobs: Vec::new(),
            prompt_logprobs: Vec::new(),
            prompt_greedy: true,
        }
    }
}

/// `seq`'s answer, ending for `reason` with `text`.
fn finish(seq: &mut InFlight, reason: FinishReason, text: String) -> Generation {
    Generation {
        text,
        tokens: seq.tokens[seq.prompt_len..].to_vec(),
        prompt_tokens: seq.prompt_len,
        finish_reason: reason,
        logprobs: std::mem::take(&mut seq.logprobs),
        prompt_logprobs: std::mem::take(&mut seq.scored),
        prompt_greedy: seq.scored_greedy,
    }
}

/// Takes the logits of `span`'s rows that score a prompt token ([`Self::step_rows`] asked
/// for them, in position order): each scored token's log-probability, and whether it was
/// the likeliest there.
fn score_prompt(
    seq: &mut InFlight,
    scoring: Option<PromptScoring>,
    span: &Span,
    logits: &mut impl Iterator<Item = NextToken>,
) {
    let Some(top) = scoring.map(|s| s.top) else {
        return;
    };
    let done = seq.scored.len();
    for pos in span.start..span.end {
        if !PromptScoring::wants_row(scoring, done, pos) {
            continue;
        }
        let token = seq.tokens[pos + 1];
        match logits.next().expect("one per scoring row") {
            NextToken::Logits(row) => {
                seq.scored_greedy &= draw::argmax(&row) == token;
                seq.scored.push(sampling::token_logprob(&row, token, top));
            }
            NextToken::Listed { logprob, greedy } => {
                debug_assert_eq!(logprob.token, token);
                seq.scored_greedy &= greedy;
                seq.scored.push(logprob);
            }
            NextToken::Chosen(_) => unreachable!("a scoring row asks for its score or logits"),
        }
    }
}

/// Plans the next step and reserves its KV blocks. While the cache is full, the sequence in
/// flight admitted last is preempted: its blocks are freed and it waits, with what it
/// generated, to be computed again (vLLM's recompute preemption). One sequence alone that
/// does not fit is out of memory.
fn reserve_step(
    batch: &mut Batch,
    kv: &mut Cache,
    limits: StepLimits,
    profile: Option<&StepProfile>,
) -> Result<Vec<Span>, ModelError> {
    loop {
        let progress: Vec<SeqProgress> = batch
            .flight
            .iter()
            .map(|f| SeqProgress {
                tokens: f.tokens.len(),
                cached: f.cached,
            })
            .collect();
        let spans = plan_step(&progress, limits);
        let seqs: Vec<SeqKv<'_>> = batch
            .flight
            .iter()
            .map(|f| SeqKv {
                slot: f.slot,
                tokens: &f.tokens,
            })
            .collect();
        match kv.reserve(&spans, &seqs) {
            Ok(()) => return Ok(spans),
            Err(ReserveError::OutOfBlocks(_)) if batch.flight.len() > 1 => {
                let mut seq = batch.flight.pop().expect("more than one in flight");
                kv.release(seq.slot);
                batch.free_slots.push(seq.slot);
                seq.cached = 0;
                batch.preempted.push(seq);
                if let Some(profile) = profile {
                    profile.count_preemption();
                }
            }
            Err(ReserveError::OutOfBlocks(full)) => {
                return Err(ModelError::OutOfMemory(full.to_string()));
            }
            Err(ReserveError::Device(error)) => return Err(ModelError::from_candle(error)),
        }
    }
}

#[cfg(test)]
mod dense_tests;
#[cfg(test)]
mod score_tests;
#[cfg(test)]
mod tests;
