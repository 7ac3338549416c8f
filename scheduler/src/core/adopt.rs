//! Taking back what agents kept while the scheduler was away: the actors a registering node
//! reports (through the pure `policy::reconcile`), and the outcomes it held for tasks this
//! scheduler did not dispatch.

use std::collections::BTreeMap;

use resident_proto::{ActorId, GpuFraction, JobId, NodeId, PoolName, TaskId, pb};

use super::Core;
use super::records::{ActorRecord, HeldOutcome};
use crate::placement::{Assignment, share_per_gpu};
use crate::policy::reconcile::{
    ReportedActor, StartShape, Verdict, WantedPlace, WantedPool, reconcile,
};
use crate::state::{ActorEvent, ActorState, Restarts, TaskEvent, TaskState};

fn reported_shape(start: &pb::StartActor) -> StartShape {
    StartShape {
        kind: start.kind.clone(),
        config: start.config.to_vec(),
        vram_per_gpu: start.vram_bytes,
        max_in_flight: start.max_in_flight,
        gpu_count: start.gpu_indices.len() as u32,
        share_per_gpu: GpuFraction::from_gpus(start.gpu_fraction).unwrap_or_default(),
    }
}

impl Core {
    /// The pools as placement would start their actors now, with where each live actor is.
    fn wanted_pools(&self) -> BTreeMap<PoolName, WantedPool> {
        self.pools
            .iter()
            .map(|(name, pool)| {
                let shape = StartShape {
                    kind: pool.spec.actor_kind.clone(),
                    config: pool.spec.actor_config.to_vec(),
                    vram_per_gpu: pool.request.vram_per_gpu.0,
                    max_in_flight: pool.in_flight_per_actor,
                    gpu_count: pool.request.gpus.whole_gpus(),
                    share_per_gpu: share_per_gpu(pool.request.gpus),
                };
                let mut actors: Vec<(u64, ActorId, WantedPlace)> = pool
                    .actors
                    .iter()
                    .filter_map(|id| {
                        let actor = &self.actors[id];
                        let place = match (actor.state, &actor.assignment) {
                            (ActorState::Pending, _) => WantedPlace::Unplaced,
                            (ActorState::Starting | ActorState::Ready, Some(assignment)) => {
                                WantedPlace::On {
                                    node: assignment.node.clone(),
                                    incarnation: actor.incarnation,
                                }
                            }
                            _ => return None,
                        };
                        Some((actor.order, id.clone(), place))
                    })
                    .collect();
                actors.sort();
                let actors = actors.into_iter().map(|(_, id, p)| (id, p)).collect();
                (name.clone(), WantedPool { shape, actors })
            })
            .collect()
    }

    /// Adopts what a registering node reports that a pool wants, and stops the rest.
    pub(super) fn adopt_inventory(&mut self, node_id: &NodeId, inventory: Vec<pb::HostedActor>) {
        let mut hosted = BTreeMap::new();
        let mut reported = Vec::new();
        for actor in inventory {
            let (Some(start), Some(report)) = (&actor.start, &actor.report) else {
                continue;
            };
            if report.state == pb::ActorState::Dead as i32 {
                continue;
            }
            let id = ActorId::new(start.actor_id.clone());
            let pool = PoolName::new(start.pool.clone());
            if let Some(why) = self.not_placed_here(node_id, &id, &pool) {
                self.refuse_adoption(node_id, &id, start.incarnation, &pool, &why);
                continue;
            }
            reported.push(ReportedActor {
                id: id.clone(),
                pool,
                shape: reported_shape(start),
                incarnation: start.incarnation,
            });
            hosted.insert(id, actor);
        }
        if reported.is_empty() {
            return;
        }
        for verdict in reconcile(node_id, &self.wanted_pools(), &reported) {
            match verdict {
                Verdict::Adopt {
                    id,
                    pool,
                    replacing,
                } => {
                    let actor = hosted.remove(&id).expect("reported");
                    self.adopt_actor(node_id, &pool, actor, replacing);
                }
                Verdict::Stop { id, why } => {
                    tracing::info!(actor_id = %id, node_id = %node_id, reason = %why, "stopping a reported actor nobody wants");
                    let incarnation = hosted
                        .get(&id)
                        .and_then(|actor| actor.start.as_ref())
                        .map_or(0, |start| start.incarnation);
                    if let Some(node) = self.nodes.get(node_id) {
                        node.send(pb::scheduler_message::Body::StopActor(pb::StopActor {
                            actor_id: id.to_string(),
                            incarnation,
                        }));
                    }
                }
            }
        }
        self.replan_needed = true;
    }

