//! What the scheduler loop remembers about each node, pool, actor, task and job.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use prost::bytes::Bytes;
use resident_proto::{ActorId, JobId, PoolName, TaskId, pb};
use tokio::time::Instant;

use super::dispatch_index::DispatchIndex;
use super::job_results::JobResults;
use crate::placement::{Assignment, NodeCapacity, ResourceRequest};
use crate::state::{ActorState, ActorWork, JobCounts, Restarts, TaskLifecycle};
use tokio::sync::mpsc;

/// Where the scheduler sends messages to one agent (its session's outbound stream).
pub type ToAgent = mpsc::UnboundedSender<Result<pb::SchedulerMessage, tonic::Status>>;

/// One registration of an agent: a reconnect is a new session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(pub u64);

/// When an agent's session last delivered a message, stamped by the session handler on
/// receipt: a node is alive by what it sent, not by how fast the loop got to it.
#[derive(Clone, Debug)]
pub struct LastHeard(std::sync::Arc<std::sync::Mutex<Instant>>);

impl LastHeard {
    /// Stamped now.
    pub fn now() -> Self {
        Self(std::sync::Arc::new(std::sync::Mutex::new(Instant::now())))
    }

    /// A message arrived.
    pub fn heard(&self) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    /// When the last message arrived.
    pub fn at(&self) -> Instant {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub struct NodeRecord {
    pub generation: String,
    /// The credential it registered with; only that credential may re-register the id
    /// while the node is alive.
    pub credential: String,
    pub session: SessionId,
    pub hostname: String,
    pub labels: BTreeMap<String, String>,
    /// What placement may hand out here: VRAM free at registration, refreshed from
    /// heartbeats (`refreshed_usable_vram`).
    pub capacity: NodeCapacity,
    /// As registered; `free_vram_bytes` is updated by heartbeats.
    pub gpus: Vec<pb::GpuInfo>,
    /// GPUs the agent could not open, as registered: shown, never placed on.
    pub unavailable_gpus: Vec<pb::UnavailableGpu>,
    pub cpu_cores: u32,
    pub ram_bytes: u64,
    pub actor_kinds: BTreeSet<String>,
    pub alive: bool,
    /// The agent is going away (it sent `Drain`): its actors get no new tasks and no actor
    /// is placed there; it leaves once its tasks in hand are answered.
    pub draining: bool,
    /// Each GPU's free VRAM when its capacity was last computed: heartbeats recompute it
    /// only when this moved (the computation walks every actor).
    pub free_vram_at_refresh: BTreeMap<u32, u64>,
    /// Whether the store lists it as a node a restart waits for.
    pub remembered: bool,
    /// Stamped by the session handler as messages arrive.
    pub last_heard: LastHeard,
    /// When its last heartbeat (which lists every actor it hosts) was handled.
    pub last_heartbeat: Instant,
    pub outbound: Option<ToAgent>,
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
    /// How long its actors may load before they are started again.
    pub load_timeout: std::time::Duration,
    /// How long a task may run before its actor is stopped (`core/task_deadlines.rs`).
    pub task_timeout: Option<std::time::Duration>,
    pub actors: BTreeSet<ActorId>,
    pub queue: VecDeque<TaskId>,
    /// Tasks whose input crashed an actor once, waiting to run again alone (see
    /// `core/quarantine.rs`), oldest first.
    pub suspects: VecDeque<TaskId>,
    /// The actor kept for suspects (its `quarantine` is set), if any.
    pub kept_for_suspect: Option<ActorId>,
    /// The actors that take tasks now, freest first: dispatch reads the first instead of
    /// scanning the pool. Kept by `Core::refresh_dispatchable`.
    pub dispatchable: DispatchIndex,
    /// Since when nothing has used it (for `idle_ttl_ms`); `None` while in use.
    pub idle_since: Option<Instant>,
    /// Its spec is on disk. A pool just created is not until its write commits, and its
    /// actors are placed only then: a create that fails to save started nothing.
    pub saved: bool,
    /// What its placed actors hold now and have held since the pool was created (through
    /// restarts), by price class, kept as they take and leave their places
    /// (`core/accounting.rs`): charging a running job reads this, not every actor, and a
    /// corpus job's `report.json` bills from it.
    pub usage: PoolUsage,
}

/// What a placed actor is priced by: its GPU's model name (empty on the CPU) and its
/// node's `pool` label (empty when it has none).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct PriceClass {
    pub gpu_name: String,
    pub pool_label: String,
}

/// GPUs (each actor's fraction times its GPU count) and CPU cores: held now, or, summed over
/// time, GPU- and core-seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GpusAndCores {
    pub gpus: f64,
    pub cpu_cores: f64,
}

/// What one placed actor holds, and its price class.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Holding {
    pub class: PriceClass,
    pub held: GpusAndCores,
}

