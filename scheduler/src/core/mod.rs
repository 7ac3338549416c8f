//! The scheduler's single owner task: every node, pool, actor, job and task lives here and
//! changes only in response to one [`SchedulerCommand`] at a time, so there are no locks and
//! each decision sees a consistent world.
//!
//! The map, model first:
//! - `model.rs`: `Core`, the records and the indices kept beside them, with their numbered
//!   invariants; `model/indices.rs`, the only writer of those indices (placing an actor,
//!   the pending queue, the dispatch index); `records.rs`, `dispatch_index.rs`, `table.rs`,
//!   `job_results.rs`, `config.rs`: what it holds.
//! - The controllers, each an `impl Core` over the model: `nodes.rs` (sessions, heartbeats,
//!   registration), `adopt.rs` (actors a node reports), `pools.rs` (pools and placement),
//!   `jobs.rs` (a client's job), `tasks.rs` (dispatch, outcomes, retries), `parked.rs`,
//!   `quarantine.rs`, `host_deaths.rs`, `task_deadlines.rs`, `reconcile_tick.rs`,
//!   `accounting.rs` (GPU time and cost), `acknowledged.rs` (calls answered once durable).
//! - Read-only views: `views.rs` (the overview), `demand.rs` (for autoscalers).
//! - This file: the commands, the handle that sends them, and the loop that runs them one at a
//!   time (`Core::handle`) with its ticks.

mod accounting;
mod acknowledged;
mod adopt;
mod config;
mod demand;
mod dispatch_index;
mod finished;
mod host_deaths;
mod job_results;
mod jobs;
mod model;
mod nodes;
mod parked;
mod pools;
pub(crate) mod quarantine;
mod reconcile_tick;
mod records;
mod table;
mod task_deadlines;
mod tasks;
#[cfg(test)]
mod tests;
mod views;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use resident_proto::{JobId, PoolName, pb};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::auth::Principal;
use crate::budget::{BufferBudget, BufferCharge};
use crate::error::SchedulerError;
use crate::metrics::SchedulerMetrics;
use crate::store::{DurableStore, StoreHealth, StoreOp, StoreWriter};

pub use config::{
    CoreConfig, DEFAULT_DEAD_NODE_TTL, DEFAULT_DETACH_GRACE, DEFAULT_MAX_JOB_BUFFERED_BYTES,
    DEFAULT_MAX_JOBS_PER_PRINCIPAL, default_max_buffered_bytes,
};
pub use demand::{Demand, PoolDemand};
pub use job_results::{JobResultMessage, JobResults};
use model::{Core, Reply};
pub use records::{JobStream, LastHeard, SessionId, ToAgent};
pub use views::Overview;

