//! The pipeline every corpus job runs (see `mod.rs`), generic over the job's own part
//! ([`ChunkWork`]).

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use resident_sdk::{Cluster, Pool, SubmitOptions};

use super::manifest::{Manifest, ShardEntry};
use super::manifest_store::ManifestStore;
use super::output::{OutputDir, merge_wanted};
use super::poison::RecoveryQueue;
use super::reader::{Item, Record, RecordReader};
use super::report::{self, JobReport, ReportBuilder};
use super::results::{BodyPlanner, ChunkAnswer, ChunkWriter, PendingChunk};
use super::scan::{self, Scan};
use super::schedule::ChunkSchedule;
use super::work::ChunkWork;
use super::work::pool_name;
use super::{CorpusJobConfig, InputSet, JobError, Progress, planner};
use crate::model_pin::pin_model;
use crate::storage::S3Client;
use crate::usage::{UsageReading, held_between, read_pool_usage};

/// One run of a job, once its output is claimed.
struct Job<'a, W> {
    cluster: &'a Cluster,
    config: &'a CorpusJobConfig,
    work: &'a W,
    out: &'a OutputDir,
    s3: Option<&'a S3Client>,
    started: Instant,
}

/// Runs the job on `cluster` and returns its report (also written to `report.json`).
pub(super) async fn run_job<W: ChunkWork>(
    cluster: &Cluster,
    config: &CorpusJobConfig,
    work: &W,
    on_progress: &mut (dyn FnMut(Progress) + Send),
) -> Result<JobReport<W::Figures>, JobError> {
    let started = Instant::now();
    let mut config = Cow::Borrowed(config);
    if config.gpus_per_actor.is_none() {
        let choice = (config.to_mut())
            .choose_device(cluster, "gpus_per_actor")
            .await?;
        tracing::info!(why = %choice.why, "chose the actors' device");
    }
    let s3 = match config.input.is_s3() || config.output.is_s3() {
        true => Some(S3Client::connect(&config.s3).await),
        false => None,
    };
    if config.limit_share.is_some() {
        scan::resolve_limit_share(config.to_mut(), s3.as_ref()).await?;
    }
    let config = config.as_ref();
    let out = OutputDir::prepare(&config.output, s3.as_ref()).await?;
    let job = Job {
        cluster,
        config,
        work,
        out: &out,
        s3: s3.as_ref(),
        started,
    };
    let finished = job.run(on_progress).await;
    // On success and on failure alike: the next run need not wait for a lease to go stale,
    // and the pool frees its GPUs unless kept.
    out.release().await;
    config
        .retention
        .job_ended(cluster, &pool_name::<W>(config))
        .await;
    finished
}

/// What the job found before its first chunk: the input and the ready pool (the manifest
/// goes its own way, to its store).
struct Prepared {
    inputs: InputSet,
    scan: Scan,
    pool: Pool,
    actors: usize,
    /// From the job's start until its pool was ready (the input scanned, the model pinned,
    /// the actors loaded).
    ready: Duration,
    /// What the pool had held before this run (a pool kept from an earlier one): the
    /// report bills what it holds beyond that.
    held_before: UsageReading,
}

/// What dispatching left for the end of the job.
struct Dispatched<'a, T> {
    store: ManifestStore<'a>,
    plan_reasoning: String,
    builder: ReportBuilder,
    tally: T,
    file_names: Arc<Vec<String>>,
    reused_chunks: u64,
}

impl<'a, W: ChunkWork> Job<'a, W> {
    async fn run(
        &self,
        on_progress: &mut (dyn FnMut(Progress) + Send),
    ) -> Result<JobReport<W::Figures>, JobError> {
        let (prepared, mut manifest) = self.prepare().await?;
        self.prepare_output(&prepared, &mut manifest).await?;
        let plan_reasoning = self.plan_chunks(&prepared, &mut manifest).await?;
        keep_intact_shards(self.out, &mut manifest).await?;
        let dispatched = self
            .dispatch(&prepared, manifest, plan_reasoning, on_progress)
            .await?;
        self.finish(prepared, dispatched).await
    }

