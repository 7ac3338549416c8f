//! The scheduler's single owner task: every node, pool, actor, job and task lives here and
//! changes only in response to one [`SchedulerCommand`] at a time, so there are no locks and
//! each decision sees a consistent world.

mod accounting;
mod acknowledged;
mod adopt;
mod demand;
mod finished;
mod host_deaths;
mod jobs;
mod nodes;
mod parked;
mod pools;
pub(crate) mod quarantine;
mod reconcile_tick;
mod records;
mod table;
mod task_deadlines;
#[cfg(test)]
mod tests;
mod views;

use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use resident_proto::{ActorId, JobId, NodeId, PoolName, TaskId, pb};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::auth::Principal;
use crate::budget::{BufferBudget, BufferCharge, JobBuffer};
use crate::error::SchedulerError;
use crate::metrics::SchedulerMetrics;
use crate::policy::backoff::RetryBackoff;
use crate::store::{DurableStore, StoreHealth, StoreOp, StoreWriter};

pub use demand::{Demand, PoolDemand};
use records::{ActorRecord, JobRecord, NodeRecord, PoolRecord, TaskRecord};
pub use records::{JobStream, LastHeard, SessionId};
pub use views::Overview;

/// Timing and default limits of the scheduler loop.
#[derive(Clone, Debug)]
pub struct CoreConfig {
    pub heartbeat_interval: Duration,
    /// Least time between two progress reports of one actor inside a task (zero: none).
    pub task_progress_interval: Duration,
    /// A node whose last message is older than this is dead.
    pub node_dead_after: Duration,
    pub retry_backoff: RetryBackoff,
    pub default_in_flight_per_actor: u32,
    pub default_max_restarts: u32,
    pub default_max_task_attempts: u32,
    /// A task re-queued this many times because its node died fails instead.
    pub max_node_losses_per_task: u32,
    /// Finished jobs kept (in memory and in the store) for `GetJob`; older ones are
    /// forgotten, with their recorded outcomes.
    pub finished_job_history: usize,
    /// After a restart, placement waits this long for the nodes that were alive before
    /// (less once all are back), so replicas do not pile onto the first node to return.
    pub settle_window: Duration,
    /// How long an actor may load before it is stopped and started again, for pools that
    /// set no `load_timeout_ms`.
    pub default_load_timeout: Duration,
    /// How often the loop compares placed actors with what their nodes report.
    pub reconcile_interval: Duration,
    /// A node dead this long, hosting nothing, is forgotten (its record and listing go; it
    /// may come back as new).
    pub dead_node_ttl: Duration,
    /// Bytes all running jobs may buffer together (payloads not finished, results not
    /// read); new jobs are refused beyond it.
    pub max_buffered_bytes: u64,
    /// Bytes one job may buffer; its client's stream is read no further beyond it.
    pub max_job_buffered_bytes: u64,
    /// Running jobs one principal may have at once.
    pub max_jobs_per_principal: usize,
    /// How long a job whose client stream broke runs on, waiting for the client to
    /// reattach, before what is left of it is cancelled (zero: cancelled at once).
    pub detach_grace: Duration,
}

/// A quarter of this machine's memory (4 GiB where it cannot be read).
pub fn default_max_buffered_bytes() -> u64 {
    resident_proto::host::total_ram_bytes().unwrap_or(16 << 30) / 4
}

/// One job's default buffer: 256 MiB.
pub const DEFAULT_MAX_JOB_BUFFERED_BYTES: u64 = 256 << 20;
/// How long a job waits for its client to reattach after its stream broke, by default.
pub const DEFAULT_DETACH_GRACE: Duration = Duration::from_secs(60);
/// How long a dead node stays listed, by default.
pub const DEFAULT_DEAD_NODE_TTL: Duration = Duration::from_secs(3600);
/// Running jobs one principal may have at once, by default.
pub const DEFAULT_MAX_JOBS_PER_PRINCIPAL: usize = 64;

