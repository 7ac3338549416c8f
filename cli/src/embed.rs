use std::io::IsTerminal;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, ValueEnum};
use resident_jobs::embed_job::{
    BadRecordPolicy, EmbedJobConfig, OutputDtype, Progress, ReaderOptions, run_embed_job,
};
use resident_jobs::storage::Location;
use resident_sdk::{Cluster, LocalConfig};

#[derive(Clone, Copy, ValueEnum)]
enum Dtype {
    F32,
    F16,
}

#[derive(Clone, Copy, ValueEnum)]
enum OnBadRecord {
    Skip,
    Fail,
}

#[derive(Args)]
pub struct EmbedArgs {
    /// A .jsonl/.txt/.parquet file (JSONL and text optionally .gz or .zst), a directory of
    /// them, or an s3://bucket/prefix holding them.
    #[arg(long, env = "RESIDENT_INPUT")]
    input: String,
    /// The model: a directory, `s3://bucket/prefix/` (pushed with `resident model push`),
    /// or a Hugging Face id (`org/name`, `org/name@commit`). The job pins it to one content
    /// digest or commit, and agents download it once per node into their --model-cache.
    #[arg(long, env = "RESIDENT_MODEL")]
    model: String,
    /// Output directory or s3://bucket/prefix (shards/, manifest.json and its journal/,
    /// index.json, embeddings.npy, ids.jsonl, report.json).
    #[arg(long, env = "RESIDENT_OUTPUT")]
    output: String,
    /// An S3-compatible endpoint (MinIO, Garage, ...), addressed path-style. Credentials
    /// and region come from the standard AWS chain (AWS_ACCESS_KEY_ID, profiles, IRSA).
    #[arg(long, env = "RESIDENT_S3_ENDPOINT")]
    s3_endpoint: Option<String>,
    /// Scheduler URL; without it a local cluster runs in this process.
    #[arg(long, env = "RESIDENT_CLUSTER")]
    cluster: Option<String>,
    #[command(flatten)]
    credentials: crate::credentials::CredentialArgs,
    #[command(flatten)]
    reconnect: crate::credentials::ReconnectArgs,
    #[command(flatten)]
    pool: crate::pool_args::PoolRetentionArgs,
    /// Actors; default one per CPU core (CPU) or as many as the GPUs hold.
    #[arg(long, env = "RESIDENT_REPLICAS")]
    replicas: Option<u32>,
    /// GPUs per actor (0 = CPU; 0.25 shares a GPU four ways).
    #[arg(long, env = "RESIDENT_GPUS_PER_ACTOR", default_value_t = 0.0)]
    gpus_per_actor: f64,
    /// VRAM each actor reserves on its GPU, in GiB.
    #[arg(long, env = "RESIDENT_VRAM_GIB", default_value_t = 2.0)]
    vram_gib: f64,
    /// Only nodes with these labels: `pool=onprem-a6000` (repeatable; in the variable,
    /// comma-separated).
    #[arg(long, env = "RESIDENT_SELECTOR", value_delimiter = ',')]
    selector: Vec<String>,
    /// Documents per chunk, or `auto` to plan from measured speed.
    #[arg(long, env = "RESIDENT_CHUNK_SIZE", default_value = "auto")]
    chunk_size: String,
    /// The vectors' type in embeddings.npy and the shards: f32, or f16 (half the size).
    #[arg(long, env = "RESIDENT_DTYPE", value_enum, default_value = "f32")]
    dtype: Dtype,
    /// A record without an id or text, or not valid JSON: `skip` it (listed in the report)
    /// or `fail` the job (exit status 2).
    #[arg(
        long,
        env = "RESIDENT_ON_BAD_RECORD",
        value_enum,
        default_value = "skip"
    )]
    on_bad_record: OnBadRecord,
    /// Keep the shards; do not write embeddings.npy and ids.jsonl.
    #[arg(long, env = "RESIDENT_NO_MERGE")]
    no_merge: bool,
    /// Write embeddings.npy and ids.jsonl only up to this many GiB of vectors; past it the
    /// shards, listed in index.json with their first rows, are the output.
    #[arg(long, env = "RESIDENT_MERGE_MAX_GIB", default_value_t = 64.0)]
    merge_max_gib: f64,
    /// Fold the manifest's journal into manifest.json once it holds this many chunks (and a
    /// quarter of the manifest's): fewer means shorter resumes, more means fewer rewrites.
    #[arg(long, env = "RESIDENT_MANIFEST_COMPACT_MIN", default_value_t = 1024)]
    manifest_compact_min: usize,
    /// The JSON field holding each record's id (JSONL and Parquet).
    #[arg(long, env = "RESIDENT_ID_FIELD", default_value = "id")]
    id_field: String,
    /// The JSON field holding each record's text (JSONL and Parquet).
    #[arg(long, env = "RESIDENT_TEXT_FIELD", default_value = "text")]
    text_field: String,
    /// Price of a GPU-hour on nodes labelled `pool=LABEL`: `LABEL=USD` (repeatable; in the
    /// variable, comma-separated).
    #[arg(long, env = "RESIDENT_PRICE", value_delimiter = ',')]
    price: Vec<String>,
    /// Local mode only: report simulated GPUs (the work runs on CPU).
    #[arg(long, env = "RESIDENT_SIMULATE_GPUS")]
    simulate_gpus: Option<String>,
}

