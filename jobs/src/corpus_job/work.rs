//! What differs between corpus jobs: what a chunk asks of the pool, how its answer is read,
//! and what a shard and the merged output hold. The pipeline (`mod.rs`, `scan.rs`,
//! `results.rs`, `poison.rs`, `output.rs`) does everything else the same way for every
//! job: read, check, plan chunks, dispatch, shard, journal, merge and report.

use std::future::Future;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use resident_sdk::{ActorId, Bytes, Cluster, NodeId, Pool, RowWindow, SdkError, TaskOutput};

use super::config::CorpusJobConfig;
use super::error::JobError;
use super::manifest::Manifest;
use super::output::MergeLayout;
use super::reader::{Kept, Record};
use super::shard_rows::ShardRows;
use crate::model_pin::PinnedModel;

/// One answered task, read: who computed it, and the work's data for its records.
#[derive(Clone, Debug)]
pub struct Piece<T> {
    /// Records it answers (its data may have more rows: a record's windows).
    pub rows: usize,
    pub actor_id: ActorId,
    pub node_id: NodeId,
    /// The actor's time on it.
    pub micros: u64,
    /// The content fingerprint of the model that computed it ("" when the kind reports
    /// none): every chunk of an output must come from one model.
    pub model_fingerprint: String,
    pub data: T,
}

