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
//! restarts, so a corpus with many poison records does not wear the pool out.

use futures::StreamExt;
use resident_proto::CRASHES_THE_MODEL;
use resident_sdk::{Pool, SubmitOptions, TaskOutput};

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

/// Runs the records of chunk `index` (its task's `payload`) one per task.
pub(super) async fn one_by_one<W: ChunkWork>(
    work: &W,
    pool: &Pool,
    index: u64,
    payload: &[u8],
) -> Result<Salvage<W::Data>, JobError> {
    let singles = work.split(payload).map_err(|e| JobError::ChunkFailed {
        index,
        error: format!("cannot re-read the chunk to find the record that crashes: {e}"),
    })?;
    let count = singles.len();
    tracing::warn!(
        chunk = index,
        records = count,
        "a record of this chunk crashes the model; running its records one by one to find it"
    );
    let options = SubmitOptions {
        expected_tasks: count as u64,
        ..Default::default()
    };
    let mut results = pool
        .submit_with(
            &format!("find the poison in chunk {index}"),
            futures::stream::iter(singles),
            options,
        )
        .await?;
    let mut outputs = Vec::with_capacity(count);
    while let Some(output) = results.next().await {
        outputs.push(output?);
    }
    sort_salvage(work, index, count, outputs)
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
    use crate::corpus_job::{EmbedWork, OutputDtype};
    use prost::Message;
    use resident_proto::pb;
    use resident_sdk::{ActorId, NodeId};

    const WORK: EmbedWork = EmbedWork {
        dtype: OutputDtype::F32,
    };

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
        let salvage = sort_salvage(&WORK, 9, 3, outputs).unwrap();
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
        let error = sort_salvage(&WORK, 3, 1, outputs).unwrap_err().to_string();
        assert!(
            error.contains("chunk 3") && error.contains("node lost"),
            "{error}"
        );
        let error = sort_salvage(&WORK, 3, 2, vec![answer(0, Ok(one_vector(1.0)))])
            .unwrap_err()
            .to_string();
        assert!(error.contains("1 of its 2 records"), "{error}");
    }
}
