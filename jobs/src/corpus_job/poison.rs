//! Chunks that hold an input which crashes the model.
//!
//! When an actor crashes on a task, the scheduler runs that task once more, alone. If it
//! crashes again, the task fails for good with [`CRASHES_THE_MODEL`]
//! (`scheduler/src/core/quarantine.rs`). For a corpus chunk, that points at one record or a
//! few. The job then runs the chunk's records one per task, so that only the records that
//! crash are left out. Those become bad records in the report, or stop the job under
//! `--on-bad-record fail`. The other records' answers are written as the chunk's shard.
//!
//! One record per task costs one more crash per poison record. A bisection would cost two
//! crashes at every level, and each crash reloads a model. Proven crashes spend no actor
//! restarts, so a corpus with many poison records does not wear the pool out. A chunk of
//! one record that crashes is that record: it is listed without running again.
//!
//! Every crashing chunk's records go through one job, the [`RecoveryQueue`], opened at the
//! first such chunk and fed as more arrive: a corpus with a thousand poison chunks holds
//! one job slot beside the main job, never one per chunk (which the principal's job limit
//! refuses).

use std::collections::{BTreeMap, VecDeque};

use futures::StreamExt;
use resident_proto::CRASHES_THE_MODEL;
use resident_sdk::{Bytes, JobStream, Pool, SubmitOptions, TaskOutput};
use tokio::sync::mpsc;

use super::JobError;
use super::work::{ChunkWork, Piece};

/// Whether a task's error says its input crashes the model.
pub(super) fn crashes_the_model(error: &str) -> bool {
    error.starts_with(CRASHES_THE_MODEL)
}

/// What running a crashing chunk one record at a time left.
#[derive(Debug)]
pub(super) struct Salvage<T> {
    /// One piece per record that did not crash, in chunk order.
    pub pieces: Vec<Piece<T>>,
    /// The chunk positions of the records in `pieces`, ascending.
    pub kept: Vec<usize>,
    /// The positions of the records that crash the model, with their tasks' errors.
    pub crashed: Vec<(usize, String)>,
}

/// A chunk handed back by the [`RecoveryQueue`]: the caller's tag and what its records left.
pub(super) type Recovered<C, T> = (C, Result<Salvage<T>, JobError>);

/// One chunk whose records run in the recovery job: the seqs `first..first + count`.
struct Recovering<C> {
    tag: C,
    index: u64,
    count: usize,
    outputs: Vec<TaskOutput>,
}

/// The crashing chunks of a job, their records run one per task through one job (see the
/// module doc). `C` is what the caller keeps with each chunk, handed back with its
/// [`Salvage`].
pub(super) struct RecoveryQueue<'a, W: ChunkWork, C> {
    work: &'a W,
    pool: &'a Pool,
    /// Feeds the recovery job (`None`: not opened yet, or closed by [`Self::close`]).
    inputs: Option<mpsc::UnboundedSender<Bytes>>,
    results: Option<JobStream>,
    closed: bool,
    next_seq: u64,
    /// Chunks waiting for answers, by the seq of their first record.
    running: BTreeMap<u64, Recovering<C>>,
    /// Chunks with every answer in (or settled without running), not yet handed back.
    done: VecDeque<Recovered<C, W::Data>>,
}

impl<'a, W: ChunkWork, C> RecoveryQueue<'a, W, C> {
    pub fn new(work: &'a W, pool: &'a Pool) -> Self {
        Self {
            work,
            pool,
            inputs: None,
            results: None,
            closed: false,
            next_seq: 0,
            running: BTreeMap::new(),
            done: VecDeque::new(),
        }
    }

    /// Whether a chunk is still to be handed back by [`Self::next`].
    pub fn is_empty(&self) -> bool {
        self.running.is_empty() && self.done.is_empty()
    }

    /// Queues chunk `index` (its task's `payload`), which failed with `error` (it crashes
    /// the model), to run one record per task.
    pub async fn add(
        &mut self,
        index: u64,
        payload: &[u8],
        error: String,
        tag: C,
    ) -> Result<(), JobError> {
        let singles = match self.work.split(payload) {
            Ok(singles) => singles,
            Err(e) => {
                let error =
                    format!("cannot re-read the chunk to find the record that crashes: {e}");
                self.done
                    .push_back((tag, Err(JobError::ChunkFailed { index, error })));
                return Ok(());
            }
        };
        let count = singles.len();
        if count == 1 {
            // The chunk is its one record: that is what crashes.
            let salvage = Salvage {
                pieces: Vec::new(),
                kept: Vec::new(),
                crashed: vec![(0, error)],
            };
            self.done.push_back((tag, Ok(salvage)));
            return Ok(());
        }
        tracing::warn!(
            chunk = index,
            records = count,
            "a record of this chunk crashes the model; running its records one by one to find it"
        );
        let inputs = self.open().await?;
        for single in singles {
            // The job's end is the only way the receiver goes; its stream reports that.
            let _ = inputs.send(single);
        }
        let first = self.next_seq;
        self.next_seq += count as u64;
        self.running.insert(
            first,
            Recovering {
                tag,
                index,
                count,
                outputs: Vec::with_capacity(count),
            },
        );
        Ok(())
    }

    /// The recovery job's input, opening the job the first time.
    async fn open(&mut self) -> Result<&mpsc::UnboundedSender<Bytes>, JobError> {
        if self.closed {
            return Err(JobError::Output(
                "a chunk to recover arrived after the job's last answer".into(),
            ));
        }
        if self.inputs.is_none() {
            let (inputs, receiver) = mpsc::unbounded_channel();
            let results = self
                .pool
                .submit_with(
                    "recover the records that crash the model",
                    tokio_stream::wrappers::UnboundedReceiverStream::new(receiver),
                    SubmitOptions::default(),
                )
                .await?;
            self.inputs = Some(inputs);
            self.results = Some(results);
        }
        Ok(self.inputs.as_ref().expect("opened"))
    }

