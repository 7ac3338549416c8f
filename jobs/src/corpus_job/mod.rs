//! Corpus jobs: run a corpus through a pool of resident actors end to end, resumably.
//! `resident embed` writes a vector per record, `resident generate` a completion; both run
//! the same pipeline (`pipeline.rs`), and each adds only its own part (`work.rs`:
//! `embed.rs`, `generate.rs`).
//!
//! 1. Check the input, the output directory and the manifest of an earlier run (a changed
//!    input, model or generation settings under the same output is refused); list bad
//!    records.
//! 2. Create the job's pool and wait until every actor has loaded the model.
//! 3. Pick the chunk size (the earlier run's, `--chunk-size`, or planned from measured
//!    records/s), then stream chunks to the pool; each finished chunk becomes a shard,
//!    written atomically and recorded by one synced line in the manifest's journal, which is
//!    folded into `manifest.json` now and then (`manifest_store`). Chunks already recorded
//!    are skipped.
//! 4. Merge the shards (streamed; skipped past `merge_max_bytes`): `embeddings.npy` +
//!    `ids.jsonl`, or `generations.jsonl`. Write `index.json` and `report.json`.

pub mod chat_input;
pub mod duplicates;
pub mod embed;
pub mod generate;
pub mod inputs;
pub mod journal;
pub mod manifest_store;
mod openai_batch;
pub mod output;
#[cfg(not(feature = "parquet"))]
#[path = "parquet_out_off.rs"]
mod parquet_out;
#[cfg(feature = "parquet")]
mod parquet_out;
#[cfg(not(feature = "parquet"))]
#[path = "parquet_off.rs"]
mod parquet_rows;
#[cfg(feature = "parquet")]
mod parquet_rows;
mod pipeline;
pub mod planner;
mod poison;
pub mod prompt;
pub mod reader;
mod report;
mod results;
pub(crate) mod scan;
pub mod schedule;
pub mod vectors;
pub mod work;

use std::collections::BTreeMap;
use std::time::Duration;

use resident_sdk::{Cluster, SdkError};

use crate::pools::PoolRetention;
use crate::storage::{Location, S3Options};
pub use chat_input::PromptInput;
pub use embed::{EmbedJobConfig, EmbedWork, Normalization, VectorFormat};
pub use generate::{GenerateJobConfig, GenerateWork, GenerationOutput, GenerationTally};
pub use inputs::InputSet;
pub use output::OutputDtype;
pub use prompt::PromptTemplate;
pub use reader::{BadRecord, ReaderOptions};
pub use report::{EmbedFigures, GenerateFigures, JobReport, PriceTable, Report, WindowFigures};
pub use resident_sdk::{Prompt, WindowSplit, Windows};
pub use vectors::QuantizationRanges;
use work::ChunkWork;

#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error("input: {0}")]
    Input(String),
    #[error("output: {0}")]
    Output(String),
    #[error(
        "bad record at {file}:{line}: {reason} (use --on-bad-record skip to skip such records)"
    )]
    BadRecord {
        file: String,
        line: u64,
        reason: String,
    },
    #[error("{0}")]
    Mismatch(String),
    #[error("model did not load: {0}")]
    Model(String),
    /// A chunk size whose results would not fit in one message.
    #[error("{0}")]
    ChunkSize(String),
    #[error("chunk {index} failed: {error}")]
    ChunkFailed { index: u64, error: String },
    #[error(transparent)]
    Cluster(#[from] SdkError),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BadRecordPolicy {
    Skip,
    Fail,
}

/// 64 GiB of vectors: 16M documents of 1,024 f32 dimensions. Past that, the shards and
/// `index.json` are the output.
pub const DEFAULT_MERGE_MAX_BYTES: u64 = 64 << 30;

