//! The job's reading side: the first pass over the input (counts, bad records,
//! fingerprint), the manifest check, speed calibration and the chunk producer.

use resident_sdk::TaskPayload;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use super::duplicates::DuplicateFinder;
use super::inputs::InputSet;
use super::manifest::Manifest;
use super::output::OutputDir;
use super::reader::{BadRecord, IdCheck, Item, ReaderOptions, Record, RecordReader};
use super::record_limit::RecordLimit;
use super::results::PendingChunk;
use super::schedule::{ChunkCutter, ChunkSchedule, NextChunk};
use super::work::ChunkWork;
use super::{BadRecordPolicy, CorpusJobConfig, JobError};
use crate::storage::S3Client;

/// Bad records listed in the report; past this only their count grows, so a corpus of
/// mostly bad lines cannot fill the client's memory.
pub(super) const BAD_RECORDS_LISTED: usize = 10_000;

pub(super) struct Scan {
    pub valid_records: u64,
    /// The first [`BAD_RECORDS_LISTED`] bad records.
    pub bad_records: Vec<BadRecord>,
    pub bad_records_total: u64,
    /// Ordinals of the records whose id an earlier record has (skipped by later passes).
    pub duplicate_ordinals: Arc<Vec<u64>>,
    pub input_fingerprint: String,
    pub model_fingerprint: String,
}

/// Makes a share limit a count: reads the whole input once (its items, bad lines included,
/// as the limit counts them) and keeps the first `ceil(share x items)`, so the job reads
/// what `--limit` with that count would. Nothing to do without a share, or once done.
pub(crate) async fn resolve_limit_share(
    config: &mut CorpusJobConfig,
    s3: Option<&S3Client>,
) -> Result<(), JobError> {
    let resolved = config.reader.limit.is_some() || config.reader.group_limits.is_some();
    let (Some(share), false) = (config.limit_share, resolved) else {
        return Ok(());
    };
    let (items, by_group) = count_items(config, s3).await?;
    let share = RecordLimit::Share(share);
    if config.reader.limit_by.is_some() {
        let limits: BTreeMap<String, u64> = (by_group.into_iter())
            .map(|(group, records)| (group, share.records_of(records)))
            .collect();
        let groups = limits.len();
        tracing::info!(%share, groups, "--limit as a share of each group's records");
        config.reader.group_limits = Some(Arc::new(limits));
        return Ok(());
    }
    let count = share.records_of(items);
    tracing::info!(%share, items, count, "--limit as a share: the first {count} records");
    config.reader.limit = Some(count);
    Ok(())
}

/// The input's items (records and bad lines; blank lines are not items), read whole,
/// whatever `reader.limit` says, and with `--limit-by` each group's records: what a share
/// limit is a share of.
async fn count_items(
    config: &CorpusJobConfig,
    s3: Option<&S3Client>,
) -> Result<(u64, BTreeMap<String, u64>), JobError> {
    let inputs = InputSet::list(&config.input, s3).await?;
    let options = ReaderOptions {
        limit: None,
        group_limits: None,
        ..config.reader.clone()
    };
    let counted = tokio::task::spawn_blocking(move || {
        let mut reader = RecordReader::new(inputs, options);
        let (mut items, mut by_group) = (0u64, BTreeMap::new());
        while let Some(item) = reader.next_item()? {
            items += 1;
            if let Item::Record(Record {
                limit_group: Some(group),
                ..
            }) = item
            {
                *by_group.entry(group).or_insert(0) += 1;
            }
        }
        Ok::<_, JobError>((items, by_group))
    });
    counted
        .await
        .map_err(|e| JobError::Input(format!("reader stopped: {e}")))?
}

