//! The job's writing side: each chunk the pool answers becomes a shard, recorded in the
//! manifest's journal, and its probe timings plan the body.

use std::sync::Arc;

use resident_sdk::Bytes;

use super::manifest_store::ManifestStore;
use super::output::OutputDir;
use super::poison::Salvage;
use super::reader::{BadRecord, Kept};
use super::report::ReportBuilder;
use super::schedule::{self, ChunkSchedule};
use super::shard_rows::ShardRows;
use super::work::{ChunkWork, Piece};
use super::{BadRecordPolicy, JobError, planner};

/// A chunk sent to the pool and not answered yet.
pub(super) struct PendingChunk {
    pub index: u64,
    pub ids: Vec<serde_json::Value>,
    /// Each record's carried fields (`--keep-columns`; empty when none are kept).
    pub kept: Vec<Kept>,
    /// Where each record was read: its file's index in the input set, and its line.
    pub places: Vec<(u32, u64)>,
    /// The task's payload (shared with the task, not copied): re-read when a record of the
    /// chunk crashes the model.
    pub payload: Bytes,
    /// A probe chunk, whose timing sizes the body.
    pub probe: bool,
}

/// Plans the body once the probes this run measures are back.
pub(super) struct BodyPlanner {
    pub schedule: ChunkSchedule,
    pub timings: planner::ProbeTimings,
    /// Tells the chunk producer the plan; `None` once sent (or for a planned schedule).
    pub plan_tx: Option<tokio::sync::oneshot::Sender<(usize, usize)>>,
    pub probes_to_measure: usize,
    pub actors: usize,
    pub total_docs: u64,
}

impl BodyPlanner {
    /// Plans the body if its probes are in and it is not planned yet: records the plan in
    /// `manifest.json` before any body chunk is cut (so a resume cuts the same chunks), then
    /// tells the producer. Returns the reasoning when it planned.
    pub async fn plan_if_due(
        &mut self,
        store: &mut ManifestStore<'_>,
    ) -> Result<Option<String>, JobError> {
        let total_docs = self.total_docs;
        let due = self.timings.results() >= self.probes_to_measure
            && total_docs > self.schedule.probe_docs(total_docs);
        let Some(tx) = self.plan_tx.take_if(|_| due) else {
            return Ok(None);
        };
        let speeds = self.timings.speeds(self.actors);
        let slowest = speeds.iter().copied().fold(f64::INFINITY, f64::min);
        let plan = planner::plan_chunk_size(&planner::PlanInput {
            total_docs: total_docs - self.schedule.probe_docs(total_docs),
            actor_docs_per_s: speeds,
            dimension: store.manifest().dim.unwrap_or(0),
            min_chunk: self.schedule.min_chunk,
        });
        let schedule = &mut self.schedule;
        schedule.plan_body(plan.chunk_size, schedule::tail_floor(slowest));
        let manifest = store.manifest_mut();
        manifest.chunk_size = plan.chunk_size;
        manifest.chunk_schedule = Some(schedule.clone());
        store.save().await?;
        // The producer is gone only if the job is failing; its error tells why.
        let _ = tx.send((plan.chunk_size, schedule.tail_min));
        let reasoning = format!(
            "{} probe chunks of {}, then {}; the last chunks shrink to {} so the actors finish \
             together",
            schedule.probe_indexes(total_docs).end,
            schedule.probe_size,
            plan.reasoning,
            schedule.tail_min
        );
        tracing::info!(chunk_size = plan.chunk_size, reasoning = %reasoning, "chunk plan");
        Ok(Some(reasoning))
    }
}

impl BodyPlanner {
    /// A probe chunk that will bring no timing (a record of it crashed the model): the
    /// body is planned from the others.
    pub fn probe_lost(&mut self) {
        self.probes_to_measure = self.probes_to_measure.saturating_sub(1);
    }
}

/// A chunk's answer as the pool gave it back.
pub(super) enum ChunkAnswer<T> {
    /// The whole chunk, from one task.
    Whole(Piece<T>),
    /// Its records one by one, some of which crash the model (`poison.rs`).
    Salvaged(Salvage<T>),
}

/// Writes answered chunks as shards and records them, keeping the report's tallies.
pub(super) struct ChunkWriter<'a, W: ChunkWork> {
    pub out: &'a OutputDir,
    pub work: &'a W,
    pub store: ManifestStore<'a>,
    pub body_planner: BodyPlanner,
    pub plan_reasoning: String,
    pub builder: ReportBuilder,
    pub tally: W::Tally,
    /// Records written or found to crash the model (this run's and reused ones).
    pub done_docs: u64,
    /// The input's file names, by index, for the places of records that crash the model.
    pub file_names: Arc<Vec<String>>,
    pub on_bad_record: BadRecordPolicy,
}

