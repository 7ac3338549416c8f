//! `resident embed`: embed a corpus end to end on a cluster, resumably.
//!
//! 1. Check the input, the output directory and the manifest of an earlier run (a changed
//!    input or model under the same output is refused); list bad records.
//! 2. Create the embed pool and wait until every actor has loaded the model.
//! 3. Pick the chunk size (the earlier run's, `--chunk-size`, or planned from measured
//!    docs/s), then stream chunks to the pool; each finished chunk becomes a shard, written
//!    atomically and recorded by one synced line in the manifest's journal, which is folded
//!    into `manifest.json` now and then (`manifest_store`). Chunks already recorded are
//!    skipped.
//! 4. Merge the shards into `embeddings.npy` + `ids.jsonl` (streamed; skipped past
//!    `merge_max_bytes`), and write `index.json` and `report.json`.

pub mod duplicates;
pub mod inputs;
pub mod journal;
pub mod manifest_store;
pub mod output;
#[cfg(not(feature = "parquet"))]
#[path = "parquet_off.rs"]
mod parquet_rows;
#[cfg(feature = "parquet")]
mod parquet_rows;
pub mod planner;
mod poison;
pub mod reader;
mod report;
mod results;
pub(crate) mod scan;
pub mod schedule;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use resident_sdk::{Cluster, EmbeddedChunk, SdkError};

use crate::model_pin::{PinnedModel, pin_model};
use crate::pools::{EmbedActors, PoolRetention};
use crate::storage::{Location, S3Client, S3Options};
pub use inputs::InputSet;
use manifest_store::ManifestStore;
use output::OutputDir;
pub use output::OutputDtype;
pub use reader::{BadRecord, ReaderOptions};
pub use report::{PriceTable, Report};
use report::{ReportBuilder, VectorStats};
use results::{BodyPlanner, ChunkVectors, ChunkWriter, PendingChunk};
use schedule::ChunkSchedule;

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

#[derive(Clone, Debug)]
pub struct EmbedJobConfig {
    /// A local file or directory, or an `s3://bucket/prefix` of corpus files.
    pub input: Location,
    /// A local directory or an `s3://bucket/prefix`.
    pub output: Location,
    /// How to reach S3 for `s3://` locations.
    pub s3: S3Options,
    pub model: String,
    /// Actors; `None` = one per alive node's CPU core (CPU) or one per GPU slot.
    pub replicas: Option<u32>,
    pub gpus_per_actor: f64,
    pub vram_gib_per_actor: f64,
    pub selector: BTreeMap<String, String>,
    /// `None` = planned from measured docs/s.
    pub chunk_size: Option<usize>,
    pub dtype: OutputDtype,
    pub on_bad_record: BadRecordPolicy,
    pub merge: bool,
    /// Past this many bytes of vectors the merged files are not written: the shards plus
    /// `index.json` are the output.
    pub merge_max_bytes: u64,
    /// When the manifest's journal is folded into `manifest.json`.
    pub manifest_compaction: journal::CompactionPolicy,
    pub reader: ReaderOptions,
    pub prices: PriceTable,
    pub load_timeout: Duration,
    /// Whether the pool outlives the job (`--keep-pool`, `--idle-ttl`).
    pub retention: PoolRetention,
}

impl EmbedJobConfig {
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
            gpus_per_actor: 0.0,
            vram_gib_per_actor: 2.0,
            selector: BTreeMap::new(),
            chunk_size: None,
            dtype: OutputDtype::F32,
            on_bad_record: BadRecordPolicy::Skip,
            merge: true,
            merge_max_bytes: DEFAULT_MERGE_MAX_BYTES,
            manifest_compaction: journal::CompactionPolicy::default(),
            reader: ReaderOptions::default(),
            prices: PriceTable::default(),
            load_timeout: Duration::from_secs(600),
            retention: PoolRetention::default(),
        }
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

    /// At this run's speed; `None` before any new document is done.
    pub fn eta(&self) -> Option<Duration> {
        let rate = self.docs_per_second();
        (rate > 0.0).then(|| {
            Duration::from_secs_f64(self.total_docs.saturating_sub(self.position()) as f64 / rate)
        })
    }
}

