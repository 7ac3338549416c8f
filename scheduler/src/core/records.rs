//! What the scheduler loop remembers about each node, pool, actor, task and job.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Instant;

use prost::bytes::Bytes;
use resident_proto::{ActorId, JobId, PoolName, TaskId, pb};

use super::{AgentOutbound, JobResults};
use crate::placement::{Assignment, NodeCapacity, ResourceRequest};
use crate::state::{ActorState, Restarts};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(pub u64);

pub struct NodeRecord {
    pub generation: String,
    pub session: SessionId,
    pub hostname: String,
    pub labels: BTreeMap<String, String>,
    /// What placement may hand out here (VRAM free at registration).
    pub capacity: NodeCapacity,
    /// As registered; `free_vram_bytes` is updated by heartbeats.
    pub gpus: Vec<pb::GpuInfo>,
    pub cpu_cores: u32,
    pub ram_bytes: u64,
    pub actor_kinds: BTreeSet<String>,
    pub alive: bool,
    pub last_seen: Instant,
    pub outbound: Option<AgentOutbound>,
}

impl NodeRecord {
    /// Sends a message to the agent; a closed session is noticed by the session handler.
    pub fn send(&self, body: pb::scheduler_message::Body) {
        if let Some(outbound) = &self.outbound {
            let _ = outbound.send(Ok(pb::SchedulerMessage { body: Some(body) }));
        }
    }
}

pub struct PoolRecord {
    pub spec: pb::PoolSpec,
    pub request: ResourceRequest,
    pub in_flight_per_actor: u32,
    pub max_task_attempts: u32,
    pub max_restarts: u32,
    pub actors: BTreeSet<ActorId>,
    pub queue: VecDeque<TaskId>,
    /// Set once deletion starts; the record goes when its last actor is dead.
    pub deleting: bool,
}

pub struct ActorRecord {
    pub pool: PoolName,
    pub state: ActorState,
    pub restarts: Restarts,
    /// Bumped on every start, so reports from an earlier start are told apart.
    pub incarnation: u64,
    pub order: u64,
    pub assignment: Option<Assignment>,
    pub in_flight: BTreeSet<TaskId>,
    pub tasks_done: u64,
    /// Loads reported by earlier incarnations plus the current one.
    pub model_loads: u64,
    pub loads_before_this_start: u64,
    pub vram_bytes: u64,
    pub error: String,
    pub unplaced_reason: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskPhase {
    Queued,
    /// Waiting out a retry backoff.
    Backoff,
    Running,
}

pub struct TaskRecord {
    pub job: JobId,
    pub seq: u64,
    pub pool: PoolName,
    pub payload: Bytes,
    pub phase: TaskPhase,
    pub actor: Option<ActorId>,
    /// Number of times sent to an actor; an outcome must carry the current one.
    pub dispatch: u32,
    pub failures: u32,
    pub node_losses: u32,
    pub submitted_at: Instant,
    pub started_at: Option<Instant>,
    pub last_error: String,
    /// Cancelled while running: its outcome frees the actor's credit and is dropped.
    pub cancelled: bool,
}

pub struct JobRecord {
    pub status: pb::JobStatus,
    pub results: Option<JobResults>,
    pub input_closed: bool,
}

impl JobRecord {
    pub fn outstanding(&self) -> u64 {
        self.status.queued + self.status.running
    }
}
