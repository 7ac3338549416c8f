//! Node registry: registration with generations, heartbeats, agent reports, failure detection.

use std::collections::BTreeMap;

use resident_proto::{ActorId, JobId, NodeId, VramBytes, pb};
use tokio::time::Instant;

use super::host_deaths::NodeLoss;
use super::records::{LastHeard, NodeRecord, SessionId};
use super::{Core, ToAgent};
use crate::error::SchedulerError;
use crate::placement::{ComputeCapability, GpuCapacity, NodeCapacity};
use crate::state::{ActorEvent, ActorState};
use crate::store::StoreOp;

pub(super) fn node_capacity(node: &NodeRecord, registered: &[pb::GpuInfo]) -> NodeCapacity {
    NodeCapacity {
        labels: node.labels.clone(),
        actor_kinds: node.actor_kinds.clone(),
        gpus: registered
            .iter()
            .map(|gpu| GpuCapacity {
                index: gpu.index,
                name: gpu.name.clone(),
                usable_vram: VramBytes(gpu.free_vram_bytes.min(gpu.total_vram_bytes)),
                compute: ComputeCapability {
                    major: gpu.compute_major,
                    minor: gpu.compute_minor,
                },
            })
            .collect(),
        cpu_millicores: u64::from(node.cpu_cores) * 1000,
    }
}

/// What placement may hand out on one GPU after a heartbeat: what the agent saw free, plus
/// what this scheduler's own actors there hold (the agent counts their memory as used; an
/// actor still loading holds nothing yet, and its reservation is counted by placement), at
/// least what those actors reserve (so a foreign process that takes memory never evicts a
/// running actor; it only stops new placements), and at most the GPU's total.
pub(super) fn refreshed_usable_vram(
    total: u64,
    free: u64,
    held_by_ours: u64,
    reserved_by_ours: u64,
) -> u64 {
    free.saturating_add(held_by_ours)
        .max(reserved_by_ours)
        .min(total.max(reserved_by_ours))
}

/// A change in usable VRAM smaller than this does not trigger placement (heartbeats come
/// every few seconds, and free memory jitters).
const VRAM_REPLAN_STEP: u64 = 256 << 20;

impl Core {
    /// Placement capacity from the GPUs' free memory as last heard (not only as registered:
    /// an agent that re-registers while memory is briefly taken would stay low for good).
    fn refresh_gpu_capacity(&mut self, node_id: &NodeId) {
        let mut held: BTreeMap<u32, u64> = BTreeMap::new();
        let mut reserved: BTreeMap<u32, u64> = BTreeMap::new();
        // Only this node's actors (the `hosted` index), never a walk of the whole fleet.
        let here = self.hosted_here(node_id);
        for actor in here.filter_map(|id| self.actors.get(id)) {
            let Some(assignment) = actor.assignment.as_ref() else {
                continue;
            };
            if !actor.state.is_placed() || assignment.gpus.is_empty() {
                continue;
            }
            let share = actor.vram_bytes / assignment.gpus.len() as u64;
            for index in &assignment.gpus {
                *held.entry(*index).or_default() += share;
                *reserved.entry(*index).or_default() += actor.request.vram_per_gpu.0;
            }
        }
        let Some(node) = self.nodes.get_mut(node_id) else {
            return;
        };
        for gpu in &node.gpus {
            node.free_vram_at_refresh
                .insert(gpu.index, gpu.free_vram_bytes);
            let Some(capacity) = node.capacity.gpus.iter_mut().find(|c| c.index == gpu.index)
            else {
                continue;
            };
            let usable = refreshed_usable_vram(
                gpu.total_vram_bytes,
                gpu.free_vram_bytes,
                held.get(&gpu.index).copied().unwrap_or(0),
                reserved.get(&gpu.index).copied().unwrap_or(0),
            );
            if usable.abs_diff(capacity.usable_vram.0) >= VRAM_REPLAN_STEP {
                tracing::debug!(node_id = %node_id, gpu = gpu.index, from = capacity.usable_vram.0, to = usable, "GPU capacity refreshed");
                capacity.usable_vram = VramBytes(usable);
                self.replan_needed = true;
                // The occupancy counts by node and GPU index, which this does not move.
                self.alive_capacities.take();
            }
        }
    }