    /// Lists and scans the input, pins the model, opens the manifest, readies the pool.
    async fn prepare(&self) -> Result<(Prepared, Manifest), JobError> {
        let config = self.config;
        let inputs = InputSet::list(&config.input, self.s3).await?;
        let model = pin_model(&config.model, &config.s3)
            .await
            .map_err(JobError::Model)?;
        let mut fingerprint = self.work.settings_fingerprint(&model.fingerprint);
        if let Some(reading) = config.reader.output_settings() {
            fingerprint = crate::files::sha256_hex(format!("{fingerprint}{reading}").as_bytes());
        }
        let scan = {
            let (config, inputs) = (config.clone(), inputs.clone());
            tokio::task::spawn_blocking(move || scan::scan_input(&config, inputs, fingerprint))
                .await
                .map_err(|e| JobError::Input(format!("reader stopped: {e}")))??
        };
        let manifest = scan::open_manifest(self.out, config, self.work, &scan).await?;
        let replicas = match config.replicas {
            Some(replicas) => replicas,
            None => {
                self.cluster
                    .default_replicas(&config.selector, config.gpus(), |cores| {
                        self.work.cpu_actors_per_node(cores)
                    })
                    .await?
            }
        };
        let held_before = read_pool_usage(self.cluster, &pool_name::<W>(config)).await?;
        let pool = self
            .work
            .create_pool(self.cluster, config, &model, replicas)
            .await?;
        let actors = pool.status().await?.actors.len().max(1);
        let prepared = Prepared {
            inputs,
            scan,
            pool,
            actors,
            ready: self.started.elapsed(),
            held_before,
        };
        Ok((prepared, manifest))
    }

    /// Lets the work check its settings on the ready pool and record what every shard needs
    /// (reading the corpus's first records for it when it asks).
    async fn prepare_output(
        &self,
        prepared: &Prepared,
        manifest: &mut Manifest,
    ) -> Result<(), JobError> {
        let wanted = self
            .work
            .calibration_records(manifest, prepared.scan.valid_records);
        let sample = match wanted {
            0 => Vec::new(),
            _ => {
                let reader = RecordReader::new(prepared.inputs.clone(), self.config.reader.clone());
                tokio::task::spawn_blocking(move || first_records(reader, wanted))
                    .await
                    .map_err(|e| JobError::Input(format!("reader stopped: {e}")))??
            }
        };
        self.work
            .prepare_output(&prepared.pool, sample, manifest)
            .await
    }

    /// Settles how the corpus is cut into chunks, and says why.
    async fn plan_chunks(
        &self,
        prepared: &Prepared,
        manifest: &mut Manifest,
    ) -> Result<String, JobError> {
        let total_docs = prepared.scan.valid_records;
        let reasoning = if manifest.chunk_size == 0 && manifest.chunk_schedule.is_none() {
            match self.config.chunk_size {
                Some(size) => {
                    self.work.check_chunk_size(&prepared.pool, size).await?;
                    manifest.chunk_size = size.max(1);
                    format!("--chunk-size {size}")
                }
                None => {
                    let schedule = ChunkSchedule::probing(
                        total_docs,
                        prepared.actors,
                        self.work.min_chunk_records(self.config.gpus() > 0.0),
                    );
                    let reasoning = format!(
                        "probing: {} first, whose timings size the rest",
                        schedule.probes(total_docs)
                    );
                    manifest.chunk_schedule = Some(schedule);
                    reasoning
                }
            }
        } else {
            if let Some(dimension) = manifest.dim {
                planner::check_chunk_size(manifest.chunk_size, dimension).map_err(|why| {
                    JobError::ChunkSize(format!(
                        "this output was started with chunks of {} records, and {why}; \
                         write to a new --output",
                        manifest.chunk_size
                    ))
                })?;
            }
            format!(
                "resumed with the earlier run's chunk schedule ({})",
                manifest.schedule().describe(total_docs)
            )
        };
        tracing::info!(chunk_size = manifest.chunk_size, %reasoning, "chunk plan");
        Ok(reasoning)
    }