/// What every corpus job is given: input, output, model, pool, chunks, bad records,
/// prices. `embed` wraps it in [`EmbedJobConfig`], `generate` in [`GenerateJobConfig`].
#[derive(Clone, Debug)]
pub struct CorpusJobConfig {
    /// A local file or directory, or an `s3://bucket/prefix` of corpus files.
    pub input: Location,
    /// A local directory or an `s3://bucket/prefix`.
    pub output: Location,
    /// How to reach S3 for `s3://` locations.
    pub s3: S3Options,
    pub model: String,
    /// Actors; `None` = one per alive node's CPU core (CPU) or one per GPU slot.
    pub replicas: Option<u32>,
    /// GPUs per actor (0 = CPU actors); `None` = the GPUs of the nodes the job may use,
    /// one actor each, or CPU actors where they have none ([`resident_sdk::choose_device`]).
    pub gpus_per_actor: Option<f64>,
    pub vram_gib_per_actor: f64,
    pub selector: BTreeMap<String, String>,
    /// `None` = planned from measured docs/s.
    pub chunk_size: Option<usize>,
    pub on_bad_record: BadRecordPolicy,
    pub merge: bool,
    /// Past this many bytes of merged data the merged files are not written: the shards
    /// plus `index.json` are the output.
    pub merge_max_bytes: u64,
    /// When the manifest's journal is folded into `manifest.json`.
    pub manifest_compaction: journal::CompactionPolicy,
    pub reader: ReaderOptions,
    pub prices: PriceTable,
    pub load_timeout: Duration,
    /// Whether the pool outlives the job (`--keep-pool`, `--idle-ttl`).
    pub retention: PoolRetention,
    /// The pool's task deadline (`--task-timeout`; `PoolSpec::task_timeout`).
    pub task_timeout: Option<Duration>,
}

impl CorpusJobConfig {
    pub fn new(
        input: impl Into<Location>,
        model: impl Into<String>,
        output: impl Into<Location>,
    ) -> Self {
        Self {
            input: input.into(),
            output: output.into(),
            s3: S3Options::default(),
            model: model.into(),
            replicas: None,
            gpus_per_actor: None,
            vram_gib_per_actor: 2.0,
            selector: BTreeMap::new(),
            chunk_size: None,
            on_bad_record: BadRecordPolicy::Skip,
            merge: true,
            merge_max_bytes: DEFAULT_MERGE_MAX_BYTES,
            manifest_compaction: journal::CompactionPolicy::default(),
            reader: ReaderOptions::default(),
            prices: PriceTable::default(),
            load_timeout: Duration::from_secs(600),
            retention: PoolRetention::default(),
            task_timeout: None,
        }
    }
}

impl CorpusJobConfig {
    /// GPUs per actor once chosen ([`Self::choose_device`]); 0 = CPU actors.
    pub(crate) fn gpus(&self) -> f64 {
        self.gpus_per_actor.unwrap_or(0.0)
    }

    /// Fills in `gpus_per_actor` when it is unset (the cluster's GPUs when the nodes this
    /// job may use have any) and says what it chose and why; `knob` names the setting in
    /// the caller's words for that sentence (`--gpus-per-actor`).
    pub async fn choose_device(
        &mut self,
        cluster: &Cluster,
        knob: &str,
    ) -> Result<resident_sdk::DeviceChoice, JobError> {
        let choice = cluster
            .choose_device(self.gpus_per_actor, self.replicas, &self.selector, knob)
            .await?;
        self.gpus_per_actor = Some(choice.gpus_per_actor);
        Ok(choice)
    }
}

/// Where the job stands, for progress bars and logs.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    /// Documents whose vectors are written (this run's and reused ones).
    pub done_docs: u64,
    /// Documents embedded so far inside chunks still running (actors report after each
    /// model batch): the bar moves before a chunk ends.
    pub running_docs: u64,
    pub total_docs: u64,
    /// Of `done_docs`, those an earlier run embedded (a resume): not this run's speed.
    pub reused_docs: u64,
    pub elapsed: Duration,
    /// Tokens generated by this run, inside running chunks too (`generate`; 0 for `embed`).
    pub generated_tokens: u64,
}

