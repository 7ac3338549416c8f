//! The actor host: each resident actor is one OS thread that owns its model and is fed by a
//! bounded channel; its health is published on a `watch` channel.
//!
//! The host outlives the agent's sessions: when the scheduler goes away, the actors keep
//! their models and finish the tasks in hand; their outcomes wait in the uplink channel
//! until the next session forwards them, and the next registration lists what the host
//! holds ([`ActorHost::inventory`]) so a restarted scheduler can adopt it.

mod actor_thread;
mod fed_tasks;
mod task_work;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use resident_models::roots::FileRoots;

use crate::model_cache::ModelCache;
use resident_proto::{ActorId, pb};
use tokio::sync::{mpsc, watch};

use crate::backends::progress::ProgressInterval;
use crate::backends::{ActorKindRegistry, DeviceAssignment, LoadContext, TaskProgress};
use crate::gpu::GpuHealth;
pub use actor_thread::{ActorCommand, ActorHealth, ActorPhase};
use actor_thread::{ActorGpus, run_actor_thread};

pub use crate::uplink::ToScheduler;

struct ActorSlot {
    /// How the scheduler started it, reported back in the inventory.
    start: pb::StartActor,
    /// Tasks handed to the actor whose outcome has not been forwarded to a session yet.
    in_hand: BTreeMap<u64, Option<pb::TaskKey>>,
    incarnation: u64,
    commands: mpsc::Sender<ActorCommand>,
    health: watch::Receiver<ActorHealth>,
    cancelled: Arc<Mutex<HashSet<u64>>>,
    gpu_indices: Vec<u32>,
    vram_bytes: u64,
}

/// The actors of this agent: starts them on their own threads, hands them tasks, stops them
/// and reports what they hold.
pub struct ActorHost {
    registry: ActorKindRegistry,
    outbound: ToScheduler,
    /// The node's GPUs that failed while it ran (and whether its GPUs are simulated).
    gpu_health: Arc<GpuHealth>,
    roots: FileRoots,
    models: Arc<ModelCache>,
    actors: HashMap<ActorId, ActorSlot>,
    /// How often actors may report progress inside a task (set at each registration).
    progress_interval: ProgressInterval,
}

/// The answer to a task that never reached its actor; `not_run` when the actor is gone
/// (the scheduler's view of it is stale), not when it is only overloaded.
fn outcome_error(task: &pb::RunTask, error: String, not_run: bool) -> pb::AgentMessage {
    pb::AgentMessage {
        body: Some(pb::agent_message::Body::TaskOutcome(pb::TaskOutcome {
            task_id: task.task_id,
            dispatch: task.dispatch,
            actor_id: task.actor_id.clone(),
            result: Some(pb::task_outcome::Result::Error(error)),
            run_micros: 0,
            permanent: false,
            key: task.key.clone(),
            crashed: false,
            not_run,
        })),
    }
}

impl ActorHost {
    /// A host with no actors, starting kinds from `registry` and sending what actors say on
    /// `outbound`.
    pub fn new(
        registry: ActorKindRegistry,
        outbound: ToScheduler,
        gpu_health: Arc<GpuHealth>,
        roots: FileRoots,
        models: Arc<ModelCache>,
    ) -> Self {
        Self {
            registry,
            outbound,
            gpu_health,
            roots,
            models,
            actors: HashMap::new(),
            progress_interval: ProgressInterval::default(),
        }
    }

    /// The scheduler's least time between two progress reports of one actor (zero: none).
    pub fn set_progress_interval(&self, interval: std::time::Duration) {
        self.progress_interval.set(interval);
    }

    /// Answers a start with DEAD at once, saying why.
    pub fn refuse_start(&self, start: &pb::StartActor, why: &str) {
        let _ = self.outbound.send(pb::AgentMessage {
            body: Some(pb::agent_message::Body::ActorReport(pb::ActorReport {
                actor_id: start.actor_id.clone(),
                incarnation: start.incarnation,
                state: pb::ActorState::Dead as i32,
                error: why.to_owned(),
                ..Default::default()
            })),
        });
    }