impl Default for CoreConfig {
    fn default() -> Self {
        Self {
            heartbeat_interval: Duration::from_secs(2),
            task_progress_interval: Duration::from_millis(500),
            node_dead_after: Duration::from_secs(10),
            retry_backoff: RetryBackoff {
                base: Duration::from_millis(200),
                max: Duration::from_secs(10),
            },
            default_in_flight_per_actor: 2,
            default_max_restarts: 3,
            default_max_task_attempts: 3,
            max_node_losses_per_task: 10,
            finished_job_history: 1000,
            settle_window: Duration::from_secs(15),
            default_load_timeout: Duration::from_secs(15 * 60),
            reconcile_interval: Duration::from_secs(5),
            dead_node_ttl: DEFAULT_DEAD_NODE_TTL,
            max_buffered_bytes: default_max_buffered_bytes(),
            max_job_buffered_bytes: DEFAULT_MAX_JOB_BUFFERED_BYTES,
            max_jobs_per_principal: DEFAULT_MAX_JOBS_PER_PRINCIPAL,
            detach_grace: DEFAULT_DETACH_GRACE,
        }
    }
}

impl CoreConfig {
    /// Short intervals for tests.
    pub fn for_test() -> Self {
        Self {
            heartbeat_interval: Duration::from_millis(100),
            task_progress_interval: Duration::from_millis(100),
            // Generous: a loaded 2-core CI machine can stall a heartbeat for a while; a
            // killed agent is noticed at once anyway (its stream closes).
            node_dead_after: Duration::from_millis(2000),
            retry_backoff: RetryBackoff {
                base: Duration::from_millis(20),
                max: Duration::from_millis(200),
            },
            reconcile_interval: Duration::from_millis(200),
            // A broken stream cancels at once unless a test asks for a grace.
            detach_grace: Duration::ZERO,
            ..Self::default()
        }
    }
}

/// Where the scheduler sends messages to one agent (its session's outbound stream).
pub type ToAgent = mpsc::UnboundedSender<Result<pb::SchedulerMessage, tonic::Status>>;
/// One message on its way to a job's client, holding its bytes in the job's buffer until
/// the client reads it.
#[derive(Debug)]
pub struct JobResultMessage {
    pub message: Result<pb::SubmitResponse, tonic::Status>,
    pub charge: Option<BufferCharge>,
}

/// Where the scheduler sends one job's results. The channel has no count bound: what it
/// holds is bounded in bytes by the job's buffer, since every message is charged to it and
/// the job's task forwarder takes no new task while the buffer is full.
///
/// When the core lets go of the last copy (the job finished or was cancelled, or another
/// stream took it over), the token that [`JobResults::new`] returns fires: the task forwarder then
/// reads no more of the client's tasks.
#[derive(Clone, Debug)]
pub struct JobResults {
    tx: mpsc::UnboundedSender<JobResultMessage>,
    buffer: Arc<JobBuffer>,
    _release_on_drop: Arc<DropGuard>,
}

impl JobResults {
    /// The sender, the client's receiver, and the token that fires once the core holds
    /// no copy of the sender.
    pub fn new(
        buffer: Arc<JobBuffer>,
    ) -> (
        Self,
        mpsc::UnboundedReceiver<JobResultMessage>,
        CancellationToken,
    ) {
        let (tx, rx) = mpsc::unbounded_channel();
        let released = CancellationToken::new();
        let results = Self {
            tx,
            buffer,
            _release_on_drop: Arc::new(released.clone().drop_guard()),
        };
        (results, rx, released)
    }

    /// Queues a message for the client, charged to the job's buffer.
    pub fn send(&self, message: pb::SubmitResponse) {
        let charge = self
            .buffer
            .charge_result(prost::Message::encoded_len(&message) as u64);
        let _ = self.tx.send(JobResultMessage {
            message: Ok(message),
            charge: Some(charge),
        });
    }

    /// The job's buffer, which its results are charged to.
    pub fn buffer(&self) -> &Arc<JobBuffer> {
        &self.buffer
    }

    /// Ends the client's stream with an error.
    pub fn fail(&self, status: tonic::Status) {
        let _ = self.tx.send(JobResultMessage {
            message: Err(status),
            charge: None,
        });
    }
}

type Reply<T> = oneshot::Sender<Result<T, SchedulerError>>;