    /// Why `node` may not hand back actor `id` of `pool`, if it may not: adoption takes
    /// only actors this scheduler (or the state it restored) started on that node for that
    /// pool, and never an id that another pool's record holds.
    fn not_placed_here(&self, node: &NodeId, id: &ActorId, pool: &PoolName) -> Option<String> {
        if let Some(actor) = self.actors.get(id)
            && &actor.pool != pool
        {
            return Some(format!("actor {id} belongs to pool `{}`", actor.pool));
        }
        match self.placement_of(id) {
            None => Some(format!("this scheduler never started actor {id}")),
            Some((placed_pool, _)) if placed_pool != pool => Some(format!(
                "actor {id} was started for pool `{placed_pool}`, not `{pool}`"
            )),
            Some((_, placed_node)) if placed_node != node => {
                Some(format!("actor {id} was started on {placed_node}"))
            }
            Some(_) => None,
        }
    }

    /// Stops an actor a node may not hand back, and audits the refusal under the node's
    /// credential.
    fn refuse_adoption(
        &mut self,
        node_id: &NodeId,
        id: &ActorId,
        incarnation: u64,
        pool: &PoolName,
        why: &str,
    ) {
        let principal = self.node_principal(node_id);
        let subject = format!("actor {id} of pool {pool} on node {node_id}");
        crate::auth::audit::refused(&principal, "adopt_actor", &subject, why);
        if let Some(node) = self.nodes.get(node_id) {
            node.send(pb::scheduler_message::Body::StopActor(pb::StopActor {
                actor_id: id.to_string(),
                incarnation,
            }));
        }
    }

    fn adopt_actor(
        &mut self,
        node_id: &NodeId,
        pool_name: &PoolName,
        hosted: pb::HostedActor,
        replacing: Option<ActorId>,
    ) {
        let start = hosted.start.expect("checked");
        let report = hosted.report.expect("checked");
        let id = ActorId::new(start.actor_id.clone());
        if let Some(old) = replacing {
            // A restored pool's fresh, never-placed actor gives its place (and its order)
            // to the one that is already loaded.
            let record = self.actors.remove(&old).expect("wanted actor");
            if self.unindex_pending(record.order, &old) {
                self.index_pending(record.order, id.clone());
            }
            let pool = self.pools.get_mut(pool_name).expect("wanted pool");
            pool.actors.remove(&old);
            pool.actors.insert(id.clone());
            self.actors.insert(
                id.clone(),
                ActorRecord {
                    restarts: Restarts {
                        used: 0,
                        max: pool.max_restarts,
                    },
                    ..record
                },
            );
        }
        self.inherit_runs(&id, &hosted.tasks_in_hand);
        let actor = self.actors.get_mut(&id).expect("adopted actor exists");
        actor.inherited_in_flight = hosted.tasks_in_hand.len() as u32;
        if std::mem::take(&mut actor.restart_spent_on_host) {
            // Its host was taken for dead (a cut, missed heartbeats) but comes back with
            // the actor loaded: nothing crashed, so the restart is given back.
            actor.restarts.used = actor.restarts.used.saturating_sub(1);
        }
        if actor.state == ActorState::Pending {
            if actor.incarnation != start.incarnation {
                // Another start than the one this scheduler counted (a restored record):
                // its loads come on top. The same start back (its host was taken for
                // dead) has had its loads counted already.
                actor.loads_before_this_start = actor.model_loads;
            }
            actor.incarnation = start.incarnation;
            actor.unplaced_reason.clear();
            actor.error.clear();
            self.change_actor(&id, ActorEvent::Placed);
            let assignment = Assignment {
                node: node_id.clone(),
                gpus: start.gpu_indices.clone(),
                share_per_gpu: GpuFraction::from_gpus(start.gpu_fraction).unwrap_or_default(),
            };
            self.assign(&id, assignment);
        }
        let actor = self.actors.get_mut(&id).expect("exists");
        actor
            .started_at
            .get_or_insert_with(tokio::time::Instant::now);
        actor.last_reported = Some(tokio::time::Instant::now());
        actor.model_loads = actor.loads_before_this_start + report.model_loads;
        // Like its loads, the work it did before this scheduler knew it is not counted
        // again in this process's metrics: later reports add only what is new.
        actor.reported_work = crate::state::ActorWork::of(&report);
        actor.vram_bytes = report.vram_bytes;
        if report.state == pb::ActorState::Ready as i32 && actor.state == ActorState::Starting {
            self.change_actor(&id, ActorEvent::Loaded);
        }
        tracing::info!(
            actor_id = %id,
            node_id = %node_id,
            pool = %pool_name,
            tasks_in_hand = hosted.tasks_in_hand.len(),
            "adopted a resident actor (its model stays loaded)"
        );
        self.refresh_dispatchable(&id);
        self.dispatch_pool(pool_name);
    }

