//! Pools and their actors: creation, scaling, deletion, placement and the lifecycle edges.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use resident_proto::{ActorId, GpuFraction, PoolName, TaskId, VramBytes, pb};

use tokio::time::Instant;

use super::Core;
use super::host_deaths::TaskBlame;
use super::records::{ActorRecord, Crash, Holding, PoolRecord, PoolUsage};
use crate::auth::{Principal, may_manage_pool};
use crate::error::SchedulerError;
use crate::placement::{self, ActorDemand, ComputeCapability, PlacementStrategy, ResourceRequest};
use crate::state::{ActorEvent, ActorState, Restarts, TaskState, transition};
use crate::store::StoreOp;

/// Labels a pool's selector may name (as a node's): every listing carries them. Each key
/// and value (and the GPU model name) is at most a node label's length.
const MAX_SELECTOR_LABELS: usize = crate::policy::field_limits::MAX_NODE_LABELS;
use crate::policy::field_limits::MAX_LABEL_BYTES;

/// Checks a pool spec and turns its resources into a placement request. Every field that
/// lands in listings is bounded (name, kind, config, selector), so a listing of every
/// pool fits a message.
pub(super) fn validate_pool_spec(spec: &pb::PoolSpec) -> Result<ResourceRequest, SchedulerError> {
    let bad = |m: String| Err(SchedulerError::InvalidArgument(m));
    let name_ok = !spec.name.is_empty()
        && spec.name.len() <= 63
        && spec
            .name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !name_ok {
        return bad(format!(
            "pool name `{}` must be 1-63 characters of letters, digits, `-` or `_`",
            spec.name
        ));
    }
    if spec.actor_kind.trim().is_empty() {
        return bad("actor kind is empty".into());
    }
    if spec.actor_kind.len() > 128 {
        return bad(format!(
            "actor kind is {} bytes long; the limit is 128",
            spec.actor_kind.len()
        ));
    }
    resident_actor::limits::check_config(&spec.actor_kind, &spec.actor_config)
        .map_err(|over| SchedulerError::InvalidArgument(over.to_string()))?;
    if spec.replicas == 0 {
        return bad("replicas must be at least 1".into());
    }
    if spec.replicas > 10_000 {
        return bad(format!(
            "replicas must be at most 10000, got {}",
            spec.replicas
        ));
    }
    let resources = spec.resources.clone().unwrap_or_default();
    let long_label = resources
        .selector
        .iter()
        .find(|(k, v)| k.len() > MAX_LABEL_BYTES || v.len() > MAX_LABEL_BYTES);
    if resources.selector.len() > MAX_SELECTOR_LABELS || long_label.is_some() {
        return bad(format!(
            "the selector has {} labels; at most {MAX_SELECTOR_LABELS} are allowed, each key and value at most {MAX_LABEL_BYTES} bytes",
            resources.selector.len()
        ));
    }
    if resources.gpu_model.len() > MAX_LABEL_BYTES {
        return bad(format!("gpu_model is longer than {MAX_LABEL_BYTES} bytes"));
    }
    let gpus = GpuFraction::from_gpus(resources.gpus)
        .map_err(|refused| SchedulerError::InvalidArgument(refused.to_string()))?;
    if !resources.cpus.is_finite() || resources.cpus < 0.0 {
        return bad(format!(
            "cpus must be a non-negative number, got {}",
            resources.cpus
        ));
    }
    if gpus.is_cpu_only() && resources.vram_bytes > 0 {
        return bad("vram_bytes needs gpus > 0".into());
    }
    let min_compute = (resources.min_compute_major > 0).then_some(ComputeCapability {
        major: resources.min_compute_major,
        minor: resources.min_compute_minor,
    });
    Ok(ResourceRequest {
        actor_kind: spec.actor_kind.clone(),
        gpus,
        vram_per_gpu: VramBytes(resources.vram_bytes),
        selector: resources.selector.into_iter().collect(),
        gpu_model: Some(resources.gpu_model).filter(|m| !m.trim().is_empty()),
        min_compute,
        strategy: match pb::PlacementStrategy::try_from(resources.strategy) {
            Ok(pb::PlacementStrategy::Spread) => PlacementStrategy::Spread,
            _ => PlacementStrategy::Pack,
        },
        cpu_millicores: (resources.cpus * 1000.0).round() as u64,
    })
}

