//! Running a sweep on a cluster: one pool of `embed` actors loads the model once, embeds the
//! data once (cached on disk), then trains trial after trial on those actors, segment by
//! segment, as the driver and ASHA decide. Trials are their own message (`TrialRequest`) sent
//! to the actors' `trial` method, so they share the resident model's actor and device
//! without riding on the embed request.
//!
//! In three phases, as a corpus job: `prepare` (claim the output, pin the model, read and
//! embed the data, ready the pool), `run_trials` (resume what an earlier run finished, then
//! segments as the driver decides), `summarise` (`summary.json`).
//!
//! Under PBT, after each round the runner copies every copier's donor checkpoint and saves
//! the population (`population.json`), which a resumed sweep starts from.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures::StreamExt;
use prost::Message;
use resident_proto::{SeededRng, pb};
use resident_sdk::{Cluster, EmbedPool, JobStream, Pool, SdkError, SubmitOptions, TaskOutput};

use super::SweepError;
use super::best_head::{BEST_HEAD_FILE, best_head_trial, head_metadata, write_best_head};
use super::config::{SweepConfig, TrialScheduler};
use super::data::{SweepData, embed_into_cache, read_sweep_data};
use super::driver::{Phase, Round, Segment, SweepDriver, TrialPlan};
use super::pbt::{PbtSettings, policy};
use super::population::{Member, SavedPopulation, load_population, save_population};
use super::results::{
    SweepSummary, TrialResult, append_result, beats, best, read_results, write_results,
};
use crate::files::{OutputLock, sha256_hex, write_atomically};
use crate::model_pin::pin_model;
use crate::pools::EmbedActors;
use crate::storage::{Location, S3Client, S3Options, key_under};
use crate::usage::{PricedUsage, UsageReading, held_between, read_pool_usage};

/// The `embed` actors' method that trains a trial segment.
pub use resident_proto::EMBED_TRIAL_METHOD as TRIAL_METHOD;

/// What the runner tells its caller as the sweep goes.
pub enum SweepEvent<'a> {
    /// The data is embedded.
    DataReady {
        /// Examples in it.
        examples: usize,
        /// It came from the cache.
        cache_hit: bool,
    },
    /// The trials are known: `total` of them, `resumed` finished by an earlier run (with
    /// the metrics they reached).
    TrialsPlanned {
        /// Trials in all.
        total: usize,
        /// Those an earlier run finished.
        resumed: &'a [TrialResult],
    },
    /// A trial finished (its line is in `results.jsonl`).
    TrialFinished(&'a TrialResult),
    /// PBT: a round ran and the population was saved.
    PbtRound {
        /// The epoch every trial stood at.
        epoch: u32,
        /// Trials still training.
        members: usize,
        /// Those that copied a better trial.
        copies: usize,
        /// The best metric at that epoch.
        best_metric: Option<f64>,
    },
    /// PBT: an earlier run's population was resumed from its last round.
    PopulationResumed {
        /// That round's epoch.
        epoch: u32,
        /// Its trials still training.
        members: usize,
    },
}

/// Where one trial stands in this run.
#[derive(Default)]
struct TrialRun {
    started: Option<Instant>,
    checkpoint: Option<pb::TrialCheckpoint>,
    train_micros: u64,
    actor_id: String,
}

fn output_error(path: &Path, e: impl std::fmt::Display) -> SweepError {
    SweepError::Output(format!("{}: {e}", path.display()))
}

/// Refuses an output directory that another run is writing or that holds a different
/// sweep; records this one. The lock is held until the returned value drops.
fn claim_output(config: &SweepConfig, output: &Path) -> Result<OutputLock, SweepError> {
    std::fs::create_dir_all(output).map_err(|e| output_error(output, e))?;
    let lock =
        OutputLock::acquire(output).map_err(|refused| SweepError::Output(refused.to_string()))?;
    let path = output.join("sweep.json");
    let declared = serde_json::to_value(config).map_err(|e| SweepError::Output(e.to_string()))?;
    if let Ok(bytes) = std::fs::read(&path) {
        let earlier: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
        if the_sweep(earlier) != the_sweep(declared.clone()) {
            return Err(SweepError::Mismatch(format!(
                "{} holds a different sweep (see its sweep.json); use another output or remove it",
                output.display()
            )));
        }
    }
    let bytes =
        serde_json::to_vec_pretty(&declared).map_err(|e| SweepError::Output(e.to_string()))?;
    write_atomically(&path, &bytes).map_err(|e| SweepError::Output(e.to_string()))?;
    Ok(lock)
}