pub enum SchedulerCommand {
    RegisterNode {
        register: pb::RegisterNode,
        /// The credential (token name) the agent authenticated with.
        credential: String,
        outbound: ToAgent,
        /// Shared with the session handler, which stamps it on every message received.
        last_heard: LastHeard,
        reply: Reply<SessionId>,
    },
    AgentMessage {
        session: SessionId,
        message: pb::agent_message::Body,
    },
    AgentGone {
        session: SessionId,
    },
    /// Creates a pool owned by `requester`, or attaches to an existing one of the same spec.
    CreatePool {
        spec: pb::PoolSpec,
        requester: Principal,
        reply: Reply<pb::PoolStatus>,
    },
    /// Scales a pool; only its owner or an admin may.
    ScalePool {
        pool: PoolName,
        replicas: u32,
        requester: Principal,
        reply: Reply<pb::PoolStatus>,
    },
    /// Answers why the pool was kept (with `if_unused`), or `None` once deleted; only its
    /// owner or an admin may.
    DeletePool {
        pool: PoolName,
        if_unused: bool,
        requester: Principal,
        reply: Reply<Option<String>>,
    },
    GetPool {
        pool: PoolName,
        reply: Reply<pb::PoolStatus>,
    },
    ListPools {
        /// Each pool's status without its actors (a cheap poll at fleet scale).
        omit_actors: bool,
        reply: Reply<Vec<pb::PoolStatus>>,
    },
    OpenJob {
        header: pb::SubmitHeader,
        /// The principal submitting it; only it (or an admin) may cancel the job.
        owner: String,
        results: JobResults,
        reply: Reply<JobStream>,
    },
    SubmitTask {
        stream: JobStream,
        input: pb::TaskInput,
        /// The payload's bytes in the job's buffer, held until the task is done.
        charge: Option<BufferCharge>,
    },
    /// The client sent its last task.
    CloseJobInput {
        stream: JobStream,
    },
    /// The client's stream broke: cancel what is left of the job (unless another stream
    /// was attached to it since).
    ClientGone {
        stream: JobStream,
    },
    GetJob {
        job: JobId,
        reply: Reply<pb::JobStatus>,
    },
    ListJobs {
        reply: Reply<Vec<pb::JobStatus>>,
    },
    AnnotateJob {
        job: JobId,
        requester: Principal,
        summary_json: String,
        reply: Reply<()>,
    },
    CancelJob {
        job: JobId,
        requester: Principal,
        reply: Reply<pb::JobStatus>,
    },
    ListNodes {
        reply: Reply<Vec<pb::NodeInfo>>,
    },
    /// The auth file was re-read: only these credentials are valid now. Nodes that joined,
    /// and running jobs opened, with any other credential are cut off.
    CredentialsChanged {
        valid: std::collections::BTreeSet<String>,
    },
    ListActors {
        pool: Option<PoolName>,
        reply: Reply<Vec<pb::ActorInfo>>,
    },
    /// Demand for autoscalers; placed GPUs counted on nodes carrying all `node_labels`.
    Demand {
        node_labels: BTreeMap<String, String>,
        reply: Reply<Demand>,
    },
    /// Everything the dashboard and `/metrics` show, in one consistent read.
    Overview {
        reply: Reply<Overview>,
    },
    /// Panics the core: how the server's tests stand in for a bug.
    #[cfg(test)]
    PanicForTest,
}

/// Commands queued for the loop before senders wait (backpressure to agents and clients).
const COMMAND_QUEUE_CAPACITY: usize = 65_536;
/// Commands handled in one turn of the loop before placement and timers get their turn: a
/// burst (24,000 actors reporting ready at once) is taken in slices of a few milliseconds.
const MAX_COMMANDS_PER_TURN: usize = 256;
/// How often the loop measures how late it is (`resident_scheduler_loop_lag_seconds`): a
/// timer due every period, observed by how long after its due time it ran.
const LAG_PROBE_PERIOD: Duration = Duration::from_millis(20);