/// Why a pool of `kind` is refused: no alive agent offers it; names other versions of the
/// same kind when agents have them, and says how a kind gets onto agents.
fn kind_not_offered(kind: &str, offered: &BTreeSet<&String>) -> String {
    let (name, _) = resident_actor::split_kind_id(kind);
    let versions: Vec<&str> = offered
        .iter()
        .filter(|other| resident_actor::split_kind_id(other).0 == name)
        .map(|other| other.as_str())
        .collect();
    let all: Vec<&str> = offered.iter().map(|k| k.as_str()).collect();
    let mut message = format!("no alive agent offers actor kind `{kind}`");
    if !versions.is_empty() {
        message.push_str(&format!(
            "; agents offer other versions of it: {} (build the client and the agents from \
             the same version of the kind, or roll the agents out first)",
            versions.join(", ")
        ));
    }
    message.push_str(&format!(
        "; alive agents offer: {}. A kind of your own runs on agents built with it (see \
         examples/custom-actor)",
        all.join(", ")
    ));
    message
}

/// Actors placed (and started) in one turn of the loop at most: 80,000 new actors are
/// placed in slices of about 10 ms, with agents and clients served in between.
pub(super) const MAX_PLACEMENTS_PER_TURN: usize = 2048;

/// A pending actor as a placement slice takes it: its id and demand (with its order).
type PendingDemand = (ActorId, ActorDemand);

impl Core {
    /// Creates `spec` owned by `requester`; the same spec again attaches to the pool (any
    /// principal may, to run jobs on it), and only its owner or an admin changes its TTL.
    pub(super) fn create_pool(
        &mut self,
        mut spec: pb::PoolSpec,
        requester: &Principal,
    ) -> Result<pb::PoolStatus, SchedulerError> {
        let request = validate_pool_spec(&spec)?;
        let name = PoolName::new(spec.name.clone());
        if let Some(existing) = self.pools.get_mut(&name) {
            spec.owner = existing.spec.owner.clone();
            let same_but_ttl = pb::PoolSpec {
                idle_ttl_ms: existing.spec.idle_ttl_ms,
                ..spec.clone()
            } == existing.spec;
            if same_but_ttl {
                let may_change =
                    may_manage_pool(requester, name.as_str(), &existing.spec.owner).is_ok();
                if existing.spec.idle_ttl_ms != spec.idle_ttl_ms && may_change {
                    existing.spec.idle_ttl_ms = spec.idle_ttl_ms;
                    self.store.write(StoreOp::PutPool(spec));
                }
                return self.pool_status(&name);
            }
            return Err(SchedulerError::AlreadyExists(format!(
                "pool `{name}` already exists with a different spec; delete or scale it"
            )));
        }
        spec.owner = requester.name.clone();
        self.check_kind_offered(&spec.actor_kind)?;
        self.check_placeable(&name, &request)?;
        self.add_pool(spec.clone(), request);
        // Its actors are placed once the pool is on disk (`core/acknowledged.rs`).
        self.pools.get_mut(&name).expect("just added").saved = false;
        self.store.write(StoreOp::PutPool(spec));
        self.pool_status(&name)
    }

    fn check_kind_offered(&self, kind: &str) -> Result<(), SchedulerError> {
        let alive: Vec<_> = self.nodes.values().filter(|n| n.alive).collect();
        if alive.is_empty() || alive.iter().any(|n| n.actor_kinds.contains(kind)) {
            return Ok(());
        }
        let offered: BTreeSet<&String> = alive.iter().flat_map(|n| n.actor_kinds.iter()).collect();
        Err(SchedulerError::InvalidArgument(kind_not_offered(
            kind, &offered,
        )))
    }

    /// A request that cannot fit even on an empty cluster is refused up front.
    fn check_placeable(
        &self,
        pool: &PoolName,
        request: &ResourceRequest,
    ) -> Result<(), SchedulerError> {
        let nodes = self.alive_node_capacities();
        if nodes.is_empty() {
            return Ok(());
        }
        let probe = ActorId::new("probe");
        let demand = ActorDemand {
            pool: pool.clone(),
            request: request.clone(),
            order: 0,
        };
        // Nothing held: the cluster as if empty.
        let alone = BTreeMap::from([(probe.clone(), demand)]);
        let plan = placement::place_pending(nodes, std::iter::empty(), &alone, 1);
        match plan.refusals.get(&probe) {
            None => Ok(()),
            Some(refusal) => Err(SchedulerError::Unplaceable {
                pool: pool.to_string(),
                refusal: refusal.clone(),
            }),
        }
    }

