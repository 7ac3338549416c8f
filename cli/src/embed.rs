//! `resident embed`: a vector per record of a corpus, resumably.

use clap::{Args, ValueEnum};
use resident_jobs::corpus_job::{
    EmbedJobConfig, EmbedWork, KeptColumn, Normalization, OutputDtype, Prompt, VectorFormat,
    WindowSplit, Windows, run_embed_job,
};

use crate::corpus_args::{CorpusArgs, progress_reporter};
use crate::exit::BadInput;

#[derive(Clone, Copy, ValueEnum)]
enum Dtype {
    F32,
    F16,
}

#[derive(Args)]
pub struct EmbedArgs {
    #[command(flatten)]
    corpus: CorpusArgs,
    /// The vectors' type in embeddings.npy and the shards: f32, or f16 (half the size).
    /// `--precision` has these and more.
    #[arg(long, env = "RESIDENT_DTYPE", value_enum, conflicts_with = "precision")]
    dtype: Option<Dtype>,
    /// How vectors are stored, as sentence-transformers' `precision`: float32, float16,
    /// int8 or uint8 (a byte a dimension, from per-dimension ranges calibrated on the
    /// corpus's first records, a twentieth of it between 256 and 1,024, and written to
    /// index.json), binary or ubinary (a bit a dimension, 32x smaller than float32).
    #[arg(long, env = "RESIDENT_PRECISION", value_parser = parse_precision)]
    precision: Option<OutputDtype>,
    /// A prompt the model names in its config_sentence_transformers.json (`query`,
    /// `passage`, `document`), put before every text as sentence-transformers'
    /// `prompt_name=` does. Default: the model's `default_prompt_name`, if it has one.
    #[arg(long, env = "RESIDENT_PROMPT_NAME", conflicts_with = "prompt")]
    prompt_name: Option<String>,
    /// A prompt's text, put before every text (`"query: "`; `""` for none, even where the
    /// model has a default prompt), as sentence-transformers' `prompt=`.
    #[arg(long, env = "RESIDENT_PROMPT")]
    prompt: Option<String>,
    /// Keep each vector's first N dimensions (matryoshka models: nomic, mxbai, Qwen3).
    #[arg(long, env = "RESIDENT_TRUNCATE_DIM")]
    truncate_dim: Option<usize>,
    /// Scale every vector to unit length, after --truncate-dim (sentence-transformers'
    /// `normalize_embeddings=True`). Default: as the model does.
    #[arg(long, env = "RESIDENT_NORMALIZE", conflicts_with = "no_normalize")]
    normalize: bool,
    /// Write vectors as pooled, without the model's own Normalize module.
    #[arg(long, env = "RESIDENT_NO_NORMALIZE")]
    no_normalize: bool,
    /// Cut each text (its prompt included) to N tokens; only shorter than the model's own
    /// max_seq_length.
    #[arg(long, env = "RESIDENT_MAX_SEQ_LENGTH")]
    max_seq_length: Option<usize>,
    /// Padded tokens per model batch on each actor (speed only; default 1024 on CPU, 16384
    /// on GPU).
    #[arg(long, env = "RESIDENT_MAX_BATCH_TOKENS")]
    max_batch_tokens: Option<usize>,
    /// npy: shards/*.npy merged into embeddings.npy plus ids.jsonl. parquet: shards/*.parquet
    /// (columns `id`, `embedding` as a fixed-size list, and --keep-columns) merged into
    /// embeddings.parquet, which pyarrow, pandas, DuckDB and Spark read as it is.
    #[arg(long, env = "RESIDENT_FORMAT", value_enum, default_value = "npy")]
    format: Format,
    /// Input fields carried to the output with each vector: `title,url` (JSONL fields or
    /// Parquet columns, or paths into them, `meta.url`; missing ones are null), FIELD=NAME
    /// to write one under another name. Parquet output: text columns; npy output: fields
    /// of each ids.jsonl line.
    #[arg(long, env = "RESIDENT_KEEP_COLUMNS", value_delimiter = ',')]
    keep_columns: Vec<String>,
    /// Cut long texts into windows instead of cutting them off at the model's length:
    /// `tokens:SIZE:OVERLAP` (e.g. tokens:256:32: windows of 256 of the model's tokens,
    /// consecutive ones sharing at least 32, edges on word boundaries; `tokens` alone: as
    /// long as the model takes) or `sentences[:SIZE]` (whole sentences packed into windows
    /// of at most SIZE tokens). Each window is a row (`id` is `<doc id>#<window>`, with
    /// `doc_id`, `window`, `char_start`, `char_end`: Unicode code points) embedded as its
    /// text alone would be; a text that fits is one window of all of it.
    #[arg(long, env = "RESIDENT_SPLIT", value_parser = WindowSplit::parse)]
    split: Option<WindowSplit>,
    /// With --split: `none` writes a row per window; `mean` writes a vector per document,
    /// the mean of its windows' (unit length again where the model normalises).
    #[arg(long, env = "RESIDENT_POOL_WINDOWS", value_enum, requires = "split")]
    pool_windows: Option<PoolWindows>,
}