/// What the core's loop is asked, one at a time; a command with a `reply` is answered on
/// it.
pub enum SchedulerCommand {
    /// An agent registers (after its session handler checked the credential).
    RegisterNode {
        /// What the agent said of itself: id, generation, GPUs, labels, what it still
        /// hosts.
        register: pb::RegisterNode,
        /// The credential (token name) the agent authenticated with.
        credential: String,
        /// Where messages to the agent go.
        outbound: ToAgent,
        /// Shared with the session handler, which stamps it on every message received.
        last_heard: LastHeard,
        /// The new session, or why the node was refused.
        reply: Reply<SessionId>,
    },
    /// A message from a registered agent.
    AgentMessage {
        /// The agent's session.
        session: SessionId,
        /// What it said.
        message: pb::agent_message::Body,
    },
    /// An agent's stream ended.
    AgentGone {
        /// The agent's session.
        session: SessionId,
    },
    /// Creates a pool owned by `requester`, or attaches to an existing one of the same spec.
    CreatePool {
        /// The pool asked for.
        spec: pb::PoolSpec,
        /// Who asks.
        requester: Principal,
        /// The pool's status, or why it was refused.
        reply: Reply<pb::PoolStatus>,
    },
    /// Scales a pool; only its owner or an admin may.
    ScalePool {
        /// The pool.
        pool: PoolName,
        /// Actors wanted.
        replicas: u32,
        /// Who asks.
        requester: Principal,
        /// The pool's status, or why it was refused.
        reply: Reply<pb::PoolStatus>,
    },
    /// Answers why the pool was kept (with `if_unused`), or `None` once deleted; only its
    /// owner or an admin may.
    DeletePool {
        /// The pool.
        pool: PoolName,
        /// Keep a pool that jobs use.
        if_unused: bool,
        /// Who asks.
        requester: Principal,
        /// Why it was kept, `None` once deleted, or why it was refused.
        reply: Reply<Option<String>>,
    },
    /// One pool's status.
    GetPool {
        /// The pool.
        pool: PoolName,
        /// Its status, or that there is no such pool.
        reply: Reply<pb::PoolStatus>,
    },
    /// Every pool's status.
    ListPools {
        /// Each pool's status without its actors (a cheap poll at fleet scale).
        omit_actors: bool,
        /// The statuses, by name.
        reply: Reply<Vec<pb::PoolStatus>>,
    },
    /// A client opens a job (or resumes one by id) on a pool.
    OpenJob {
        /// The job's pool, name, window and method (and id, to resume).
        header: pb::SubmitHeader,
        /// The principal submitting it; only it (or an admin) may cancel the job.
        owner: String,
        /// Where the job's results go.
        results: JobResults,
        /// The stream attached to the job, or why it was refused.
        reply: Reply<JobStream>,
    },
    /// A task of an open job.
    SubmitTask {
        /// The job's stream that sent it.
        stream: JobStream,
        /// The task: its sequence number, payload and items.
        input: pb::TaskInput,
        /// The payload's bytes in the job's buffer, held until the task is done.
        charge: Option<BufferCharge>,
    },
    /// The client sent its last task.
    CloseJobInput {
        /// The job's stream.
        stream: JobStream,
    },
    /// The client's stream broke: cancel what is left of the job (unless another stream
    /// was attached to it since).
    ClientGone {
        /// The job's stream.
        stream: JobStream,
    },
    /// One job's status.
    GetJob {
        /// The job.
        job: JobId,
        /// Its status, or that there is no such job.
        reply: Reply<pb::JobStatus>,
    },
    /// Every job the scheduler remembers.
    ListJobs {
        /// Their statuses, by id.
        reply: Reply<Vec<pb::JobStatus>>,
    },
    /// Sets a job's summary (a JSON object the dashboard shows); only its owner or an admin
    /// may.
    AnnotateJob {
        /// The job.
        job: JobId,
        /// Who asks.
        requester: Principal,
        /// The summary: a JSON object, or empty to clear it.
        summary_json: String,
        /// Done, or why it was refused.
        reply: Reply<()>,
    },
    /// Cancels a job's unfinished tasks; only its owner or an admin may.
    CancelJob {
        /// The job.
        job: JobId,
        /// Who asks.
        requester: Principal,
        /// The job's status after, or why it was refused.
        reply: Reply<pb::JobStatus>,
    },
    /// Every node the scheduler knows, alive or not.
    ListNodes {
        /// Their descriptions.
        reply: Reply<Vec<pb::NodeInfo>>,
    },
    /// The auth file was re-read: only these credentials are valid now. Nodes that joined,
    /// and running jobs opened, with any other credential are cut off.
    CredentialsChanged {
        /// The credentials' names.
        valid: std::collections::BTreeSet<String>,
    },
    /// The actors of one pool, or of all.
    ListActors {
        /// The pool; `None` for every pool.
        pool: Option<PoolName>,
        /// The actors.
        reply: Reply<Vec<pb::ActorInfo>>,
    },
    /// Demand for autoscalers; placed GPUs counted on nodes carrying all `node_labels`.
    Demand {
        /// The labels a node must carry to count.
        node_labels: BTreeMap<String, String>,
        /// The demand.
        reply: Reply<Demand>,
    },
    /// Everything the dashboard and `/metrics` show, in one consistent read.
    Overview {
        /// The overview.
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
    // Write-behind ops (task outcomes, job counters, what the pools held up to now) still
    // queued go to disk first.
    core.save_pool_usage(Instant::now());
    if let Err(error) = core.store.flush(SHUTDOWN_FLUSH_ATTEMPTS).await {
        tracing::error!(%error, "the state store's last writes failed");
    }
    tracing::info!("scheduler loop stopped");
}

/// Tries at shutdown to write what is queued for the store, a second apart.
const SHUTDOWN_FLUSH_ATTEMPTS: u32 = 3;

/// How often running jobs' counters are written to the store (when they changed): what
/// `resident status` shows after a restart is at most this old for `submitted`; the done
/// counts are exact anyway (recounted from the outcomes, written as each task finishes).
const JOB_FLUSH_PERIOD: Duration = Duration::from_secs(1);

impl Core {
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
        self.save_pool_usage_when_due(now);
        self.detect_dead_nodes(now);
        self.reconcile_actors(now);
        self.enforce_task_deadlines(now);
        self.release_due_retries(now);
        self.expire_detached_jobs(now);
        self.after_commands();
    }
}