    /// Refuses `start` when it names a GPU that failed here; whether it did.
    fn refused_on_failed_gpu(&self, start: &pb::StartActor) -> bool {
        let failed = start
            .gpu_indices
            .iter()
            .find_map(|&gpu| Some((gpu, self.gpu_health.failure(gpu)?)));
        let Some((gpu, reason)) = failed else {
            return false;
        };
        self.refuse_start(start, &format!("GPU {gpu} of this node failed: {reason}"));
        true
    }

    /// Starts an actor thread; it loads the model and reports READY or DEAD. An actor
    /// placed on a GPU that failed here (the scheduler had not heard yet) is refused.
    pub fn start(&mut self, start: pb::StartActor) {
        if self.refused_on_failed_gpu(&start) {
            return;
        }
        let actor_id = ActorId::new(start.actor_id.clone());
        if let Some(existing) = self.actors.get(&actor_id) {
            if existing.incarnation == start.incarnation {
                return;
            }
            self.stop(&actor_id);
        }
        let report = |error: String| pb::ActorReport {
            actor_id: start.actor_id.clone(),
            incarnation: start.incarnation,
            state: pb::ActorState::Dead as i32,
            error,
            ..Default::default()
        };
        let Some(kind) = self.registry.get(&start.kind) else {
            let error = format!(
                "unknown actor kind `{}`; this agent offers: {}",
                start.kind,
                self.registry.names().join(", ")
            );
            let _ = self.outbound.send(pb::AgentMessage {
                body: Some(pb::agent_message::Body::ActorReport(report(error))),
            });
            return;
        };
        let context = self.load_context(&actor_id, &start);
        let capacity = start.max_in_flight.max(1) as usize + 1;
        let (commands, receiver) = mpsc::channel(capacity);
        let (health_tx, health) = watch::channel(ActorHealth::loading());
        let cancelled = Arc::new(Mutex::new(HashSet::new()));
        let thread_cancelled = cancelled.clone();
        let outbound = self.outbound.clone();
        let incarnation = start.incarnation;
        let gpus = ActorGpus {
            indices: start.gpu_indices.clone(),
            health: self.gpu_health.clone(),
        };
        let spawned = std::thread::Builder::new()
            .name(format!("actor-{actor_id}"))
            .spawn(move || {
                run_actor_thread(
                    kind,
                    context,
                    incarnation,
                    receiver,
                    health_tx,
                    outbound,
                    thread_cancelled,
                    gpus,
                )
            });
        if let Err(error) = spawned {
            let _ = self.outbound.send(pb::AgentMessage {
                body: Some(pb::agent_message::Body::ActorReport(report(format!(
                    "cannot start thread: {error}"
                )))),
            });
            return;
        }
        self.actors.insert(
            actor_id,
            ActorSlot {
                in_hand: BTreeMap::new(),
                start: start.clone(),
                incarnation,
                commands,
                health,
                cancelled,
                gpu_indices: start.gpu_indices,
                vram_bytes: start.vram_bytes,
            },
        );
    }

    /// What the actor's kind loads its model with.
    fn load_context(&self, actor_id: &ActorId, start: &pb::StartActor) -> LoadContext {
        LoadContext {
            actor_id: actor_id.clone(),
            config: start.config.to_vec(),
            device: DeviceAssignment {
                gpu_indices: start.gpu_indices.clone(),
                gpu_fraction: start.gpu_fraction,
                vram_bytes: start.vram_bytes,
                simulated: self.gpu_health.simulated(),
            },
            roots: self.roots.clone(),
            models: self.models.clone(),
            progress: TaskProgress::new(self.outbound.clone(), self.progress_interval.clone()),
        }
    }