/// A declaration without the keys that only say how a run goes
/// ([`SweepConfig::RUN_OPTIONS`]): what two runs must agree on to be one sweep.
fn the_sweep(mut declaration: serde_json::Value) -> serde_json::Value {
    if let Some(keys) = declaration.as_object_mut() {
        for option in SweepConfig::RUN_OPTIONS {
            keys.remove(option);
        }
    }
    declaration
}

/// The embedded data's cache file and key, as actors find it.
pub struct DatasetRef {
    /// Where actors read it: a local path or `s3://`.
    pub uri: String,
    /// The cache key (model, data and fields).
    pub key: String,
    /// Hex SHA-256 of the dataset's bytes, which an agent checks an `s3://` copy against.
    pub sha256: String,
}

/// Where the agents find the embedded dataset: the local cache file, or its copy under the
/// sweep's `cache = "s3://…"` (uploaded unless an object of the same size is there; the key
/// covers the model and the data, so the same key is the same content).
pub async fn publish_dataset(
    config: &SweepConfig,
    file: &Path,
    key: &str,
) -> Result<DatasetRef, SweepError> {
    let bytes = tokio::fs::read(file)
        .await
        .map_err(|e| output_error(file, e))?;
    let sha256 = sha256_hex(&bytes);
    let Some(cache) = &config.cache else {
        return Ok(DatasetRef {
            uri: file.display().to_string(),
            key: key.to_owned(),
            sha256,
        });
    };
    let Ok(Location::S3 { bucket, prefix }) = Location::parse(cache) else {
        return Err(SweepError::Output(format!("cache {cache} is not s3://")));
    };
    let object = key_under(&prefix, &format!("{key}.dataset"));
    let client = S3Client::connect(&S3Options {
        endpoint: config.s3_endpoint.clone(),
        ..S3Options::default()
    })
    .await;
    let size = bytes.len() as u64;
    if client
        .size(&bucket, &object)
        .await
        .map_err(|e| SweepError::Output(e.to_string()))?
        != Some(size)
    {
        client
            .upload_file(&bucket, &object, file)
            .await
            .map_err(|e| SweepError::Output(e.to_string()))?;
    }
    Ok(DatasetRef {
        uri: format!("s3://{bucket}/{object}"),
        key: key.to_owned(),
        sha256,
    })
}

/// The task that trains `segment` of a trial with `params`.
pub fn trial_payload(
    config: &SweepConfig,
    dataset: &DatasetRef,
    params: &super::Params,
    segment: &Segment,
    checkpoint: Option<pb::TrialCheckpoint>,
) -> prost::bytes::Bytes {
    pb::TrialRequest {
        kind: format!("{:?}", config.trial).to_lowercase(),
        dataset_uri: dataset.uri.clone(),
        dataset_key: dataset.key.clone(),
        params_json: serde_json::to_string(params).unwrap_or_default(),
        split_seed: config.seed,
        trial_seed: SeededRng::derived(config.seed, segment.trial as u64).next_u64(),
        start_epoch: segment.start_epoch,
        end_epoch: segment.end_epoch,
        metric: config.metric.clone(),
        checkpoint,
        dataset_sha256: dataset.sha256.clone(),
    }
    .encode_to_vec()
    .into()
}