    /// Ends the session `node_id` holds while alive: an agent that reconnected (same
    /// generation) or restarted (a new one) with the same credential. Another credential
    /// may not take a live node id over.
    fn end_earlier_session(
        &mut self,
        node_id: &NodeId,
        generation: &str,
        credential: &str,
    ) -> Result<(), SchedulerError> {
        let Some(old) = self.nodes.get(node_id).filter(|old| old.alive) else {
            return Ok(());
        };
        if old.credential != credential {
            return Err(SchedulerError::PermissionDenied(format!(
                "node id `{node_id}` is alive and held by credential `{}`; credential `{credential}` cannot take it over (give this agent its own --node-id, or stop the other agent first)",
                old.credential
            )));
        }
        if old.generation == generation {
            self.mark_node_dead(node_id, "agent reconnected", NodeLoss::Orderly);
        } else {
            let why = "agent restarted as a new generation";
            self.mark_node_dead(node_id, why, NodeLoss::Sudden);
        }
        Ok(())
    }

    pub(super) fn register_node(
        &mut self,
        mut register: pb::RegisterNode,
        credential: String,
        outbound: ToAgent,
        last_heard: LastHeard,
    ) -> Result<SessionId, SchedulerError> {
        check_registration(&register)?;
        let node_id = NodeId::new(register.node_id.clone());
        self.end_earlier_session(&node_id, &register.generation, &credential)?;
        let session = SessionId(self.next_session);
        self.next_session += 1;
        let inventory = std::mem::take(&mut register.inventory);
        let free_vram_at_refresh = register
            .gpus
            .iter()
            .map(|g| (g.index, g.free_vram_bytes))
            .collect();
        let record = NodeRecord {
            generation: register.generation.clone(),
            credential,
            session,
            hostname: register.hostname,
            labels: register.labels.into_iter().collect(),
            capacity: NodeCapacity::default(),
            gpus: register.gpus,
            unavailable_gpus: register.unavailable_gpus,
            cpu_cores: register.cpu_cores,
            ram_bytes: register.ram_bytes,
            actor_kinds: register.actor_kinds.into_iter().collect(),
            alive: true,
            draining: false,
            free_vram_at_refresh,
            remembered: true,
            last_heard,
            last_heartbeat: Instant::now(),
            outbound: Some(outbound),
        };
        let capacity = node_capacity(&record, &record.gpus);
        let record = NodeRecord { capacity, ..record };
        record.send(pb::scheduler_message::Body::Registered(pb::Registered {
            heartbeat_interval_ms: self.config.heartbeat_interval.as_millis() as u64,
            task_progress_interval_ms: self.config.task_progress_interval.as_millis() as u64,
        }));
        tracing::info!(
            node_id = %node_id,
            generation = %record.generation,
            gpus = record.gpus.len(),
            unavailable_gpus = record.unavailable_gpus.len(),
            "node registered"
        );
        self.nodes.insert(node_id.clone(), record);
        self.node_capacities_changed();
        self.store.write(StoreOp::PutNode(node_id.clone()));
        if let Some(settle) = &mut self.settle {
            settle.awaited.remove(&node_id);
        }
        self.sessions.insert(session, node_id.clone());
        self.adopt_inventory(&node_id, inventory);
        self.replan_needed = true;
        Ok(session)
    }

    pub(super) fn agent_message(&mut self, session: SessionId, message: pb::agent_message::Body) {
        use pb::agent_message::Body;
        let Some(node_id) = self.sessions.get(&session).cloned() else {
            return;
        };
        let Some(node) = self.nodes.get_mut(&node_id) else {
            return;
        };
        match message {
            Body::Heartbeat(heartbeat) => {
                node.last_heartbeat = Instant::now();
                // Capacity is recomputed only when free memory moved: an actor loading or
                // stopping, another process; not on every heartbeat of a steady node.
                let moved = heartbeat.gpus.iter().any(|live| {
                    node.free_vram_at_refresh
                        .get(&live.index)
                        .is_none_or(|seen| {
                            seen.abs_diff(live.free_vram_bytes) >= VRAM_REPLAN_STEP / 4
                        })
                });
                for live in heartbeat.gpus {
                    if let Some(gpu) = node.gpus.iter_mut().find(|g| g.index == live.index) {
                        gpu.free_vram_bytes = live.free_vram_bytes;
                    }
                }
                for report in heartbeat.actors {
                    self.actor_report(&node_id, report);
                }
                if moved {
                    self.refresh_gpu_capacity(&node_id);
                }
            }
            Body::ActorReport(report) => self.actor_report(&node_id, report),
            Body::TaskOutcome(outcome) => self.task_outcome(&node_id, outcome),
            Body::TaskProgress(progress) => self.task_progress(&node_id, progress),
            Body::Drain(drain) => {
                tracing::info!(
                    node_id = %node_id,
                    deadline_ms = drain.deadline_ms,
                    reason = %drain.reason,
                    "node draining: no new tasks or actors go there"
                );
                node.draining = true;
                self.replan_needed = true;
                self.node_capacities_changed();
                for id in self.hosted_on(&node_id) {
                    self.refresh_dispatchable(&id);
                }
            }
            Body::Leave(leave) => self.node_left(&node_id, leave.abandoned_tasks),
            Body::GpuFailed(pb::GpuFailed { gpu: Some(gpu) }) => self.gpu_failed(&node_id, gpu),
            Body::GpuFailed(pb::GpuFailed { gpu: None }) => {
                tracing::warn!(node_id = %node_id, "ignoring a GPU failure that names no GPU");
            }
            Body::Register(_) => {
                tracing::warn!(node_id = %node_id, "ignoring a second registration on one session");
            }
        }
    }

