//! What the cluster reports about its nodes, actors, pools and jobs, as plain Rust types
//! (the wire messages stay inside the SDK).

use std::collections::BTreeMap;
use std::time::Duration;

use resident_proto::{ActorId, JobId, NodeId, PoolName, pb};

use crate::pool_spec::PoolSpec;

/// One GPU of a node.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuInfo {
    /// The GPU's index on its node.
    pub index: u32,
    /// The GPU's UUID (NVML), or a simulated one.
    pub uuid: String,
    /// The GPU's model (`NVIDIA A10G`).
    pub name: String,
    /// The GPU's memory, in bytes.
    pub total_vram_bytes: u64,
    /// Memory not held by any actor, in bytes.
    pub free_vram_bytes: u64,
    /// CUDA compute capability, `(major, minor)`.
    pub compute_capability: (u32, u32),
    /// Capacity only (`--simulate-gpus`): the work runs on CPU.
    pub simulated: bool,
}

/// A GPU a node has that its agent could not open (held by another process in exclusive
/// mode, fallen off the bus): no actor is placed on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnavailableGpu {
    /// Its CUDA ordinal on the node.
    pub index: u32,
    /// The driver's reason.
    pub reason: String,
}

/// One node agent, alive or dead.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeInfo {
    /// The node's id (its agent's `--node-id`).
    pub node_id: NodeId,
    /// Changes whenever the agent process restarts.
    pub generation: String,
    /// The host the agent runs on.
    pub hostname: String,
    /// Whether the agent's heartbeats arrive.
    pub alive: bool,
    /// The node's labels, for pool selectors.
    pub labels: BTreeMap<String, String>,
    /// The node's GPUs.
    pub gpus: Vec<GpuInfo>,
    /// CPU cores the agent offers.
    pub cpu_cores: u32,
    /// The host's memory, in bytes.
    pub ram_bytes: u64,
    /// Milliseconds since the agent's last heartbeat.
    pub last_heartbeat_ms_ago: u64,
    /// The credential (token name) the agent joined with; `anonymous` without tokens.
    pub credential: String,
    /// The agent is shutting down: it takes no new tasks or actors and leaves once the
    /// tasks in hand are answered.
    pub draining: bool,
    /// GPUs the node has that its agent could not open (not in `gpus`).
    pub unavailable_gpus: Vec<UnavailableGpu>,
}

/// Where an actor is in its life (see the scheduler's actor state machine).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ActorState {
    /// Not placed on a node yet.
    Pending,
    /// Placed; loading its model.
    Starting,
    /// Loaded; taking tasks.
    Ready,
    /// Finishing the tasks in hand before it stops.
    Draining,
    /// Stopped or lost.
    Dead,
    /// A state this SDK does not know (a newer scheduler).
    Unknown,
}

impl ActorState {
    /// The name `resident status` prints.
    pub fn name(self) -> &'static str {
        match self {
            ActorState::Pending => "pending",
            ActorState::Starting => "starting",
            ActorState::Ready => "ready",
            ActorState::Draining => "draining",
            ActorState::Dead => "dead",
            ActorState::Unknown => "unknown",
        }
    }
}

/// One resident actor.
#[derive(Clone, Debug, PartialEq)]
pub struct ActorInfo {
    /// The actor's id.
    pub actor_id: ActorId,
    /// The pool it belongs to.
    pub pool: PoolName,
    /// `None` while the actor is not placed.
    pub node_id: Option<NodeId>,
    /// The GPUs it holds on its node.
    pub gpu_indices: Vec<u32>,
    /// The share of each GPU it holds (0 on the CPU).
    pub gpu_fraction: f64,
    /// Where it stands.
    pub state: ActorState,
    /// Model loads over every restart of this actor.
    pub model_loads: u64,
    /// Times the actor was started again after a failure.
    pub restarts: u32,
    /// VRAM it reserves, in bytes.
    pub vram_bytes: u64,
    /// Tasks it is running now.
    pub in_flight: u32,
    /// Tasks it has finished.
    pub tasks_done: u64,
    /// The last load or run error, if any.
    pub error: Option<String>,
}

impl ActorInfo {
    /// Whether the actor is placed on `node`.
    pub fn is_on(&self, node: &str) -> bool {
        self.node_id.as_ref().is_some_and(|n| n == node)
    }
}

/// A pool and its actors.
#[derive(Clone, Debug)]
pub struct PoolStatus {
    /// What the pool asked for.
    pub spec: PoolSpec,
    /// Actors that have loaded and take tasks.
    pub ready_actors: u32,
    /// The pool's actors.
    pub actors: Vec<ActorInfo>,
    /// Why some actors are not placed yet, when they are not.
    pub unplaced_reason: Option<String>,
    /// What its actors have held since the pool was created, by price class; each actor
    /// counts while it holds its place, lost ones until they were lost. It outlives a
    /// scheduler restart, less the time the scheduler was down (and, after a kill -9, its
    /// last few unsaved seconds). Empty from a scheduler that does not count it.
    pub usage: Vec<HeldUsage>,
    /// When `usage` began to be counted (the pool's creation), Unix milliseconds: two
    /// readings with the same value differ by what was held between them. 0 from a
    /// scheduler that does not say.
    pub usage_since_unix_ms: u64,
}

