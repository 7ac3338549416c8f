//! What the store keeps and the one trait every store implements: the operations
//! ([`StoreOp`]), the records they write, and [`DurableStore`]. A leaf: the stores
//! (memory, redb) and the writer thread build on it.

use prost::Message;
use resident_proto::{ActorId, JobId, NodeId, PoolName, pb};
use serde::{Deserialize, Serialize};

/// Why the state store failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database failed (its message).
    #[error("state store: {0}")]
    Backend(String),
    /// A record does not decode as protobuf.
    #[error("state store record is corrupt")]
    Decode(#[from] prost::DecodeError),
    /// A record does not decode as JSON.
    #[error("state store record is corrupt")]
    Json(#[from] serde_json::Error),
}

/// A task's final outcome as recorded (the output itself went to the client).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StoredOutcome {
    /// Whether the task succeeded.
    pub ok: bool,
    /// Times it was dispatched.
    pub attempts: u32,
    /// Its error, when it failed.
    pub error: Option<String>,
    /// Size of its output.
    pub output_bytes: u64,
    /// Documents the task covered (0 in records written before this field).
    #[serde(default)]
    pub items: u32,
}

/// One change the store writes, in order, from the writer thread.
#[derive(Clone, Debug)]
pub enum StoreOp {
    /// A pool was created or changed.
    PutPool(pb::PoolSpec),
    /// A pool was deleted.
    DeletePool(PoolName),
    /// A job's status changed.
    PutJob(pb::JobStatus),
    /// Forgets a finished job and its outcomes (history beyond the configured limit).
    DeleteJob(JobId),
    /// A task finished.
    PutOutcome {
        /// Its job.
        job: JobId,
        /// Its sequence number in the job.
        seq: u64,
        /// How it ended.
        outcome: StoredOutcome,
    },
    /// A node registered: a restarted scheduler waits a settle window for it.
    PutNode(NodeId),
    /// A node died or left: a restart does not wait for it.
    DeleteNode(NodeId),
    /// The scheduler started `actor` of `pool` on `node`: a restarted scheduler adopts it
    /// from that node only.
    PutPlacement {
        /// The actor.
        actor: ActorId,
        /// Its pool.
        pool: PoolName,
        /// The node it was started on.
        node: NodeId,
    },
    /// The actor is gone: no node may hand it back.
    DeletePlacement(ActorId),
    /// What a pool's actors have held so far (written every few seconds while they hold
    /// something, and at a clean stop). Removed with the pool by [`StoreOp::DeletePool`].
    PutPoolUsage(StoredUsage),
}

/// What a pool's actors have held since it was created, as last written: protobuf, as the
/// pool's spec is, with `PoolStatus.usage`'s own message for each price class.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StoredUsage {
    /// The pool.
    #[prost(string, tag = "1")]
    pub pool: String,
    /// When the counting began (the pool's creation), in Unix milliseconds.
    #[prost(uint64, tag = "2")]
    pub since_unix_ms: u64,
    /// GPU- and core-seconds by price class.
    #[prost(message, repeated, tag = "3")]
    pub classes: Vec<pb::HeldUsage>,
}

/// Where the scheduler last started an actor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredPlacement {
    /// The actor's pool.
    pub pool: String,
    /// The node.
    pub node: String,
}

/// Where the scheduler's state outlives the process: what a restarted scheduler reads back.
/// Writes go through `StoreOp`s on the writer thread.
pub trait DurableStore: Send + Sync + 'static {
    /// Every saved pool spec.
    fn load_pools(&self) -> Result<Vec<pb::PoolSpec>, StoreError>;
    /// Every saved job status.
    fn load_jobs(&self) -> Result<Vec<pb::JobStatus>, StoreError>;
    /// The outcomes recorded for `job`, by sequence number.
    fn outcomes(&self, job: &JobId) -> Result<Vec<(u64, StoredOutcome)>, StoreError>;
    /// Nodes that were alive when last written.
    fn load_nodes(&self) -> Result<Vec<NodeId>, StoreError>;
    /// Actors started and not gone, with their pool and node.
    fn load_placements(&self) -> Result<Vec<(ActorId, StoredPlacement)>, StoreError>;
    /// What each saved pool's actors had held when last written.
    fn load_pool_usage(&self) -> Result<Vec<StoredUsage>, StoreError>;
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
