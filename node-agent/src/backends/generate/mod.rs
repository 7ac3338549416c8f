//! `generate@1`: the typed actor kind around [`resident_models::generate::GenerateModel`].
//! The model loads once per actor and stays resident with its KV arena; its tasks run in
//! one continuous batch (`batch.rs`: the next task joins while the last one runs), each
//! reporting progress in generated tokens. `prompts.rs` plans each task's prompts and turns
//! the generations into its completions. The contract (config, request, response) is
//! [`resident_actor::generate`].

mod batch;
mod prompts;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use resident_actor::generate::{Generate, GenerateConfig, GenerateRequest};
use resident_models::device::select_device;
use resident_models::generate::batcher::StepLimits;
use resident_models::generate::kv_blocks::BLOCK_SIZE;
use resident_models::generate::{self as engine, GenerateModel, WeightDtype};
use resident_models::roots::{
    FileRoots, MAX_MODEL_JSON_BYTES, MAX_TOKENIZER_BYTES, MAX_WEIGHTS_BYTES,
};

pub use prompts::{
    chat_messages, context_reading, model_prompt, response_format_problem, score_window,
    scored_choices, scored_text,
};

use super::typed::{Reply, RequestFeed, TypedActor};
use super::{BackendError, LoadContext, TaskProgress};

/// The `generate` kind's actor: a GGUF or safetensors decoder loaded once, completing
/// batches of prompts with continuous batching.
pub struct GenerateActor {
    model: GenerateModel,
    /// The actor's own compute threads on the CPU (`None` on a GPU): every core by default,
    /// whatever the process's one-thread-per-operation setting for encoders
    /// (`--compute-threads`) says, since a node runs one generation actor.
    threads: Option<Arc<rayon::ThreadPool>>,
    limits: StepLimits,
    progress: TaskProgress,
    _model_in_use: Option<crate::model_cache::eviction::ModelInUse>,
}

/// What to load from `path`: a GGUF file, the one `.gguf` file in the directory `path`, or
/// the directory itself when it is a safetensors checkpoint (it has a `config.json`).
fn model_file(path: &Path) -> Result<PathBuf, BackendError> {
    if !path.is_dir() || engine::checkpoint::is_safetensors_dir(path) {
        return Ok(path.to_owned());
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(|e| BackendError::InvalidConfig(format!("{}: {e}", path.display())))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|ext| ext == "gguf"))
        .collect();
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(BackendError::InvalidConfig(format!(
            "{} holds no .gguf file and no config.json; give a GGUF file or a safetensors \
             checkpoint",
            path.display()
        ))),
        _ => Err(BackendError::InvalidConfig(format!(
            "{} holds {} .gguf files; name the one to load",
            path.display(),
            found.len()
        ))),
    }
}

/// Every file a checkpoint directory holds (or the one GGUF file) must resolve inside the
/// agent's model roots (symlinks followed) and stay within its size limit: the loader
/// reads `config.json`, the tokenizer and the weights by name, so a symlink planted in a
/// directory inside the roots must not lead it elsewhere.
fn check_model_files(roots: &FileRoots, file: &Path) -> Result<(), BackendError> {
    if !file.is_dir() {
        roots.check_model_file(file, MAX_WEIGHTS_BYTES)?;
        return Ok(());
    }
    let entries = std::fs::read_dir(file)
        .map_err(|e| BackendError::InvalidConfig(format!("{}: {e}", file.display())))?;
    for entry in entries.filter_map(Result::ok) {
        let path = entry.path();
        if path.is_dir() {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        let limit = match name.as_str() {
            "tokenizer.json" => MAX_TOKENIZER_BYTES,
            _ if name.ends_with(".json") => MAX_MODEL_JSON_BYTES,
            _ => MAX_WEIGHTS_BYTES,
        };
        roots.check_model_file(&path, limit)?;
    }
    Ok(())
}

/// How a generate actor's KV cache fits its memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum KvPlan {
    /// Every sequence's whole context fits.
    Full,
    /// A paged cache of this many blocks: fewer positions than every sequence's whole
    /// context, so sequences wait for blocks and the newest is preempted when they run out.
    Blocks(usize),
}

