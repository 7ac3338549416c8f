//! Chunks that hold an input which crashes the model.
//!
//! When an actor crashes on a task, the scheduler runs that task once more, alone. If it
//! crashes again, the task fails for good with [`CRASHES_THE_MODEL`]
//! (`scheduler/src/core/quarantine.rs`). For an embed chunk, that points at one record or a
//! few. The job then embeds the chunk's records one per task, so that only the records that
//! crash are left out. Those become bad records in the report, or stop the job under
//! `--on-bad-record fail`. The other records' vectors are written as the chunk's shard.
//!
//! One record per task costs one more crash per poison record. A bisection would cost two
//! crashes at every level, and each crash reloads a model. Proven crashes spend no actor
//! restarts, so a corpus with many poison records does not wear the pool out.

use futures::StreamExt;
use prost::Message;
use resident_proto::{CRASHES_THE_MODEL, pb};
use resident_sdk::{EmbeddedChunk, Pool, SubmitOptions, TaskOutput, embed_request};

use super::JobError;

/// Whether a task's error says its input crashes the model.
pub(super) fn crashes_the_model(error: &str) -> bool {
    error.starts_with(CRASHES_THE_MODEL)
}

/// What embedding a crashing chunk one record at a time left.
#[derive(Debug, Default)]
pub(super) struct Salvage {
    /// One piece per record that embedded, in chunk order.
    pub pieces: Vec<EmbeddedChunk>,
    /// The chunk positions of the records in `pieces`, ascending.
    pub kept: Vec<usize>,
    /// The positions of the records that crash the model, with their tasks' errors.
    pub crashed: Vec<(usize, String)>,
}

/// Embeds the texts of chunk `index` (its `EmbedRequest` payload) one per task.
pub(super) async fn embed_one_by_one(
    pool: &Pool,
    index: u64,
    payload: &[u8],
) -> Result<Salvage, JobError> {
    let request = pb::EmbedRequest::decode(payload).map_err(|e| JobError::ChunkFailed {
        index,
        error: format!("cannot re-read the chunk to find the record that crashes: {e}"),
    })?;
    let count = request.texts.len();
    tracing::warn!(
        chunk = index,
        records = count,
        "a record of this chunk crashes the model; embedding its records one by one to find it"
    );
    let singles: Vec<_> = request
        .texts
        .into_iter()
        .map(|text| embed_request(vec![text], request.is_query))
        .collect();
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
    sort_salvage(index, count, outputs)
}

/// Sorts the answers of one-record tasks (in any order) into a [`Salvage`].
fn sort_salvage(
    index: u64,
    count: usize,
    mut outputs: Vec<TaskOutput>,
) -> Result<Salvage, JobError> {
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
    let mut salvage = Salvage::default();
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
                let piece =
                    EmbeddedChunk::from_output(output).map_err(|e| JobError::ChunkFailed {
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
        let salvage = sort_salvage(9, 3, outputs).unwrap();
        assert_eq!(salvage.kept, vec![0, 2]);
        assert_eq!(salvage.crashed, vec![(1, crash)]);
        let values: Vec<f32> = salvage
            .pieces
            .iter()
            .flat_map(|p| p.values.clone())
            .collect();
        assert_eq!(values, vec![0.0, 0.0, 2.0, 2.0]);
    }

    #[test]
    fn another_failure_or_a_missing_answer_fails_the_chunk() {
        let outputs = vec![answer(0, Err("node lost 4 times".into()))];
        let error = sort_salvage(3, 1, outputs).unwrap_err().to_string();
        assert!(
            error.contains("chunk 3") && error.contains("node lost"),
            "{error}"
        );
        let error = sort_salvage(3, 2, vec![answer(0, Ok(one_vector(1.0)))])
            .unwrap_err()
            .to_string();
        assert!(error.contains("1 of its 2 records"), "{error}");
    }
}