    /// Streams the chunks not done yet to the pool and writes each answer as a shard.
    async fn dispatch(
        &self,
        prepared: &Prepared,
        manifest: Manifest,
        plan_reasoning: String,
        on_progress: &mut (dyn FnMut(Progress) + Send),
    ) -> Result<Dispatched<'a, W::Tally>, JobError> {
        let total_docs = prepared.scan.valid_records;
        let (store, found) = self.open_store(prepared, manifest).await?;
        // Chunks stream from a reader thread; at most `window` are submitted and unanswered.
        let actors = prepared.actors;
        let window = (actors * 3).max(4);
        let pending: Arc<Mutex<HashMap<u64, PendingChunk>>> = Arc::default();
        let schedule = store.manifest().schedule();
        let expected_tasks = schedule
            .chunk_count(total_docs)
            .saturating_sub(found.reused_chunks);
        let producer = self.start_producer(prepared, &schedule, found.done, &pending, window);
        let mut writer = ChunkWriter {
            out: self.out,
            work: self.work,
            store,
            body_planner: BodyPlanner {
                schedule,
                timings: planner::ProbeTimings::default(),
                plan_tx: producer.plan_tx,
                probes_to_measure: producer.probes_to_run.min(actors),
                actors,
                total_docs,
            },
            plan_reasoning,
            builder: ReportBuilder::default(),
            tally: W::Tally::default(),
            done_docs: found.done_docs,
            file_names: found.file_names.clone(),
            on_bad_record: self.config.on_bad_record,
        };
        // A resume that finds every probe done plans at once.
        if let Some(reasoning) = writer.body_planner.plan_if_due(&mut writer.store).await? {
            writer.plan_reasoning = reasoning;
        }
        let options = SubmitOptions {
            window: window as u32,
            expected_tasks,
            ..Default::default()
        };
        let payloads = tokio_stream::wrappers::ReceiverStream::new(producer.chunks);
        let results = prepared
            .pool
            .submit_payloads(W::JOB, payloads, options)
            .await?;
        let clock = ProgressClock {
            total_docs,
            reused_docs: found.done_docs,
            started: self.started,
        };
        let answers = Answers {
            work: self.work,
            pool: &prepared.pool,
            pending: &pending,
        };
        (answers.write_all(results, &mut writer, clock, on_progress)).await?;
        producer
            .reader
            .await
            .map_err(|e| JobError::Input(format!("reader stopped: {e}")))??;
        let missing = pending.lock().expect("pending chunks").len();
        dispatched(writer, found.file_names, found.reused_chunks, missing)
    }

    /// Hands the manifest to its store, and says what earlier runs finished.
    async fn open_store(
        &self,
        prepared: &Prepared,
        manifest: Manifest,
    ) -> Result<(ManifestStore<'a>, FoundDone), JobError> {
        let found = FoundDone {
            reused_chunks: manifest.chunks.len() as u64,
            done: manifest.chunks.iter().map(|c| c.index).collect(),
            done_docs: manifest.chunks.iter().map(ShardEntry::records).sum(),
            file_names: Arc::new(
                prepared
                    .inputs
                    .files
                    .iter()
                    .map(|f| f.name.clone())
                    .collect(),
            ),
        };
        let store =
            ManifestStore::start(self.out, manifest, self.config.manifest_compaction).await?;
        Ok((store, found))
    }

    /// Starts the reader thread that cuts the chunks not `done` and sends them, at most
    /// `window` ahead.
    fn start_producer(
        &self,
        prepared: &Prepared,
        schedule: &ChunkSchedule,
        done: HashSet<u64>,
        pending: &Arc<Mutex<HashMap<u64, PendingChunk>>>,
        window: usize,
    ) -> Producer {
        let total_docs = prepared.scan.valid_records;
        let (chunks_tx, chunks) = tokio::sync::mpsc::channel(window);
        // The body is planned from the first probes this run sends (one per actor), while
        // the others run; a resume that finds every probe done plans at once.
        let probes_to_run = schedule
            .probe_indexes(total_docs)
            .filter(|index| !done.contains(index))
            .count();
        let (plan_tx, plan_rx) = tokio::sync::oneshot::channel();
        // A planned schedule never asks; dropping the sender is then harmless.
        let plan_tx = (!schedule.is_planned()).then_some(plan_tx);
        let reader = scan::spawn_chunk_producer(
            scan::ChunkSource {
                config: self.config.clone(),
                work: self.work.clone(),
                inputs: prepared.inputs.clone(),
                schedule: schedule.clone(),
                total_docs,
                done,
                duplicate_ordinals: prepared.scan.duplicate_ordinals.clone(),
            },
            pending.clone(),
            chunks_tx,
            plan_rx,
        );
        Producer {
            reader,
            chunks,
            plan_tx,
            probes_to_run,
        }
    }

    /// Merges the shards, writes `index.json` and `report.json`.
    async fn finish(
        &self,
        prepared: Prepared,
        dispatched: Dispatched<'_, W::Tally>,
    ) -> Result<JobReport<W::Figures>, JobError> {
        let config = self.config;
        let (manifest, manifest_writes) = dispatched.store.finish().await?;
        let layout = self.work.layout();
        let merged = merge_wanted(
            config.merge,
            W::merged_bytes(&manifest),
            config.merge_max_bytes,
        );
        if merged {
            let no_rows = match layout.parquet {
                true => self.work.no_rows_data(&manifest)?,
                false => Vec::new(),
            };
            self.out.merge(&manifest, &layout, no_rows).await?;
        } else {
            // An earlier run's merged files would not match this output's shards.
            for name in layout.files() {
                self.out.remove(name).await?;
            }
        }
        self.out.write_index(&manifest, merged, &layout).await?;
        let merge_skipped = match (config.merge, merged) {
            (false, _) => Some("--no-merge".to_owned()),
            (true, false) => Some(format!(
                "the output is larger than --merge-max-gib {}: read the shards through \
                 index.json",
                config.merge_max_bytes as f64 / (1u64 << 30) as f64
            )),
            (true, true) => None,
        };
        let scan = prepared.scan;
        let (bad_records, bad_records_total) = scan::with_crashed_records(
            scan.bad_records,
            scan.bad_records_total,
            &manifest,
            &dispatched.file_names,
        );
        let actors_info = self.cluster.list_actors().await?;
        let nodes_info = self.cluster.list_nodes().await?;
        let held_after = UsageReading::of(&prepared.pool.status().await?);
        let wall = self.started.elapsed();
        let figures = self.work.figures(dispatched.tally, &manifest, wall);
        let report = dispatched.builder.finish(report::ReportInputs {
            config,
            manifest: &manifest,
            bad_records,
            bad_records_total,
            output: report::OutputSummary {
                merged,
                merge_skipped,
                manifest_writes,
            },
            figures,
            wall,
            ready: prepared.ready,
            reused_chunks: dispatched.reused_chunks,
            plan_reasoning: dispatched.plan_reasoning,
            pool: prepared.pool.name(),
            actors: &actors_info,
            nodes: &nodes_info,
            held: held_between(&prepared.held_before, &held_after),
            input_fingerprint: scan.input_fingerprint,
            model_fingerprint: scan.model_fingerprint,
        });
        let json =
            serde_json::to_vec_pretty(&report).map_err(|e| JobError::Output(e.to_string()))?;
        self.out.write("report.json", json).await?;
        Ok(report)
    }
}