/// Runs the sweep on `cluster` and returns its summary (also in `summary.json`). Its pool is
/// deleted at the end, on success or failure, unless `keep_pool`.
pub async fn run_sweep(
    cluster: &Cluster,
    config: &SweepConfig,
    on_event: &mut (dyn FnMut(SweepEvent<'_>) + Send),
) -> Result<SweepSummary, SweepError> {
    let summary = sweep_on(cluster, config, on_event).await;
    if config.validate().is_ok() {
        config
            .retention()
            .job_ended(cluster, &sweep_pool_name(config))
            .await;
    }
    summary
}

/// Rows of the leaderboard the dashboard shows.
const DASHBOARD_LEADERBOARD_ROWS: usize = 10;

/// Tells the scheduler how the sweep stands, for the dashboard; a failure only costs the
/// dashboard its leaderboard.
async fn report_to_dashboard(
    cluster: &Cluster,
    job: &resident_sdk::JobId,
    results: &[TrialResult],
    total: usize,
    config: &SweepConfig,
) {
    let summary = super::results::job_summary(
        results,
        total,
        config.mode,
        &config.metric,
        DASHBOARD_LEADERBOARD_ROWS,
    );
    if let Err(error) = cluster.annotate_job(job, &summary).await {
        tracing::debug!(%error, "could not update the sweep's summary on the scheduler");
    }
}

/// PBT: tells the dashboard how the population stands after a round (its trials end only at
/// the last epoch, so the finished trials alone would show nothing until then).
async fn report_round(
    cluster: &Cluster,
    job: &resident_sdk::JobId,
    driver: &SweepDriver,
    epoch: u32,
    config: &SweepConfig,
) {
    let standing: Vec<TrialResult> = driver
        .trials()
        .iter()
        .enumerate()
        .filter(|(_, t)| t.phase == Phase::Ready && t.metrics.len() == epoch as usize)
        .map(|(id, t)| TrialResult {
            trial_id: id,
            params: t.params.clone(),
            metric: t.metrics.last().copied(),
            epochs: epoch,
            stopped_early: false,
            actor_id: String::new(),
            wall_s: 0.0,
            metrics: Vec::new(),
            train_s: 0.0,
            error: None,
            schedule: Vec::new(),
        })
        .collect();
    let mut summary = super::results::job_summary(
        &standing,
        driver.trials().len(),
        config.mode,
        &config.metric,
        DASHBOARD_LEADERBOARD_ROWS,
    );
    let best = summary["leaderboard"][0][config.metric.as_str()].as_f64();
    summary["status"] = serde_json::Value::from(format!(
        "PBT round at epoch {epoch} of {}: {} trials training{}",
        config.scheduler.max_epochs,
        standing.len(),
        best.map_or_else(String::new, |b| format!(", best {} {b:.4}", config.metric))
    ));
    if let Err(error) = cluster.annotate_job(job, &summary).await {
        tracing::debug!(%error, "could not update the sweep's summary on the scheduler");
    }
}

fn sweep_pool_name(config: &SweepConfig) -> String {
    format!("sweep-{}", config.name)
}

async fn sweep_on(
    cluster: &Cluster,
    config: &SweepConfig,
    on_event: &mut (dyn FnMut(SweepEvent<'_>) + Send),
) -> Result<SweepSummary, SweepError> {
    let started = Instant::now();
    let prepared = prepare(cluster, config, on_event).await?;
    let trials = run_trials(cluster, config, &prepared, on_event).await?;
    summarise(cluster, config, prepared, trials, started).await
}

/// What a sweep has before its first trial: its output claimed, the model's pool loaded and
/// the data embedded (or found in the cache).
struct Prepared {
    output: PathBuf,
    /// Held until the sweep ends: no other run writes the output meanwhile.
    _lock: OutputLock,
    data: SweepData,
    pool: EmbedPool,
    /// The embedded data, on disk.
    cache: PathBuf,
    cache_hit: bool,
    model_load_s: f64,
    embed_s: f64,
    /// What a pool of the sweep's name had held before this run (one kept from an earlier
    /// run): `summary.json` bills what it holds beyond that.
    held_before: UsageReading,
}

/// Checks the config, claims the output, pins the model, reads the data, readies the pool
/// and embeds the data once.
async fn prepare(
    cluster: &Cluster,
    config: &SweepConfig,
    on_event: &mut (dyn FnMut(SweepEvent<'_>) + Send),
) -> Result<Prepared, SweepError> {
    config.validate()?;
    let output = PathBuf::from(&config.output);
    let lock = claim_output(config, &output)?;
    let s3 = S3Options {
        endpoint: config.s3_endpoint.clone(),
        ..S3Options::default()
    };
    let model = pin_model(&config.model, &s3)
        .await
        .map_err(SweepError::Model)?;
    let data = {
        let config = config.clone();
        let fingerprint = model.fingerprint.clone();
        tokio::task::spawn_blocking(move || read_sweep_data(&config, &fingerprint))
            .await
            .map_err(|e| SweepError::Data(e.to_string()))??
    };
    let spec = EmbedActors {
        pool: sweep_pool_name(config),
        model: &config.model,
        revision: model.revision.as_deref(),
        replicas: config.replicas,
        gpus_per_actor: config.gpus_per_actor,
        vram_gib_per_actor: config.vram_gib,
        selector: &config.selector,
        retention: config.retention(),
        task_timeout: None,
        max_seq_length: None,
        max_batch_tokens: None,
    }
    .spec();
    let held_before = read_pool_usage(cluster, &sweep_pool_name(config)).await?;
    let load_started = Instant::now();
    let pool = cluster
        .create_embed_pool(spec, Duration::from_secs(600))
        .await
        .map_err(|error| match error {
            // What went wrong stays typed (the CLI's exit code tells them apart).
            SdkError::Unplaceable(_)
            | SdkError::Unavailable(_)
            | SdkError::Unauthenticated(_)
            | SdkError::PermissionDenied(_) => SweepError::Sdk(error),
            other => SweepError::Model(other.to_string()),
        })?;
    let model_load_s = load_started.elapsed().as_secs_f64();
    let embed_started = Instant::now();
    let (cache, cache_hit) = embed_into_cache(&pool, &data, &output).await?;
    let embed_s = if cache_hit {
        0.0
    } else {
        embed_started.elapsed().as_secs_f64()
    };
    on_event(SweepEvent::DataReady {
        examples: data.texts.len(),
        cache_hit,
    });
    let cache = std::fs::canonicalize(&cache).map_err(|e| output_error(&cache, e))?;
    Ok(Prepared {
        output,
        _lock: lock,
        data,
        pool,
        cache,
        cache_hit,
        model_load_s,
        embed_s,
        held_before,
    })
}

/// What the trials came to: every result (an earlier run's included), in the order they
/// finished, how many an earlier run had finished, and the PBT round it was resumed from.
struct TrialsRun {
    results: Vec<TrialResult>,
    resumed_trials: usize,
    resumed_from_epoch: u32,
}

/// The driver a sweep declares: its plan, its scheduler and, under PBT, its rounds.
fn new_driver(config: &SweepConfig, max_running: usize) -> SweepDriver {
    let driver = SweepDriver::new(
        TrialPlan::of(config),
        &config.scheduler,
        config.mode,
        max_running,
    );
    match config.scheduler.kind {
        TrialScheduler::Pbt => driver.population_based(PbtSettings::of(config)),
        TrialScheduler::Fifo | TrialScheduler::Asha => driver,
    }
}

/// Generates the trials, keeps those an earlier run finished (and, under PBT, its last
/// round's population), and runs the rest as the driver (and ASHA or PBT) decide, one job
/// of segments on the pool; each finished trial is appended to `results.jsonl` and shown
/// on the dashboard.
async fn run_trials(
    cluster: &Cluster,
    config: &SweepConfig,
    prepared: &Prepared,
    on_event: &mut (dyn FnMut(SweepEvent<'_>) + Send),
) -> Result<TrialsRun, SweepError> {
    let pool = &prepared.pool.pool;
    let actors = pool.status().await?.actors.len().max(1);
    let window = actors * config.trials_per_actor as usize;
    let mut driver = new_driver(config, window);
    let total = driver.trials().len();
    let results_path = prepared.output.join("results.jsonl");
    let mut results = resume(&results_path, &mut driver)?;
    let resumed_trials = results.len();
    on_event(SweepEvent::TrialsPlanned {
        total,
        resumed: &results,
    });

    let (mut segments, mut outputs) = Segments::open(pool, config, window).await?;
    let output = &prepared.output;
    let resumed_from_epoch =
        resume_population(output, &results, &mut driver, &mut segments, on_event).await?;
    let dataset = publish_dataset(config, &prepared.cache, &prepared.data.key).await?;
    if !results.is_empty() {
        report_to_dashboard(cluster, &outputs.job_id, &results, total, config).await;
    }
    while !driver.finished() {
        segments.send_next(&mut driver, config, &dataset)?;
        if segments.in_flight.is_empty() {
            return Err(SweepError::Cluster(
                "the sweep stalled: no trial can run and none is running (rerun it to resume)"
                    .into(),
            ));
        }
        let Some(output) = outputs.next().await else {
            return Err(SweepError::Cluster(
                "the scheduler ended the sweep's job early".into(),
            ));
        };
        // This result may end its trial, and ASHA decisions it unblocks may end others.
        let ended = segments.take(output?, &mut driver)?;
        let any_ended = !ended.is_empty();
        for (trial, mut run) in ended {
            let checkpoint = run.checkpoint.take();
            let result = trial_result(&driver, trial, run);
            keep_if_best(config, prepared, &results, &result, checkpoint).await?;
            record_result(&results_path, &result).await?;
            on_event(SweepEvent::TrialFinished(&result));
            results.push(result);
        }
        for round in driver.take_rounds() {
            run_round(
                config,
                &round,
                &driver,
                &mut segments,
                &prepared.output,
                on_event,
            )
            .await?;
            report_round(cluster, &outputs.job_id, &driver, round.epoch, config).await;
        }
        if any_ended {
            report_to_dashboard(cluster, &outputs.job_id, &results, total, config).await;
        }
    }
    Ok(TrialsRun {
        results,
        resumed_trials,
        resumed_from_epoch,
    })
}

/// Writes a finished trial's head as the sweep's best when it beats every trial before it
/// (`best_head.rs`), off the runtime's threads.
async fn keep_if_best(
    config: &SweepConfig,
    prepared: &Prepared,
    earlier: &[TrialResult],
    result: &TrialResult,
    checkpoint: Option<pb::TrialCheckpoint>,
) -> Result<(), SweepError> {
    let Some(checkpoint) = checkpoint.filter(|_| result.error.is_none()) else {
        return Ok(());
    };
    let finite = result.metric.is_some_and(f64::is_finite);
    if !finite || best(earlier, config.mode).is_some_and(|b| !beats(result, b, config.mode)) {
        return Ok(());
    }
    let metadata = head_metadata(config, result, &prepared.data.classes);
    let output = prepared.output.clone();
    tokio::task::spawn_blocking(move || write_best_head(&output, &checkpoint, metadata))
        .await
        .map_err(|e| SweepError::Output(format!("writing the best head panicked: {e}")))?
}

/// Appends a finished trial to `results.jsonl`; the append's fsync runs on tokio's
/// blocking pool, off the runtime threads.
async fn record_result(results_path: &Path, result: &TrialResult) -> Result<(), SweepError> {
    let (path, line) = (results_path.to_owned(), result.clone());
    tokio::task::spawn_blocking(move || append_result(&path, &line))
        .await
        .map_err(|e| SweepError::Output(format!("appending a trial result panicked: {e}")))?
}

/// PBT: each copier takes its donor's checkpoint as it stood at the round, then the
/// population is saved for a resumed sweep.
async fn run_round(
    config: &SweepConfig,
    round: &Round,
    driver: &SweepDriver,
    segments: &mut Segments,
    output: &Path,
    on_event: &mut (dyn FnMut(SweepEvent<'_>) + Send),
) -> Result<(), SweepError> {
    let copied: Vec<(usize, Option<pb::TrialCheckpoint>)> = round
        .exploits
        .iter()
        .map(|e| {
            let donor = segments.runs.get(&e.donor);
            (e.trial, donor.and_then(|run| run.checkpoint.clone()))
        })
        .collect();
    for (trial, checkpoint) in copied {
        segments.runs.entry(trial).or_default().checkpoint = checkpoint;
    }
    let mut members = Vec::new();
    for (id, trial) in driver.trials().iter().enumerate() {
        if trial.phase != Phase::Ready {
            continue;
        }
        let run = segments.runs.get(&id);
        let Some(checkpoint) = run.and_then(|run| run.checkpoint.clone()) else {
            tracing::warn!(
                trial = id,
                "no checkpoint to save; this round's population is not saved"
            );
            return Ok(());
        };
        let member = Member {
            trial_id: id,
            params: trial.params.clone(),
            metrics: trial.metrics.clone(),
            schedule: trial.schedule.clone(),
            train_s: run.map_or(0.0, |run| run.train_micros as f64 / 1e6),
            checkpoint: String::new(),
        };
        members.push((member, checkpoint));
    }
    let at_round = members
        .iter()
        .map(|(m, _)| m.metrics[round.epoch as usize - 1]);
    let best_metric = match config.mode {
        super::Mode::Max => at_round.reduce(f64::max),
        super::Mode::Min => at_round.reduce(f64::min),
    };
    let count = members.len();
    let (output, epoch) = (output.to_owned(), round.epoch);
    tokio::task::spawn_blocking(move || save_population(&output, epoch, members))
        .await
        .map_err(|e| SweepError::Output(format!("saving the population panicked: {e}")))??;
    on_event(SweepEvent::PbtRound {
        epoch,
        members: count,
        copies: round.exploits.len(),
        best_metric,
    });
    Ok(())
}

/// PBT (nothing otherwise): puts the trials an earlier run's last round left training back
/// where they were, with their checkpoints; returns that round's epoch (0 when there was
/// none). A trial neither finished nor in that population cannot join it again: it counts
/// as failed.
async fn resume_population(
    output: &Path,
    results: &[TrialResult],
    driver: &mut SweepDriver,
    segments: &mut Segments,
    on_event: &mut (dyn FnMut(SweepEvent<'_>) + Send),
) -> Result<u32, SweepError> {
    if !driver.is_population_based() {
        return Ok(0);
    }
    let output = output.to_owned();
    let saved = tokio::task::spawn_blocking(move || load_population(&output))
        .await
        .map_err(|e| SweepError::Output(format!("reading the population panicked: {e}")))?;
    let Some(SavedPopulation { epoch, members }) = saved else {
        return Ok(0);
    };
    let finished: Vec<usize> = results.iter().map(|r| r.trial_id).collect();
    let mut restored = 0;
    for (member, checkpoint) in members {
        let trial = member.trial_id;
        if finished.contains(&trial) || trial >= driver.trials().len() {
            continue;
        }
        driver.restore_member(trial, member.params, member.metrics, member.schedule);
        let run = segments.runs.entry(trial).or_default();
        run.checkpoint = Some(checkpoint);
        run.train_micros = (member.train_s * 1e6) as u64;
        restored += 1;
    }
    for trial in 0..driver.trials().len() {
        if driver.trials()[trial].phase == Phase::NotStarted {
            driver.restore_failed(
                trial,
                format!("not in the population saved at epoch {epoch}: it cannot rejoin"),
            );
        }
    }
    on_event(SweepEvent::PopulationResumed {
        epoch,
        members: restored,
    });
    Ok(epoch)
}

/// The trial segments sent on the sweep's job and the trials they belong to.
struct Segments {
    tx: tokio::sync::mpsc::UnboundedSender<prost::bytes::Bytes>,
    /// Each segment sent and not yet answered, by its task's sequence number.
    in_flight: HashMap<u64, Segment>,
    runs: HashMap<usize, TrialRun>,
    next_seq: u64,
}

impl Segments {
    /// Opens the sweep's job on `pool`, `window` segments in flight at most.
    async fn open(
        pool: &Pool,
        config: &SweepConfig,
        window: usize,
    ) -> Result<(Segments, JobStream), SweepError> {
        let (tx, segments_rx) = tokio::sync::mpsc::unbounded_channel();
        let outputs = pool
            .submit_with(
                &format!("sweep-{}", config.name),
                tokio_stream::wrappers::UnboundedReceiverStream::new(segments_rx),
                SubmitOptions {
                    window: window as u32,
                    method: TRIAL_METHOD.to_owned(),
                    ..SubmitOptions::default()
                },
            )
            .await?;
        let segments = Segments {
            tx,
            in_flight: HashMap::new(),
            runs: HashMap::new(),
            next_seq: 0,
        };
        Ok((segments, outputs))
    }

    /// Sends every segment the driver wants run now, each resuming its trial's checkpoint.
    fn send_next(
        &mut self,
        driver: &mut SweepDriver,
        config: &SweepConfig,
        dataset: &DatasetRef,
    ) -> Result<(), SweepError> {
        for segment in driver.next_segments() {
            let run = self.runs.entry(segment.trial).or_default();
            run.started.get_or_insert_with(Instant::now);
            let params = &driver.trials()[segment.trial].params;
            let checkpoint = run.checkpoint.clone();
            let payload = trial_payload(config, dataset, params, &segment, checkpoint);
            self.in_flight.insert(self.next_seq, segment);
            self.next_seq += 1;
            self.tx
                .send(payload)
                .map_err(|_| SweepError::Cluster("the sweep's job stream closed".into()))?;
        }
        Ok(())
    }

    /// Tells the driver how a segment went; the trials that ended with it, and how each ran.
    fn take(
        &mut self,
        output: TaskOutput,
        driver: &mut SweepDriver,
    ) -> Result<Vec<(usize, TrialRun)>, SweepError> {
        let segment = self.in_flight.remove(&output.seq).ok_or_else(|| {
            SweepError::Cluster(format!("result for unknown task {}", output.seq))
        })?;
        let run = self.runs.entry(segment.trial).or_default();
        run.actor_id = output.actor_id.to_string();
        let response = output.output.and_then(|bytes| {
            pb::TrialResponse::decode(bytes).map_err(|e| format!("not a TrialResponse: {e}"))
        });
        let ended = match response {
            Ok(response) => {
                run.checkpoint = response.checkpoint;
                run.train_micros += response.train_micros;
                driver.on_segment_done(segment.trial, &response.metrics)
            }
            Err(error) => driver.on_segment_failed(segment.trial, error),
        };
        Ok(ended
            .into_iter()
            .map(|trial| (trial, self.runs.remove(&trial).unwrap_or_default()))
            .collect())
    }
}

/// Trials finished by an earlier run count as they are (the driver is told their metrics);
/// anything else runs again, except under PBT, whose population went on without a trial
/// that failed. `results.jsonl` is rewritten with those alone.
fn resume(results_path: &Path, driver: &mut SweepDriver) -> Result<Vec<TrialResult>, SweepError> {
    let keep_failed = driver.is_population_based();
    let mut results: Vec<TrialResult> = read_results(results_path)
        .into_iter()
        .filter(|r| {
            driver.accepts_result(r.trial_id, &r.params) && (keep_failed || r.error.is_none())
        })
        .collect();
    results.sort_by_key(|r| r.trial_id);
    results.dedup_by_key(|r| r.trial_id);
    write_results(results_path, &results)?;
    for result in &results {
        match &result.error {
            Some(error) => driver.restore_failed(result.trial_id, error.clone()),
            None => driver.restore(
                result.trial_id,
                result.params.clone(),
                result.metrics.clone(),
                result.stopped_early,
            ),
        }
    }
    Ok(results)
}

/// The result of a trial the driver reports ended, with what this run saw of it.
fn trial_result(driver: &SweepDriver, trial: usize, run: TrialRun) -> TrialResult {
    let progress = &driver.trials()[trial];
    let (stopped_early, error) = match &progress.phase {
        Phase::Done { stopped_early } => (*stopped_early, None),
        Phase::Failed(error) => (false, Some(error.clone())),
        _ => unreachable!("the driver reports ended trials only"),
    };
    TrialResult {
        trial_id: trial,
        params: progress.params.clone(),
        metric: if error.is_some() {
            None
        } else {
            progress.metrics.last().copied()
        },
        epochs: progress.metrics.len() as u32,
        stopped_early,
        actor_id: run.actor_id,
        wall_s: run.started.map_or(0.0, |s| s.elapsed().as_secs_f64()),
        metrics: progress.metrics.clone(),
        train_s: run.train_micros as f64 / 1e6,
        error,
        schedule: progress.schedule.clone(),
    }
}

/// The sweep's summary (best trial, trials, model loads, timings), also written to
/// `summary.json`.
async fn summarise(
    cluster: &Cluster,
    config: &SweepConfig,
    prepared: Prepared,
    trials: TrialsRun,
    started: Instant,
) -> Result<SweepSummary, SweepError> {
    let TrialsRun {
        mut results,
        resumed_trials,
        resumed_from_epoch,
    } = trials;
    let pool_name = prepared.pool.pool.name().to_owned();
    let pool_actors: Vec<_> = cluster
        .list_actors()
        .await?
        .into_iter()
        .filter(|a| a.pool.as_str() == pool_name)
        .collect();
    let held_after = UsageReading::of(&prepared.pool.pool.status().await?);
    let held = held_between(&prepared.held_before, &held_after);
    let usage = PricedUsage::of(&held, &config.prices);
    results.sort_by_key(|r| r.trial_id);
    let best_result = best(&results, config.mode);
    let summary = SweepSummary {
        name: config.name.clone(),
        metric_name: config.metric.clone(),
        mode: config.mode,
        best_trial: best_result.map(|r| r.trial_id),
        best_params: best_result.map(|r| r.params.clone()),
        best_metric: best_result.and_then(|r| r.metric),
        model_loads: pool_actors.iter().map(|a| a.model_loads).sum(),
        actors: pool_actors.len() as u64,
        trials: results.len(),
        stopped_early: results.iter().filter(|r| r.stopped_early).count(),
        failed: results.iter().filter(|r| r.error.is_some()).count(),
        resumed_trials,
        epochs_trained: results.iter().map(|r| u64::from(r.epochs)).sum(),
        wall_s: started.elapsed().as_secs_f64(),
        model_load_s: prepared.model_load_s,
        embed_s: prepared.embed_s,
        embedding_cache_hit: prepared.cache_hit,
        examples: prepared.data.texts.len(),
        skipped_records: prepared.data.skipped,
        gpu_hours: usage.gpu_hours,
        cpu_hours: usage.cpu_hours,
        estimated_cost_usd: usage.cost_usd,
        best_policy: best_result
            .map(|r| best_policy(&results, r))
            .unwrap_or_default(),
        best_head: best_result
            .filter(|r| best_head_trial(&prepared.output) == Some(r.trial_id))
            .map(|_| BEST_HEAD_FILE.to_owned()),
        resumed_from_epoch,
    };
    let path = prepared.output.join("summary.json");
    let bytes =
        serde_json::to_vec_pretty(&summary).map_err(|e| SweepError::Output(e.to_string()))?;
    write_atomically(&path, &bytes).map_err(|e| SweepError::Output(e.to_string()))?;
    Ok(summary)
}

/// PBT: the hyperparameters that trained `best`'s weights, through the trials it copied
/// (empty under other schedulers, whose trials copy nothing).
fn best_policy(results: &[TrialResult], best: &TrialResult) -> Vec<super::pbt::PolicyStep> {
    if best.schedule.is_empty() {
        return Vec::new();
    }
    let schedules = results
        .iter()
        .map(|r| (r.trial_id, r.schedule.as_slice()))
        .collect();
    policy(&schedules, best.trial_id, best.epochs)
}

/// The sweep's results as they are on disk, in trial order.
pub fn load_results(output: &Path) -> Vec<TrialResult> {
    let mut results = read_results(&output.join("results.jsonl"));
    results.sort_by_key(|r| r.trial_id);
    results
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(trials: u32) -> SweepConfig {
        SweepConfig::from_toml(&format!(
            "name = \"t\"\nmodel = \"m\"\ntrial = \"classifier\"\ndata = \"d.jsonl\"\nmetric = \"accuracy\"\nmode = \"max\"\noutput = \"o\"\ntrials = {trials}\n[space]\nlr = {{ choice = [0.1] }}\n"
        ))
        .unwrap()
    }

    /// A rerun that only keeps its pool, gives it an idle TTL or prices it otherwise is the
    /// same sweep (it resumes); one that declares other trials is refused.
    #[test]
    fn a_rerun_with_other_run_options_claims_the_same_sweep() {
        let dir = tempfile::tempdir().unwrap();
        drop(claim_output(&config(4), dir.path()).unwrap());
        let mut rerun = config(4);
        rerun.keep_pool = true;
        rerun.idle_ttl = Some(Duration::from_secs(1800));
        rerun.prices.per_pool_label.insert("spot".into(), 0.2);
        rerun.cache = Some("s3://bucket/sweeps/".into());
        rerun.s3_endpoint = Some("http://127.0.0.1:9000".into());
        drop(claim_output(&rerun, dir.path()).unwrap());
        match claim_output(&config(8), dir.path()) {
            Err(SweepError::Mismatch(message)) => {
                assert!(message.contains("holds a different sweep"), "{message}")
            }
            Err(other) => panic!("{other}"),
            Ok(_) => panic!("a different sweep claimed the output"),
        }
    }
}