/// Cheap to clone; every gRPC handler holds one.
#[derive(Clone)]
pub struct SchedulerHandle {
    tx: mpsc::Sender<SchedulerCommand>,
    metrics: SchedulerMetrics,
    budget: Arc<BufferBudget>,
    store_health: StoreHealth,
}

impl SchedulerHandle {
    /// Whether the state store writes (`None`) or fails (its error): health checks report
    /// NOT_SERVING while it fails, since every change is refused.
    pub fn store_health(&self) -> StoreHealth {
        self.store_health.clone()
    }

    /// The counters the loop keeps (shared; read at each scrape).
    pub fn metrics(&self) -> &SchedulerMetrics {
        &self.metrics
    }

    /// What the scheduler buffers for clients, against `--max-buffered-bytes` (the job
    /// streams charge it; `/metrics` reads it).
    pub(crate) fn buffer_budget(&self) -> &Arc<BufferBudget> {
        &self.budget
    }

    /// Sends a command that needs no answer, waiting while the loop's queue is full.
    pub async fn send(&self, command: SchedulerCommand) -> Result<(), SchedulerError> {
        self.tx
            .send(command)
            .await
            .map_err(|_| SchedulerError::ShuttingDown)
    }

    /// Sends a command from code that cannot wait (a `Drop`): queued at once if there is
    /// room, else by a task that waits for room.
    pub fn send_soon(&self, command: SchedulerCommand) {
        match self.tx.try_send(command) {
            Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {}
            Err(mpsc::error::TrySendError::Full(command)) => {
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    let tx = self.tx.clone();
                    runtime.spawn(async move {
                        let _ = tx.send(command).await;
                    });
                }
            }
        }
    }

    /// Sends a command built around a reply channel and waits for the answer.
    pub async fn call<T>(
        &self,
        make: impl FnOnce(Reply<T>) -> SchedulerCommand,
    ) -> Result<T, SchedulerError> {
        let (reply, answer) = oneshot::channel();
        self.send(make(reply)).await?;
        answer.await.map_err(|_| SchedulerError::ShuttingDown)?
    }
}

/// Starts the scheduler loop; it stops when `cancel` fires.
pub fn spawn_scheduler_loop(
    config: CoreConfig,
    store: Arc<dyn DurableStore>,
    cancel: CancellationToken,
) -> Result<(SchedulerHandle, tokio::task::JoinHandle<()>), SchedulerError> {
    let (tx, rx) = mpsc::channel(COMMAND_QUEUE_CAPACITY);
    let budget = BufferBudget::new(config.max_buffered_bytes, config.max_job_buffered_bytes);
    let metrics = SchedulerMetrics::default();
    let writer = StoreWriter::spawn(store.clone(), metrics.clone());
    let store_health = writer.health();
    let mut core = Core::new(config, writer, metrics.clone());
    core.held_outcomes = budget.job_buffer();
    core.restore(store.as_ref())?;
    let task = spawn_loop_thread(core, rx, cancel)?;
    let handle = SchedulerHandle {
        tx,
        metrics,
        budget,
        store_health,
    };
    Ok((handle, task))
}

/// Runs the loop on a thread of its own, on a single-threaded runtime that holds nothing
/// else (timers, no I/O), and returns a task on the caller's runtime that ends when it does
/// (with its panic, if it panicked). On the runtime that serves gRPC the loop was one task
/// among every connection's, queued behind the tasks its own messages woke: at 10,000
/// agents its lag p99 while placing was 196-405 ms there and is 97-145 ms here (scale-bench,
/// same code otherwise). The price is a hop between threads for each command: one call at a
/// time through a local cluster is about 8% slower (SCALE.md).
fn spawn_loop_thread(
    core: Core,
    rx: mpsc::Receiver<SchedulerCommand>,
    cancel: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, SchedulerError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .map_err(|e| {
            SchedulerError::Exhausted(format!(
                "cannot start the scheduler loop's runtime ({e}); the process may be at its \
                 limit of threads or open files"
            ))
        })?;
    let (ended_tx, ended_rx) = oneshot::channel::<std::thread::Result<()>>();
    std::thread::Builder::new()
        .name("scheduler-loop".into())
        .spawn(move || {
            let ended = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                runtime.block_on(run_scheduler_loop(core, rx, cancel))
            }));
            let _ = ended_tx.send(ended);
        })
        .map_err(|e| {
            SchedulerError::Exhausted(format!(
                "cannot start the scheduler loop's thread ({e}); the process may be at its \
                 limit of threads or memory"
            ))
        })?;
    Ok(tokio::spawn(async move {
        if let Ok(Err(panic)) = ended_rx.await {
            std::panic::resume_unwind(panic);
        }
    }))
}

