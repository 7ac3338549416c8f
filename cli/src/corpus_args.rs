//! The flags, cluster and progress display every corpus job shares (`resident embed`,
//! `resident generate`).

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, ValueEnum};
use resident_jobs::corpus_job::{
    BadRecordPolicy, CorpusJobConfig, Progress, ReaderOptions, RecordLimit,
};
use resident_jobs::storage::Location;
use resident_sdk::{Cluster, LocalConfig};

#[derive(Clone, Copy, ValueEnum)]
enum OnBadRecord {
    Skip,
    Fail,
}

/// The flags every corpus job takes (`resident embed`, `resident generate`).
#[derive(Args)]
pub struct CorpusArgs {
    /// A .jsonl/.txt/.parquet file (JSONL and text optionally .gz or .zst), a directory of
    /// them, or an s3://bucket/prefix holding them.
    #[arg(long, env = "RESIDENT_INPUT")]
    pub input: String,
    /// The model: a directory, `s3://bucket/prefix/` (pushed with `resident model push`),
    /// or a Hugging Face id (`org/name`, `org/name@commit`). The job pins it to one content
    /// digest or commit, and agents download it once per node into their --model-cache.
    #[arg(long, env = "RESIDENT_MODEL")]
    pub model: String,
    /// Output directory or s3://bucket/prefix (shards/, manifest.json and its journal/,
    /// index.json, report.json, and the merged output: embeddings.npy and ids.jsonl, or
    /// generations.jsonl).
    #[arg(long, env = "RESIDENT_OUTPUT")]
    pub output: String,
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
    /// GPUs per actor (0 = CPU actors; 0.25 shares a GPU four ways). Default: one actor per
    /// GPU where the nodes the job may use have GPUs, CPU actors where they have none.
    #[arg(long, env = "RESIDENT_GPUS_PER_ACTOR")]
    gpus_per_actor: Option<f64>,
    /// VRAM each actor reserves on its GPU, in GiB.
    #[arg(long, env = "RESIDENT_VRAM_GIB", default_value_t = 2.0)]
    vram_gib: f64,
    /// Only nodes with these labels: `pool=onprem-a6000` (repeatable; in the variable,
    /// comma-separated).
    #[arg(long, env = "RESIDENT_SELECTOR", value_delimiter = ',')]
    selector: Vec<String>,
    /// Read only the input's first N records, bad ones included, or a share of them below
    /// 1 (0.1: the first tenth, rounded up; the input is counted first), as
    /// lm-evaluation-harness's --limit: a quick look at a task or a model before the whole
    /// run. Another limit under the same --output is another input.
    #[arg(long, env = "RESIDENT_LIMIT", value_name = "N|SHARE")]
    limit: Option<RecordLimit>,
    /// With --limit, each value of this field gets the limit (MMLU's `subject`: the first N,
    /// or the share, of each subject's questions, as lm-evaluation-harness limits each of
    /// its tasks); a record without the field is bad.
    #[arg(
        long,
        env = "RESIDENT_LIMIT_BY",
        value_name = "FIELD",
        requires = "limit"
    )]
    limit_by: Option<String>,
    /// Records per chunk, or `auto` to plan from measured speed.
    #[arg(long, env = "RESIDENT_CHUNK_SIZE", default_value = "auto")]
    chunk_size: String,
    /// A record without an id or text, or not valid JSON: `skip` it (listed in the report)
    /// or `fail` the job (exit status 2).
    #[arg(
        long,
        env = "RESIDENT_ON_BAD_RECORD",
        value_enum,
        default_value = "skip"
    )]
    on_bad_record: OnBadRecord,
    /// Keep the shards; do not write the merged output (embeddings.npy and ids.jsonl, or
    /// generations.jsonl).
    #[arg(long, env = "RESIDENT_NO_MERGE")]
    no_merge: bool,
    /// Write the merged output only up to this many GiB; past it the shards, listed in
    /// index.json with their first rows, are the output.
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
    #[command(flatten)]
    price: crate::pool_args::PriceArgs,
    /// A chunk running longer than this (`10m`, `90s`) is taken back and retried, and the
    /// actor running it stopped and started again: a hung GPU call cannot hold its GPU and
    /// the job forever. Default: no deadline.
    #[arg(long, env = "RESIDENT_TASK_TIMEOUT", value_parser = humantime::parse_duration)]
    task_timeout: Option<Duration>,
    /// Local mode only: report simulated GPUs (the work runs on CPU).
    #[arg(long, env = "RESIDENT_SIMULATE_GPUS")]
    simulate_gpus: Option<String>,
}

