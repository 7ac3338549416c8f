use std::path::Path;

use prost::Message;
use redb::{Database, ReadableTable, TableDefinition};
use resident_proto::{ActorId, JobId, NodeId, pb};

use super::{
    DurableStore, StoreError, StoreOp, StoredOutcome, StoredPlacement, encode_job, encode_pool,
};

const POOLS: TableDefinition<&str, &[u8]> = TableDefinition::new("pools");
const JOBS: TableDefinition<&str, &[u8]> = TableDefinition::new("jobs");
const OUTCOMES: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("task_outcomes");
/// Node ids that were alive when last written (the value is unused).
const NODES: TableDefinition<&str, &[u8]> = TableDefinition::new("nodes");
/// Actor id to where it was started (`StoredPlacement`, JSON).
const PLACEMENTS: TableDefinition<&str, &[u8]> = TableDefinition::new("placements");

/// An embedded redb database at `<state-dir>/scheduler.redb`.
pub struct RedbStore {
    db: Database,
}

fn backend(error: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(error.to_string())
}

impl RedbStore {
    pub fn open(state_dir: &Path) -> Result<Self, StoreError> {
        std::fs::create_dir_all(state_dir).map_err(|e| {
            StoreError::Backend(format!(
                "cannot create state dir {}: {e}",
                state_dir.display()
            ))
        })?;
        let db = Database::create(state_dir.join("scheduler.redb")).map_err(backend)?;
        let txn = db.begin_write().map_err(backend)?;
        txn.open_table(POOLS).map_err(backend)?;
        txn.open_table(JOBS).map_err(backend)?;
        txn.open_table(OUTCOMES).map_err(backend)?;
        txn.open_table(NODES).map_err(backend)?;
        txn.open_table(PLACEMENTS).map_err(backend)?;
        txn.commit().map_err(backend)?;
        Ok(Self { db })
    }

    fn load_all<M: Message + Default>(
        &self,
        table: TableDefinition<&str, &[u8]>,
    ) -> Result<Vec<M>, StoreError> {
        let txn = self.db.begin_read().map_err(backend)?;
        let table = txn.open_table(table).map_err(backend)?;
        let mut out = Vec::new();
        for entry in table.iter().map_err(backend)? {
            let (_, value) = entry.map_err(backend)?;
            out.push(M::decode(value.value())?);
        }
        Ok(out)
    }
}

impl DurableStore for RedbStore {
    fn load_pools(&self) -> Result<Vec<pb::PoolSpec>, StoreError> {
        self.load_all(POOLS)
    }

    fn load_jobs(&self) -> Result<Vec<pb::JobStatus>, StoreError> {
        self.load_all(JOBS)
    }

    fn outcomes(&self, job: &JobId) -> Result<Vec<(u64, StoredOutcome)>, StoreError> {
        let txn = self.db.begin_read().map_err(backend)?;
        let table = txn.open_table(OUTCOMES).map_err(backend)?;
        let mut out = Vec::new();
        let range = table
            .range((job.as_str(), 0)..=(job.as_str(), u64::MAX))
            .map_err(backend)?;
        for entry in range {
            let (key, value) = entry.map_err(backend)?;
            out.push((key.value().1, serde_json::from_slice(value.value())?));
        }
        Ok(out)
    }

    fn load_nodes(&self) -> Result<Vec<NodeId>, StoreError> {
        let txn = self.db.begin_read().map_err(backend)?;
        let table = txn.open_table(NODES).map_err(backend)?;
        let mut out = Vec::new();
        for entry in table.iter().map_err(backend)? {
            let (key, _) = entry.map_err(backend)?;
            out.push(NodeId::new(key.value().to_owned()));
        }
        Ok(out)
    }

    fn load_placements(&self) -> Result<Vec<(ActorId, StoredPlacement)>, StoreError> {
        let txn = self.db.begin_read().map_err(backend)?;
        let table = txn.open_table(PLACEMENTS).map_err(backend)?;
        let mut out = Vec::new();
        for entry in table.iter().map_err(backend)? {
            let (key, value) = entry.map_err(backend)?;
            let placed = serde_json::from_slice(value.value())?;
            out.push((ActorId::new(key.value().to_owned()), placed));
        }
        Ok(out)
    }

    fn apply(&self, batch: &[StoreOp]) -> Result<(), StoreError> {
        let txn = self.db.begin_write().map_err(backend)?;
        {
            let mut pools = txn.open_table(POOLS).map_err(backend)?;
            let mut jobs = txn.open_table(JOBS).map_err(backend)?;
            let mut outcomes = txn.open_table(OUTCOMES).map_err(backend)?;
            let mut nodes = txn.open_table(NODES).map_err(backend)?;
            let mut placements = txn.open_table(PLACEMENTS).map_err(backend)?;
            for op in batch {
                match op {
                    StoreOp::PutPool(spec) => {
                        pools
                            .insert(spec.name.as_str(), encode_pool(spec).as_slice())
                            .map_err(backend)?;
                    }
                    StoreOp::DeletePool(name) => {
                        pools.remove(name.as_str()).map_err(backend)?;
                    }
                    StoreOp::PutJob(job) => {
                        jobs.insert(job.job_id.as_str(), encode_job(job).as_slice())
                            .map_err(backend)?;
                    }
                    StoreOp::DeleteJob(job) => {
                        jobs.remove(job.as_str()).map_err(backend)?;
                        outcomes
                            .retain_in((job.as_str(), 0)..=(job.as_str(), u64::MAX), |_, _| false)
                            .map_err(backend)?;
                    }
                    StoreOp::PutOutcome { job, seq, outcome } => {
                        let value = serde_json::to_vec(outcome)?;
                        outcomes
                            .insert((job.as_str(), *seq), value.as_slice())
                            .map_err(backend)?;
                    }
                    StoreOp::PutNode(node) => {
                        nodes
                            .insert(node.as_str(), [].as_slice())
                            .map_err(backend)?;
                    }
                    StoreOp::DeleteNode(node) => {
                        nodes.remove(node.as_str()).map_err(backend)?;
                    }
                    StoreOp::PutPlacement { actor, pool, node } => {
                        let value = serde_json::to_vec(&StoredPlacement {
                            pool: pool.to_string(),
                            node: node.to_string(),
                        })?;
                        placements
                            .insert(actor.as_str(), value.as_slice())
                            .map_err(backend)?;
                    }
                    StoreOp::DeletePlacement(actor) => {
                        placements.remove(actor.as_str()).map_err(backend)?;
                    }
                }
            }
        }
        txn.commit().map_err(backend)?;
        Ok(())
    }
}