/// Keeps only the recorded shards still there unchanged; the others are redone. Checked a
/// few at a time: on S3 each check is a round trip per file.
/// The first `count` good records `reader` gives (bad ones passed over).
fn first_records(mut reader: RecordReader, count: usize) -> Result<Vec<Record>, JobError> {
    let mut records = Vec::with_capacity(count);
    while records.len() < count {
        match reader.next_item()? {
            Some(Item::Record(record)) => records.push(record),
            Some(Item::Bad(_)) => {}
            None => break,
        }
    }
    Ok(records)
}

async fn keep_intact_shards(out: &OutputDir, manifest: &mut Manifest) -> Result<(), JobError> {
    let checks: Vec<(ShardEntry, Result<bool, JobError>)> =
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
    Ok(())
}

/// What earlier runs of this output finished.
struct FoundDone {
    reused_chunks: u64,
    done: HashSet<u64>,
    /// Records in finished chunks (written or found to crash the model).
    done_docs: u64,
    /// The input's file names, by index.
    file_names: Arc<Vec<String>>,
}

/// The chunk producer's reader thread, its chunks, and what planning the body needs.
struct Producer {
    reader: tokio::task::JoinHandle<Result<(), JobError>>,
    chunks: tokio::sync::mpsc::Receiver<resident_sdk::TaskPayload>,
    /// Tells the reader the body's plan; `None` for a planned schedule.
    plan_tx: Option<tokio::sync::oneshot::Sender<(usize, usize)>>,
    probes_to_run: usize,
}