    pub(super) fn add_pool(&mut self, spec: pb::PoolSpec, request: ResourceRequest) {
        let name = PoolName::new(spec.name.clone());
        let or_default = |value: u32, default: u32| if value == 0 { default } else { value };
        let record = PoolRecord {
            in_flight_per_actor: or_default(
                spec.max_in_flight_per_actor,
                self.config.default_in_flight_per_actor,
            ),
            max_task_attempts: or_default(
                spec.max_task_attempts,
                self.config.default_max_task_attempts,
            ),
            max_restarts: or_default(spec.max_restarts, self.config.default_max_restarts),
            load_timeout: match spec.load_timeout_ms {
                0 => self.config.default_load_timeout,
                ms => std::time::Duration::from_millis(ms),
            },
            task_timeout: (spec.task_timeout_ms > 0)
                .then(|| std::time::Duration::from_millis(spec.task_timeout_ms)),
            request,
            actors: BTreeSet::new(),
            queue: VecDeque::new(),
            suspects: VecDeque::new(),
            kept_for_suspect: None,
            dispatchable: Default::default(),
            idle_since: None,
            saved: true,
            usage: PoolUsage::since(Instant::now()),
            spec,
        };
        let replicas = record.spec.replicas;
        self.pools.insert(name.clone(), record);
        for _ in 0..replicas {
            self.new_actor(&name);
        }
        tracing::info!(pool = %name, replicas, "pool created");
    }

    fn new_actor(&mut self, pool: &PoolName) {
        let record = self.pools.get_mut(pool).expect("pool exists");
        let id = ActorId::generate(pool);
        record.actors.insert(id.clone());
        let actor = ActorRecord {
            pool: pool.clone(),
            request: record.request.clone(),
            state: ActorState::Pending,
            restarts: Restarts {
                used: 0,
                max: record.max_restarts,
            },
            incarnation: 0,
            order: self.next_actor_order,
            assignment: None,
            in_flight: BTreeSet::new(),
            inherited_in_flight: 0,
            quarantine: None,
            crash: None,
            restart_spent_on_host: false,
            started_at: None,
            last_reported: None,
            task_timeout: record.task_timeout,
            last_answer: None,
            tasks_done: 0,
            model_loads: 0,
            loads_before_this_start: 0,
            vram_bytes: 0,
            error: String::new(),
            unplaced_reason: String::new(),
            reported_work: Default::default(),
            holding: Holding::default(),
        };
        self.index_pending(self.next_actor_order, id.clone());
        self.next_actor_order += 1;
        self.actors.insert(id, actor);
        self.replan_needed = true;
    }

    pub(super) fn scale_pool(
        &mut self,
        pool: &PoolName,
        replicas: u32,
        requester: &Principal,
    ) -> Result<pb::PoolStatus, SchedulerError> {
        let record = self.pool_record(pool)?;
        may_manage_pool(requester, pool.as_str(), &record.spec.owner)?;
        if replicas == 0 {
            return Err(SchedulerError::InvalidArgument(
                "replicas must be at least 1; delete the pool to remove it".into(),
            ));
        }
        self.set_replicas(pool, replicas);
        self.after_commands();
        self.pool_status(pool)
    }

    /// Sets the pool's replicas, writes its spec, and starts or drains actors to match.
    pub(super) fn set_replicas(&mut self, pool: &PoolName, replicas: u32) {
        let Some(record) = self.pools.get(pool) else {
            return;
        };
        let mut live: Vec<(u8, usize, u64, ActorId)> = record
            .actors
            .iter()
            .filter_map(|id| {
                let a = &self.actors[id];
                let rank = match a.state {
                    ActorState::Pending => 0,
                    ActorState::Starting => 1,
                    ActorState::Ready => 2,
                    ActorState::Draining | ActorState::Dead => return None,
                };
                Some((rank, a.in_flight.len(), u64::MAX - a.order, id.clone()))
            })
            .collect();
        let current = live.len() as u32;
        let record = self.pools.get_mut(pool).expect("checked");
        record.spec.replicas = replicas;
        self.store.write(StoreOp::PutPool(record.spec.clone()));
        if replicas > current {
            for _ in current..replicas {
                self.new_actor(pool);
            }
        } else {
            live.sort();
            for (_, _, _, id) in live.into_iter().take((current - replicas) as usize) {
                self.drain_actor(&id);
            }
        }
    }