/// GPU-seconds and CPU core-seconds a pool's actors of one price class held.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HeldUsage {
    /// The GPU's model name as its agent reports it; empty for CPU actors.
    pub gpu_name: String,
    /// The node's `pool` label (what a job's `--price LABEL=USD` prices); empty when none.
    pub node_pool_label: String,
    /// Each actor's GPU fraction times its GPUs, times the seconds it held them.
    pub gpu_seconds: f64,
    /// CPU cores times the seconds they were held.
    pub cpu_core_seconds: f64,
}

impl From<pb::HeldUsage> for HeldUsage {
    fn from(usage: pb::HeldUsage) -> Self {
        Self {
            gpu_name: usage.gpu_name,
            node_pool_label: usage.node_pool_label,
            gpu_seconds: usage.gpu_seconds,
            cpu_core_seconds: usage.cpu_core_seconds,
        }
    }
}

impl PoolStatus {
    /// The replica count asked for.
    pub fn replicas(&self) -> u32 {
        self.spec.replicas_wanted()
    }
}

/// Where a job is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum JobState {
    /// Tasks queued or running.
    Running,
    /// Every task succeeded.
    Succeeded,
    /// Some task failed for good.
    Failed,
    /// Cancelled by its client.
    Cancelled,
    /// The scheduler restarted while the job ran; its recorded outcomes are kept.
    Interrupted,
    /// A state this client does not know (a newer scheduler).
    Unknown,
}

/// A job's counters: every submitted task is in exactly one of queued, running, succeeded,
/// failed and cancelled.
#[derive(Clone, Debug, PartialEq)]
pub struct JobStatus {
    /// The job's id.
    pub job_id: JobId,
    /// The pool it runs on.
    pub pool: PoolName,
    /// The name its client gave it.
    pub name: String,
    /// Where it stands.
    pub state: JobState,
    /// Tasks submitted so far.
    pub submitted: u64,
    /// Tasks waiting for an actor.
    pub queued: u64,
    /// Tasks running on actors.
    pub running: u64,
    /// Tasks that succeeded.
    pub succeeded: u64,
    /// Tasks that failed for good.
    pub failed: u64,
    /// Tasks cancelled.
    pub cancelled: u64,
    /// Who submitted it (the token's name; `anonymous` when the cluster has no tokens).
    pub owner: String,
    /// The client's total of tasks (0 when it did not say).
    pub expected_tasks: u64,
    /// Items (documents) of succeeded tasks, and those done so far inside running ones.
    pub items_done: u64,
    /// Items done so far inside running tasks (actors report within a task).
    pub items_running: u64,
    /// Unix milliseconds; `finished_unix_ms` is 0 while the job runs.
    pub started_unix_ms: u64,
    /// When the job finished (0 while it runs).
    pub finished_unix_ms: u64,
    /// GPU-seconds its pool held while it ran, and their price.
    pub gpu_seconds: f64,
    /// The price of those GPU-seconds, in US dollars.
    pub cost_usd: f64,
    /// What the job says about itself (a sweep's leaderboard), JSON.
    pub summary_json: Option<String>,
}

impl JobState {
    /// Lower-case, as `resident jobs` prints it.
    pub fn name(self) -> &'static str {
        match self {
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
            JobState::Interrupted => "interrupted",
            JobState::Unknown => "unknown",
        }
    }
}

impl JobStatus {
    /// Whether tasks are still queued or running.
    pub fn is_running(&self) -> bool {
        self.state == JobState::Running
    }

    /// Tasks finished (any outcome) over the expected total, else the submitted ones: 0
    /// to 1.
    pub fn progress(&self) -> f64 {
        let finished = self.succeeded + self.failed + self.cancelled;
        match self.expected_tasks.max(self.submitted) {
            0 => 0.0,
            total => (finished as f64 / total as f64).min(1.0),
        }
    }

    /// From its start to its end, or to `now_unix_ms` while it runs.
    pub fn elapsed(&self, now_unix_ms: u64) -> Duration {
        let end = match self.finished_unix_ms {
            0 => now_unix_ms,
            finished => finished,
        };
        Duration::from_millis(end.saturating_sub(self.started_unix_ms))
    }

    /// Items (documents) per second since it started, those inside running tasks included.
    pub fn items_per_second(&self, now_unix_ms: u64) -> f64 {
        let seconds = self.elapsed(now_unix_ms).as_secs_f64();
        match seconds > 0.0 {
            true => (self.items_done + self.items_running) as f64 / seconds,
            false => 0.0,
        }
    }
}