/// First pass, blocking: count records, list bad ones (or stop at the first with `fail`).
pub(super) fn scan_input(
    config: &CorpusJobConfig,
    inputs: InputSet,
    model_fingerprint: String,
) -> Result<Scan, JobError> {
    let input_fingerprint = match (inputs.fingerprint()?, config.reader.limit_settings()) {
        (whole, None) => whole,
        // Another --limit reads other records: another input.
        (whole, Some(limit)) => crate::files::sha256_hex(format!("{whole}{limit}").as_bytes()),
    };
    let file_names: Vec<String> = inputs.files.iter().map(|f| f.name.clone()).collect();
    let mut reader = RecordReader::new(inputs, config.reader.clone())
        .with_id_check(IdCheck::Collect(DuplicateFinder::default()));
    let (mut valid_records, mut bad_records, mut bad_records_total) = (0u64, Vec::new(), 0u64);
    while let Some(item) = reader.next_item()? {
        match item {
            Item::Record(_) => valid_records += 1,
            Item::Bad(bad) if config.on_bad_record == BadRecordPolicy::Fail => {
                return Err(JobError::BadRecord {
                    file: bad.file,
                    line: bad.line,
                    reason: bad.reason,
                });
            }
            Item::Bad(bad) => {
                bad_records_total += 1;
                if bad_records.len() < BAD_RECORDS_LISTED {
                    bad_records.push(bad);
                }
            }
        }
    }
    let duplicates = reader.duplicates()?;
    let duplicate_bad = |d: &super::duplicates::Duplicate| BadRecord {
        file: file_names[d.file as usize].clone(),
        line: d.line,
        reason: format!("duplicate id {}", d.id),
    };
    if let Some(first) = duplicates.first()
        && config.on_bad_record == BadRecordPolicy::Fail
    {
        let bad = duplicate_bad(first);
        return Err(JobError::BadRecord {
            file: bad.file,
            line: bad.line,
            reason: format!(
                "{} (first at {}:{})",
                bad.reason, file_names[first.first_file as usize], first.first_line
            ),
        });
    }
    valid_records -= duplicates.len() as u64;
    bad_records_total += duplicates.len() as u64;
    let room = BAD_RECORDS_LISTED.saturating_sub(bad_records.len());
    bad_records.extend(duplicates.iter().take(room).map(duplicate_bad));
    sort_by_place(&mut bad_records, &file_names);
    let duplicate_ordinals = Arc::new(duplicates.iter().map(|d| d.ordinal).collect());
    if valid_records == 0 {
        return Err(JobError::Input(format!(
            "{} holds no usable records",
            config.input
        )));
    }
    Ok(Scan {
        valid_records,
        bad_records,
        bad_records_total,
        duplicate_ordinals,
        input_fingerprint,
        model_fingerprint,
    })
}

/// The scan's bad records and those the chunks found to crash the model (this run's and
/// earlier runs'), in input order, at most [`BAD_RECORDS_LISTED`]; and their count.
pub(super) fn with_crashed_records(
    mut bad_records: Vec<BadRecord>,
    bad_records_total: u64,
    manifest: &Manifest,
    file_names: &[String],
) -> (Vec<BadRecord>, u64) {
    let crashed = manifest.chunks.iter().flat_map(|chunk| &chunk.crashed);
    let total = bad_records_total + crashed.clone().count() as u64;
    let room = BAD_RECORDS_LISTED.saturating_sub(bad_records.len());
    bad_records.extend(crashed.take(room).cloned());
    sort_by_place(&mut bad_records, file_names);
    (bad_records, total)
}

/// Sorts bad records by their file's place in the input, then by line.
fn sort_by_place(bad_records: &mut [BadRecord], file_names: &[String]) {
    let order: HashMap<&str, usize> = file_names
        .iter()
        .enumerate()
        .map(|(i, name)| (name.as_str(), i))
        .collect();
    bad_records.sort_by_key(|b| (order.get(b.file.as_str()).copied(), b.line));
}

/// The earlier run's manifest, if it is for the same input, model and settings; a new one
/// otherwise.
pub(super) async fn open_manifest<W: ChunkWork>(
    out: &OutputDir,
    config: &CorpusJobConfig,
    work: &W,
    scan: &Scan,
) -> Result<Manifest, JobError> {
    match super::manifest_store::load_manifest(out).await? {
        Some(manifest) => {
            let place = &config.output;
            if manifest.input_fingerprint != scan.input_fingerprint {
                return Err(JobError::Mismatch(format!(
                    "{place} holds {} of a different input (or --limit); use another --output \
                     or remove it",
                    W::OUTPUT
                )));
            }
            if manifest.model_fingerprint != scan.model_fingerprint {
                return Err(JobError::Mismatch(format!(
                    "{place} holds {} from a different {}; use another --output or remove it",
                    W::OUTPUT,
                    W::SETTINGS
                )));
            }
            work.check_resume(&manifest, &place.to_string())?;
            if let Some(asked) = config
                .chunk_size
                .filter(|size| *size != manifest.chunk_size)
            {
                tracing::warn!(
                    asked,
                    kept = manifest.chunk_size,
                    "keeping the earlier run's chunk size so finished shards stay valid"
                );
            }
            Ok(manifest)
        }
        None => Ok(Manifest {
            version: super::manifest_store::MANIFEST_VERSION,
            input_fingerprint: scan.input_fingerprint.clone(),
            model_fingerprint: scan.model_fingerprint.clone(),
            chunk_size: 0,
            chunk_schedule: None,
            dtype: work.output_dtype(),
            dim: None,
            quantization_ranges: None,
            model_content: None,
            chunks: Vec::new(),
            journal_generation: 0,
        }),
    }
}

