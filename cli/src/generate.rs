//! `resident generate`: a completion per record of a corpus (summaries, answers), from an
//! LLM kept resident in `generate` actors, resumably.

use clap::{Args, ValueEnum};
use resident_actor::generate::{GenerateParams, Template};
use resident_jobs::corpus_job::{GenerateJobConfig, PromptTemplate, run_generate_job};

use crate::corpus_args::{CorpusArgs, progress_reporter};

#[derive(Clone, Copy, ValueEnum)]
enum TemplateArg {
    /// The prompt as the single user turn of the model's chat template, with the
    /// generation prompt added.
    Chat,
    /// The prompt as it is, after BOS when the model's metadata asks for one.
    None,
}

#[derive(Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    corpus: CorpusArgs,
    /// The prompt of each record: `{text}` is the record's text (cut from its middle when
    /// the prompt would not fit the context), `{field}` any other field of the record,
    /// `{{` and `}}` literal braces. Example: "Summarise in one sentence:\n\n{text}".
    #[arg(long, env = "RESIDENT_PROMPT")]
    prompt: String,
    /// How the prompt reaches the model.
    #[arg(long, env = "RESIDENT_TEMPLATE", value_enum, default_value = "chat")]
    template: TemplateArg,
    /// At most this many tokens per completion.
    #[arg(long, env = "RESIDENT_MAX_NEW_TOKENS", default_value_t = 128)]
    max_new_tokens: u32,
    /// 0 is greedy; higher samples more freely.
    #[arg(long, env = "RESIDENT_TEMPERATURE", default_value_t = 0.0)]
    temperature: f32,
    /// Sample from the smallest set of tokens whose probabilities add up to this.
    #[arg(long, env = "RESIDENT_TOP_P", default_value_t = 1.0)]
    top_p: f32,
    /// Sample from the K likeliest tokens (0 = all).
    #[arg(long, env = "RESIDENT_TOP_K", default_value_t = 0)]
    top_k: u32,
    /// With each record's id, seeds its sampler: the same output on any agent, chunk size
    /// or rerun.
    #[arg(long, env = "RESIDENT_SEED", default_value_t = 0)]
    seed: u64,
    /// Stop a completion before this text (repeatable; the variable gives one).
    #[arg(long = "stop", env = "RESIDENT_STOP")]
    stop: Vec<String>,
    /// Sequences each actor decodes at once (continuous batching); the kind's default
    /// when absent.
    #[arg(long, env = "RESIDENT_MAX_SEQUENCES")]
    max_sequences: Option<u32>,
    /// Tokens in one forward step, prompts and decodes together; the kind's default when
    /// absent.
    #[arg(long, env = "RESIDENT_MAX_STEP_TOKENS")]
    max_step_tokens: Option<u32>,
    /// Cap each sequence's context (prompt and completion) at this many tokens, below the
    /// model's own: longer record texts are cut from their middle. Bounds the KV cache.
    #[arg(long, env = "RESIDENT_MAX_CONTEXT")]
    max_context: Option<u32>,
    /// The weights' precision on the actors: auto (a GGUF file's quantised blocks on the
    /// CPU, bf16 on a GPU, f32 for a safetensors checkpoint on the CPU), quantised, f32,
    /// f16 or bf16.
    #[arg(
        long,
        env = "RESIDENT_WEIGHTS_DTYPE",
        value_parser = ["auto", "quantised", "f32", "f16", "bf16"]
    )]
    dtype: Option<String>,
}

impl GenerateArgs {
    fn job_config(&self) -> anyhow::Result<GenerateJobConfig> {
        let prompt = PromptTemplate::parse(&self.prompt).map_err(crate::exit::BadInput)?;
        crate::exit::require(
            self.max_new_tokens >= 1,
            "--max-new-tokens must be at least 1",
        )?;
        crate::exit::require(
            self.temperature >= 0.0 && self.temperature.is_finite(),
            "--temperature must be 0 (greedy) or more",
        )?;
        crate::exit::require(
            self.top_p > 0.0 && self.top_p <= 1.0,
            "--top-p must be above 0 and at most 1",
        )?;
        crate::exit::require(
            self.stop.iter().all(|stop| !stop.is_empty()),
            "--stop must not be empty",
        )?;
        for (flag, value) in [
            ("--max-sequences", self.max_sequences),
            ("--max-step-tokens", self.max_step_tokens),
            ("--max-context", self.max_context),
        ] {
            crate::exit::require(value != Some(0), format!("{flag} must be at least 1"))?;
        }
        let corpus = self.corpus.corpus_config()?;
        let mut config = GenerateJobConfig::new(corpus, prompt);
        let generation = &mut config.generation;
        generation.params = GenerateParams {
            template: match self.template {
                TemplateArg::Chat => Template::Chat,
                TemplateArg::None => Template::None,
            },
            max_new_tokens: self.max_new_tokens,
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            seed: self.seed,
            stop: self.stop.clone(),
        };
        generation.max_sequences = self.max_sequences;
        generation.max_step_tokens = self.max_step_tokens;
        generation.max_context = self.max_context;
        generation.dtype = self.dtype.clone().filter(|dtype| dtype != "auto");
        Ok(config)
    }
}

impl GenerateArgs {
    /// Whether the job runs on a cluster in this process.
    pub fn is_local(&self) -> bool {
        self.corpus.is_local()
    }
}

pub async fn run(args: GenerateArgs) -> anyhow::Result<()> {
    let config = args.job_config()?;
    let cluster = args.corpus.cluster("generate").await?;
    let mut progress = progress_reporter("generate");
    let report = run_generate_job(&cluster, &config, &mut progress).await?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    let figures = &report.figures;
    eprintln!(
        "generated for {} records ({} new) into {} in {:.1} s: {} prompt and {} generated tokens \
         ({:.1} tokens/s out), {} prompts cut to fit, {} bad records, {} model loads; report: {}",
        report.items,
        report.computed_items,
        config.corpus.output,
        report.wall_seconds,
        figures.tally.prompt_tokens,
        figures.tally.generated_tokens,
        figures.generated_tokens_per_second,
        figures.tally.truncated_prompts,
        report.bad_record_count,
        report.model_loads,
        config.corpus.output.join("report.json")
    );
    Ok(())
}