impl<W: ChunkWork> ChunkWriter<'_, W> {
    /// Writes `chunk`'s shard from its answer and records it in the manifest.
    pub async fn write(
        &mut self,
        chunk: PendingChunk,
        answer: ChunkAnswer<W::Data>,
    ) -> Result<(), JobError> {
        let (pieces, kept, crashed) = match answer {
            ChunkAnswer::Whole(piece) => {
                if piece.rows != chunk.ids.len() {
                    return Err(JobError::ChunkFailed {
                        index: chunk.index,
                        error: format!(
                            "{} answers for the chunk's {} records",
                            piece.rows,
                            chunk.ids.len()
                        ),
                    });
                }
                (vec![piece], None, Vec::new())
            }
            ChunkAnswer::Salvaged(salvage) => {
                let crashed = self.crashed_records(&chunk, &salvage.crashed)?;
                if chunk.probe {
                    self.body_planner.probe_lost();
                }
                (salvage.pieces, Some(salvage.kept), crashed)
            }
        };
        let (ids, carried) = match &kept {
            None => (chunk.ids.clone(), chunk.kept.clone()),
            Some(kept) => (
                kept.iter().map(|&i| chunk.ids[i].clone()).collect(),
                match chunk.kept.is_empty() {
                    true => Vec::new(),
                    false => kept.iter().map(|&i| chunk.kept[i].clone()).collect(),
                },
            ),
        };
        let chunk_tally = self.tally_pieces(chunk.index, &pieces, &carried)?;
        let carried = self.work.kept_as_written(carried);
        let windows = self.work.row_windows(&pieces);
        let rows_of = ShardRows {
            ids: &ids,
            kept: &carried,
            windows: &windows,
        };
        let rows = ids.len() as u64;
        let (data_file, data) =
            self.work
                .shard_data(chunk.index, &pieces, &rows_of, self.store.manifest_mut())?;
        let mut entry = self
            .out
            .write_shard(chunk.index, data_file, data, &rows_of)
            .await?;
        entry.crashed = crashed;
        entry.counts = self.work.lasting_counts(&chunk_tally);
        W::merge_tally(&mut self.tally, chunk_tally);
        self.store.record(entry).await?;
        self.done_docs += chunk.ids.len() as u64;
        if chunk.probe && kept.is_none() {
            let piece = &pieces[0];
            self.body_planner
                .timings
                .add(&piece.actor_id.to_string(), rows, piece.micros);
        }
        if chunk.probe
            && let Some(reasoning) = self.body_planner.plan_if_due(&mut self.store).await?
        {
            self.plan_reasoning = reasoning;
        }
        Ok(())
    }

    /// The chunk's tallies from its pieces (checked to come from the output's model), each
    /// piece's records' carried fields beside it.
    fn tally_pieces(
        &mut self,
        index: u64,
        pieces: &[Piece<W::Data>],
        carried: &[Kept],
    ) -> Result<W::Tally, JobError> {
        let (mut first_record, mut chunk_tally) = (0, W::Tally::default());
        for piece in pieces {
            self.store.manifest_mut().check_model_content(
                &piece.model_fingerprint,
                index,
                &format!("actor {} on node {}", piece.actor_id, piece.node_id),
            )?;
            let records = first_record..first_record + piece.rows;
            let piece_kept = carried.get(records).unwrap_or_default();
            self.work.tally(&mut chunk_tally, piece, piece_kept);
            first_record += piece.rows;
            self.builder.add_chunk(piece);
        }
        Ok(chunk_tally)
    }

    /// The bad records of a chunk's records that crash the model; under
    /// `--on-bad-record fail`, the error naming the first.
    fn crashed_records(
        &self,
        chunk: &PendingChunk,
        crashed: &[(usize, String)],
    ) -> Result<Vec<BadRecord>, JobError> {
        let records: Vec<BadRecord> = crashed
            .iter()
            .map(|(position, error)| {
                let (file, line) = chunk.places[*position];
                BadRecord {
                    file: self.file_names[file as usize].clone(),
                    line,
                    reason: error.clone(),
                }
            })
            .collect();
        match records.first() {
            Some(first) if self.on_bad_record == BadRecordPolicy::Fail => {
                Err(JobError::BadRecord {
                    file: first.file.clone(),
                    line: first.line,
                    reason: first.reason.clone(),
                })
            }
            _ => Ok(records),
        }
    }
}