fn non_empty(text: String) -> Option<String> {
    (!text.is_empty()).then_some(text)
}

impl From<pb::GpuInfo> for GpuInfo {
    fn from(gpu: pb::GpuInfo) -> Self {
        Self {
            index: gpu.index,
            uuid: gpu.uuid,
            name: gpu.name,
            total_vram_bytes: gpu.total_vram_bytes,
            free_vram_bytes: gpu.free_vram_bytes,
            compute_capability: (gpu.compute_major, gpu.compute_minor),
            simulated: gpu.simulated,
        }
    }
}

impl From<pb::NodeInfo> for NodeInfo {
    fn from(node: pb::NodeInfo) -> Self {
        Self {
            node_id: NodeId::new(node.node_id),
            generation: node.generation,
            hostname: node.hostname,
            alive: node.alive,
            labels: node.labels.into_iter().collect(),
            gpus: node.gpus.into_iter().map(GpuInfo::from).collect(),
            cpu_cores: node.cpu_cores,
            ram_bytes: node.ram_bytes,
            last_heartbeat_ms_ago: node.last_heartbeat_ms_ago,
            credential: node.credential,
            draining: node.draining,
            unavailable_gpus: node
                .unavailable_gpus
                .into_iter()
                .map(|gpu| UnavailableGpu {
                    index: gpu.index,
                    reason: gpu.reason,
                })
                .collect(),
        }
    }
}

impl From<i32> for ActorState {
    fn from(state: i32) -> Self {
        match pb::ActorState::try_from(state) {
            Ok(pb::ActorState::Pending) => ActorState::Pending,
            Ok(pb::ActorState::Starting) => ActorState::Starting,
            Ok(pb::ActorState::Ready) => ActorState::Ready,
            Ok(pb::ActorState::Draining) => ActorState::Draining,
            Ok(pb::ActorState::Dead) => ActorState::Dead,
            Ok(pb::ActorState::Unspecified) | Err(_) => ActorState::Unknown,
        }
    }
}

impl From<pb::ActorInfo> for ActorInfo {
    fn from(actor: pb::ActorInfo) -> Self {
        Self {
            actor_id: ActorId::new(actor.actor_id),
            pool: PoolName::new(actor.pool),
            node_id: non_empty(actor.node_id).map(NodeId::new),
            gpu_indices: actor.gpu_indices,
            gpu_fraction: actor.gpu_fraction,
            state: ActorState::from(actor.state),
            model_loads: actor.model_loads,
            restarts: actor.restarts,
            vram_bytes: actor.vram_bytes,
            in_flight: actor.in_flight,
            tasks_done: actor.tasks_done,
            error: non_empty(actor.error),
        }
    }
}

impl From<pb::PoolStatus> for PoolStatus {
    fn from(status: pb::PoolStatus) -> Self {
        Self {
            spec: PoolSpec::from_pb(status.spec.unwrap_or_default()),
            ready_actors: status.ready_actors,
            actors: status.actors.into_iter().map(ActorInfo::from).collect(),
            unplaced_reason: non_empty(status.unplaced_reason),
            usage: status.usage.into_iter().map(HeldUsage::from).collect(),
            usage_since_unix_ms: status.usage_since_unix_ms,
        }
    }
}

impl From<i32> for JobState {
    fn from(state: i32) -> Self {
        match pb::JobState::try_from(state) {
            Ok(pb::JobState::Running) => JobState::Running,
            Ok(pb::JobState::Succeeded) => JobState::Succeeded,
            Ok(pb::JobState::Failed) => JobState::Failed,
            Ok(pb::JobState::Cancelled) => JobState::Cancelled,
            Ok(pb::JobState::Interrupted) => JobState::Interrupted,
            Ok(pb::JobState::Unspecified) | Err(_) => JobState::Unknown,
        }
    }
}

impl From<pb::JobStatus> for JobStatus {
    fn from(job: pb::JobStatus) -> Self {
        Self {
            job_id: JobId::new(job.job_id),
            pool: PoolName::new(job.pool),
            name: job.name,
            state: JobState::from(job.state),
            submitted: job.submitted,
            queued: job.queued,
            running: job.running,
            succeeded: job.succeeded,
            failed: job.failed,
            cancelled: job.cancelled,
            owner: job.owner,
            expected_tasks: job.expected_tasks,
            items_done: job.items_done,
            items_running: job.items_running,
            started_unix_ms: job.started_unix_ms,
            finished_unix_ms: job.finished_unix_ms,
            gpu_seconds: job.gpu_seconds,
            cost_usd: job.cost_usd,
            summary_json: non_empty(job.summary_json),
        }
    }
}
