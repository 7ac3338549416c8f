use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{RwLock, RwLockReadGuard};

use prost::Message;
use redb::{Database, ReadableTable, TableDefinition};
use resident_proto::{ActorId, JobId, NodeId, pb};

use super::{
    DurableStore, StoreError, StoreOp, StoredOutcome, StoredPlacement, StoredUsage, encode_job,
    encode_pool,
};

const POOLS: TableDefinition<&str, &[u8]> = TableDefinition::new("pools");
const JOBS: TableDefinition<&str, &[u8]> = TableDefinition::new("jobs");
const OUTCOMES: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("task_outcomes");
/// Node ids that were alive when last written (the value is unused).
const NODES: TableDefinition<&str, &[u8]> = TableDefinition::new("nodes");
/// Actor id to where it was started (`StoredPlacement`, JSON).
const PLACEMENTS: TableDefinition<&str, &[u8]> = TableDefinition::new("placements");
/// Pool name to what its actors have held (`StoredUsage`, protobuf).
const POOL_USAGE: TableDefinition<&str, &[u8]> = TableDefinition::new("pool_usage");

/// An embedded redb database at `<state-dir>/scheduler.redb`.
///
/// After a failed write redb refuses every later operation ("previous I/O error") until
/// the database is opened again: [`DurableStore::recover`] closes and reopens it (redb
/// repairs the file as it opens, from its last committed transaction).
pub struct RedbStore {
    path: PathBuf,
    /// `None` only between closing and reopening, or when a reopen failed.
    db: RwLock<Option<Database>>,
    /// A write failed: the database must be reopened before the next one.
    broken: AtomicBool,
}

fn backend(error: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(error.to_string())
}

impl RedbStore {
    /// Opens (or creates) the store in `state_dir`.
    pub fn open(state_dir: &Path) -> Result<Self, StoreError> {
        std::fs::create_dir_all(state_dir).map_err(|e| {
            StoreError::Backend(format!(
                "cannot create state dir {}: {e}",
                state_dir.display()
            ))
        })?;
        let path = state_dir.join("scheduler.redb");
        let db = open_database(&path)?;
        Ok(Self {
            path,
            db: RwLock::new(Some(db)),
            broken: AtomicBool::new(false),
        })
    }

    fn database(&self) -> Result<DatabaseGuard<'_>, StoreError> {
        let guard = self.db.read().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() {
            return Err(StoreError::Backend(format!(
                "{} is closed after a failed write and could not be opened again yet",
                self.path.display()
            )));
        }
        Ok(DatabaseGuard(guard))
    }

    fn load_all<M: Message + Default>(
        &self,
        table: TableDefinition<&str, &[u8]>,
    ) -> Result<Vec<M>, StoreError> {
        let txn = self.database()?.begin_read().map_err(backend)?;
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
        let txn = self.database()?.begin_read().map_err(backend)?;
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
        let txn = self.database()?.begin_read().map_err(backend)?;
        let table = txn.open_table(NODES).map_err(backend)?;
        let mut out = Vec::new();
        for entry in table.iter().map_err(backend)? {
            let (key, _) = entry.map_err(backend)?;
            out.push(NodeId::new(key.value().to_owned()));
        }
        Ok(out)
    }

    fn load_placements(&self) -> Result<Vec<(ActorId, StoredPlacement)>, StoreError> {
        let txn = self.database()?.begin_read().map_err(backend)?;
        let table = txn.open_table(PLACEMENTS).map_err(backend)?;
        let mut out = Vec::new();
        for entry in table.iter().map_err(backend)? {
            let (key, value) = entry.map_err(backend)?;
            let placed = serde_json::from_slice(value.value())?;
            out.push((ActorId::new(key.value().to_owned()), placed));
        }
        Ok(out)
    }

    fn load_pool_usage(&self) -> Result<Vec<StoredUsage>, StoreError> {
        self.load_all(POOL_USAGE)
    }

    fn apply(&self, batch: &[StoreOp]) -> Result<(), StoreError> {
        let applied = self.apply_once(batch);
        if applied.is_err() {
            self.broken.store(true, Ordering::Relaxed);
        }
        applied
    }

    fn recover(&self) -> Result<(), StoreError> {
        if !self.broken.load(Ordering::Relaxed) {
            return Ok(());
        }
        let mut db = self.db.write().unwrap_or_else(|e| e.into_inner());
        // The old handle holds the file's lock: it closes before the file opens again.
        *db = None;
        *db = Some(open_database(&self.path)?);
        self.broken.store(false, Ordering::Relaxed);
        tracing::info!(path = %self.path.display(), "reopened the state store after a failed write");
        Ok(())
    }
}

/// The database, read-locked against a reopen.
struct DatabaseGuard<'a>(RwLockReadGuard<'a, Option<Database>>);

impl std::ops::Deref for DatabaseGuard<'_> {
    type Target = Database;
    fn deref(&self) -> &Database {
        self.0.as_ref().expect("checked when the guard was made")
    }
}

/// Opens (or creates) the database and every table.
fn open_database(path: &Path) -> Result<Database, StoreError> {
    let db = Database::create(path).map_err(backend)?;
    let txn = db.begin_write().map_err(backend)?;
    txn.open_table(POOLS).map_err(backend)?;
    txn.open_table(JOBS).map_err(backend)?;
    txn.open_table(OUTCOMES).map_err(backend)?;
    txn.open_table(NODES).map_err(backend)?;
    txn.open_table(PLACEMENTS).map_err(backend)?;
    txn.open_table(POOL_USAGE).map_err(backend)?;
    txn.commit().map_err(backend)?;
    Ok(db)
}

impl RedbStore {
    fn apply_once(&self, batch: &[StoreOp]) -> Result<(), StoreError> {
        let txn = self.database()?.begin_write().map_err(backend)?;
        {
            let mut pools = txn.open_table(POOLS).map_err(backend)?;
            let mut jobs = txn.open_table(JOBS).map_err(backend)?;
            let mut outcomes = txn.open_table(OUTCOMES).map_err(backend)?;
            let mut nodes = txn.open_table(NODES).map_err(backend)?;
            let mut placements = txn.open_table(PLACEMENTS).map_err(backend)?;
            let mut pool_usage = txn.open_table(POOL_USAGE).map_err(backend)?;
            for op in batch {
                match op {
                    StoreOp::PutPool(spec) => {
                        pools
                            .insert(spec.name.as_str(), encode_pool(spec).as_slice())
                            .map_err(backend)?;
                    }
                    StoreOp::DeletePool(name) => {
                        pools.remove(name.as_str()).map_err(backend)?;
                        pool_usage.remove(name.as_str()).map_err(backend)?;
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
                    StoreOp::PutPoolUsage(usage) => {
                        pool_usage
                            .insert(usage.pool.as_str(), usage.encode_to_vec().as_slice())
                            .map_err(backend)?;
                    }
                }
            }
        }
        txn.commit().map_err(backend)?;
        Ok(())
    }
}