    /// Why `pool` is in use now, if it is: a running job, queued work or a loading actor.
    pub(super) fn pool_in_use(&self, pool: &PoolName) -> Option<String> {
        let record = self.pools.get(pool)?;
        if let Some(job) = self
            .jobs
            .iter()
            .find(|(_, j)| j.is_running() && j.status.pool == pool.as_str())
        {
            return Some(format!("job {} is running on it", job.0));
        }
        let queued = record.queue.len() + record.suspects.len();
        if queued > 0 {
            return Some(format!("{queued} tasks are queued on it"));
        }
        record
            .actors
            .iter()
            .any(|id| self.actors[id].state == ActorState::Starting)
            .then(|| "an actor is loading".to_owned())
    }

    /// Deletes pools unused for longer than their `idle_ttl_ms`.
    pub(super) fn expire_idle_pools(&mut self, now: Instant) {
        let names: Vec<PoolName> = self
            .pools
            .iter()
            .filter(|(_, p)| p.spec.idle_ttl_ms > 0)
            .map(|(name, _)| name.clone())
            .collect();
        for name in names {
            let in_use = self.pool_in_use(&name).is_some();
            let record = self.pools.get_mut(&name).expect("listed");
            if in_use {
                record.idle_since = None;
                continue;
            }
            let since = *record.idle_since.get_or_insert(now);
            let ttl = std::time::Duration::from_millis(record.spec.idle_ttl_ms);
            if now.saturating_duration_since(since) >= ttl {
                let message = format!("deleted after {} unused", humantime::format_duration(ttl));
                tracing::info!(pool = %name, ?ttl, "pool idle past its TTL; deleting");
                self.metrics.events.record("pool", name.as_str(), message);
                let _ = self.delete_pool(&name);
                self.replan_needed = true;
            }
        }
    }

    /// Whether `requester` may delete `pool` now: `Ok(None)` if so; with `if_unused`,
    /// `Ok(Some(why))` when [`Core::pool_in_use`] finds a use (the pool is kept).
    pub(super) fn may_delete_pool(
        &self,
        pool: &PoolName,
        if_unused: bool,
        requester: &Principal,
    ) -> Result<Option<String>, SchedulerError> {
        let owner = &self.pool_record(pool)?.spec.owner;
        may_manage_pool(requester, pool.as_str(), owner)?;
        if if_unused && let Some(why) = self.pool_in_use(pool) {
            return Ok(Some(why));
        }
        Ok(None)
    }

    pub(super) fn delete_pool(&mut self, pool: &PoolName) -> Result<(), SchedulerError> {
        // Queued and backing-off tasks fail now; running ones finish on their draining
        // actors and their results still reach the client.
        let record = self.pools.get_mut(pool).ok_or_else(|| no_pool(pool))?;
        let mut queued: Vec<_> = record.queue.drain(..).collect();
        queued.extend(record.suspects.drain(..));
        let actors: Vec<ActorId> = record.actors.iter().cloned().collect();
        let record_actors = actors.clone();
        queued.extend(self.take_parked_on(pool));
        let waiting = self.tasks.iter().filter(|(_, t)| {
            &t.pool == pool && matches!(t.lifecycle.state(), TaskState::BackingOff { .. })
        });
        let waiting: Vec<_> = waiting.map(|(id, _)| *id).collect();
        for task in queued.into_iter().chain(waiting) {
            self.fail_task(task, format!("pool `{pool}` was deleted"));
        }
        self.metrics.forget_pool(pool.as_str());
        for actor in actors {
            if !matches!(
                self.actors[&actor].state,
                ActorState::Draining | ActorState::Dead
            ) {
                self.drain_actor(&actor);
            }
        }
        self.store.write(StoreOp::DeletePool(pool.clone()));
        self.pools.remove(pool);
        // Its draining actors are charged to no job now, nor to a pool of the same name
        // created before they stop.
        for id in &record_actors {
            if let Some(actor) = self.actors.get_mut(id) {
                actor.holding = Holding::default();
            }
        }
        self.actors
            .retain(|_, a| &a.pool != pool || a.state != ActorState::Dead);
        tracing::info!(pool = %pool, "pool deleted");
        Ok(())
    }

