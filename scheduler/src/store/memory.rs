use std::collections::BTreeMap;
use std::sync::Mutex;

use prost::Message;
use resident_proto::{ActorId, JobId, NodeId, pb};

use super::{
    DurableStore, StoreError, StoreOp, StoredOutcome, StoredPlacement, StoredUsage, encode_job,
    encode_pool,
};

/// Keeps state for the life of the process (local mode without `--state-dir`).
#[derive(Default)]
pub struct MemoryStore {
    inner: Mutex<Tables>,
}

#[derive(Default)]
struct Tables {
    pools: BTreeMap<String, Vec<u8>>,
    jobs: BTreeMap<String, Vec<u8>>,
    outcomes: BTreeMap<(String, u64), StoredOutcome>,
    nodes: std::collections::BTreeSet<String>,
    placements: BTreeMap<String, StoredPlacement>,
    pool_usage: BTreeMap<String, StoredUsage>,
}

impl DurableStore for MemoryStore {
    fn load_pools(&self) -> Result<Vec<pb::PoolSpec>, StoreError> {
        let tables = self.inner.lock().expect("store lock");
        let pools = tables
            .pools
            .values()
            .map(|b| pb::PoolSpec::decode(b.as_slice()));
        Ok(pools.collect::<Result<_, _>>()?)
    }

    fn load_jobs(&self) -> Result<Vec<pb::JobStatus>, StoreError> {
        let tables = self.inner.lock().expect("store lock");
        let jobs = tables
            .jobs
            .values()
            .map(|b| pb::JobStatus::decode(b.as_slice()));
        Ok(jobs.collect::<Result<_, _>>()?)
    }

    fn outcomes(&self, job: &JobId) -> Result<Vec<(u64, StoredOutcome)>, StoreError> {
        let tables = self.inner.lock().expect("store lock");
        let key = job.as_str().to_owned();
        Ok(tables
            .outcomes
            .range((key.clone(), 0)..=(key, u64::MAX))
            .map(|((_, seq), outcome)| (*seq, outcome.clone()))
            .collect())
    }

    fn load_nodes(&self) -> Result<Vec<NodeId>, StoreError> {
        let tables = self.inner.lock().expect("store lock");
        Ok(tables
            .nodes
            .iter()
            .map(|n| NodeId::new(n.clone()))
            .collect())
    }

    fn load_placements(&self) -> Result<Vec<(ActorId, StoredPlacement)>, StoreError> {
        let tables = self.inner.lock().expect("store lock");
        Ok(tables
            .placements
            .iter()
            .map(|(id, placed)| (ActorId::new(id.clone()), placed.clone()))
            .collect())
    }

    fn load_pool_usage(&self) -> Result<Vec<StoredUsage>, StoreError> {
        let tables = self.inner.lock().expect("store lock");
        Ok(tables.pool_usage.values().cloned().collect())
    }

    fn apply(&self, batch: &[StoreOp]) -> Result<(), StoreError> {
        let mut tables = self.inner.lock().expect("store lock");
        for op in batch {
            match op {
                StoreOp::PutPool(spec) => {
                    tables.pools.insert(spec.name.clone(), encode_pool(spec));
                }
                StoreOp::DeletePool(name) => {
                    tables.pools.remove(name.as_str());
                    tables.pool_usage.remove(name.as_str());
                }
                StoreOp::PutJob(job) => {
                    tables.jobs.insert(job.job_id.clone(), encode_job(job));
                }
                StoreOp::DeleteJob(job) => {
                    tables.jobs.remove(job.as_str());
                    let key = job.as_str().to_owned();
                    let seqs: Vec<u64> = tables
                        .outcomes
                        .range((key.clone(), 0)..=(key.clone(), u64::MAX))
                        .map(|((_, seq), _)| *seq)
                        .collect();
                    for seq in seqs {
                        tables.outcomes.remove(&(key.clone(), seq));
                    }
                }
                StoreOp::PutOutcome { job, seq, outcome } => {
                    tables
                        .outcomes
                        .insert((job.as_str().to_owned(), *seq), outcome.clone());
                }
                StoreOp::PutNode(node) => {
                    tables.nodes.insert(node.as_str().to_owned());
                }
                StoreOp::DeleteNode(node) => {
                    tables.nodes.remove(node.as_str());
                }
                StoreOp::PutPlacement { actor, pool, node } => {
                    let placed = StoredPlacement {
                        pool: pool.to_string(),
                        node: node.to_string(),
                    };
                    tables.placements.insert(actor.to_string(), placed);
                }
                StoreOp::DeletePlacement(actor) => {
                    tables.placements.remove(actor.as_str());
                }
                StoreOp::PutPoolUsage(usage) => {
                    tables.pool_usage.insert(usage.pool.clone(), usage.clone());
                }
            }
        }
        Ok(())
    }
}