/// What a pool's placed actors hold now and have held since the pool was created, by price
/// class; accrued whenever what they hold changes, so each actor counts exactly while it
/// holds its place (`core/accounting.rs`). Saved every few seconds while it changes, and
/// restored by a restarted scheduler.
#[derive(Clone, Debug)]
pub struct PoolUsage {
    pub held: BTreeMap<PriceClass, GpusAndCores>,
    /// GPU- and core-seconds up to `accrued_at`.
    pub seconds: BTreeMap<PriceClass, GpusAndCores>,
    pub accrued_at: Instant,
    /// When the counting began (the pool's creation, before any restart), Unix ms.
    pub since_unix_ms: u64,
    /// It changed since it was last written to the store.
    pub unsaved: bool,
}

/// Where an actor kept for a suspect task stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quarantine {
    /// Takes no new task; the suspect goes to it once its tasks in flight are done.
    Emptying,
    /// Runs the suspect task, alone.
    Running(TaskId),
}

/// What an actor that crashed on a task crashed on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Crash {
    /// A task not (yet) proven to crash the model: its death is a restart like any other.
    OnTask,
    /// An input proven to crash the model (`core/quarantine.rs`): its death spends no
    /// restart.
    OnPoison,
}

pub struct ActorRecord {
    pub pool: PoolName,
    /// What it adds to its pool's [`PoolRecord::usage`] while it holds a place (nothing when it holds none, or its pool was deleted).
    pub holding: Holding,
    /// What the actor holds where it is placed. Kept with the actor, so a draining actor
    /// of a deleted pool still counts against its node's capacity until it stops.
    pub request: ResourceRequest,
    pub state: ActorState,
    pub restarts: Restarts,
    /// Bumped on every start, so reports from an earlier start are told apart.
    pub incarnation: u64,
    pub order: u64,
    pub assignment: Option<Assignment>,
    pub in_flight: BTreeSet<TaskId>,
    /// Tasks an adopted actor still held from before this scheduler knew it (their
    /// outcomes arrive as unawaited ones); they take credit until answered.
    pub inherited_in_flight: u32,
    /// Set while it is kept for a suspect task (emptying, then running it alone): it takes
    /// no other task meanwhile.
    pub quarantine: Option<Quarantine>,
    /// Set when it crashed on a task and is stopping (its agent reports it dead next): it
    /// takes no task until it is lost and started again.
    pub crash: Option<Crash>,
    /// Its last loss was its host dying suddenly, which spent a restart: given back if that
    /// host comes back as itself with the actor still loaded (a network cut, not a crash).
    pub restart_spent_on_host: bool,
    /// When it was last started (placed), and when its node last listed it in a report.
    pub started_at: Option<Instant>,
    pub last_reported: Option<Instant>,
    /// Its pool's task deadline, kept with the actor so a draining actor of a deleted pool
    /// still has one (`core/task_deadlines.rs`).
    pub task_timeout: Option<std::time::Duration>,
    /// When it last answered a task: the task after it started running then.
    pub last_answer: Option<Instant>,
    pub tasks_done: u64,
    /// Loads reported by earlier incarnations plus the current one.
    pub model_loads: u64,
    pub loads_before_this_start: u64,
    pub vram_bytes: u64,
    pub error: String,
    pub unplaced_reason: String,
    /// The work counters of the current incarnation's last report (`ActorReport`), so
    /// the next report adds only what is new to the metrics.
    pub reported_work: ActorWork,
}

pub struct TaskRecord {
    pub job: JobId,
    pub seq: u64,
    /// Documents it covers (at least 1), for the job's `items_done`.
    pub items: u32,
    pub pool: PoolName,
    pub payload: Bytes,
    /// Its state and dispatch count; changed only through `Core::change_task`.
    pub lifecycle: TaskLifecycle,
    /// The actor that ran it last, for the result.
    pub last_actor: Option<ActorId>,
    pub failures: u32,
    pub node_losses: u32,
    pub submitted_at: Instant,
    pub started_at: Option<Instant>,
    pub last_error: String,
    /// Items its current dispatch reported done (`TaskProgress`), counted in the job's
    /// `items_running`; back to 0 at the task's next transition.
    pub items_running: u64,
    /// How many actors crashed running it (see `core/quarantine.rs`).
    pub crashes: u32,
    /// The actors whose restart its first crash spent (the actor that ran it, or every
    /// actor of a host that died under it), given back once the input is proven to crash
    /// the model.
    pub first_crash_victims: Vec<ActorId>,
    /// Its payload's bytes in the job's buffer, given back when the record goes (held
    /// only for its `Drop`).
    #[allow(dead_code)]
    pub charge: Option<crate::budget::BufferCharge>,
}