impl Progress {
    /// Documents embedded: written, plus those done inside running chunks (at most the
    /// total).
    pub fn position(&self) -> u64 {
        (self.done_docs + self.running_docs).min(self.total_docs.max(self.done_docs))
    }

    /// This run's documents per second (reused ones left out).
    pub fn docs_per_second(&self) -> f64 {
        self.position().saturating_sub(self.reused_docs) as f64
            / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Tokens generated per second by this run.
    pub fn tokens_per_second(&self) -> f64 {
        self.generated_tokens as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// At this run's speed; `None` before any new document is done.
    pub fn eta(&self) -> Option<Duration> {
        let rate = self.docs_per_second();
        (rate > 0.0).then(|| {
            Duration::from_secs_f64(self.total_docs.saturating_sub(self.position()) as f64 / rate)
        })
    }
}

/// Runs `resident embed` on `cluster` and returns its report (also written to
/// `report.json`).
pub async fn run_embed_job(
    cluster: &Cluster,
    config: &EmbedJobConfig,
    on_progress: &mut (dyn FnMut(Progress) + Send),
) -> Result<Report, JobError> {
    let mut corpus = config.corpus.clone();
    corpus.reader.keep_fields = config.embedding.keep_columns.clone();
    pipeline::run_job(cluster, &corpus, &config.embedding, on_progress).await
}

/// Runs `resident generate` on `cluster` and returns its report (also written to
/// `report.json`).
pub async fn run_generate_job(
    cluster: &Cluster,
    config: &GenerateJobConfig,
    on_progress: &mut (dyn FnMut(Progress) + Send),
) -> Result<JobReport<GenerateFigures>, JobError> {
    pipeline::run_job(cluster, &config.corpus, &config.generation, on_progress).await
}

/// A pool per job, output directory and model, so reruns reuse the resident actors of a
/// long-lived cluster.
fn pool_name<W: ChunkWork>(config: &CorpusJobConfig) -> String {
    let key = format!("{}|{}", config.output, config.model);
    format!(
        "{}-{}",
        W::JOB,
        &crate::files::sha256_hex(key.as_bytes())[..10]
    )
}

/// A pool that could not be made ready, as the job's error: a model that did not load is a
/// model error.
fn pool_error(error: SdkError) -> JobError {
    match error {
        error @ SdkError::ActorsFailed { .. } => JobError::Model(error.to_string()),
        SdkError::Unavailable(message) | SdkError::Timeout(message) => JobError::Model(message),
        other => other.into(),
    }
}

#[cfg(test)]
mod progress_tests {
    use super::*;

    #[test]
    fn after_a_resume_speed_and_eta_count_only_new_documents() {
        let progress = Progress {
            running_docs: 0,
            done_docs: 700,
            total_docs: 1000,
            reused_docs: 500,
            elapsed: Duration::from_secs(10),
            generated_tokens: 0,
        };
        assert!((progress.docs_per_second() - 20.0).abs() < 1e-9);
        assert_eq!(progress.eta(), Some(Duration::from_secs(15)));
        let fresh = Progress {
            done_docs: 500,
            ..progress
        };
        assert_eq!(fresh.eta(), None, "nothing new yet");
    }

    #[test]
    fn documents_inside_running_chunks_move_the_position_and_the_speed() {
        let progress = Progress {
            done_docs: 0,
            running_docs: 300,
            total_docs: 1000,
            reused_docs: 0,
            elapsed: Duration::from_secs(10),
            generated_tokens: 0,
        };
        assert_eq!(progress.position(), 300);
        assert!((progress.docs_per_second() - 30.0).abs() < 1e-9);
        let overshoot = Progress {
            done_docs: 900,
            running_docs: 300,
            ..progress
        };
        assert_eq!(overshoot.position(), 1000, "never past the total");
    }
}