    /// An outcome no dispatch of this scheduler awaits. From an actor that still held tasks
    /// when it was adopted, it frees that credit. Its output answers a task of a restored
    /// job (at once if the client sent it again and it waits in the queue, or held until
    /// the client does) only when it comes from the run this scheduler inherited: the node
    /// hosts the actor, and the actor listed that task in hand when it was adopted. Any
    /// other outcome (a task never handed to that node, another job's, a guess) is dropped
    /// and audited under the node's credential.
    pub(super) fn unawaited_outcome(&mut self, node_id: &NodeId, outcome: pb::TaskOutcome) {
        let actor_id = ActorId::new(outcome.actor_id.clone());
        let hosted_here = self.actors.get(&actor_id).is_some_and(|actor| {
            actor
                .assignment
                .as_ref()
                .is_some_and(|a| &a.node == node_id)
        });
        let mut freed_pool = None;
        if hosted_here
            && let Some(actor) = self.actors.get_mut(&actor_id)
            && actor.inherited_in_flight > 0
        {
            actor.inherited_in_flight -= 1;
            actor.last_answer = Some(tokio::time::Instant::now());
            freed_pool = Some(actor.pool.clone());
            self.refresh_dispatchable(&actor_id);
        }
        match outcome.key {
            Some(key) if hosted_here && self.inherited_run_of(&actor_id, &key) => {
                self.settle_earlier_run(key, outcome.result, actor_id, outcome.run_micros)
            }
            Some(key) if self.jobs.contains_key(&JobId::new(key.job_id.clone())) => {
                self.refuse_outcome(node_id, &actor_id, &key, outcome.task_id)
            }
            _ => tracing::debug!(task_id = outcome.task_id, "ignoring stale task outcome"),
        }
        if let Some(pool) = freed_pool {
            self.dispatch_pool(&pool);
        }
    }

    /// The agent principal a node joined as, for the audit log.
    fn node_principal(&self, node_id: &NodeId) -> crate::auth::Principal {
        crate::auth::Principal {
            name: self
                .nodes
                .get(node_id)
                .map(|n| n.credential.clone())
                .unwrap_or_default(),
            role: crate::auth::Role::Agent,
        }
    }

    /// Whether `actor` had task `key` in hand when this scheduler adopted it (and has not
    /// answered it since).
    fn inherited_run_of(&self, actor: &ActorId, key: &pb::TaskKey) -> bool {
        self.jobs
            .get(&JobId::new(key.job_id.clone()))
            .and_then(|job| job.inherited_runs.get(&key.seq))
            .is_some_and(|by| by == actor)
    }

    /// Drops an outcome for a task of a known job that this node was never handed, and
    /// audits it: a compromised agent token may not answer other nodes' or jobs' tasks.
    fn refuse_outcome(&self, node_id: &NodeId, actor: &ActorId, key: &pb::TaskKey, task: u64) {
        let principal = self.node_principal(node_id);
        let subject = format!(
            "task {task} (job {} seq {}) from actor {actor} on node {node_id}",
            key.job_id, key.seq
        );
        crate::auth::audit::refused(
            &principal,
            "task_outcome",
            &subject,
            "this node was not handed that task (and did not hold it when its actor was adopted); the outcome is dropped",
        );
    }

    /// The outcome of task `key` from a dispatch before this scheduler (or this attachment):
    /// it answers the task if the client sent it again, is held until the client does, or,
    /// if it failed there, lets a resent task that waited for it run here, afresh.
    fn settle_earlier_run(
        &mut self,
        key: pb::TaskKey,
        result: Option<pb::task_outcome::Result>,
        actor: ActorId,
        run_micros: u64,
    ) {
        let job_id = JobId::new(key.job_id);
        let Some(job) = self.jobs.get_mut(&job_id) else {
            return;
        };
        job.inherited_runs.remove(&key.seq);
        let live = job.live.get(&key.seq).copied();
        match (result, live) {
            (Some(pb::task_outcome::Result::Output(output)), Some(task_id)) => {
                self.answer_queued_task(task_id, output, actor, run_micros)
            }
            (Some(pb::task_outcome::Result::Output(output)), None) => {
                if job.may_be_resumed()
                    && let Some(charge) =
                        self.held_outcomes.charge_within_total(output.len() as u64)
                {
                    let held = HeldOutcome {
                        output,
                        actor,
                        run_micros,
                        charge,
                    };
                    job.hold(key.seq, held, self.config.max_job_buffered_bytes);
                }
            }
            (_, Some(task_id)) => self.run_waiting_task(task_id),
            (_, None) => {}
        }
    }