/// Where the job stands, from the writer's counts and the running chunks' reports.
#[derive(Clone, Copy)]
struct ProgressClock {
    total_docs: u64,
    reused_docs: u64,
    started: Instant,
}

impl ProgressClock {
    fn at(&self, done_docs: u64, running_docs: u64, generated_tokens: u64) -> Progress {
        Progress {
            done_docs,
            running_docs,
            total_docs: self.total_docs,
            reused_docs: self.reused_docs,
            elapsed: self.started.elapsed(),
            generated_tokens,
        }
    }
}

/// Reads the pool's answers and hands them to the writer.
struct Answers<'a, W> {
    work: &'a W,
    pool: &'a Pool,
    pending: &'a Mutex<HashMap<u64, PendingChunk>>,
}

impl<W: ChunkWork> Answers<'_, W> {
    /// Until every chunk is answered. A chunk with a record that crashes the model is run
    /// again one record at a time beside the job (`poison.rs`).
    async fn write_all(
        &self,
        mut results: resident_sdk::JobStream,
        writer: &mut ChunkWriter<'_, W>,
        clock: ProgressClock,
        on_progress: &mut (dyn FnMut(Progress) + Send),
    ) -> Result<(), JobError> {
        let mut items_running = results.items_running();
        let progress = |writer: &ChunkWriter<'_, W>, running: u64| {
            let (running_docs, running_tokens) = match W::RUNNING_ITEMS_ARE_RECORDS {
                true => (running, 0),
                false => (0, running),
            };
            let tokens = W::generated_tokens(&writer.tally) + running_tokens;
            clock.at(writer.done_docs, running_docs, tokens)
        };
        let mut recovery = RecoveryQueue::new(self.work, self.pool);
        let mut results_done = false;
        while !(results_done && recovery.is_empty()) {
            let (chunk, answer) = tokio::select! {
                output = results.next(), if !results_done => {
                    let Some(output) = output else {
                        results_done = true;
                        recovery.close();
                        continue;
                    };
                    let output = output?;
                    let chunk = self.take_pending(output.seq)?;
                    if let Err(error) = &output.output
                        && super::poison::crashes_the_model(error)
                    {
                        let (index, payload) = (chunk.index, chunk.payload.clone());
                        recovery.add(index, &payload, error.clone(), chunk).await?;
                        continue;
                    }
                    let piece = self.work.read(output).map_err(|e| JobError::ChunkFailed {
                        index: chunk.index,
                        error: e.to_string(),
                    })?;
                    (chunk, ChunkAnswer::Whole(piece))
                }
                Some((chunk, salvage)) = recovery.next(), if !recovery.is_empty() => {
                    (chunk, ChunkAnswer::Salvaged(salvage?))
                }
                Ok(()) = items_running.changed() => {
                    let running = *items_running.borrow_and_update();
                    on_progress(progress(writer, running));
                    continue;
                }
            };
            writer.write(chunk, answer).await?;
            on_progress(progress(writer, *items_running.borrow()));
        }
        recovery.finish().await
    }

    fn take_pending(&self, seq: u64) -> Result<PendingChunk, JobError> {
        self.pending
            .lock()
            .expect("pending chunks")
            .remove(&seq)
            .ok_or_else(|| JobError::Output(format!("result for unknown task {seq}")))
    }
}

/// What the chunks came to once every answer is written; an error when `missing` chunks got
/// none (a rerun finishes them).
fn dispatched<'a, W: ChunkWork>(
    writer: ChunkWriter<'a, W>,
    file_names: Arc<Vec<String>>,
    reused_chunks: u64,
    missing: usize,
) -> Result<Dispatched<'a, W::Tally>, JobError> {
    if missing > 0 {
        return Err(JobError::Output(format!(
            "{missing} chunks got no result; rerun the same command to finish them"
        )));
    }
    Ok(Dispatched {
        store: writer.store,
        plan_reasoning: writer.plan_reasoning,
        builder: writer.builder,
        tally: writer.tally,
        file_names,
        reused_chunks,
    })
}
