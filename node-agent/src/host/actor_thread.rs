use std::collections::HashSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use resident_proto::{ActorId, panic_text, pb};
use tokio::sync::{mpsc, watch};

use super::ToScheduler;
use super::fed_tasks::{FedRun, serve_fed};
use super::task_work::{Input, Ran, TaskAnswers, TaskError, Work};
use crate::backends::{ActorKind, BackendError, LoadContext, ModelBackend, Preparer, TaskProgress};
use crate::gpu::GpuHealth;

/// The GPUs an actor runs on, and where to ask whether one failed under it.
pub(super) struct ActorGpus {
    /// As placed (empty for a CPU actor).
    pub indices: Vec<u32>,
    pub health: Arc<GpuHealth>,
}

/// What an actor's thread is told, in order.
pub enum ActorCommand {
    /// Run one task.
    Run {
        /// The task as the scheduler sent it.
        task: pb::RunTask,
        /// The task's tracing span, entered while it runs.
        span: tracing::Span,
    },
    /// Stop after what is in hand: the thread drops the model and exits.
    Stop,
}

/// Where an actor is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActorPhase {
    /// Loading its model.
    Loading,
    /// Loaded and taking tasks.
    Ready,
    /// Its load failed, it panicked or it was stopped.
    Dead,
}

/// An actor's state and counters since it loaded, as its thread keeps them and heartbeats
/// report them.
#[derive(Clone, Debug)]
pub struct ActorHealth {
    /// Where it is in its life.
    pub phase: ActorPhase,
    /// Why it died (empty while alive).
    pub error: String,
    /// Models it loaded (1 once loaded).
    pub model_loads: u64,
    /// VRAM its model holds.
    pub vram_bytes: u64,
    /// Tasks it answered.
    pub tasks_done: u64,
    /// Time spent running them.
    pub busy_micros: u64,
    /// Items (documents, prompts) they covered.
    pub items_done: u64,
    /// Tokens the model ran over for them.
    pub tokens_done: u64,
}

impl ActorHealth {
    /// A fresh actor, loading.
    pub fn loading() -> Self {
        Self {
            phase: ActorPhase::Loading,
            error: String::new(),
            model_loads: 0,
            vram_bytes: 0,
            tasks_done: 0,
            busy_micros: 0,
            items_done: 0,
            tokens_done: 0,
        }
    }

    /// The report the scheduler hears of it.
    pub fn report(&self, actor_id: &ActorId, incarnation: u64) -> pb::ActorReport {
        let state = match self.phase {
            ActorPhase::Loading => pb::ActorState::Starting,
            ActorPhase::Ready => pb::ActorState::Ready,
            ActorPhase::Dead => pb::ActorState::Dead,
        };
        pb::ActorReport {
            actor_id: actor_id.to_string(),
            incarnation,
            state: state as i32,
            error: self.error.clone(),
            model_loads: self.model_loads,
            vram_bytes: self.vram_bytes,
            tasks_done: self.tasks_done,
            busy_micros: self.busy_micros,
            items_done: self.items_done,
            tokens_done: self.tokens_done,
        }
    }
}

/// Runs on the preparation thread: takes commands in arrival order, prepares payloads ahead
/// of the model when the backend has a preparer, and hands work over one at a time.
fn feed_work(
    mut commands: mpsc::Receiver<ActorCommand>,
    preparer: Option<Preparer>,
    cancelled: Arc<Mutex<HashSet<u64>>>,
    work: std::sync::mpsc::SyncSender<Work>,
) {
    while let Some(command) = commands.blocking_recv() {
        let ActorCommand::Run { task, span } = command else {
            return;
        };
        let skip = cancelled.lock().expect("cancel set").remove(&task.task_id);
        // Only the default method has a preparation stage; other methods run as they come.
        let preparer = preparer.as_ref().filter(|_| task.method.is_empty());
        let input = match (preparer, skip) {
            (_, true) => Input::Cancelled,
            (None, false) => Input::Raw,
            (Some(prepare), false) => {
                let _entered = span.enter();
                let prepared = catch_unwind(AssertUnwindSafe(|| prepare(&task.payload)));
                Input::Prepared(match prepared {
                    Ok(result) => result.map_err(TaskError::from),
                    Err(panic) => Err(TaskError::panic("preparation", panic.as_ref())),
                })
            }
        };
        if work.send(Work { task, span, input }).is_err() {
            return;
        }
    }
}