async fn run_scheduler_loop(
    mut core: Core,
    mut rx: mpsc::Receiver<SchedulerCommand>,
    cancel: CancellationToken,
) {
    let mut tick = tokio::time::interval(core.tick_period());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut follow_ups = core.follow_ups_rx.take().expect("the loop runs once");
    let mut lag_probe = tokio::time::interval(LAG_PROBE_PERIOD);
    lag_probe.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // Biased, in this order, so nothing waits behind more than one turn of the others:
        // timers (rare and cheap) first, then follow-ups, then a batch of commands, and
        // placement only once those are served. Commands cannot starve placement: a turn of
        // commands also places a slice while placement has more to do. (Unbiased, a branch
        // lost a coin toss to every other ready one: at 10,000 agents the lag probe waited
        // behind ten turns at its 99th percentile.)
        tokio::select! {
            biased;
            _ = cancel.cancelled() => break,
            _ = tick.tick() => {
                core.on_tick(Instant::now());
                continue;
            }
            due = lag_probe.tick() => {
                core.metrics.loop_lag(Instant::now().saturating_duration_since(due));
                continue;
            }
            Some(done) = follow_ups.recv() => {
                done.run(&mut core);
                core.after_commands();
            }
            command = rx.recv() => {
                let Some(command) = command else { break };
                core.handle(command);
                for _ in 1..MAX_COMMANDS_PER_TURN {
                    let Ok(more) = rx.try_recv() else { break };
                    core.handle(more);
                }
                core.replan_needed |= core.more_to_place;
                core.after_commands();
            }
            () = std::future::ready(()), if core.more_to_place => {
                core.replan_needed = true;
                core.after_commands();
            }
        }
        // A turn that worked yields, so that the runtime's timers are read before the next
        // one: timers fire only when the loop's task returns to its runtime, and while
        // commands keep coming or placement goes on it would not (with tokio's cooperative
        // budget alone it returned once in 128 turns, and a timer then waited 0.3-2.7 s at
        // 10,000 agents). The loop has its runtime to itself, so a yield queues it behind
        // nothing.
        tokio::task::yield_now().await;
    }
    // Write-behind ops (task outcomes, job counters) still queued go to disk first.
    if let Err(error) = core.store.flush(SHUTDOWN_FLUSH_ATTEMPTS).await {
        tracing::error!(%error, "the state store's last writes failed");
    }
    tracing::info!("scheduler loop stopped");
}

/// Tries at shutdown to write what is queued for the store, a second apart.
const SHUTDOWN_FLUSH_ATTEMPTS: u32 = 3;