impl TaskRecord {
    /// A task just submitted as `seq` of `job` on `pool`, not yet dispatched.
    pub fn submitted(
        job: JobId,
        pool: PoolName,
        input: pb::TaskInput,
        lifecycle: TaskLifecycle,
        charge: Option<crate::budget::BufferCharge>,
    ) -> Self {
        TaskRecord {
            job,
            seq: input.seq,
            items: input.items.max(1),
            pool,
            payload: input.payload,
            lifecycle,
            last_actor: None,
            failures: 0,
            node_losses: 0,
            submitted_at: Instant::now(),
            started_at: None,
            last_error: String::new(),
            items_running: 0,
            crashes: 0,
            first_crash_victims: Vec::new(),
            charge,
        }
    }
}

/// One client stream attached to a job: a resumed job gets a new one, and what the old
/// stream's handler sends afterwards is ignored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobStream {
    /// The job.
    pub job: JobId,
    /// Which attachment of it this stream is (one more at each resume).
    pub attachment: u64,
}

/// An outcome an agent held across a restart, for a task its client has not sent again
/// yet.
pub struct HeldOutcome {
    pub output: Bytes,
    pub actor: ActorId,
    pub run_micros: u64,
    /// Its bytes in the scheduler-wide budget, given back when it goes (held only for its
    /// `Drop`).
    #[allow(dead_code)]
    pub charge: crate::budget::BufferCharge,
}

/// Outcomes held per job until its client sends their tasks again; more are dropped (those
/// tasks simply run again).
const MAX_HELD_OUTCOMES: usize = 65_536;

pub struct JobRecord {
    /// Name, pool and state; the counters live in `counts`.
    pub status: pb::JobStatus,
    pub counts: JobCounts,
    /// Bumped each time a client stream attaches (opens or resumes the job).
    pub attachment: u64,
    /// The job's unfinished tasks by sequence number: a task sent again while it is still
    /// here is not run twice.
    pub live: HashMap<u64, TaskId>,
    /// How each finished task ended (restored from the outcomes after a restart), so a
    /// task the client sends again (it never read the result) moves out of its counter
    /// instead of being counted twice.
    pub finished: super::finished::FinishedSeqs,
    /// Outcomes agents held across the restart, or that finished while the client was
    /// detached, by sequence number, until the client sends those tasks again (see
    /// [`JobRecord::hold`]). Only through `hold`, `take_held` and `clear_held`, which
    /// keep `held_bytes`.
    pub held: HashMap<u64, HeldOutcome>,
    pub held_bytes: u64,
    /// Tasks an adopted actor still had in hand for this job, by sequence number: a task
    /// the client sends again waits for that run (`core/adopt.rs`) instead of running twice.
    pub inherited_runs: HashMap<u64, ActorId>,
    /// The actor method every task of the job calls (empty = the kind's default).
    pub method: String,
    pub results: Option<JobResults>,
    pub input_closed: bool,
    /// The counters as last written to the store (running jobs are written again when
    /// they differ, at most once per `JOB_FLUSH_PERIOD`).
    pub persisted: JobCounts,
    /// Since when its client's stream is gone while the job runs on, waiting for the
    /// client to reattach (`CoreConfig::detach_grace`; `core/jobs.rs::client_gone`).
    pub detached_since: Option<Instant>,
    /// Queued tasks held back from dispatch while its client has a full buffer of results
    /// to read, oldest first (`core/parked.rs`).
    pub parked: VecDeque<TaskId>,
}

impl JobRecord {
    /// Holds an outcome for a task the client will send again, within
    /// [`MAX_HELD_OUTCOMES`] and `max_bytes` (the job's buffer); past them it is dropped
    /// (the task just runs again).
    pub fn hold(&mut self, seq: u64, outcome: HeldOutcome, max_bytes: u64) {
        let bytes = outcome.output.len() as u64;
        if self.held.len() >= MAX_HELD_OUTCOMES || self.held_bytes + bytes > max_bytes {
            return;
        }
        if let Some(earlier) = self.held.insert(seq, outcome) {
            self.held_bytes -= earlier.output.len() as u64;
        }
        self.held_bytes += bytes;
    }

    pub fn take_held(&mut self, seq: u64) -> Option<HeldOutcome> {
        let held = self.held.remove(&seq)?;
        self.held_bytes -= held.output.len() as u64;
        Some(held)
    }

    pub fn clear_held(&mut self) {
        self.held.clear();
        self.held_bytes = 0;
    }

    /// The status as clients and the store see it.
    pub fn snapshot(&self) -> pb::JobStatus {
        let mut status = self.status.clone();
        self.counts.fill(&mut status);
        if !self.is_running() {
            status.items_running = 0;
        }
        status
    }

    pub fn is_running(&self) -> bool {
        self.status.state == pb::JobState::Running as i32
    }

    /// Running, or interrupted by a restart: its client may still send its tasks again.
    pub fn may_be_resumed(&self) -> bool {
        self.is_running() || self.status.state == pb::JobState::Interrupted as i32
    }
}
