//! State that survives a scheduler restart: pools, jobs and task outcomes.
//!
//! [`DurableStore`] is synchronous; [`StoreWriter`] owns one on its own thread and applies
//! writes in batches (group commit), so the scheduler loop never waits on disk, while an
//! answer that acknowledges a change leaves only once the change is on disk.

mod memory;
mod redb_store;
#[cfg(test)]
pub(crate) mod testing;
mod writer;

use prost::Message;
use resident_proto::{ActorId, JobId, NodeId, PoolName, pb};
use serde::{Deserialize, Serialize};

pub use memory::MemoryStore;
pub use redb_store::RedbStore;
pub use writer::{MAX_UNWRITTEN_OPS, StoreHealth, StoreWriter, WriteOutcome};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("state store: {0}")]
    Backend(String),
    #[error("state store record is corrupt")]
    Decode(#[from] prost::DecodeError),
    #[error("state store record is corrupt")]
    Json(#[from] serde_json::Error),
}

/// A task's final outcome as recorded (the output itself went to the client).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StoredOutcome {
    pub ok: bool,
    pub attempts: u32,
    pub error: Option<String>,
    pub output_bytes: u64,
    /// Documents the task covered (0 in records written before this field).
    #[serde(default)]
    pub items: u32,
}

#[derive(Clone, Debug)]
pub enum StoreOp {
    PutPool(pb::PoolSpec),
    DeletePool(PoolName),
    PutJob(pb::JobStatus),
    /// Forgets a finished job and its outcomes (history beyond the configured limit).
    DeleteJob(JobId),
    PutOutcome {
        job: JobId,
        seq: u64,
        outcome: StoredOutcome,
    },
    /// A node registered: a restarted scheduler waits a settle window for it.
    PutNode(NodeId),
    /// A node died or left: a restart does not wait for it.
    DeleteNode(NodeId),
    /// The scheduler started `actor` of `pool` on `node`: a restarted scheduler adopts it
    /// from that node only.
    PutPlacement {
        actor: ActorId,
        pool: PoolName,
        node: NodeId,
    },
    /// The actor is gone: no node may hand it back.
    DeletePlacement(ActorId),
}

/// Where the scheduler last started an actor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredPlacement {
    pub pool: String,
    pub node: String,
}

pub trait DurableStore: Send + Sync + 'static {
    fn load_pools(&self) -> Result<Vec<pb::PoolSpec>, StoreError>;
    fn load_jobs(&self) -> Result<Vec<pb::JobStatus>, StoreError>;
    fn outcomes(&self, job: &JobId) -> Result<Vec<(u64, StoredOutcome)>, StoreError>;
    /// Nodes that were alive when last written.
    fn load_nodes(&self) -> Result<Vec<NodeId>, StoreError>;
    /// Actors started and not gone, with their pool and node.
    fn load_placements(&self) -> Result<Vec<(ActorId, StoredPlacement)>, StoreError>;
    /// Applies a batch atomically.
    fn apply(&self, batch: &[StoreOp]) -> Result<(), StoreError>;
    /// Makes the store usable again after a failed [`DurableStore::apply`], before the
    /// writer tries again (redb refuses every operation after an I/O error until it is
    /// reopened). A store with nothing to recover does nothing.
    fn recover(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

pub(crate) fn encode_pool(spec: &pb::PoolSpec) -> Vec<u8> {
    spec.encode_to_vec()
}

pub(crate) fn encode_job(job: &pb::JobStatus) -> Vec<u8> {
    job.encode_to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exercise(store: &dyn DurableStore) {
        let spec = pb::PoolSpec {
            name: "emb".into(),
            actor_kind: "echo".into(),
            replicas: 2,
            ..Default::default()
        };
        let job = pb::JobStatus {
            job_id: "j1".into(),
            pool: "emb".into(),
            succeeded: 3,
            ..Default::default()
        };
        let outcome = StoredOutcome {
            ok: true,
            attempts: 1,
            error: None,
            output_bytes: 4,
            items: 1,
        };
        store
            .apply(&[
                StoreOp::PutPool(spec.clone()),
                StoreOp::PutJob(job.clone()),
                StoreOp::PutOutcome {
                    job: JobId::from("j1"),
                    seq: 7,
                    outcome: outcome.clone(),
                },
            ])
            .unwrap();
        assert_eq!(store.load_pools().unwrap(), vec![spec]);
        assert_eq!(store.load_jobs().unwrap(), vec![job.clone()]);
        assert_eq!(
            store.outcomes(&JobId::from("j1")).unwrap(),
            vec![(7, outcome.clone())]
        );
        store
            .apply(&[StoreOp::DeletePool(PoolName::from("emb"))])
            .unwrap();
        assert!(store.load_pools().unwrap().is_empty());
        store
            .apply(&[StoreOp::DeleteJob(JobId::from("j1"))])
            .unwrap();
        assert!(store.load_jobs().unwrap().is_empty());
        assert!(store.outcomes(&JobId::from("j1")).unwrap().is_empty());
        // Put back, for the reopen check of the redb test.
        let again = StoreOp::PutOutcome {
            job: JobId::from("j1"),
            seq: 7,
            outcome,
        };
        store.apply(&[StoreOp::PutJob(job), again]).unwrap();
        store
            .apply(&[
                StoreOp::PutNode(NodeId::from("n1")),
                StoreOp::PutNode(NodeId::from("n2")),
                StoreOp::PutNode(NodeId::from("n1")),
                StoreOp::DeleteNode(NodeId::from("n2")),
            ])
            .unwrap();
        assert_eq!(store.load_nodes().unwrap(), vec![NodeId::from("n1")]);
        store
            .apply(&[
                StoreOp::PutPlacement {
                    actor: ActorId::from("a1"),
                    pool: PoolName::from("emb"),
                    node: NodeId::from("n1"),
                },
                StoreOp::PutPlacement {
                    actor: ActorId::from("a2"),
                    pool: PoolName::from("emb"),
                    node: NodeId::from("n1"),
                },
                StoreOp::DeletePlacement(ActorId::from("a2")),
            ])
            .unwrap();
        let placed = StoredPlacement {
            pool: "emb".into(),
            node: "n1".into(),
        };
        assert_eq!(
            store.load_placements().unwrap(),
            vec![(ActorId::from("a1"), placed)]
        );
    }

    #[test]
    fn memory_store_round_trips() {
        exercise(&MemoryStore::default());
    }

    #[test]
    fn redb_store_round_trips_and_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = RedbStore::open(dir.path()).unwrap();
            exercise(&store);
            store
                .apply(&[StoreOp::PutPool(pb::PoolSpec {
                    name: "kept".into(),
                    ..Default::default()
                })])
                .unwrap();
        }
        let reopened = RedbStore::open(dir.path()).unwrap();
        assert_eq!(reopened.load_pools().unwrap()[0].name, "kept");
        assert_eq!(reopened.outcomes(&JobId::from("j1")).unwrap().len(), 1);
        assert_eq!(reopened.load_nodes().unwrap(), vec![NodeId::from("n1")]);
        assert_eq!(reopened.load_placements().unwrap().len(), 1);
    }
}