pub(crate) struct Core {
    config: CoreConfig,
    store: StoreWriter,
    nodes: table::Table<NodeId, NodeRecord>,
    sessions: table::FastMap<SessionId, NodeId>,
    next_session: u64,
    pools: BTreeMap<PoolName, PoolRecord>,
    actors: table::Table<ActorId, ActorRecord>,
    /// Where each actor was last started (mirrored in the store): a node may hand back only
    /// an actor started on it, for the pool it was started for.
    placed: table::FastMap<ActorId, (PoolName, NodeId)>,
    /// The actors holding an assignment on each node (those with `assignment` set), so what
    /// happens to a node touches its actors without a scan of every actor.
    hosted: table::FastMap<NodeId, std::collections::BTreeSet<ActorId>>,
    /// The actors waiting for a place (state `Pending`), by creation order then id: the
    /// order placement takes them in, so it reads what it has to place, not every actor.
    pending: std::collections::BTreeSet<(u64, ActorId)>,
    /// Placement of many actors goes in slices (a *burst*): the last pending actor the
    /// burst has reached, after which the next slice goes on.
    placement_cursor: Option<(u64, ActorId)>,
    /// An actor became pending behind the cursor during a burst: once the burst reaches the
    /// end, another starts from the first pending actor.
    pending_behind_cursor: bool,
    /// What placed actors take of the alive nodes, kept from one placement slice to the
    /// next while `holdings_version` stays the one it was built or last updated at (and
    /// dropped when the alive nodes change), so that a slice does not walk every actor.
    occupancy: Option<(u64, crate::placement::Occupancy)>,
    /// Moves whenever an actor takes or leaves a place ([`Core::assign`], [`Core::unhost`]).
    holdings_version: u64,
    /// What alive, non-draining nodes offer placement, built when placement first needs it
    /// and dropped whenever a node joins, dies, drains or its capacity moves
    /// ([`Core::node_capacities_changed`]): placing in slices then copies no node's
    /// capacity per slice.
    alive_capacities: std::cell::OnceCell<BTreeMap<NodeId, crate::placement::NodeCapacity>>,
    next_actor_order: u64,
    tasks: table::FastMap<TaskId, TaskRecord>,
    next_task: u64,
    /// Failed tasks waiting out their backoff, earliest first.
    retries: BinaryHeap<std::cmp::Reverse<(Instant, TaskId)>>,
    jobs: table::FastMap<JobId, JobRecord>,
    /// Finished jobs, oldest first, bounded by `finished_job_history`.
    finished_jobs: VecDeque<JobId>,
    /// Set when nodes or actors changed; placement runs once after the current batch.
    replan_needed: bool,
    /// The last placement stopped at its per-turn limit: the loop places more as soon as
    /// it has served what is queued.
    more_to_place: bool,
    /// After a restart: placement waits for these nodes until then.
    settle: Option<Settle>,
    /// When running jobs' counters were last written to the store.
    last_job_flush: Instant,
    /// When running jobs were last charged for the GPUs their pools hold.
    last_job_charge: Instant,
    /// When placed actors were last compared with what their nodes report.
    last_reconcile: Instant,
    /// When running tasks were last checked against their deadlines.
    last_deadline_check: Instant,
    /// Charges outcomes held for detached or restarted clients to the scheduler-wide byte
    /// budget (the handle's; a budget of its own from the config in unit tests).
    held_outcomes: Arc<JobBuffer>,
    /// Where follow-ups (of store writes, of a job's buffer having room) come back to the
    /// loop (`core/acknowledged.rs`).
    follow_ups: mpsc::UnboundedSender<acknowledged::FollowUp>,
    /// Taken by the loop (or a unit test) that runs the follow-ups.
    follow_ups_rx: Option<acknowledged::FollowUpRx>,
    metrics: SchedulerMetrics,
    prices: resident_proto::prices::PriceTable,
}

/// How often running jobs' counters are written to the store (when they changed): what
/// `resident status` shows after a restart is at most this old for `submitted`; the done
/// counts are exact anyway (recounted from the outcomes, written as each task finishes).
const JOB_FLUSH_PERIOD: Duration = Duration::from_secs(1);

/// The settle window after a restart: the nodes that were alive before, still awaited.
#[derive(Debug)]
struct Settle {
    until: Instant,
    awaited: std::collections::BTreeSet<NodeId>,
}

/// Task ids start from the boot time in milliseconds, shifted left by 20 bits, so ids of
/// one scheduler run never repeat those of an earlier run (whose outcomes agents may still
/// deliver after a restart) unless that run handed out a million tasks per millisecond.
fn first_task_id() -> u64 {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    (millis << 20).max(1)
}