#[derive(Clone, Copy, ValueEnum)]
enum PoolWindows {
    None,
    Mean,
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Npy,
    Parquet,
}

fn parse_precision(name: &str) -> Result<OutputDtype, String> {
    OutputDtype::parse(name)
}

impl EmbedArgs {
    /// Whether the job runs on a cluster in this process.
    pub fn is_local(&self) -> bool {
        self.corpus.is_local()
    }

    /// What the job does to every text.
    fn embedding(&self) -> anyhow::Result<EmbedWork> {
        let dtype = match (self.precision, self.dtype) {
            (Some(precision), _) => precision,
            (None, Some(Dtype::F16)) => OutputDtype::F16,
            (None, Some(Dtype::F32) | None) => OutputDtype::F32,
        };
        // clap refuses both flags together first, naming them.
        let prompt = Prompt::from_name_or_text(self.prompt_name.clone(), self.prompt.clone())
            .map_err(anyhow::Error::msg)?;
        let normalization = match (self.normalize, self.no_normalize) {
            (true, _) => Normalization::UnitLength,
            (false, true) => Normalization::Raw,
            (false, false) => Normalization::Model,
        };
        crate::exit::require(
            self.truncate_dim != Some(0),
            "--truncate-dim must be at least 1 (leave it out to keep every dimension)",
        )?;
        crate::exit::require(
            self.max_seq_length.is_none_or(|n| n >= 2),
            "--max-seq-length must be at least 2 (room for the model's start and end tokens)",
        )?;
        crate::exit::require(
            self.max_batch_tokens.is_none_or(|n| n >= 16),
            "--max-batch-tokens must be at least 16",
        )?;
        Ok(EmbedWork {
            prompt,
            normalization,
            truncate_dim: self.truncate_dim,
            dtype,
            max_seq_length: self.max_seq_length,
            max_batch_tokens: self.max_batch_tokens,
            format: match self.format {
                Format::Npy => VectorFormat::Npy,
                Format::Parquet => VectorFormat::Parquet,
            },
            keep_columns: (self.keep_columns.iter())
                .filter(|c| !c.trim().is_empty())
                .map(|c| KeptColumn::parse(c).map_err(BadInput))
                .collect::<Result<_, _>>()?,
            windows: self.split.map(|split| Windows {
                split,
                mean: matches!(self.pool_windows, Some(PoolWindows::Mean)),
            }),
        })
    }
}

pub async fn run(args: EmbedArgs) -> anyhow::Result<()> {
    let mut config = EmbedJobConfig {
        corpus: args.corpus.corpus_config()?,
        embedding: args.embedding()?,
    };
    let cluster = args.corpus.cluster("embed", &mut config.corpus).await?;
    let mut progress = progress_reporter("embed");
    let report = run_embed_job(&cluster, &config, &mut progress).await?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    let windows = match &report.figures.windows {
        Some(windows) => format!(
            " as {} windows ({} documents cut)",
            windows.windows, windows.documents_split
        ),
        None => String::new(),
    };
    eprintln!(
        "embedded {} documents ({} new){windows} into {} in {:.1} s (actors ready after {:.1} s): {:.1} docs/s, {} bad records, {} model loads; report: {}",
        report.items,
        report.computed_items,
        config.corpus.output,
        report.wall_seconds,
        report.ready_seconds,
        report.docs_per_second,
        report.bad_record_count,
        report.model_loads,
        config.corpus.output.join("report.json")
    );
    if report.figures.non_finite_vectors > 0 {
        eprintln!(
            "warning: {} vectors hold a NaN or an infinity (report.json non_finite_vectors): \
             the model overflowed its dtype or its weights hold one; they are written as they \
             came",
            report.figures.non_finite_vectors
        );
    }
    Ok(())
}