/// What the chunk producer cuts chunks from.
pub(super) struct ChunkSource<W> {
    pub config: CorpusJobConfig,
    pub work: W,
    pub inputs: InputSet,
    pub schedule: ChunkSchedule,
    pub total_docs: u64,
    /// Chunks already done, skipped.
    pub done: HashSet<u64>,
    /// Ordinals of the records whose id an earlier record has.
    pub duplicate_ordinals: Arc<Vec<u64>>,
}

/// Second pass, on a blocking thread: cuts records into the schedule's chunks, skips
/// finished ones, and sends the rest (recording their ids) as long as the job's window
/// allows. Past the probes it waits for the body's plan (`body_plan`: chunk size, tail
/// floor); if that never comes (the job failed), it stops.
pub(super) fn spawn_chunk_producer<W: ChunkWork>(
    source: ChunkSource<W>,
    pending: Arc<Mutex<HashMap<u64, PendingChunk>>>,
    chunks: tokio::sync::mpsc::Sender<TaskPayload>,
    body_plan: tokio::sync::oneshot::Receiver<(usize, usize)>,
) -> tokio::task::JoinHandle<Result<(), JobError>> {
    tokio::task::spawn_blocking(move || {
        let ChunkSource {
            config,
            work,
            inputs,
            schedule,
            total_docs,
            done,
            duplicate_ordinals,
        } = source;
        let mut reader = RecordReader::new(inputs, config.reader.clone())
            .with_id_check(IdCheck::Skip(duplicate_ordinals));
        let mut cutter = schedule.cutter(total_docs);
        let mut body_plan = Some(body_plan);
        let (mut index, mut seq) = (0u64, 0u64);
        let Some(mut want) = next_chunk_len(&mut cutter, &mut body_plan) else {
            return Ok(());
        };
        // `want` is usize::MAX past the scanned count: no capacity from it there.
        let mut buffer = ChunkBuffer::with_capacity(want.min(super::planner::MAX_CHUNK));
        let mut flush = |buffer: &mut ChunkBuffer, index: u64| -> bool {
            if done.contains(&index) {
                buffer.clear();
                return true;
            }
            let items = buffer.records.len() as u32;
            let bytes = work.request(std::mem::take(&mut buffer.records));
            pending.lock().expect("pending chunks").insert(
                seq,
                PendingChunk {
                    index,
                    ids: std::mem::take(&mut buffer.ids),
                    kept: std::mem::take(&mut buffer.kept),
                    places: std::mem::take(&mut buffer.places),
                    payload: bytes.clone(),
                    probe: schedule.is_probe(index),
                },
            );
            seq += 1;
            chunks.blocking_send(TaskPayload::new(bytes, items)).is_ok()
        };
        loop {
            match reader.next_item()? {
                Some(Item::Record(record)) => {
                    buffer.ids.push(record.id.clone());
                    if !record.kept.is_empty() {
                        buffer.kept.push(record.kept.clone());
                    }
                    buffer.records.push(record);
                    buffer.places.push(reader.last_place());
                    if buffer.ids.len() == want {
                        if !flush(&mut buffer, index) {
                            return Ok(());
                        }
                        index += 1;
                        match next_chunk_len(&mut cutter, &mut body_plan) {
                            Some(next) => want = next,
                            None => return Ok(()),
                        }
                    }
                }
                Some(Item::Bad(_)) => {}
                None => break,
            }
        }
        if !buffer.ids.is_empty() {
            flush(&mut buffer, index);
        }
        Ok(())
    })
}

/// The records of the chunk being cut.
struct ChunkBuffer {
    ids: Vec<serde_json::Value>,
    /// Each record's carried fields (empty when none are kept).
    kept: Vec<crate::records::Kept>,
    records: Vec<Record>,
    places: Vec<(u32, u64)>,
}

impl ChunkBuffer {
    fn with_capacity(capacity: usize) -> Self {
        Self {
            ids: Vec::with_capacity(capacity),
            kept: Vec::new(),
            records: Vec::with_capacity(capacity),
            places: Vec::with_capacity(capacity),
        }
    }

    fn clear(&mut self) {
        self.ids.clear();
        self.kept.clear();
        self.records.clear();
        self.places.clear();
    }
}

/// The next chunk's size, waiting for the body's plan when the cutter needs it; `None` when
/// the plan will not come. Past the scanned count (the input grew between the passes, which
/// its fingerprint should rule out) the rest goes into one last chunk.
fn next_chunk_len(
    cutter: &mut ChunkCutter,
    body_plan: &mut Option<tokio::sync::oneshot::Receiver<(usize, usize)>>,
) -> Option<usize> {
    loop {
        match cutter.next_chunk() {
            NextChunk::Docs(docs) => return Some(docs),
            NextChunk::Done => return Some(usize::MAX),
            NextChunk::NeedsPlan => {
                let (body, tail_min) = body_plan.take()?.blocking_recv().ok()?;
                cutter.plan_body(body, tail_min);
            }
        }
    }
}