impl Core {
    fn new(config: CoreConfig, store: StoreWriter, metrics: SchedulerMetrics) -> Self {
        let held_outcomes =
            BufferBudget::new(config.max_buffered_bytes, config.max_job_buffered_bytes)
                .job_buffer();
        let (follow_ups, follow_ups_rx) = mpsc::unbounded_channel();
        Self {
            config,
            store,
            nodes: Default::default(),
            sessions: Default::default(),
            next_session: 1,
            pools: BTreeMap::new(),
            actors: Default::default(),
            placed: Default::default(),
            hosted: Default::default(),
            pending: Default::default(),
            placement_cursor: None,
            pending_behind_cursor: false,
            occupancy: None,
            holdings_version: 0,
            alive_capacities: Default::default(),
            next_actor_order: 0,
            tasks: Default::default(),
            next_task: first_task_id(),
            retries: BinaryHeap::new(),
            jobs: Default::default(),
            finished_jobs: VecDeque::new(),
            replan_needed: false,
            more_to_place: false,
            settle: None,
            last_job_flush: Instant::now(),
            last_job_charge: Instant::now(),
            last_reconcile: Instant::now(),
            last_deadline_check: Instant::now(),
            held_outcomes,
            follow_ups,
            follow_ups_rx: Some(follow_ups_rx),
            metrics,
            prices: Default::default(),
        }
    }

    fn tick_period(&self) -> Duration {
        (self.config.heartbeat_interval / 2).max(Duration::from_millis(10))
    }

    fn handle(&mut self, command: SchedulerCommand) {
        use SchedulerCommand as C;
        match command {
            C::RegisterNode {
                register,
                credential,
                outbound,
                last_heard,
                reply,
            } => {
                let _ = reply.send(self.register_node(register, credential, outbound, last_heard));
            }
            C::AgentMessage { session, message } => self.agent_message(session, message),
            C::AgentGone { session } => self.agent_gone(session),
            C::CreatePool {
                spec,
                requester,
                reply,
            } => self.create_pool_durably(spec, &requester, reply),
            C::ScalePool {
                pool,
                replicas,
                requester,
                reply,
            } => self.scale_pool_durably(pool, replicas, &requester, reply),
            C::DeletePool {
                pool,
                if_unused,
                requester,
                reply,
            } => self.delete_pool_durably(pool, if_unused, &requester, reply),
            C::OpenJob {
                header,
                owner,
                results,
                reply,
            } => self.open_job_durably(header, owner, results, reply),
            C::AnnotateJob {
                job,
                requester,
                summary_json,
                reply,
            } => self.annotate_job_durably(job, &requester, summary_json, reply),
            C::CancelJob {
                job,
                requester,
                reply,
            } => self.cancel_job_durably(job, &requester, reply),
            C::GetPool { pool, reply } => {
                let _ = reply.send(self.pool_status(&pool));
            }
            C::ListPools { omit_actors, reply } => {
                let _ = reply.send(Ok(self.pool_statuses(omit_actors)));
            }
            C::SubmitTask {
                stream,
                input,
                charge,
            } => self.submit_task(&stream, input, charge),
            C::CloseJobInput { stream } => self.close_job_input(&stream),
            C::ClientGone { stream } => self.client_gone(&stream),
            C::GetJob { job, reply } => {
                let _ = reply.send(self.job_status(&job));
            }
            C::ListJobs { reply } => {
                let _ = reply.send(Ok(self.job_statuses()));
            }
            C::CredentialsChanged { valid } => self.credentials_changed(&valid),
            C::ListNodes { reply } => {
                let _ = reply.send(Ok(self.node_infos()));
            }
            #[cfg(test)]
            C::PanicForTest => panic!("the core panicked on purpose"),
            C::ListActors { pool, reply } => {
                let _ = reply.send(Ok(self.actor_infos(pool.as_ref())));
            }
            C::Demand { node_labels, reply } => {
                let _ = reply.send(Ok(self.demand(&node_labels)));
            }
            C::Overview { reply } => {
                let _ = reply.send(Ok(self.overview()));
            }
        }
    }

    fn after_commands(&mut self) {
        if self.replan_needed {
            self.replan_needed = false;
            self.replan();
        }
        #[cfg(test)]
        self.assert_dispatchable_index();
    }

    /// The core's unit tests check after every command that every kept index (`hosted`,
    /// `pending`, the capacity copy, each pool's `dispatchable` and `held`) is what a full
    /// scan gives. The scan's reads are not counted against the command
    /// (`core/tests/fleet_cost.rs`).
    #[cfg(test)]
    fn assert_dispatchable_index(&self) {
        let visits = (self.actors.visits(), self.nodes.visits());
        self.assert_indices_uncounted();
        self.actors.forget_visits_since(visits.0);
        self.nodes.forget_visits_since(visits.1);
    }