/// Plans the KV cache from the actor's memory (the node's RAM on the CPU; on a GPU nine
/// tenths of its VRAM share less its weights, or of what the loaded model left free when the
/// actor holds the whole GPU, as a job's default actors do). `max_sequences` slots of the
/// whole context each fit, or a paged cache holds what the budget allows if that is at
/// least one whole context; otherwise the config is refused, saying what to lower. An
/// allocation that fails mid-run aborts the agent; a refusal at load does not.
fn plan_kv(
    model: &GenerateModel,
    max_sequences: u32,
    device: &crate::backends::DeviceAssignment,
    gpu_free_bytes: Option<u64>,
) -> Result<KvPlan, BackendError> {
    let (budget, what) = kv_budget(device, gpu_free_bytes, model.weight_bytes());
    let shape = KvShape {
        per_token: model.kv_bytes_per_token(),
        context: model.context() as u64,
        layers: model.config().layers,
        paged: model.paged_kv(),
    };
    shape
        .plan(max_sequences, budget, what)
        .map_err(BackendError::InvalidConfig)
}

/// What [`plan_kv`] needs of the model (pure, for tests).
struct KvShape {
    per_token: u64,
    context: u64,
    layers: usize,
    paged: bool,
}

impl KvShape {
    fn plan(&self, max_sequences: u32, budget: u64, what: &str) -> Result<KvPlan, String> {
        let one = self.per_token.checked_mul(self.context);
        let full = one.and_then(|v| v.checked_mul(u64::from(max_sequences)));
        let gib = |bytes: u64| format!("{:.1} GiB", bytes as f64 / f64::from(1u32 << 30));
        match (full, one) {
            (Some(bytes), _) if bytes <= budget => Ok(KvPlan::Full),
            (_, Some(one)) if self.paged && one <= budget => {
                let block = self.per_token * BLOCK_SIZE as u64;
                Ok(KvPlan::Blocks((budget / block) as usize))
            }
            _ => Err(format!(
                "a full KV cache ({max_sequences} sequences x {} tokens x {} layers) needs {}; \
                 {what} is {}: lower `max_sequences` or `max_context`",
                self.context,
                self.layers,
                full.map_or("more than 16 EiB".to_owned(), gib),
                gib(budget),
            )),
        }
    }
}

/// The memory a generate actor's KV cache may fill, and how to name it in a refusal: on a
/// GPU a tenth is left to the steps' activations and CUDA graphs, and a share of the GPU
/// holds the weights (`weight_bytes`) too.
fn kv_budget(
    device: &crate::backends::DeviceAssignment,
    gpu_free_bytes: Option<u64>,
    weight_bytes: u64,
) -> (u64, &'static str) {
    match (device.real_gpu(), gpu_free_bytes) {
        (Some(_), Some(free)) if device.gpu_fraction >= 1.0 => (
            free / 10 * 9,
            "nine tenths of its GPU's free memory (the actor holds the whole GPU)",
        ),
        (Some(_), _) if device.vram_bytes > 0 => (
            device.vram_bytes.saturating_sub(weight_bytes) / 10 * 9,
            "nine tenths of the actor's VRAM (`vram_gib`) less its weights",
        ),
        _ => (
            resident_proto::host::total_ram_bytes().unwrap_or(u64::MAX),
            "this node's RAM",
        ),
    }
}