    /// No chunk will be added any more: the recovery job ends once its records are
    /// answered.
    pub fn close(&mut self) {
        self.closed = true;
        self.inputs = None;
    }

    /// The next chunk whose records are all answered, sorted into a [`Salvage`]; `None`
    /// when none is queued. Cancel-safe: an answer read is kept even if the call is
    /// dropped.
    pub async fn next(&mut self) -> Option<Recovered<C, W::Data>> {
        loop {
            if let Some(done) = self.done.pop_front() {
                return Some(done);
            }
            let (&first, _) = self.running.first_key_value()?;
            let results = self
                .results
                .as_mut()
                .expect("a running chunk opened the job");
            let output = match results.next().await {
                Some(Ok(output)) => output,
                ended => {
                    let chunk = self.running.remove(&first).expect("listed");
                    let error = match ended {
                        Some(Err(error)) => JobError::from(error),
                        _ => JobError::ChunkFailed {
                            index: chunk.index,
                            error: "the job recovering its records ended before answering them"
                                .into(),
                        },
                    };
                    return Some((chunk.tag, Err(error)));
                }
            };
            let Some((&first, chunk)) = self
                .running
                .range_mut(..=output.seq)
                .next_back()
                .filter(|(first, chunk)| output.seq < **first + chunk.count as u64)
            else {
                continue;
            };
            chunk.outputs.push(output);
            if chunk.outputs.len() == chunk.count {
                let chunk = self.running.remove(&first).expect("listed");
                let salvage = sort_salvage(self.work, chunk.index, chunk.count, chunk.outputs);
                self.done.push_back((chunk.tag, salvage));
            }
        }
    }

    /// Waits for the recovery job to end (every chunk handed back and [`Self::close`]
    /// called), so it ends finished rather than cancelled.
    pub async fn finish(mut self) -> Result<(), JobError> {
        self.close();
        if let Some(mut results) = self.results.take() {
            while let Some(output) = results.next().await {
                output?;
            }
        }
        Ok(())
    }
}

/// Sorts the answers of one-record tasks (in any order) into a [`Salvage`].
fn sort_salvage<W: ChunkWork>(
    work: &W,
    index: u64,
    count: usize,
    mut outputs: Vec<TaskOutput>,
) -> Result<Salvage<W::Data>, JobError> {
    if outputs.len() != count {
        return Err(JobError::ChunkFailed {
            index,
            error: format!(
                "{} of its {count} records got an answer while looking for the one that crashes",
                outputs.len()
            ),
        });
    }
    outputs.sort_by_key(|output| output.seq);
    let mut salvage = Salvage {
        pieces: Vec::new(),
        kept: Vec::new(),
        crashed: Vec::new(),
    };
    for (position, output) in outputs.into_iter().enumerate() {
        match &output.output {
            Err(error) if crashes_the_model(error) => {
                salvage.crashed.push((position, error.clone()));
            }
            Err(error) => {
                return Err(JobError::ChunkFailed {
                    index,
                    error: format!("record {position} of the chunk failed: {error}"),
                });
            }
            Ok(_) => {
                let piece = work.read(output).map_err(|e| JobError::ChunkFailed {
                    index,
                    error: e.to_string(),
                })?;
                salvage.pieces.push(piece);
                salvage.kept.push(position);
            }
        }
    }
    Ok(salvage)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::corpus_job::EmbedWork;
    use prost::Message;
    use resident_proto::pb;
    use resident_sdk::{ActorId, NodeId};

    fn answer(seq: u64, output: Result<Vec<u8>, String>) -> TaskOutput {
        TaskOutput {
            seq,
            output: output.map(Into::into),
            attempts: 1,
            actor_id: ActorId::new("a"),
            node_id: NodeId::new("n"),
            queue_micros: 0,
            run_micros: 0,
        }
    }

    fn one_vector(value: f32) -> Vec<u8> {
        pb::EmbedResponse {
            count: 1,
            dim: 2,
            vectors: [value, value]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
            ..Default::default()
        }
        .encode_to_vec()
    }

    #[test]
    fn the_records_that_crash_are_set_apart_and_the_rest_kept_in_order() {
        let crash = format!("{CRASHES_THE_MODEL}: it crashed 2 actors");
        let outputs = vec![
            answer(2, Ok(one_vector(2.0))),
            answer(1, Err(crash.clone())),
            answer(0, Ok(one_vector(0.0))),
        ];
        let salvage = sort_salvage(&EmbedWork::default(), 9, 3, outputs).unwrap();
        assert_eq!(salvage.kept, vec![0, 2]);
        assert_eq!(salvage.crashed, vec![(1, crash)]);
        let values: Vec<f32> = salvage
            .pieces
            .iter()
            .flat_map(|p| p.data.values.clone())
            .collect();
        assert_eq!(values, vec![0.0, 0.0, 2.0, 2.0]);
    }

    #[test]
    fn another_failure_or_a_missing_answer_fails_the_chunk() {
        let outputs = vec![answer(0, Err("node lost 4 times".into()))];
        let error = sort_salvage(&EmbedWork::default(), 3, 1, outputs)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("chunk 3") && error.contains("node lost"),
            "{error}"
        );
        let error = sort_salvage(
            &EmbedWork::default(),
            3,
            2,
            vec![answer(0, Ok(one_vector(1.0)))],
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("1 of its 2 records"), "{error}");
    }
}