    /// The scheduler's stop of `incarnation` of an actor (0: whichever runs). A later
    /// incarnation running here is kept: the stop was meant for one before it (a report of
    /// the old one reached the scheduler after it had started the new one), and obeying it
    /// would kill a healthy actor and spend one of its restarts.
    pub fn stop_asked(&mut self, actor_id: &ActorId, incarnation: u64) {
        if let Some(slot) = self.actors.get(actor_id)
            && incarnation != 0
            && slot.incarnation > incarnation
        {
            tracing::debug!(actor_id = %actor_id, running = slot.incarnation, asked = incarnation, "kept a later incarnation than the stop names");
            return;
        }
        self.stop(actor_id);
    }

    /// Asks the actor to stop after what it is doing; the thread drops the model and exits.
    pub fn stop(&mut self, actor_id: &ActorId) {
        if let Some(slot) = self.actors.remove(actor_id) {
            let _ = slot.commands.try_send(ActorCommand::Stop);
        }
    }

    /// Stops the actors on GPU `gpu`, taken out of service (the scheduler counts them lost,
    /// and took their tasks back): their queued tasks are skipped, their threads end.
    fn stop_actors_on_gpu(&mut self, gpu: u32) {
        let on_gpu: Vec<ActorId> = self
            .actors
            .iter()
            .filter(|(_, slot)| slot.gpu_indices.contains(&gpu))
            .map(|(id, _)| id.clone())
            .collect();
        for id in on_gpu {
            let slot = &self.actors[&id];
            slot.cancelled
                .lock()
                .expect("cancel set")
                .extend(slot.in_hand.keys().copied());
            tracing::warn!(actor_id = %id, gpu, "stopping an actor on a GPU taken out of service");
            self.stop(&id);
        }
    }

    /// Stops every actor.
    pub fn stop_all(&mut self) {
        let ids: Vec<ActorId> = self.actors.keys().cloned().collect();
        for id in ids {
            self.stop(&id);
        }
    }

    /// Queues a task on its actor; a missing or overloaded actor answers with an error at once.
    pub fn run(&mut self, task: pb::RunTask) {
        let actor_id = ActorId::new(task.actor_id.clone());
        let Some(slot) = self.actors.get_mut(&actor_id) else {
            let _ = self.outbound.send(outcome_error(
                &task,
                format!("actor {actor_id} is not running on this node"),
                true,
            ));
            return;
        };
        let span = tracing::debug_span!("task", task_id = task.task_id, actor_id = %actor_id);
        slot.in_hand.insert(task.task_id, task.key.clone());
        if let Err(error) = slot.commands.try_send(ActorCommand::Run { task, span }) {
            let (task, why, gone) = match error {
                mpsc::error::TrySendError::Full(ActorCommand::Run { task, .. }) => {
                    (task, "actor is overloaded", false)
                }
                mpsc::error::TrySendError::Closed(ActorCommand::Run { task, .. }) => {
                    (task, "actor has stopped", true)
                }
                _ => unreachable!("only Run commands are sent here"),
            };
            slot.in_hand.remove(&task.task_id);
            let _ = self
                .outbound
                .send(outcome_error(&task, why.to_owned(), gone));
        }
    }

    /// Marks a queued task cancelled; the actor skips it (a running call finishes). Only a
    /// task still in hand is marked, and its mark goes with its outcome (`forwarded`), so
    /// the set holds no id of a task that already ran or was answered.
    pub fn cancel(&mut self, cancel: pb::CancelTask) {
        if let Some(slot) = self.actors.get(&ActorId::new(cancel.actor_id))
            && slot.in_hand.contains_key(&cancel.task_id)
        {
            slot.cancelled
                .lock()
                .expect("cancel set")
                .insert(cancel.task_id);
        }
    }

    /// Task ids marked cancelled and not yet skipped or answered, over all actors.
    #[cfg(test)]
    fn cancel_marks(&self) -> usize {
        self.actors
            .values()
            .map(|slot| slot.cancelled.lock().expect("cancel set").len())
            .sum()
    }

