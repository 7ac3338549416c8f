//! `resident embed`: a vector per record of a corpus, resumably.

use clap::{Args, ValueEnum};
use resident_jobs::corpus_job::{OutputDtype, run_embed_job};

use crate::corpus_args::{CorpusArgs, progress_reporter};

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
    #[arg(long, env = "RESIDENT_DTYPE", value_enum, default_value = "f32")]
    dtype: Dtype,
}

impl EmbedArgs {
    /// Whether the job runs on a cluster in this process.
    pub fn is_local(&self) -> bool {
        self.corpus.is_local()
    }
}

pub async fn run(args: EmbedArgs) -> anyhow::Result<()> {
    let mut config = args.corpus.corpus_config()?;
    config.dtype = match args.dtype {
        Dtype::F32 => OutputDtype::F32,
        Dtype::F16 => OutputDtype::F16,
    };
    let cluster = args.corpus.cluster("embed").await?;
    let mut progress = progress_reporter("embed");
    let report = run_embed_job(&cluster, &config, &mut progress).await?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    eprintln!(
        "embedded {} documents ({} new) into {} in {:.1} s: {:.1} docs/s, {} bad records, {} model loads; report: {}",
        report.items,
        report.computed_items,
        config.output,
        report.wall_seconds,
        report.docs_per_second,
        report.bad_record_count,
        report.model_loads,
        config.output.join("report.json")
    );
    Ok(())
}