    /// Finishes a queued task with an output from an earlier dispatch; a task that is
    /// running again (or backing off) waits for its own answer.
    pub(super) fn answer_queued_task(
        &mut self,
        task_id: TaskId,
        output: prost::bytes::Bytes,
        actor: ActorId,
        run_micros: u64,
    ) {
        let Some(task) = self.tasks.get_mut(&task_id) else {
            return;
        };
        if task.lifecycle.state() != &TaskState::Queued {
            return;
        }
        task.last_actor = Some(actor);
        let pool = task.pool.clone();
        if let Some(record) = self.pools.get_mut(&pool) {
            record.queue.retain(|t| *t != task_id);
            record.suspects.retain(|t| *t != task_id);
        }
        if self.change_task(task_id, TaskEvent::AnsweredEarlier) {
            self.finish_task(task_id, Ok(output), run_micros);
        }
    }

    /// Notes the tasks adopted actor `actor` still has in hand, so a task its client sends
    /// again waits for that run. One the client sent again already, still queued, leaves
    /// the queue to wait too.
    fn inherit_runs(&mut self, actor: &ActorId, in_hand: &[pb::TaskKey]) {
        let mut waiting = Vec::new();
        for key in in_hand {
            let job_id = JobId::new(key.job_id.clone());
            let Some(job) = self.jobs.get_mut(&job_id).filter(|j| j.may_be_resumed()) else {
                continue;
            };
            job.inherited_runs.insert(key.seq, actor.clone());
            waiting.extend(job.live.get(&key.seq).copied());
        }
        for task_id in waiting {
            let Some(task) = self.tasks.get_mut(&task_id) else {
                continue;
            };
            if task.lifecycle.state() != &TaskState::Queued {
                continue;
            }
            if let Some(pool) = self.pools.get_mut(&task.pool) {
                let suspected = pool.suspects.contains(&task_id);
                pool.queue.retain(|t| *t != task_id);
                pool.suspects.retain(|t| *t != task_id);
                if suspected {
                    // Suspected because its host was taken for dead; the host is back with
                    // the run still going, so nothing crashed.
                    task.crashes = task.crashes.saturating_sub(1);
                    task.first_crash_victims.clear();
                }
            }
        }
    }

    /// Whether the task `seq` of `job`, just sent again, should wait for the run an adopted
    /// actor still has in hand rather than run a second time.
    pub(super) fn awaits_inherited_run(&self, job: &JobId, seq: u64) -> bool {
        let Some(actor) = self.jobs.get(job).and_then(|j| j.inherited_runs.get(&seq)) else {
            return false;
        };
        let waits = self
            .actors
            .get(actor)
            .is_some_and(|a| a.inherited_in_flight > 0 && a.assignment.is_some());
        if waits {
            tracing::debug!(job_id = %job, seq, actor_id = %actor, "sent again: waits for the run an adopted actor has in hand");
        }
        waits
    }

    /// Adopted actor `actor` will not answer the tasks it had in hand (it was lost): the
    /// resent tasks that waited for it go to their queues.
    pub(super) fn release_inherited_runs(&mut self, actor: &ActorId) {
        let mut waiting = Vec::new();
        for job in self.jobs.values_mut() {
            job.inherited_runs.retain(|seq, by| {
                if by != actor {
                    return true;
                }
                waiting.extend(job.live.get(seq).copied());
                false
            });
        }
        for task_id in waiting {
            self.run_waiting_task(task_id);
        }
    }

    /// Queues a resent task that waited for an inherited run which will not answer it.
    fn run_waiting_task(&mut self, task_id: TaskId) {
        let Some(task) = self
            .tasks
            .get(&task_id)
            .filter(|t| t.lifecycle.state() == &TaskState::Queued)
        else {
            return;
        };
        let pool = task.pool.clone();
        match self.pools.get_mut(&pool) {
            Some(record) if !record.queue.contains(&task_id) => record.queue.push_front(task_id),
            Some(_) => {}
            None => {
                self.fail_task(task_id, format!("pool `{pool}` was deleted"));
                return;
            }
        }
        self.dispatch_pool(&pool);
    }
}