    /// A message from the uplink is on its way to the scheduler: an outcome's task is no
    /// longer in hand; a GPU taken out of service loses its actors.
    pub fn forwarded(&mut self, message: &pb::AgentMessage) {
        if let Some(pb::agent_message::Body::GpuFailed(pb::GpuFailed { gpu: Some(gpu) })) =
            &message.body
        {
            self.stop_actors_on_gpu(gpu.index);
        }
        if let Some(pb::agent_message::Body::TaskOutcome(outcome)) = &message.body
            && let Some(slot) = self.actors.get_mut(&ActorId::new(outcome.actor_id.clone()))
        {
            slot.in_hand.remove(&outcome.task_id);
            // Cancelled while it ran: the mark was never read.
            slot.cancelled
                .lock()
                .expect("cancel set")
                .remove(&outcome.task_id);
        }
    }

    /// Whether any actor is hosted (loading, ready or draining).
    pub fn is_empty(&self) -> bool {
        self.actors.is_empty()
    }

    /// Actors hosted (loading, ready or draining).
    pub fn len(&self) -> usize {
        self.actors.len()
    }

    /// Tasks handed to live actors and not yet answered.
    pub fn tasks_in_hand(&self) -> usize {
        self.actors
            .values()
            .filter(|slot| slot.health.borrow().phase != ActorPhase::Dead)
            .map(|slot| slot.in_hand.len())
            .sum()
    }

    /// What this host holds, for a registration: every live actor with how it was started,
    /// its state and the tasks it has not answered yet. Dead actors are dropped here.
    pub fn inventory(&mut self) -> Vec<pb::HostedActor> {
        self.actors
            .retain(|_, slot| slot.health.borrow().phase != ActorPhase::Dead);
        self.actors
            .iter()
            .map(|(id, slot)| pb::HostedActor {
                start: Some(slot.start.clone()),
                report: Some(slot.health.borrow().report(id, slot.incarnation)),
                tasks_in_hand: slot.in_hand.values().flatten().cloned().collect(),
            })
            .collect()
    }

    /// Every hosted actor's state, for heartbeats.
    pub fn reports(&self) -> Vec<pb::ActorReport> {
        self.actors
            .iter()
            .map(|(id, slot)| slot.health.borrow().report(id, slot.incarnation))
            .collect()
    }

    /// `reports` with each actor's pool, for the agent's metrics.
    pub fn observed(&self, reports: &[pb::ActorReport]) -> Vec<crate::observe::ObservedActor> {
        reports
            .iter()
            .map(|report| crate::observe::ObservedActor {
                pool: self
                    .actors
                    .get(&ActorId::new(report.actor_id.clone()))
                    .map(|slot| slot.start.pool.clone())
                    .unwrap_or_default(),
                report: report.clone(),
            })
            .collect()
    }

    /// VRAM the hosted actors reserved on GPU `index` (used for simulated GPUs' free VRAM).
    pub fn reserved_vram(&self, index: u32) -> u64 {
        self.actors
            .values()
            .filter(|slot| slot.gpu_indices.contains(&index))
            .map(|slot| slot.vram_bytes)
            .sum()
    }
}

/// A host for tests: `registry`'s kinds, simulated GPUs, no file roots, a model cache in a
/// temporary directory (returned with it, to live as long as the host), messages to
/// `outbound`.
#[cfg(test)]
fn host_for_tests(
    registry: ActorKindRegistry,
    outbound: ToScheduler,
) -> (ActorHost, tempfile::TempDir) {
    host_failing_gpu_for_tests(registry, outbound, None)
}

/// [`host_for_tests`], its two simulated GPUs failing as `failing` says
/// (`gpu::FAIL_SIMULATED_GPU_ENV`).
#[cfg(test)]
fn host_failing_gpu_for_tests(
    registry: ActorKindRegistry,
    outbound: ToScheduler,
    failing: Option<&str>,
) -> (ActorHost, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let models = crate::model_cache::ModelCacheConfig {
        dir: dir.path().to_owned(),
        ..Default::default()
    };
    let simulated = crate::gpu::SimulatedGpus::parse("T4:16GiB x2").expect("a GPU spec");
    let gpu_health =
        GpuHealth::with_injected_failure(Arc::new(simulated), outbound.clone(), failing)
            .expect("a failure spec");
    let host = ActorHost::new(
        registry,
        outbound,
        Arc::new(gpu_health),
        FileRoots::default(),
        Arc::new(ModelCache::new(models)),
    );
    (host, dir)
}