/// Runs the job on `cluster` and returns its report (also written to `report.json`).
pub async fn run_embed_job(
    cluster: &Cluster,
    config: &EmbedJobConfig,
    on_progress: &mut (dyn FnMut(Progress) + Send),
) -> Result<Report, JobError> {
    let started = Instant::now();
    let s3 = match config.input.is_s3() || config.output.is_s3() {
        true => Some(S3Client::connect(&config.s3).await),
        false => None,
    };
    let out = OutputDir::prepare(&config.output, s3.as_ref()).await?;
    let embedded = embed_into(cluster, config, on_progress, &out, s3.as_ref(), started).await;
    // On success and on failure alike: the next run need not wait for a lease to go stale,
    // and the pool frees its GPUs unless kept.
    out.release().await;
    config
        .retention
        .job_ended(cluster, &pool_name(config))
        .await;
    embedded
}

/// The job once its output is claimed.
async fn embed_into(
    cluster: &Cluster,
    config: &EmbedJobConfig,
    on_progress: &mut (dyn FnMut(Progress) + Send),
    out: &OutputDir,
    s3: Option<&S3Client>,
    started: Instant,
) -> Result<Report, JobError> {
    let inputs = InputSet::list(&config.input, s3).await?;
    let model = pin_model(&config.model, &config.s3)
        .await
        .map_err(JobError::Model)?;
    let scan = {
        let (config, inputs) = (config.clone(), inputs.clone());
        let fingerprint = model.fingerprint.clone();
        tokio::task::spawn_blocking(move || scan::scan_input(&config, inputs, fingerprint))
            .await
            .map_err(|e| JobError::Input(format!("reader stopped: {e}")))??
    };
    let mut manifest = scan::open_manifest(out, config, &scan).await?;
    let pool = create_pool(cluster, config, &model).await?;
    let actors = pool.pool.status().await?.actors.len().max(1);

    let total_docs = scan.valid_records;
    let plan_reasoning;
    if manifest.chunk_size == 0 && manifest.chunk_schedule.is_none() {
        match config.chunk_size {
            Some(size) => {
                let dimension = scan::probe_dimension(&pool).await?;
                planner::check_chunk_size(size, dimension).map_err(JobError::ChunkSize)?;
                manifest.chunk_size = size.max(1);
                plan_reasoning = format!("--chunk-size {size}");
            }
            None => {
                let schedule = ChunkSchedule::probing(total_docs, actors);
                plan_reasoning = format!(
                    "probing: {} chunks of {} documents first, whose timings size the rest",
                    schedule.probe_indexes(total_docs).end,
                    schedule.probe_size
                );
                manifest.chunk_schedule = Some(schedule);
            }
        }
    } else {
        if let Some(dimension) = manifest.dim {
            planner::check_chunk_size(manifest.chunk_size, dimension).map_err(|why| {
                JobError::ChunkSize(format!(
                    "this output was started with chunks of {} documents, and {why}; \
                     write to a new --output",
                    manifest.chunk_size
                ))
            })?;
        }
        plan_reasoning = format!(
            "resumed with the earlier run's chunk schedule (body chunks of {})",
            manifest.chunk_size
        );
    }
    tracing::info!(chunk_size = manifest.chunk_size, reasoning = %plan_reasoning, "chunk plan");
    // Checked a few at a time: on S3 each check is a round trip per file.
    let checks: Vec<(output::ShardEntry, Result<bool, JobError>)> =
        futures::stream::iter(std::mem::take(&mut manifest.chunks))
            .map(|entry| async {
                let intact = out.shard_intact(&entry).await;
                (entry, intact)
            })
            .buffered(16)
            .collect()
            .await;
    for (entry, intact) in checks {
        if intact? {
            manifest.chunks.push(entry);
        }
    }
    let reused_chunks = manifest.chunks.len() as u64;
    let done: std::collections::HashSet<u64> = manifest.chunks.iter().map(|c| c.index).collect();
    let done_docs: u64 = manifest
        .chunks
        .iter()
        .map(|c| c.rows + c.crashed.len() as u64)
        .sum();
    let reused_docs = done_docs;
    let file_names: Arc<Vec<String>> =
        Arc::new(inputs.files.iter().map(|f| f.name.clone()).collect());
    let store = ManifestStore::start(out, manifest, config.manifest_compaction).await?;

    // Chunks stream from a reader thread; at most `window` are submitted and unanswered.
    let window = (actors * 3).max(4);
    let pending: Arc<Mutex<HashMap<u64, PendingChunk>>> = Arc::default();
    let (chunks_tx, chunks_rx) = tokio::sync::mpsc::channel::<resident_sdk::TaskPayload>(window);
    let schedule = store.manifest().schedule();
    let expected_tasks = schedule
        .chunk_count(total_docs)
        .saturating_sub(reused_chunks);
    // The body is planned from the first probes this run sends (one per actor), while the
    // others run; a resume that finds every probe done plans at once, without timings.
    let probes_to_run = schedule
        .probe_indexes(total_docs)
        .filter(|index| !done.contains(index))
        .count();
    let probes_to_measure = probes_to_run.min(actors);
    let (plan_tx, plan_rx) = tokio::sync::oneshot::channel();
    // A planned schedule never asks; dropping the sender is then harmless.
    let plan_tx = (!schedule.is_planned()).then_some(plan_tx);
    let producer = scan::spawn_chunk_producer(
        config.clone(),
        inputs,
        schedule.clone(),
        total_docs,
        done,
        scan.duplicate_ordinals.clone(),
        pending.clone(),
        chunks_tx,
        plan_rx,
    );
    let mut writer = ChunkWriter {
        out,
        store,
        body_planner: BodyPlanner {
            schedule: schedule.clone(),
            timings: planner::ProbeTimings::default(),
            plan_tx,
            probes_to_measure,
            actors,
            total_docs,
        },
        plan_reasoning,
        builder: ReportBuilder::default(),
        stats: VectorStats::default(),
        done_docs,
        file_names,
        on_bad_record: config.on_bad_record,
    };
    // A resume that finds every probe done plans at once.
    if let Some(reasoning) = writer.body_planner.plan_if_due(&mut writer.store).await? {
        writer.plan_reasoning = reasoning;
    }
    let payloads = tokio_stream::wrappers::ReceiverStream::new(chunks_rx);
    let options = resident_sdk::SubmitOptions {
        window: window as u32,
        expected_tasks,
        ..Default::default()
    };
    let mut results = pool
        .pool
        .submit_payloads("embed", payloads, options)
        .await?;

    let mut items_running = results.items_running();
    let progress = |done_docs: u64, running_docs: u64| Progress {
        done_docs,
        running_docs,
        total_docs: scan.valid_records,
        reused_docs,
        elapsed: started.elapsed(),
    };
    // Chunks with a record that crashes the model, being embedded one record at a time
    // beside the job (`poison.rs`).
    let mut salvaging = futures::stream::FuturesUnordered::new();
    let mut results_done = false;
    while !(results_done && salvaging.is_empty()) {
        let (chunk, vectors) = tokio::select! {
            output = results.next(), if !results_done => {
                let Some(output) = output else {
                    results_done = true;
                    continue;
                };
                let output = output?;
                let chunk = pending
                    .lock()
                    .expect("pending chunks")
                    .remove(&output.seq)
                    .ok_or_else(|| {
                        JobError::Output(format!("result for unknown task {}", output.seq))
                    })?;
                match &output.output {
                    Err(error) if poison::crashes_the_model(error) => {
                        let pool = pool.pool.clone();
                        salvaging.push(async move {
                            let salvage =
                                poison::embed_one_by_one(&pool, chunk.index, &chunk.payload).await;
                            (chunk, salvage)
                        });
                        continue;
                    }
                    _ => {}
                }
                let embedded =
                    EmbeddedChunk::from_output(output).map_err(|e| JobError::ChunkFailed {
                        index: chunk.index,
                        error: e.to_string(),
                    })?;
                (chunk, ChunkVectors::Whole(embedded))
            }
            Some((chunk, salvage)) = salvaging.next(), if !salvaging.is_empty() => {
                (chunk, ChunkVectors::Salvaged(salvage?))
            }
            Ok(()) = items_running.changed() => {
                let running_docs = *items_running.borrow_and_update();
                on_progress(progress(writer.done_docs, running_docs));
                continue;
            }
        };
        writer.write(chunk, vectors).await?;
        on_progress(progress(writer.done_docs, *items_running.borrow()));
    }
    let ChunkWriter {
        store,
        plan_reasoning,
        builder,
        stats,
        file_names,
        ..
    } = writer;
    producer
        .await
        .map_err(|e| JobError::Input(format!("reader stopped: {e}")))??;
    let missing = pending.lock().expect("pending chunks").len();
    if missing > 0 {
        return Err(JobError::Output(format!(
            "{missing} chunks got no result; rerun the same command to finish them"
        )));
    }
    let (manifest, manifest_writes) = store.finish().await?;
    let merged = output::merge_wanted(config.merge, &manifest, config.merge_max_bytes);
    if merged {
        out.merge(&manifest).await?;
    } else {
        // An earlier run's merged files would not match this output's shards.
        for name in ["embeddings.npy", "ids.jsonl"] {
            out.remove(name).await?;
        }
    }
    out.write_index(&manifest, merged).await?;
    let merge_skipped = match (config.merge, merged) {
        (false, _) => Some("--no-merge".to_owned()),
        (true, false) => Some(format!(
            "the vectors are larger than --merge-max-gib {}: read the shards through index.json",
            config.merge_max_bytes as f64 / (1u64 << 30) as f64
        )),
        (true, true) => None,
    };
    let (bad_records, bad_records_total) = scan::with_crashed_records(
        scan.bad_records,
        scan.bad_records_total,
        &manifest,
        &file_names,
    );
    let actors_info = cluster.list_actors().await?;
    let nodes_info = cluster.list_nodes().await?;
    let report = builder.finish(report::ReportInputs {
        config,
        manifest: &manifest,
        bad_records,
        bad_records_total,
        output: report::OutputSummary {
            merged,
            merge_skipped,
            manifest_writes,
        },
        stats,
        wall: started.elapsed(),
        reused_chunks,
        plan_reasoning,
        pool: pool.pool.name(),
        actors: &actors_info,
        nodes: &nodes_info,
        input_fingerprint: scan.input_fingerprint,
        model_fingerprint: scan.model_fingerprint,
    });
    let json = serde_json::to_vec_pretty(&report).map_err(|e| JobError::Output(e.to_string()))?;
    out.write("report.json", json).await?;
    Ok(report)
}