    pub(super) fn agent_gone(&mut self, session: SessionId) {
        if let Some(node_id) = self.sessions.remove(&session) {
            let current = self
                .nodes
                .get(&node_id)
                .is_some_and(|n| n.session == session);
            if current {
                self.mark_node_dead(&node_id, "agent session closed", NodeLoss::Sudden);
            }
        }
    }

    /// A drained agent said goodbye: what it still held goes back to the queue, its actors
    /// are placed elsewhere, and a restarted scheduler will not wait for it.
    fn node_left(&mut self, node_id: &NodeId, abandoned_tasks: u32) {
        tracing::info!(node_id = %node_id, abandoned_tasks, "node left after draining");
        self.mark_node_dead(node_id, "the agent drained and left", NodeLoss::Orderly);
        if let Some(node) = self.nodes.get_mut(node_id)
            && node.remembered
        {
            node.remembered = false;
            self.store.write(StoreOp::DeleteNode(node_id.clone()));
        }
    }

    /// Cuts off what revoked credentials hold: their nodes die (the agent's stream closes and
    /// its reconnect is refused) and their running jobs are cancelled.
    pub(super) fn credentials_changed(&mut self, valid: &std::collections::BTreeSet<String>) {
        let revoked_nodes: Vec<NodeId> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.alive && !valid.contains(&n.credential))
            .map(|(id, _)| id.clone())
            .collect();
        for node_id in revoked_nodes {
            self.mark_node_dead(&node_id, "its credential was revoked", NodeLoss::Orderly);
        }
        let revoked_jobs: Vec<JobId> = self
            .jobs
            .iter()
            .filter(|(_, j)| j.is_running() && !valid.contains(&j.status.owner))
            .map(|(id, _)| id.clone())
            .collect();
        for job_id in revoked_jobs {
            self.cancel_job_tasks(&job_id, "its owner's token was revoked");
        }
    }

    pub(super) fn detect_dead_nodes(&mut self, now: Instant) {
        let deadline = self.config.node_dead_after;
        let silent: Vec<NodeId> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.alive && now.saturating_duration_since(n.last_heard.at()) > deadline)
            .map(|(id, _)| id.clone())
            .collect();
        for node_id in silent {
            self.mark_node_dead(&node_id, "missed heartbeats", NodeLoss::Sudden);
        }
        // Dead for longer than the deadline (silent, or its session closed and it did not
        // come back): a restart will not wait for it. A scheduler that stops closes every
        // session but never gets here, so its restart still waits for them all.
        for (node_id, node) in &mut self.nodes {
            if node.remembered
                && !node.alive
                && now.saturating_duration_since(node.last_heard.at()) > deadline
            {
                node.remembered = false;
                self.store.write(StoreOp::DeleteNode(node_id.clone()));
            }
        }
        self.forget_dead_nodes(now);
    }

    /// Drops the records of nodes dead for longer than `dead_node_ttl` that host nothing,
    /// so a fleet that churns (autoscaled, spot) does not grow the scheduler forever.
    fn forget_dead_nodes(&mut self, now: Instant) {
        let ttl = self.config.dead_node_ttl;
        let expired: Vec<NodeId> = self
            .nodes
            .iter()
            .filter(|(id, node)| {
                !node.alive
                    && !node.remembered
                    && now.saturating_duration_since(node.last_heard.at()) > ttl
                    && self.hosted_here(id).next().is_none()
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in &expired {
            self.nodes.remove(id);
        }
        if !expired.is_empty() {
            tracing::info!(forgotten = expired.len(), ?ttl, "forgot dead nodes");
        }
    }

    /// The node is gone: its actors are placed again and their tasks go back to the queue.
    /// A sudden loss spends a restart of each actor it hosted and counts as a crash of each
    /// task it was running (see [`NodeLoss`]).
    pub(super) fn mark_node_dead(&mut self, node_id: &NodeId, why: &str, loss: NodeLoss) {
        let Some(node) = self.nodes.get_mut(node_id) else {
            return;
        };
        if !node.alive {
            return;
        }
        node.alive = false;
        node.outbound = None;
        self.alive_capacities.take();
        self.occupancy = None;
        self.sessions.remove(&node.session);
        tracing::warn!(node_id = %node_id, reason = why, "node dead");
        self.metrics
            .events
            .record("node", node_id.as_str(), format!("dead: {why}"));
        self.lose_node_actors(node_id, &format!("node {node_id} died ({why})"), loss);
        self.replan_needed = true;
    }

    fn actor_report(&mut self, node_id: &NodeId, report: pb::ActorReport) {
        let actor_id = ActorId::new(report.actor_id.clone());
        let known = self.actors.get(&actor_id).is_some_and(|a| {
            a.incarnation == report.incarnation
                && a.state.is_placed()
                && a.assignment.as_ref().is_some_and(|p| &p.node == node_id)
        });
        let reported =
            pb::ActorState::try_from(report.state).unwrap_or(pb::ActorState::Unspecified);
        if !known {
            if reported != pb::ActorState::Dead {
                // An actor this scheduler no longer wants there (stale incarnation): stop it.
                if let Some(node) = self.nodes.get(node_id) {
                    // Only the incarnation reported: a later one may have started there since.
                    node.send(pb::scheduler_message::Body::StopActor(pb::StopActor {
                        actor_id: report.actor_id,
                        incarnation: report.incarnation,
                    }));
                }
            }
            return;
        }
        let actor = self.actors.get_mut(&actor_id).expect("known");
        actor.last_reported = Some(Instant::now());
        let loads = actor.loads_before_this_start + report.model_loads;
        self.metrics
            .models_loaded(actor.pool.as_str(), loads.saturating_sub(actor.model_loads));
        actor.model_loads = loads;
        let work = crate::state::ActorWork::of(&report);
        let added = actor.reported_work.added_by(work);
        actor.reported_work = work;
        self.metrics.actor_worked(
            actor.pool.as_str(),
            actor_id.as_str(),
            node_id.as_str(),
            added,
        );
        actor.vram_bytes = report.vram_bytes;
        match reported {
            pb::ActorState::Ready if actor.state == ActorState::Starting => {
                self.change_actor(&actor_id, ActorEvent::Loaded);
                self.actors.get_mut(&actor_id).expect("known").error.clear();
                let pool = self.actors[&actor_id].pool.clone();
                self.dispatch_pool(&pool);
            }
            pb::ActorState::Dead => {
                let error = if report.error.is_empty() {
                    "actor stopped".to_owned()
                } else {
                    report.error
                };
                self.lose_actor(&actor_id, ActorEvent::Failed, &error);
                self.replan_needed = true;
            }
            _ => {}
        }
    }

    /// Whether the node hosting an actor placed there is going away.
    pub(super) fn on_draining_node(
        &self,
        assignment: Option<&crate::placement::Assignment>,
    ) -> bool {
        assignment
            .and_then(|a| self.nodes.get(&a.node))
            .is_some_and(|n| n.draining)
    }

    /// What nodes that take new actors (alive and not draining) offer, built once until
    /// [`Self::node_capacities_changed`].
    pub(super) fn alive_node_capacities(&self) -> &BTreeMap<NodeId, NodeCapacity> {
        self.alive_capacities
            .get_or_init(|| self.alive_node_capacities_now())
    }

    pub(super) fn alive_node_capacities_now(&self) -> BTreeMap<NodeId, NodeCapacity> {
        self.nodes
            .iter()
            .filter(|(_, n)| n.alive && !n.draining)
            .map(|(id, n)| (id.clone(), n.capacity.clone()))
            .collect()
    }

    /// A node joined, died or began draining, or what it offers moved: placement's copy of
    /// the capacities is built again when next needed.
    pub(super) fn node_capacities_changed(&mut self) {
        self.alive_capacities.take();
        self.occupancy = None;
    }
}

/// A registration's node id and generation are set and its fields within their limits.
fn check_registration(register: &pb::RegisterNode) -> Result<(), SchedulerError> {
    if register.node_id.trim().is_empty() {
        return Err(SchedulerError::InvalidArgument("node id is empty".into()));
    }
    if register.generation.is_empty() {
        return Err(SchedulerError::InvalidArgument(
            "node generation is empty".into(),
        ));
    }
    crate::policy::field_limits::check_registration(register)
        .map_err(|over| SchedulerError::InvalidArgument(over.to_string()))
}