/// The body of one actor's thread: load once, then serve commands until stopped; the actor
/// dies (reported) when its load fails, its code panics, its GPU fails or it is stopped.
#[allow(clippy::too_many_arguments)]
pub(super) fn run_actor_thread(
    kind: Arc<dyn ActorKind>,
    context: LoadContext,
    incarnation: u64,
    commands: mpsc::Receiver<ActorCommand>,
    health: watch::Sender<ActorHealth>,
    outbound: ToScheduler,
    cancelled: Arc<Mutex<HashSet<u64>>>,
    gpus: ActorGpus,
) {
    let actor = ActorThread {
        actor_id: context.actor_id.clone(),
        progress: context.progress.clone(),
        kind,
        incarnation,
        health,
        outbound,
        gpus,
        gpu_failure: OnceLock::new(),
    };
    let Some(mut backend) = actor.load(&context) else {
        return;
    };
    let (work_tx, mut work_rx) = std::sync::mpsc::sync_channel::<Work>(1);
    let preparer = backend.preparer();
    let feeder = std::thread::Builder::new()
        .name(format!("prep-{}", actor.actor_id))
        .spawn(move || feed_work(commands, preparer, cancelled, work_tx));
    if let Err(error) = feeder {
        actor.die(format!("cannot start preparation thread: {error}"));
        return;
    }
    // A task the last fed run did not take (not plain), served before the next one.
    let mut held = None;
    loop {
        let work = match held.take() {
            Some(work) => work,
            None => match work_rx.recv() {
                Ok(work) => work,
                Err(_) => break,
            },
        };
        let served = match backend.takes_tasks_while_running() && work.is_plain() {
            true => serve_fed(&actor, &mut backend, work, &mut work_rx, &mut held),
            false => actor.serve_one(&mut backend, work),
        };
        if let Some(failure) = actor.gpu_failure.get() {
            drop(work_rx);
            drop(backend);
            tracing::error!(actor_id = %actor.actor_id, %failure, "actor's GPU failed; it stops, to be placed on another GPU");
            actor.die(failure.clone());
            return;
        }
        match served {
            FedRun::Answered => {}
            FedRun::UplinkGone => break,
            FedRun::Panicked(message) => {
                drop(work_rx);
                drop(backend);
                tracing::error!(actor_id = %actor.actor_id, %message, "actor panicked; it stops and restarts with a fresh model");
                actor.die(format!("{message}; restarting with a fresh model"));
                return;
            }
        }
    }
    drop(backend);
    actor.health.send_modify(|h| {
        h.phase = ActorPhase::Dead;
        h.error = "stopped".into();
    });
    tracing::info!(actor_id = %actor.actor_id, "actor stopped");
}

/// What one actor's thread holds besides its model.
struct ActorThread {
    actor_id: ActorId,
    kind: Arc<dyn ActorKind>,
    incarnation: u64,
    health: watch::Sender<ActorHealth>,
    outbound: ToScheduler,
    progress: TaskProgress,
    gpus: ActorGpus,
    /// Set when one of its GPUs failed under it: it sends no more outcomes (the scheduler
    /// took its tasks back on `GpuFailed`) and dies after the run in hand.
    gpu_failure: OnceLock<String>,
}

impl ActorThread {
    /// After a failure of its load or a task: whether one of its GPUs failed under it (the
    /// scheduler is told before the failure is reported), kept in `gpu_failure`.
    fn check_gpus(&self) -> Option<&String> {
        if self.gpus.indices.is_empty() {
            return None;
        }
        if self.gpu_failure.get().is_none() {
            let (gpu, reason) = self.gpus.health.check_after_failure(&self.gpus.indices)?;
            let _ = self
                .gpu_failure
                .set(format!("GPU {gpu} failed under the actor: {reason}"));
        }
        self.gpu_failure.get()
    }

    /// Sends the actor's state to the scheduler.
    fn publish(&self) {
        let report = self
            .health
            .borrow()
            .report(&self.actor_id, self.incarnation);
        let _ = self.outbound.send(pb::AgentMessage {
            body: Some(pb::agent_message::Body::ActorReport(report)),
        });
    }

    /// Marks the actor dead with `error` and says so.
    fn die(&self, error: String) {
        self.health.send_modify(|h| {
            h.phase = ActorPhase::Dead;
            h.error = error;
        });
        self.publish();
    }

    /// Loads the model once: ready (reported) with its backend, or dead (reported) with why.
    fn load(&self, context: &LoadContext) -> Option<Box<dyn ModelBackend>> {
        let started = Instant::now();
        // The scheduler checked the config's bounds at pool creation; a config from an
        // older scheduler, or one restored from its store, is checked again before it sizes
        // anything.
        let config = resident_actor::limits::check_config(self.kind.name(), &context.config);
        let injected = self.gpus.health.injected_load_failure(&self.gpus.indices);
        let loaded = match (config, injected) {
            (Err(refused), _) => Ok(Err(BackendError::InvalidConfig(refused.to_string()))),
            (Ok(()), Some(injected)) => Ok(Err(BackendError::Load(injected))),
            (Ok(()), None) => catch_unwind(AssertUnwindSafe(|| self.kind.load(context))),
        };
        let failed = match loaded {
            Ok(Ok(backend)) => Ok(backend),
            Ok(Err(error)) => Err(error.to_string()),
            Err(panic) => Err(format!("load panicked: {}", panic_text(panic.as_ref()))),
        };
        let backend = match failed {
            Ok(backend) => backend,
            Err(error) => {
                match self.check_gpus() {
                    Some(failure) => self.die(format!("{failure} (the load: {error})")),
                    None => self.die(error),
                }
                return None;
            }
        };
        self.health.send_modify(|h| {
            h.phase = ActorPhase::Ready;
            h.model_loads += 1;
            h.vram_bytes = backend.vram_bytes();
        });
        tracing::info!(actor_id = %self.actor_id, load_ms = started.elapsed().as_millis() as u64, "actor ready");
        self.publish();
        Some(backend)
    }

