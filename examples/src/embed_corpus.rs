//! The `resident embed` job through the SDK: embed a JSONL corpus on a cluster (or a local
//! one), resumably, and print the report.
//!
//! `scripts/fetch-model.sh && scripts/fetch-data.sh &&
//!  cargo run --release -p resident-examples --bin embed-corpus -- data/wiki_vital.jsonl out/sdk`

use resident_jobs::corpus_job::{EmbedJobConfig, run_embed_job};
use resident_sdk::{Cluster, LocalConfig};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let input = args
        .next()
        .unwrap_or_else(|| "data/wiki_vital.jsonl".into());
    let output = args.next().unwrap_or_else(|| "out/sdk".into());

    // Connect to a cluster when RESIDENT_CLUSTER is set; otherwise run one in this process.
    let cluster = match std::env::var("RESIDENT_CLUSTER") {
        Ok(url) => Cluster::connect(&url).await?,
        Err(_) => Cluster::local(LocalConfig::default()).await?,
    };

    let config = EmbedJobConfig::new(input, "models/all-MiniLM-L6-v2", output);
    let report = run_embed_job(&cluster, &config, &mut |progress| {
        eprint!("\r{}/{} documents", progress.done_docs, progress.total_docs);
    })
    .await?;

    eprintln!();
    println!(
        "{} documents, dimension {}, {:.1} docs/s, {} bad records, {} model loads, ${:.4}",
        report.items,
        report.figures.dimension,
        report.docs_per_second,
        report.bad_record_count,
        report.model_loads,
        report.estimated_cost_usd
    );
    Ok(())
}
