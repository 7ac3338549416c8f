//! State that survives a scheduler restart: pools, jobs and task outcomes.
//!
//! [`DurableStore`] is synchronous; [`StoreWriter`] owns one on its own thread and applies
//! writes in batches (group commit), so the scheduler loop never waits on disk, while an
//! answer that acknowledges a change leaves only once the change is on disk.

mod durable;
mod memory;
mod redb_store;
#[cfg(test)]
pub(crate) mod testing;
mod writer;

pub use durable::{DurableStore, StoreError, StoreOp, StoredOutcome, StoredPlacement, StoredUsage};
pub(crate) use durable::{encode_job, encode_pool};
pub use memory::MemoryStore;
pub use redb_store::RedbStore;
pub use writer::{MAX_UNWRITTEN_OPS, StoreHealth, StoreWriter, WriteOutcome};

#[cfg(test)]
mod tests {
    use super::*;
    use resident_proto::{ActorId, JobId, NodeId, PoolName, pb};

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
        let usage = |pool: &str, gpu_seconds: f64| StoredUsage {
            pool: pool.into(),
            since_unix_ms: 1_700_000_000_000,
            classes: vec![pb::HeldUsage {
                gpu_name: "NVIDIA A10G".into(),
                node_pool_label: "spot".into(),
                gpu_seconds,
                cpu_core_seconds: 0.5,
            }],
        };
        let put_usage =
            |pool: &str, gpu_seconds: f64| StoreOp::PutPoolUsage(usage(pool, gpu_seconds));
        store
            .apply(&[
                put_usage("emb", 1.0),
                put_usage("emb", 2.5),
                put_usage("gone", 9.0),
            ])
            .unwrap();
        store
            .apply(&[StoreOp::DeletePool(PoolName::from("gone"))])
            .unwrap();
        assert_eq!(
            store.load_pool_usage().unwrap(),
            vec![usage("emb", 2.5)],
            "the last write counts; a deleted pool's usage goes with it"
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
        assert_eq!(
            reopened.load_pool_usage().unwrap()[0].classes[0].gpu_seconds,
            2.5
        );
    }
}