fn parse_pairs(items: &[String], what: &str) -> anyhow::Result<Vec<(String, String)>> {
    items
        .iter()
        .flat_map(|i| i.split(','))
        .filter(|p| !p.trim().is_empty())
        .map(|pair| {
            let (k, v) = pair
                .split_once('=')
                .with_context(|| format!("{what} `{pair}` is not KEY=VALUE"))?;
            Ok((k.trim().to_owned(), v.trim().to_owned()))
        })
        .collect()
}

impl EmbedArgs {
    fn job_config(&self) -> anyhow::Result<EmbedJobConfig> {
        let input = Location::parse(&self.input).map_err(anyhow::Error::msg)?;
        let output = Location::parse(&self.output).map_err(anyhow::Error::msg)?;
        let mut config = EmbedJobConfig::new(input, &self.model, output);
        config.s3.endpoint = self.s3_endpoint.clone();
        config.replicas = self.replicas;
        anyhow::ensure!(
            self.gpus_per_actor >= 0.0,
            "--gpus-per-actor must not be negative"
        );
        config.gpus_per_actor = self.gpus_per_actor;
        config.vram_gib_per_actor = self.vram_gib;
        config.selector = parse_pairs(&self.selector, "--selector")?
            .into_iter()
            .collect();
        config.chunk_size = match self.chunk_size.as_str() {
            "auto" => None,
            n => Some(
                n.parse::<usize>()
                    .ok()
                    .filter(|n| *n > 0)
                    .context("--chunk-size must be a positive number or auto")?,
            ),
        };
        config.dtype = match self.dtype {
            Dtype::F32 => OutputDtype::F32,
            Dtype::F16 => OutputDtype::F16,
        };
        config.on_bad_record = match self.on_bad_record {
            OnBadRecord::Skip => BadRecordPolicy::Skip,
            OnBadRecord::Fail => BadRecordPolicy::Fail,
        };
        config.merge = !self.no_merge;
        anyhow::ensure!(
            self.merge_max_gib >= 0.0 && self.merge_max_gib.is_finite(),
            "--merge-max-gib must be a number of GiB, 0 or more (0 keeps only the shards)"
        );
        config.merge_max_bytes = (self.merge_max_gib * (1u64 << 30) as f64) as u64;
        anyhow::ensure!(
            self.manifest_compact_min > 0,
            "--manifest-compact-min must be at least 1"
        );
        config.manifest_compaction.min_entries = self.manifest_compact_min;
        config.retention = self.pool.retention();
        config.reader = ReaderOptions {
            id_field: self.id_field.clone(),
            text_field: self.text_field.clone(),
        };
        for (label, price) in parse_pairs(&self.price, "--price")? {
            let price: f64 = price
                .parse()
                .with_context(|| format!("--price {label}={price}: not a number"))?;
            config.prices.per_pool_label.insert(label, price);
        }
        Ok(config)
    }
}

/// A bar on a terminal; a log line every few seconds otherwise.
fn progress_reporter() -> impl FnMut(Progress) + Send {
    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            // Speed and ETA are this run's (`Progress::docs_per_second`): indicatif's own
            // would count the documents a resumed run found done as if just embedded.
            indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} docs  {msg}")
                .expect("valid template"),
        );
        bar
    });
    let mut last_log = Instant::now();
    // A chunk's result and the end of its running count can arrive in either order: the
    // bar never steps back.
    let mut shown = 0;
    move |progress: Progress| {
        shown = progress.position().max(shown);
        let rate = progress.docs_per_second();
        let eta = progress
            .eta()
            .map_or_else(|| "-".to_owned(), |eta| format!("{}s", eta.as_secs()));
        match &bar {
            Some(bar) => {
                bar.set_length(progress.total_docs);
                bar.set_position(shown);
                bar.set_message(format!("{rate:.1} docs/s  ETA {eta}"));
                if progress.done_docs >= progress.total_docs {
                    bar.finish_and_clear();
                }
            }
            None if last_log.elapsed() >= Duration::from_secs(5)
                || progress.done_docs >= progress.total_docs =>
            {
                last_log = Instant::now();
                tracing::info!(
                    done = progress.done_docs,
                    embedded = shown,
                    total = progress.total_docs,
                    reused = progress.reused_docs,
                    docs_per_s = format!("{rate:.1}"),
                    eta_s = progress.eta().map(|eta| eta.as_secs()),
                    "embedding"
                );
            }
            None => {}
        }
    }
}

pub async fn run(args: EmbedArgs) -> anyhow::Result<()> {
    let config = args.job_config()?;
    let cluster = match &args.cluster {
        Some(url) => args
            .credentials
            .connect(url)
            .await?
            .with_reconnect_timeout(args.reconnect.reconnect_timeout),
        None => {
            let mut local = LocalConfig {
                simulate_gpus: args.simulate_gpus.clone(),
                ..LocalConfig::default()
            };
            local.models.s3.endpoint = args.s3_endpoint.clone();
            Cluster::local(local).await?
        }
    };
    let mut progress = progress_reporter();
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