impl CorpusArgs {
    /// The job's config from the flags.
    pub fn corpus_config(&self) -> anyhow::Result<CorpusJobConfig> {
        let input = Location::parse(&self.input).map_err(anyhow::Error::msg)?;
        let output = Location::parse(&self.output).map_err(anyhow::Error::msg)?;
        let mut config = CorpusJobConfig::new(input, &self.model, output);
        config.s3.endpoint = self.s3_endpoint.clone();
        config.replicas = self.replicas;
        crate::exit::require(
            self.gpus_per_actor
                .is_none_or(|g| g >= 0.0 && g.is_finite()),
            "--gpus-per-actor must be 0 (CPU actors) or more, like 1 or 0.25",
        )?;
        config.gpus_per_actor = self.gpus_per_actor;
        config.vram_gib_per_actor = self.vram_gib;
        config.selector = crate::pool_args::parse_pairs(&self.selector, "--selector")?
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
        config.on_bad_record = match self.on_bad_record {
            OnBadRecord::Skip => BadRecordPolicy::Skip,
            OnBadRecord::Fail => BadRecordPolicy::Fail,
        };
        config.merge = !self.no_merge;
        crate::exit::require(
            self.merge_max_gib >= 0.0 && self.merge_max_gib.is_finite(),
            "--merge-max-gib must be a number of GiB, 0 or more (0 keeps only the shards)",
        )?;
        config.merge_max_bytes = (self.merge_max_gib * (1u64 << 30) as f64) as u64;
        crate::exit::require(
            self.manifest_compact_min > 0,
            "--manifest-compact-min must be at least 1",
        )?;
        config.manifest_compaction.min_entries = self.manifest_compact_min;
        config.retention = self.pool.retention();
        crate::exit::require(
            self.task_timeout
                .is_none_or(|t| t >= Duration::from_millis(1)),
            "--task-timeout must be at least 1ms (leave it out for no deadline)",
        )?;
        config.task_timeout = self.task_timeout;
        config.reader = ReaderOptions {
            id_field: self.id_field.clone(),
            text_field: self.text_field.clone(),
            ..ReaderOptions::default()
        };
        config.set_limit(self.limit);
        config.reader.limit_by = self.limit_by.clone();
        config.prices = self.price.prices()?;
        Ok(config)
    }

    /// Whether the job runs on a cluster in this process (no `--cluster`).
    pub fn is_local(&self) -> bool {
        self.cluster.is_none()
    }

    /// `--cluster`, if given.
    pub fn cluster_url(&self) -> Option<&str> {
        self.cluster.as_deref()
    }

    /// The cluster at `--cluster`, or a local one in this process, with the actors' device
    /// chosen into `config` (`--gpus-per-actor`, or the cluster's GPUs when it has any);
    /// says on stderr, in one line, what the job runs on and why.
    pub async fn cluster(
        &self,
        job: &str,
        config: &mut CorpusJobConfig,
    ) -> anyhow::Result<Cluster> {
        let cluster = self.connect().await?;
        let nodes = cluster.list_nodes().await?;
        let alive: Vec<_> = nodes.iter().filter(|n| n.alive).collect();
        let cores: u32 = alive.iter().map(|n| n.cpu_cores).sum();
        let gpus: usize = alive.iter().map(|n| n.gpus.len()).sum();
        let place = match &self.cluster {
            Some(url) => format!("the cluster at {url}: {} nodes", alive.len()),
            None => "a local cluster in this process".to_owned(),
        };
        let gpus = match (gpus, &self.simulate_gpus) {
            (0, _) => "no GPUs".to_owned(),
            (1, Some(_)) => "1 simulated GPU".to_owned(),
            (1, None) => "1 GPU".to_owned(),
            (n, Some(_)) => format!("{n} simulated GPUs"),
            (n, None) => format!("{n} GPUs"),
        };
        let choice = config.choose_device(&cluster, "--gpus-per-actor").await?;
        eprintln!(
            "resident {job} of {} with {} on {place} ({cores} CPU cores, {gpus}): {}",
            self.input, self.model, choice.why
        );
        Ok(cluster)
    }

    async fn connect(&self) -> anyhow::Result<Cluster> {
        Ok(match &self.cluster {
            Some(url) => self
                .credentials
                .connect(url)
                .await?
                .with_reconnect_timeout(self.reconnect.reconnect_timeout),
            None => {
                let mut local = LocalConfig {
                    simulate_gpus: self.simulate_gpus.clone(),
                    ..LocalConfig::default()
                };
                local.models.s3.endpoint = self.s3_endpoint.clone();
                Cluster::local(local).await?
            }
        })
    }
}

/// A bar on a terminal; a log line every few seconds otherwise.
pub fn progress_reporter(job: &'static str) -> impl FnMut(Progress) + Send {
    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            // Speed and ETA are this run's (`Progress::docs_per_second`): indicatif's own
            // would count the documents a resumed run found done as if just embedded.
            indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} records  {msg}")
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
        let speed = match progress.generated_tokens {
            0 => format!("{rate:.1} records/s"),
            _ => format!(
                "{rate:.1} records/s  {:.1} tokens/s",
                progress.tokens_per_second()
            ),
        };
        match &bar {
            Some(bar) => {
                bar.set_length(progress.total_docs);
                bar.set_position(shown);
                bar.set_message(format!("{speed}  ETA {eta}"));
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
                    computed = shown,
                    total = progress.total_docs,
                    reused = progress.reused_docs,
                    docs_per_s = format!("{rate:.1}"),
                    tokens_per_s = format!("{:.1}", progress.tokens_per_second()),
                    eta_s = progress.eta().map(|eta| eta.as_secs()),
                    job,
                    "progress"
                );
            }
            None => {}
        }
    }
}