    pub(super) fn pool_record(&self, pool: &PoolName) -> Result<&PoolRecord, SchedulerError> {
        self.pools.get(pool).ok_or_else(|| no_pool(pool))
    }

    /// Places actors that need a node and starts the newly placed ones: at most a slice of
    /// [`MAX_PLACEMENTS_PER_TURN`] pending actors, in creation order, from where the burst
    /// of placement going on has got to (`more_to_place` says whether it goes on).
    pub(super) fn replan(&mut self) {
        self.more_to_place = false;
        if self.settling(Instant::now()) {
            self.replan_needed = true;
            return;
        }
        // Placed actors hold their places and never move here; only pending ones are placed,
        // a slice at a time, so the cost follows what is to be placed, not the size of what
        // runs. With none pending there is nothing to solve: a node joining a settled fleet
        // costs nothing here.
        let (slice, reached_end) = self.next_placement_slice();
        if reached_end {
            self.placement_cursor = None;
            if std::mem::take(&mut self.pending_behind_cursor) {
                // Placed from the start again, after this slice.
                self.more_to_place = true;
            }
        } else {
            self.placement_cursor = slice.last().map(|(id, demand)| (demand.order, id.clone()));
            self.more_to_place = true;
        }
        if slice.is_empty() {
            return;
        }
        let mut occupancy = match self.occupancy.take() {
            Some((version, kept)) if version == self.holdings_version() => kept,
            _ => placement::Occupancy::new(self.alive_node_capacities(), self.holdings()),
        };
        let in_order: Vec<(&ActorId, &ActorDemand)> =
            slice.iter().map(|(id, demand)| (id, demand)).collect();
        let plan = placement::place_pending_on(
            self.alive_node_capacities(),
            &mut occupancy,
            &in_order,
            MAX_PLACEMENTS_PER_TURN,
        );
        // Each start takes its place through `assign`, as the plan did in `occupancy`: if
        // nothing else moved meanwhile, the occupancy is still what the actors hold.
        let expected = self.holdings_version() + plan.assignments.len() as u64;
        for (id, assignment) in plan.assignments {
            self.start_actor(&id, assignment);
        }
        if self.holdings_version() == expected {
            self.occupancy = Some((expected, occupancy));
        }
        for (id, refusal) in plan.refusals {
            // Only pending actors are planned.
            let actor = self.actors.get_mut(&id).expect("planned actor exists");
            let reason = refusal.to_string();
            if actor.unplaced_reason != reason {
                self.metrics.events.record(
                    "pool",
                    actor.pool.as_str(),
                    format!("cannot place an actor: {reason}"),
                );
            }
            actor.unplaced_reason = reason;
        }
    }

    /// The next pending actors of saved pools after the placement cursor, at most a slice,
    /// with what each asks for; and whether that reached the last pending actor.
    fn next_placement_slice(&self) -> (Vec<PendingDemand>, bool) {
        let mut slice = Vec::new();
        for id in self.pending_after(self.placement_cursor.as_ref()) {
            if slice.len() == MAX_PLACEMENTS_PER_TURN {
                return (slice, false);
            }
            let actor = &self.actors[id];
            if self.pools.get(&actor.pool).is_some_and(|p| p.saved) {
                slice.push((
                    id.clone(),
                    ActorDemand {
                        pool: actor.pool.clone(),
                        request: actor.request.clone(),
                        order: actor.order,
                    },
                ));
            }
        }
        (slice, true)
    }

