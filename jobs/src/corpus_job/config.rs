//! What every corpus job is given ([`CorpusJobConfig`]) and what a bad record does
//! ([`BadRecordPolicy`]). `embed` and `generate` wrap it in configs of their own.

use std::collections::BTreeMap;
use std::time::Duration;

use resident_proto::prices::PriceTable;
use resident_sdk::Cluster;

use super::error::JobError;
use super::journal::CompactionPolicy;
use super::reader::ReaderOptions;
use super::record_limit::RecordLimit;
use crate::pools::PoolRetention;
use crate::storage::{Location, S3Options};

/// What a bad record (not JSON, no text field, over the size limits) does to the job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BadRecordPolicy {
    /// Listed in the report and left out of the output.
    Skip,
    /// Stops the job, naming the record.
    Fail,
}

/// 64 GiB of vectors: 16M documents of 1,024 f32 dimensions. Past that, the shards and
/// `index.json` are the output.
pub const DEFAULT_MERGE_MAX_BYTES: u64 = 64 << 30;

/// What every corpus job is given: input, output, model, pool, chunks, bad records,
/// prices. `embed` wraps it in [`EmbedJobConfig`](super::EmbedJobConfig), `generate` in [`GenerateJobConfig`](super::GenerateJobConfig).
#[derive(Clone, Debug)]
pub struct CorpusJobConfig {
    /// A local file or directory, or an `s3://bucket/prefix` of corpus files.
    pub input: Location,
    /// A local directory or an `s3://bucket/prefix`.
    pub output: Location,
    /// How to reach S3 for `s3://` locations.
    pub s3: S3Options,
    /// The model: a directory, a Hugging Face id or `s3://`.
    pub model: String,
    /// Actors; `None` = one per alive node's CPU core (CPU) or one per GPU slot.
    pub replicas: Option<u32>,
    /// GPUs per actor (0 = CPU actors); `None` = the GPUs of the nodes the job may use,
    /// one actor each, or CPU actors where they have none ([`resident_sdk::choose_device`]).
    pub gpus_per_actor: Option<f64>,
    /// VRAM each GPU actor reserves, in GiB.
    pub vram_gib_per_actor: f64,
    /// Only nodes with these labels run the job.
    pub selector: BTreeMap<String, String>,
    /// `None` = planned from measured docs/s.
    pub chunk_size: Option<usize>,
    /// What a malformed record does: skipped (and reported), or the job fails.
    pub on_bad_record: BadRecordPolicy,
    /// Write the merged files (`--no-merge`: the shards and `index.json` only).
    pub merge: bool,
    /// Past this many bytes of merged data the merged files are not written: the shards
    /// plus `index.json` are the output.
    pub merge_max_bytes: u64,
    /// When the manifest's journal is folded into `manifest.json`.
    pub manifest_compaction: CompactionPolicy,
    /// How records are read (id and text fields, kept columns).
    pub reader: ReaderOptions,
    /// What the report prices GPU- and CPU-hours at.
    pub prices: PriceTable,
    /// How long every actor may take to load the model.
    pub load_timeout: Duration,
    /// Whether the pool outlives the job (`--keep-pool`, `--idle-ttl`).
    pub retention: PoolRetention,
    /// The pool's task deadline (`--task-timeout`; `PoolSpec::task_timeout`).
    pub task_timeout: Option<Duration>,
    /// What names the job's pool in place of its output (with its model): jobs given one
    /// key run on one pool (`resident eval`'s tasks, when their actors are the same).
    pub pool_key: Option<String>,
    /// `--limit` as a share of the input's records ([`Self::set_limit`]): made a count in
    /// `reader.limit` when the job starts, once the input is counted.
    pub limit_share: Option<f64>,
}

impl CorpusJobConfig {
    /// A job of `input` through `model` into `output`, every other setting at its default.
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
            manifest_compaction: CompactionPolicy::default(),
            reader: ReaderOptions::default(),
            prices: PriceTable::default(),
            load_timeout: Duration::from_secs(600),
            retention: PoolRetention::default(),
            task_timeout: None,
            pool_key: None,
            limit_share: None,
        }
    }
}

impl CorpusJobConfig {
    /// Reads only the input's first records (`--limit`): a count at once, a share once the
    /// job has counted the input.
    pub fn set_limit(&mut self, limit: Option<RecordLimit>) {
        (self.reader.limit, self.limit_share) = match limit {
            None => (None, None),
            Some(RecordLimit::Records(count)) => (Some(count), None),
            Some(RecordLimit::Share(share)) => (None, Some(share)),
        };
    }

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