async fn create_pool(
    cluster: &Cluster,
    config: &EmbedJobConfig,
    model: &PinnedModel,
) -> Result<resident_sdk::EmbedPool, JobError> {
    let replicas = match config.replicas {
        Some(replicas) => replicas,
        None => default_replicas(cluster, config).await?,
    };
    let spec = EmbedActors {
        pool: pool_name(config),
        model: &config.model,
        revision: model.revision.as_deref(),
        replicas,
        gpus_per_actor: config.gpus_per_actor,
        vram_gib_per_actor: config.vram_gib_per_actor,
        selector: &config.selector,
        retention: config.retention,
    }
    .spec();
    match cluster.create_embed_pool(spec, config.load_timeout).await {
        Ok(pool) => Ok(pool),
        Err(error @ SdkError::ActorsFailed { .. }) => Err(JobError::Model(error.to_string())),
        Err(SdkError::Unavailable(message) | SdkError::Timeout(message)) => {
            Err(JobError::Model(message))
        }
        Err(other) => Err(other.into()),
    }
}

/// One actor per CPU core of the matching nodes, or as many as fit the GPUs.
async fn default_replicas(cluster: &Cluster, config: &EmbedJobConfig) -> Result<u32, JobError> {
    let nodes = cluster.list_nodes().await?;
    let matching = nodes.iter().filter(|n| {
        n.alive
            && config
                .selector
                .iter()
                .all(|(k, v)| n.labels.get(k) == Some(v))
    });
    let count: u32 = if config.gpus_per_actor > 0.0 {
        let slots: f64 = matching
            .map(|n| n.gpus.len() as f64 / config.gpus_per_actor)
            .map(f64::floor)
            .sum();
        slots as u32
    } else {
        matching.map(|n| n.cpu_cores.max(1)).sum()
    };
    Ok(count.max(1))
}

/// A pool per output directory, so reruns reuse the resident actors of a long-lived cluster.
fn pool_name(config: &EmbedJobConfig) -> String {
    let key = format!("{}|{}", config.output, config.model);
    format!("embed-{}", &crate::files::sha256_hex(key.as_bytes())[..10])
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