    /// What every placed actor holds. A draining actor of a deleted pool keeps its place
    /// until it stops; one on a node going away holds that node's resources until it
    /// leaves (no new actor goes there).
    pub(super) fn holdings(&self) -> impl Iterator<Item = placement::Holding<'_>> {
        self.actors.values().filter_map(|actor| {
            let assignment = actor.assignment.as_ref()?;
            actor.state.is_placed().then_some(placement::Holding {
                pool: &actor.pool,
                request: &actor.request,
                assignment,
            })
        })
    }

    fn start_actor(&mut self, id: &ActorId, assignment: placement::Assignment) {
        self.change_actor(id, ActorEvent::Placed);
        let actor = self.actors.get_mut(id).expect("exists");
        actor.incarnation += 1;
        actor.loads_before_this_start = actor.model_loads;
        actor.reported_work = Default::default();
        actor.unplaced_reason.clear();
        actor.crash = None;
        actor.restart_spent_on_host = false;
        actor.started_at = Some(Instant::now());
        actor.last_reported = None;
        let pool = actor.pool.clone();
        self.assign(id, assignment.clone());
        self.record_placement(id, pool, assignment.node.clone());
        let actor = &self.actors[id];
        let pool = &self.pools[&actor.pool];
        let message = pb::StartActor {
            actor_id: id.to_string(),
            incarnation: actor.incarnation,
            pool: actor.pool.to_string(),
            kind: pool.spec.actor_kind.clone(),
            config: pool.spec.actor_config.clone(),
            gpu_indices: assignment.gpus.clone(),
            gpu_fraction: assignment.share_per_gpu.as_gpus(),
            vram_bytes: pool.request.vram_per_gpu.0,
            max_in_flight: pool.in_flight_per_actor,
        };
        tracing::info!(actor_id = %id, node_id = %assignment.node, gpus = ?assignment.gpus, "starting actor");
        self.nodes[&assignment.node].send(pb::scheduler_message::Body::StartActor(message));
    }

    /// Applies one lifecycle event; every actor state change goes through here.
    pub(super) fn change_actor(&mut self, id: &ActorId, event: ActorEvent) {
        let actor = self.actors.get_mut(id).expect("actor exists");
        match transition(actor.state, event, &mut actor.restarts) {
            Ok(to) => {
                tracing::debug!(actor_id = %id, from = ?actor.state, to = ?to, ?event, "actor transition");
                actor.state = to;
                let order = actor.order;
                if to == ActorState::Pending {
                    self.index_pending(order, id.clone());
                } else {
                    self.unindex_pending(order, id);
                }
                if !to.is_placed()
                    && let Some(left) = self.release_assignment(id)
                {
                    let pool = self.actors[id].pool.as_str();
                    self.metrics
                        .forget_actor(pool, id.as_str(), left.node.as_str());
                }
                if to == ActorState::Dead {
                    // Never started again: no node may hand it back after a restart.
                    self.forget_placement(id);
                }
                self.refresh_dispatchable(id);
            }
            Err(invalid) => tracing::warn!(actor_id = %id, %invalid, "ignored actor event"),
        }
    }

    /// The actor stopped working (failure or lost node): its running tasks go back to the queue.
    pub(super) fn lose_actor(&mut self, id: &ActorId, event: ActorEvent, why: &str) {
        self.lose_actor_blaming(id, event, why, TaskBlame::None);
    }

    /// [`Self::lose_actor`], with its running tasks blamed as `blame` says (a host that
    /// died under them, `core/host_deaths.rs`); returns the tasks blamed.
    pub(super) fn lose_actor_blaming(
        &mut self,
        id: &ActorId,
        event: ActorEvent,
        why: &str,
        blame: TaskBlame,
    ) -> Vec<TaskId> {
        let actor = self.actors.get_mut(id).expect("actor exists");
        actor.error = why.to_owned();
        self.metrics.events.record(
            "actor",
            actor.pool.as_str(),
            format!("actor {id} lost: {why}"),
        );
        let had_inherited = std::mem::take(&mut actor.inherited_in_flight) > 0;
        let running: Vec<_> = std::mem::take(&mut actor.in_flight).into_iter().collect();
        let (mut blamed, lost): (Vec<TaskId>, Vec<TaskId>) =
            running.into_iter().partition(|task| {
                let is_running = matches!(self.task_state(*task), Some(TaskState::Running { .. }));
                is_running && blame.covers(*task)
            });
        for task in &blamed {
            self.quarantine_or_fail(id, *task, why.to_owned());
        }
        let actor = self.actors.get_mut(id).expect("actor exists");
        actor.restart_spent_on_host = event == ActorEvent::HostDied;
        let event = match actor.crash.take() {
            Some(Crash::OnPoison) if matches!(event, ActorEvent::Failed | ActorEvent::HostDied) => {
                actor.restart_spent_on_host = false;
                ActorEvent::CrashedOnPoison
            }
            _ => event,
        };
        self.set_quarantine(id, None);
        self.change_actor(id, event);
        for task in lost {
            self.requeue_lost_task(task, why);
        }
        if had_inherited {
            self.release_inherited_runs(id);
        }
        if self.actors[id].state == ActorState::Dead {
            tracing::warn!(actor_id = %id, reason = why, "actor dead");
            let pool = self.actors[id].pool.clone();
            self.fail_pool_if_every_actor_died(&pool);
        }
        blamed.retain(|task| self.tasks.contains_key(task));
        blamed
    }

    /// Why the pool can run nothing: every one of its actors died for good (out of
    /// restarts: its model cannot load, or its actors kept taking their hosts down).
    pub(super) fn every_actor_died(&self, pool: &PoolName) -> Option<String> {
        let record = self.pools.get(pool)?;
        let mut actors = record.actors.iter().map(|id| &self.actors[id]);
        if record.actors.is_empty() || actors.any(|a| a.state != ActorState::Dead) {
            return None;
        }
        let last_error = record
            .actors
            .iter()
            .map(|id| self.actors[id].error.as_str())
            .find(|e| !e.is_empty())
            .unwrap_or("no error reported");
        Some(format!("every actor of pool `{pool}` failed: {last_error}"))
    }

    /// Fails the tasks waiting for a pool whose every actor died, rather than leaving them
    /// queued for actors that will never come (and ready to take down the next host).
    fn fail_pool_if_every_actor_died(&mut self, pool: &PoolName) {
        let Some(why) = self.every_actor_died(pool) else {
            return;
        };
        let record = self.pools.get_mut(pool).expect("checked");
        let mut waiting: Vec<TaskId> = record.queue.drain(..).collect();
        waiting.extend(record.suspects.drain(..));
        waiting.extend(self.take_parked_on(pool));
        waiting.extend(self.tasks.iter().filter_map(|(id, t)| {
            (&t.pool == pool && matches!(t.lifecycle.state(), TaskState::BackingOff { .. }))
                .then_some(*id)
        }));
        if waiting.is_empty() {
            return;
        }
        tracing::warn!(pool = %pool, tasks = waiting.len(), reason = %why, "failing the tasks of a pool with no actor left");
        self.metrics
            .events
            .record("pool", pool.as_str(), why.clone());
        for task in waiting {
            self.fail_task(task, why.clone());
        }
    }

    /// Stops sending tasks to the actor; it stops once its in-flight tasks finish.
    pub(super) fn drain_actor(&mut self, id: &ActorId) {
        self.change_actor(id, ActorEvent::Drain);
        if self.actors[id].in_flight.is_empty() {
            self.finish_drain(id);
        }
    }

    pub(super) fn finish_drain(&mut self, id: &ActorId) {
        let actor = &self.actors[id];
        if actor.state != ActorState::Draining {
            return;
        }
        if let Some(node) = actor
            .assignment
            .as_ref()
            .and_then(|a| self.nodes.get(&a.node))
        {
            node.send(pb::scheduler_message::Body::StopActor(pb::StopActor {
                actor_id: id.to_string(),
                incarnation: actor.incarnation,
            }));
        }
        self.change_actor(id, ActorEvent::Drained);
        let pool = self.actors[id].pool.clone();
        if !self.pools.contains_key(&pool) {
            self.actors.remove(id);
            // Tasks that finished on it after the deletion counted again under the pool.
            self.metrics.forget_pool(pool.as_str());
        }
        self.replan_needed = true;
    }
}

pub(super) fn no_pool(pool: &PoolName) -> SchedulerError {
    SchedulerError::NotFound(format!("no pool named `{pool}`"))
}

#[cfg(test)]
mod kind_refusal_tests {
    use super::kind_not_offered;

    #[test]
    fn a_kind_no_agent_has_is_refused_naming_it_and_the_versions_agents_do_have() {
        let kinds = ["echo", "embed", "minhash@1", "minhash@3"].map(str::to_owned);
        let offered = kinds.iter().collect();
        let message = kind_not_offered("minhash@2", &offered);
        assert!(
            message.starts_with(
                "no alive agent offers actor kind `minhash@2`; agents offer other versions of \
                 it: minhash@1, minhash@3 ("
            ),
            "{message}"
        );
        let message = kind_not_offered("llama-magic", &offered);
        assert!(!message.contains("other versions"), "{message}");
        assert!(
            message.contains("alive agents offer: echo, embed, minhash@1, minhash@3"),
            "{message}"
        );
    }
}