/// A thread pool of `threads` (every core when `None`) for the actor's forward steps.
fn compute_threads(threads: Option<u32>) -> Result<rayon::ThreadPool, BackendError> {
    let count = match threads {
        Some(0) => {
            return Err(BackendError::InvalidConfig(
                "`threads` must be at least 1 (absent: every core)".into(),
            ));
        }
        Some(count) => count as usize,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    rayon::ThreadPoolBuilder::new()
        .num_threads(count)
        .thread_name(|i| format!("generate-{i}"))
        .build()
        .map_err(|e| BackendError::Load(format!("cannot start {count} compute threads: {e}")))
}

impl TypedActor for GenerateActor {
    type Kind = Generate;

    fn load(config: GenerateConfig, context: &LoadContext) -> Result<Self, BackendError> {
        if config.model.is_empty() {
            return Err(BackendError::InvalidConfig(
                "the generate kind needs `model`: a GGUF file or a safetensors directory".into(),
            ));
        }
        let local = context
            .models
            .local_dir(&config.model, config.model_revision.as_deref())?;
        let checked = context.roots.check_model_path(Path::new(&local))?;
        let device = select_device(context.device.real_gpu())?;
        let threads = match device.is_cpu() {
            true => Some(Arc::new(compute_threads(config.threads)?)),
            false => None,
        };
        let dtype = WeightDtype::parse(config.dtype.as_deref())?;
        let file = model_file(&checked)?;
        check_model_files(&context.roots, &file)?;
        let mut model = GenerateModel::load_on(&file, &device, dtype)?;
        model.use_decode_graphs(!config.enforce_eager);
        model.use_attention_kernel(engine::AttentionKernel::parse(config.attention.as_deref())?)?;
        tracing::info!(engine = %model.engine_name(), "generation model loaded");
        if let Some(tokens) = config.max_context {
            model.limit_context(tokens as usize);
        }
        if let Some(source) = &config.chat_template {
            model.use_chat_template(source)?;
        }
        if let Some(kwargs) = &config.chat_template_kwargs {
            if let Some(problem) = resident_actor::generate::chat_template_kwargs_problem(kwargs) {
                return Err(BackendError::InvalidConfig(format!(
                    "chat_template_kwargs {problem}"
                )));
            }
            model.use_chat_template_kwargs(kwargs)?;
        }
        // A GPU's step costs far less than in proportion to its rows: its defaults are larger.
        let on_gpu = !device.is_cpu();
        let max_sequences = config.max_sequences_on(on_gpu);
        let max_step_tokens = config.max_step_tokens_on(on_gpu);
        tracing::info!(
            max_sequences,
            max_step_tokens,
            device = if on_gpu { "GPU" } else { "CPU" },
            set = config.max_sequences.is_some() || config.max_step_tokens.is_some(),
            "step limits (the device's defaults where the config does not say)"
        );
        let gpu_free = resident_models::device::free_gpu_memory(&device);
        let mut limits = StepLimits::new(max_sequences as usize, max_step_tokens as usize);
        match plan_kv(&model, max_sequences, &context.device, gpu_free)? {
            KvPlan::Full => {}
            KvPlan::Blocks(blocks) => {
                tracing::info!(
                    blocks,
                    positions = blocks * BLOCK_SIZE,
                    max_sequences,
                    "the KV cache holds fewer positions than every sequence's whole context: \
                     sequences wait for blocks"
                );
                limits = limits.with_kv_blocks(blocks);
            }
        }
        Ok(Self {
            model,
            threads,
            limits,
            progress: context.progress.clone(),
            _model_in_use: context.models.hold(&local),
        })
    }

    fn handle(&mut self, request: GenerateRequest) -> Reply<Generate> {
        let mut one = batch::OneRequest::new(request, self.progress.clone());
        self.handle_fed(&mut one).map_err(|e| e.to_string())?;
        one.reply.expect("the one request was answered")
    }

    const TAKES_REQUESTS_WHILE_RUNNING: bool = true;

    /// Every task at hand in one continuous batch (`batch.rs`).
    fn handle_fed(&mut self, feed: &mut dyn RequestFeed<Generate>) -> Result<(), BackendError> {
        let Self {
            model,
            threads,
            limits,
            ..
        } = self;
        match threads {
            Some(threads) => threads.install(|| batch::run_tasks(model, limits, feed)),
            None => batch::run_tasks(model, limits, feed),
        }
    }
}

#[cfg(test)]
mod tests {
    use resident_actor::generate::{ChatMessage, GenerateParams, PromptParts};

    use super::*;
    use crate::backends::ActorKindRegistry;

    fn smollm2() -> String {
        format!(
            "{}/../models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf",
            env!("CARGO_MANIFEST_DIR")
        )
    }

    #[test]
    fn the_kind_is_built_in_as_generate_at_1() {
        let registry = ActorKindRegistry::with_builtin_kinds();
        assert!(
            registry.get("generate@1").is_some(),
            "{:?}",
            registry.names()
        );
    }

    #[test]
    fn an_actor_completes_a_batch_in_order_with_token_counts() {
        let config = GenerateConfig {
            model: smollm2(),
            max_sequences: Some(2),
            ..GenerateConfig::default()
        };
        let context = LoadContext::standalone("a1", Vec::new());
        let mut actor = GenerateActor::load(config, &context).unwrap();
        let request = GenerateRequest {
            prompts: vec![
                PromptParts::new(
                    "q1",
                    "Answer briefly: ",
                    "What is the capital of France?",
                    "",
                ),
                PromptParts::new("q2", "Answer briefly: ", "Name a colour.", ""),
                PromptParts::new("q3", "", "Say hello.", ""),
            ],
            params: GenerateParams {
                max_new_tokens: 16,
                ..GenerateParams::default()
            },
        };
        let response = actor.handle(request).unwrap();
        let ids: Vec<&str> = response.completions.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, ["q1", "q2", "q3"]);
        assert!(response.completions[0].text.contains("Paris"));
        for completion in &response.completions {
            assert!(completion.generated_tokens >= 1 && completion.generated_tokens <= 16);
            assert!(completion.prompt_tokens > 5);
            assert!(!completion.truncated);
        }
    }

    /// A prompt's choices are each scored after it and nothing is generated: the right one
    /// is the likeliest, and a choice scores what the same text scored after the same
    /// prompt as a record's text does; a conversation's choices are its replies. Choices
    /// that cannot be scored are refused in their record alone.
    #[test]
    fn choices_are_scored_after_their_prompt_as_texts_are() {
        let config = GenerateConfig {
            model: smollm2(),
            max_sequences: Some(4),
            ..GenerateConfig::default()
        };
        let context = LoadContext::standalone("a1", Vec::new());
        let mut actor = GenerateActor::load(config, &context).unwrap();
        let with = |prompt: PromptParts, choices: &[&str], answers: &[u32]| PromptParts {
            choices: choices.iter().map(|c| c.to_string()).collect(),
            answers: answers.to_vec(),
            ..prompt
        };
        let capital = "The capital of France is";
        let question = ChatMessage::new("user", "What is the capital of France?");
        let replies = ["The capital of France is Paris.", "It is Berlin."];
        let answered = vec![question.clone(), ChatMessage::new("assistant", "Paris.")];
        let request = GenerateRequest {
            prompts: vec![
                with(
                    PromptParts::new("mc", "", capital, ""),
                    &[" Berlin", " Paris"],
                    &[1],
                ),
                PromptParts::new("plain", capital, " Paris", ""),
                with(PromptParts::chat("chat", vec![question]), &replies, &[0]),
                with(
                    PromptParts::new("bad", "", capital, ""),
                    &[" Paris"],
                    &[0, 3],
                ),
                with(PromptParts::chat("closed", answered), &replies, &[]),
                with(
                    PromptParts::new("empty", "", capital, ""),
                    &[" Paris", ""],
                    &[],
                ),
            ],
            params: GenerateParams {
                template: resident_actor::generate::Template::None,
                max_new_tokens: 0,
                score: true,
                ..GenerateParams::default()
            },
        };
        let (request_first, scoring) = (request.prompts[0].clone(), request.params.clone());
        let unscored = GenerateRequest {
            prompts: vec![request.prompts[0].clone()],
            params: GenerateParams {
                max_new_tokens: 4,
                ..GenerateParams::default()
            },
        };
        let response = actor.handle(request).unwrap();
        let [mc, plain, chat, bad, closed, empty] = &response.completions[..] else {
            panic!("six completions: {response:?}");
        };
        let scored = mc.choice_scores.as_ref().expect("choices scored");
        assert_eq!((scored.best(), scored.correct()), (1, Some((true, true))));
        assert_eq!(scored.chars, [7, 6]);
        assert_eq!(
            (mc.generated_tokens, mc.text.as_str(), &mc.score),
            (0, "", &None)
        );
        let text = plain.score.as_ref().expect("a text record is scored");
        assert_eq!(scored.scores[1].tokens, text.tokens);
        assert!(
            (scored.scores[1].logprob - text.logprob).abs() < 1e-3,
            "{scored:?} {text:?}"
        );
        let replies = chat.choice_scores.as_ref().unwrap();
        assert_eq!(replies.best(), 0, "{replies:?}");
        assert!(replies.scores.iter().all(|s| s.tokens > 3));
        for (refused, wanted) in [
            (bad, "the answer is choice 3, and there are 1 choices"),
            (closed, "ends with the user's turn"),
            (empty, "choice 1 is empty"),
        ] {
            let error = refused.error.as_deref().unwrap_or_default();
            assert!(error.contains(wanted), "{}: {error}", refused.id);
        }
        // Choices are never generated after: without score the record is refused.
        let unscored = actor.handle(unscored).unwrap();
        let error = unscored.completions[0].error.as_deref().unwrap_or_default();
        assert!(error.contains("they need score"), "{unscored:?}");
        // Nor sampled: n above 1 is refused, not ignored.
        let sampled = GenerateRequest {
            prompts: vec![request_first],
            params: GenerateParams { n: 2, ..scoring },
        };
        let sampled = actor.handle(sampled).unwrap();
        let error = sampled.completions[0].error.as_deref().unwrap_or_default();
        assert!(error.contains("n = 2 asks for samples"), "{sampled:?}");
    }

    #[test]
    fn a_paged_cache_holds_what_the_budget_allows_and_a_slot_cache_must_fit_whole() {
        // SmolLM2-135M in bf16: 30 layers x 2 x 192 x 2 bytes a position.
        let shape = |paged| KvShape {
            per_token: 23_040,
            context: 8192,
            layers: 30,
            paged,
        };
        let gib = 1u64 << 30;
        // 256 whole contexts need 45 GiB: an H200's free memory holds them.
        assert_eq!(shape(true).plan(256, 120 * gib, "x"), Ok(KvPlan::Full));
        // A 16 GiB T4: as many blocks as fit, sequences wait for them.
        let blocks = (15 * gib / (23_040 * BLOCK_SIZE as u64)) as usize;
        assert_eq!(
            shape(true).plan(256, 15 * gib, "x"),
            Ok(KvPlan::Blocks(blocks))
        );
        assert!(blocks * BLOCK_SIZE > 8192 * 80, "{blocks}");
        // The CPU kernels' slots cannot page: refused, saying what to lower.
        let refused = shape(false)
            .plan(256, 15 * gib, "the actor's VRAM")
            .unwrap_err();
        assert!(refused.contains("lower `max_sequences`"), "{refused}");
        // Not even one whole context: refused either way.
        assert!(shape(true).plan(4, 100 << 20, "x").is_err());
    }

    #[test]
    fn a_whole_gpu_actor_may_fill_the_gpu_and_a_shared_one_its_share() {
        let gpu = |fraction: f64, simulated: bool| crate::backends::DeviceAssignment {
            gpu_indices: vec![0],
            gpu_fraction: fraction,
            vram_bytes: 2 << 30,
            simulated,
        };
        assert_eq!(
            kv_budget(&gpu(1.0, false), Some(70 << 30), 512 << 20).0,
            (70u64 << 30) / 10 * 9
        );
        // A share holds the weights too, and leaves a tenth to the steps.
        let weights = 512 << 20;
        let share = ((2u64 << 30) - weights) / 10 * 9;
        assert_eq!(
            kv_budget(&gpu(0.25, false), Some(70 << 30), weights).0,
            share
        );
        assert_eq!(kv_budget(&gpu(1.0, false), None, weights).0, share);
        assert_eq!(kv_budget(&gpu(0.25, false), None, 3 << 30).0, 0);
        let (_, what) = kv_budget(&gpu(1.0, true), Some(70 << 30), weights);
        assert_eq!(what, "this node's RAM", "simulated GPUs run on the CPU");
    }

    #[test]
    fn a_directory_without_a_gguf_file_is_a_clear_error() {
        let empty = tempfile::tempdir().unwrap();
        let config = GenerateConfig {
            model: empty.path().to_string_lossy().into_owned(),
            ..GenerateConfig::default()
        };
        let context = LoadContext::standalone("a1", Vec::new());
        let error = GenerateActor::load(config, &context)
            .err()
            .expect("refused");
        assert!(error.to_string().contains("no .gguf file"), "{error}");
    }

    #[test]
    fn an_unknown_dtype_is_refused_with_the_ones_there_are() {
        let config = GenerateConfig {
            model: smollm2(),
            dtype: Some("f8".into()),
            ..GenerateConfig::default()
        };
        let context = LoadContext::standalone("a1", Vec::new());
        let error = GenerateActor::load(config, &context)
            .err()
            .expect("refused");
        assert!(error.is_permanent(), "{error}");
        assert!(
            error
                .to_string()
                .contains("not one of auto, quantised, f32, f16, bf16"),
            "{error}"
        );
    }

    #[test]
    fn an_unknown_attention_kernel_is_refused_and_a_cpu_actor_ignores_a_known_one() {
        let load = |attention: &str| {
            let config = GenerateConfig {
                model: smollm2(),
                attention: Some(attention.into()),
                ..GenerateConfig::default()
            };
            GenerateActor::load(config, &LoadContext::standalone("a1", Vec::new()))
        };
        let error = load("flash").err().expect("refused");
        assert!(error.is_permanent(), "{error}");
        assert!(
            error
                .to_string()
                .contains("`attention` is `flash`: use auto, tensor-cores or scalar"),
            "{error}"
        );
        // The CPU runs its reference attention: a GPU kernel named for the job's GPU actors
        // does not stop its CPU ones.
        assert!(load("tensor-cores").is_ok());
    }
}