    /// Runs one task on the model and sends its outcome.
    fn serve_one(&self, backend: &mut Box<dyn ModelBackend>, work: Work) -> FedRun {
        let Work { task, span, input } = work;
        let _entered = span.enter();
        let begun = Instant::now();
        self.progress.begin(&task);
        let kind = self.kind.name();
        let run = |backend: &mut Box<dyn ModelBackend>| match input {
            Input::Cancelled => Err(TaskError::transient("task cancelled".to_owned())),
            Input::Raw if task.method.is_empty() => {
                backend.run_chunk(&task.payload).map_err(TaskError::from)
            }
            Input::Raw if !backend.methods().contains(&task.method.as_str()) => {
                Err(TaskError::from(BackendError::unknown_method(
                    kind,
                    &task.method,
                    backend.methods(),
                )))
            }
            Input::Raw => backend
                .call(&task.method, &task.payload)
                .map_err(TaskError::from),
            Input::Prepared(Ok(prepared)) => {
                backend.run_prepared(prepared).map_err(TaskError::from)
            }
            Input::Prepared(Err(error)) => Err(error),
        };
        // A panic may have left the model (or its preparation stage) half-updated: the task
        // is retried elsewhere and this actor stops, so the scheduler restarts it with a
        // freshly loaded model.
        let result = match catch_unwind(AssertUnwindSafe(|| run(backend))) {
            Ok(result) => result,
            Err(panic) => Err(TaskError::panic("actor", panic.as_ref())),
        };
        self.progress.end();
        let panicked = match &result {
            Err(error) if error.panicked => Some(error.message.clone()),
            _ => None,
        };
        let run_micros = begun.elapsed().as_micros() as u64;
        let ran = Ran {
            run_micros,
            busy_micros: run_micros,
            size: backend.last_task_size().unwrap_or_default(),
        };
        match (self.send_outcome(task, result, ran), panicked) {
            (false, _) => FedRun::UplinkGone,
            (true, Some(message)) => FedRun::Panicked(message),
            (true, None) => FedRun::Answered,
        }
    }
}

impl TaskAnswers for ActorThread {
    fn send_outcome(
        &self,
        task: pb::RunTask,
        result: Result<Vec<u8>, TaskError>,
        ran: Ran,
    ) -> bool {
        // A result too large for one message would fail to encode and reset the whole
        // session; it fails this task alone, for good (a retry gives the same size).
        let result = match (
            result,
            self.gpus.health.injected_task_failure(&self.gpus.indices),
        ) {
            (_, Some(injected)) => Err(TaskError::transient(injected)),
            (Ok(output), None) if output.len() > resident_proto::MAX_RESULT_BYTES => Err(
                TaskError::permanent(resident_proto::oversized_result_error(output.len())),
            ),
            (other, None) => other,
        };
        // A GPU that failed under the task is reported instead of its outcome: the scheduler
        // blames the GPU, takes back every task of the actors there and places them
        // elsewhere (HD-6), so the outcome would only be refused as stale. (A scheduler
        // that does not know `GpuFailed` takes them back at the actor's death, next.)
        if result.as_ref().is_err_and(|error| !error.permanent) && self.check_gpus().is_some() {
            return true;
        }
        let permanent = result.as_ref().err().is_some_and(|e| e.permanent);
        let crashed = result.as_ref().err().is_some_and(|e| e.panicked);
        let outcome = pb::TaskOutcome {
            task_id: task.task_id,
            dispatch: task.dispatch,
            actor_id: task.actor_id,
            result: Some(match result {
                Ok(output) => pb::task_outcome::Result::Output(output.into()),
                Err(error) => pb::task_outcome::Result::Error(error.message),
            }),
            run_micros: ran.run_micros,
            permanent,
            key: task.key,
            crashed,
            not_run: false,
        };
        self.health.send_modify(|h| {
            h.tasks_done += 1;
            h.busy_micros += ran.busy_micros;
            h.items_done += ran.size.items;
            h.tokens_done += ran.size.tokens;
        });
        self.outbound
            .send(pb::AgentMessage {
                body: Some(pb::agent_message::Body::TaskOutcome(outcome)),
            })
            .is_ok()
    }

    fn progress(&self) -> &TaskProgress {
        &self.progress
    }
}