    #[cfg(test)]
    fn assert_indices_uncounted(&self) {
        let mut scanned: table::FastMap<NodeId, std::collections::BTreeSet<ActorId>> =
            Default::default();
        for (id, actor) in &self.actors {
            if let Some(assignment) = &actor.assignment {
                scanned
                    .entry(assignment.node.clone())
                    .or_default()
                    .insert(id.clone());
            }
        }
        let mut indexed = self.hosted.clone();
        indexed.retain(|_, actors| !actors.is_empty());
        assert_eq!(indexed, scanned, "the hosted index");
        let pending: std::collections::BTreeSet<(u64, ActorId)> = self
            .actors
            .iter()
            .filter(|(_, a)| a.state == crate::state::ActorState::Pending)
            .map(|(id, a)| (a.order, id.clone()))
            .collect();
        assert_eq!(self.pending, pending, "the pending index");
        if let Some((version, kept)) = &self.occupancy
            && *version == self.holdings_version
        {
            let built =
                crate::placement::Occupancy::new(self.alive_node_capacities(), self.holdings());
            assert_eq!(kept, &built, "the occupancy kept between placement slices");
        }
        if let Some(cached) = self.alive_capacities.get() {
            assert_eq!(
                cached,
                &self.alive_node_capacities_now(),
                "the capacity cache"
            );
        }
        for (name, pool) in &self.pools {
            let scanned: std::collections::BTreeSet<_> = pool
                .actors
                .iter()
                .filter_map(|id| {
                    let actor = &self.actors[id];
                    let busy = actor.in_flight.len() + actor.inherited_in_flight as usize;
                    let free = (pool.in_flight_per_actor as usize).saturating_sub(busy) as u32;
                    let takes = actor.state == crate::state::ActorState::Ready
                        && actor.quarantine.is_none()
                        && actor.crash.is_none()
                        && !self.on_draining_node(actor.assignment.as_ref());
                    (takes && free > 0)
                        .then(|| (std::cmp::Reverse(free), std::cmp::Reverse(id.clone())))
                })
                .collect();
            assert_eq!(pool.dispatchable, scanned, "pool {name}");
            let held = self.held_by_pool_now(name);
            assert!(
                (pool.held.gpus - held.gpus).abs() < 1e-6
                    && (pool.held.usd_per_hour - held.usd_per_hour).abs() < 1e-6,
                "pool {name} holds {:?}, counted {held:?}",
                pool.held
            );
        }
    }

    /// Whether placement still waits for known nodes after a restart; ends the window
    /// (and asks for placement) once they are all back or its time is up.
    fn settling(&mut self, now: Instant) -> bool {
        let Some(settle) = &self.settle else {
            return false;
        };
        if settle.awaited.is_empty() || now >= settle.until {
            tracing::info!(
                missing = ?settle.awaited,
                "settle window over; placing actors"
            );
            self.settle = None;
            self.replan_needed = true;
            return false;
        }
        true
    }

    /// Writes the counters of running jobs that changed since their last write.
    fn flush_job_counters(&mut self, now: Instant) {
        if now.saturating_duration_since(self.last_job_flush) < JOB_FLUSH_PERIOD {
            return;
        }
        self.last_job_flush = now;
        for job in self.jobs.values_mut() {
            if job.is_running() && job.counts != job.persisted {
                job.persisted = job.counts;
                self.store.write(StoreOp::PutJob(job.snapshot()));
            }
        }
    }

    fn on_tick(&mut self, now: Instant) {
        self.charge_running_jobs(now);
        self.expire_idle_pools(now);
        self.settling(now);
        self.flush_job_counters(now);
        self.detect_dead_nodes(now);
        self.reconcile_actors(now);
        self.enforce_task_deadlines(now);
        self.release_due_retries(now);
        self.expire_detached_jobs(now);
        self.after_commands();
    }
}