/// One job's own part of the pipeline.
pub trait ChunkWork: Clone + Send + Sync + 'static {
    /// What one answered task holds, read.
    type Data: Send + 'static;
    /// This work's tallies, added up over the pieces this run computed.
    type Tally: Default + Send;
    /// This work's own figures in `report.json`.
    type Figures: Serialize + DeserializeOwned + Clone + std::fmt::Debug + Send;
    /// Names the job's pool and tasks: `embed`, `generate`.
    const JOB: &'static str;
    /// What its output holds, for messages: `embeddings`, `generations`.
    const OUTPUT: &'static str;
    /// What its output depends on besides the input (see [`Self::settings_fingerprint`]),
    /// for messages: `model`; `model, prompt or decoding parameters`.
    const SETTINGS: &'static str;
    const LAYOUT: MergeLayout;

    /// What this run's merge writes: [`Self::LAYOUT`] unless the work's settings choose
    /// another (embed: `--format parquet`).
    fn layout(&self) -> MergeLayout {
        Self::LAYOUT
    }

    /// Whether the actors report progress inside a chunk in records (embed) rather than in
    /// generated tokens (generate).
    const RUNNING_ITEMS_ARE_RECORDS: bool;

    /// What an output's shards depend on besides the input: the model's fingerprint, and
    /// whatever else of this work changes the output (generate: the prompt and decoding
    /// parameters). A resume under a different one is refused.
    fn settings_fingerprint(&self, model_fingerprint: &str) -> String {
        model_fingerprint.to_owned()
    }

    /// The fewest records a planned chunk holds (the planner's own floor when smaller), for
    /// actors on GPUs when `on_gpus`.
    fn min_chunk_records(&self, _on_gpus: bool) -> usize {
        0
    }

    /// Actors on a CPU node of `cores` cores when `--replicas` does not say: one per core.
    fn cpu_actors_per_node(&self, cores: u32) -> u32 {
        cores
    }

    /// Creates the job's pool of `replicas` actors (or resizes one of that name) and waits
    /// until every actor has loaded `model`.
    fn create_pool(
        &self,
        cluster: &Cluster,
        config: &CorpusJobConfig,
        model: &PinnedModel,
        replicas: u32,
    ) -> impl Future<Output = Result<Pool, JobError>> + Send;

    /// How vectors are stored (`--precision`; float32 for works that write none).
    fn output_dtype(&self) -> super::OutputDtype {
        super::OutputDtype::F32
    }

    /// Records from the start of a corpus of `total_docs` that [`Self::prepare_output`]
    /// wants (embed: those that calibrate int8 ranges, when the manifest has none yet).
    fn calibration_records(&self, manifest: &Manifest, total_docs: u64) -> usize {
        let _ = (manifest, total_docs);
        0
    }

    /// Before the first chunk: checks this work's settings against the loaded model and
    /// records in `manifest` what every shard needs (embed: int8 ranges from `sample`, the
    /// corpus's first [`Self::calibration_records`] records).
    fn prepare_output(
        &self,
        pool: &Pool,
        sample: Vec<Record>,
        manifest: &mut Manifest,
    ) -> impl Future<Output = Result<(), JobError>> + Send {
        let _ = (pool, sample, manifest);
        async { Ok(()) }
    }

    /// Refuses an output started under other settings of this work (embed: `--precision`).
    fn check_resume(&self, manifest: &Manifest, place: &str) -> Result<(), JobError> {
        let _ = (manifest, place);
        Ok(())
    }

    /// Refuses a `--chunk-size` given by hand whose answers would not fit one message.
    fn check_chunk_size(
        &self,
        pool: &Pool,
        size: usize,
    ) -> impl Future<Output = Result<(), JobError>> + Send {
        let _ = (pool, size);
        async { Ok(()) }
    }

    /// One chunk's records as one task's payload.
    fn request(&self, records: Vec<Record>) -> Bytes;

    /// A chunk's payload as one payload per record, in order: to find the records that
    /// crash the model.
    fn split(&self, payload: &[u8]) -> Result<Vec<Bytes>, String>;

    /// Reads an answered task.
    fn read(&self, output: TaskOutput) -> Result<Piece<Self::Data>, SdkError>;

    /// When this work cut its records' texts into windows (embed `--split`), a row per
    /// window of `pieces`, in order: its record (the index among the pieces' records) and
    /// where in the text it lies. Empty when each record is one row.
    fn row_windows(&self, pieces: &[Piece<Self::Data>]) -> Vec<RowWindow> {
        let _ = pieces;
        Vec::new()
    }

    /// Its records' carried fields as the shard's files write them, after the tallies
    /// have read them by field (embed: each `--keep-columns FIELD=NAME` under its name).
    fn kept_as_written(&self, carried: Vec<Kept>) -> Vec<Kept> {
        carried
    }

    /// Adds a piece to the tallies; `kept` holds its records' carried fields, in order
    /// (empty when none are carried).
    fn tally(&self, tally: &mut Self::Tally, piece: &Piece<Self::Data>, kept: &[Kept]);

    /// Adds one chunk's tallies to the run's.
    fn merge_tally(into: &mut Self::Tally, chunk: Self::Tally);

    /// What of one chunk's tallies the report counts over the whole output, reused chunks
    /// too, as the manifest keeps it beside the chunk (generate: its answers against the
    /// records' right answers; embed: its vectors' norms); `None` when the report counts
    /// this run's chunks only.
    fn lasting_counts(&self, chunk: &Self::Tally) -> Option<serde_json::Value>;

    /// Tokens generated so far, by the tallies (for the progress line).
    fn generated_tokens(tally: &Self::Tally) -> u64 {
        let _ = tally;
        0
    }

    /// The report's figures at the job's end.
    fn figures(&self, tally: Self::Tally, manifest: &Manifest, wall: Duration) -> Self::Figures;

    /// The data file of chunk `index`'s shard: its file name and bytes, from its pieces in
    /// record order (`rows`: an id per row, and the carried fields). May record what every
    /// shard shares in `manifest` (embed: the dimension).
    fn shard_data(
        &self,
        index: u64,
        pieces: &[Piece<Self::Data>],
        rows: &ShardRows<'_>,
        manifest: &mut Manifest,
    ) -> Result<(String, Vec<u8>), JobError>;

    /// The merged data file when no shard has a row, for layouts that need more than
    /// nothing (Parquet: a file with the columns and no rows, so readers open it).
    fn no_rows_data(&self, _manifest: &Manifest) -> Result<Vec<u8>, JobError> {
        Ok(Vec::new())
    }

    /// Bytes the merged data file would have, to skip a merge past `--merge-max-gib`.
    fn merged_bytes(manifest: &Manifest) -> u64;
}

/// A pool per job, output directory and model, so reruns reuse the resident actors of a
/// long-lived cluster.
pub(super) fn pool_name<W: ChunkWork>(config: &CorpusJobConfig) -> String {
    let key = match &config.pool_key {
        Some(key) => format!("{key}|{}", config.model),
        None => format!("{}|{}", config.output, config.model),
    };
    format!(
        "{}-{}",
        W::JOB,
        &crate::files::sha256_hex(key.as_bytes())[..10]
    )
}

/// A pool that could not be made ready, as the job's error: a model that did not load is a
/// model error.
pub(super) fn pool_error(error: SdkError) -> JobError {
    match error {
        error @ SdkError::ActorsFailed { .. } => JobError::Model(error.to_string()),
        SdkError::Unavailable(message) | SdkError::Timeout(message) => JobError::Model(message),
        other => other.into(),
    }
}