#[cfg(test)]
mod gpu_failure_tests;

#[cfg(test)]
mod cancel_tests {
    use std::time::Duration;

    use super::*;

    fn run(id: u64) -> pb::RunTask {
        pb::RunTask {
            task_id: id,
            dispatch: 1,
            actor_id: "a1".into(),
            payload: vec![b'x'].into(),
            ..Default::default()
        }
    }

    /// Forwards what the actor sends until `outcomes` task outcomes went by.
    async fn forward_outcomes(
        host: &mut ActorHost,
        rx: &mut mpsc::UnboundedReceiver<pb::AgentMessage>,
        outcomes: usize,
    ) {
        let mut seen = 0;
        while seen < outcomes {
            let message = tokio::time::timeout(Duration::from_secs(10), rx.recv())
                .await
                .expect("the actor answers")
                .expect("open");
            if matches!(message.body, Some(pb::agent_message::Body::TaskOutcome(_))) {
                seen += 1;
            }
            host.forwarded(&message);
        }
    }

    #[tokio::test]
    async fn cancel_marks_go_with_their_tasks_and_none_are_kept_for_answered_ones() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let (mut host, _models) =
            super::host_for_tests(ActorKindRegistry::with_builtin_kinds(), tx);
        host.start(pb::StartActor {
            actor_id: "a1".into(),
            incarnation: 1,
            pool: "p".into(),
            kind: "echo".into(),
            config: br#"{"delay_ms": 300}"#.to_vec().into(),
            max_in_flight: 4,
            ..Default::default()
        });
        let cancel = |task_id| pb::CancelTask {
            task_id,
            actor_id: "a1".into(),
        };
        // 1 runs while it is cancelled; 2 is cancelled while it waits; 3 is answered before
        // its cancel arrives; 99 was never here.
        host.run(run(1));
        host.run(run(2));
        tokio::time::sleep(Duration::from_millis(100)).await;
        host.cancel(cancel(1));
        host.cancel(cancel(2));
        host.cancel(cancel(99));
        forward_outcomes(&mut host, &mut rx, 2).await;
        host.run(run(3));
        forward_outcomes(&mut host, &mut rx, 1).await;
        host.cancel(cancel(3));
        assert_eq!(host.cancel_marks(), 0, "no mark outlives its task");
    }
}

#[cfg(test)]
mod stop_tests {
    use super::*;

    fn start(incarnation: u64) -> pb::StartActor {
        pb::StartActor {
            actor_id: "a1".into(),
            incarnation,
            pool: "p".into(),
            kind: "echo".into(),
            max_in_flight: 1,
            ..Default::default()
        }
    }

    /// A stop of incarnation 1 that reaches the agent after incarnation 2 started (the
    /// scheduler heard a late report of 1 and stopped what it named) leaves 2 running; a stop
    /// of 2, or of no incarnation in particular, stops it.
    #[tokio::test]
    async fn a_stop_of_an_earlier_incarnation_keeps_the_later_one() {
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let (mut host, _models) =
            super::host_for_tests(ActorKindRegistry::with_builtin_kinds(), tx);
        let a1 = ActorId::new("a1");
        host.start(start(1));
        host.start(start(2));
        host.stop_asked(&a1, 1);
        assert_eq!(host.actors.get(&a1).map(|slot| slot.incarnation), Some(2));
        host.stop_asked(&a1, 2);
        assert!(!host.actors.contains_key(&a1));

        host.start(start(3));
        host.stop_asked(&a1, 0);
        assert!(!host.actors.contains_key(&a1), "0 stops whichever runs");
        host.start(start(4));
        host.stop_asked(&a1, 5);
        assert!(
            !host.actors.contains_key(&a1),
            "a stop of a later incarnation than the one here stops it too"
        );
    }
}
