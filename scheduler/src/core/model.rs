//! The scheduler core's state: every record ([`Core`]'s tables of nodes, pools, actors,
//! tasks and jobs) and the indices kept beside them so that a command reads what it
//! touches, not the whole fleet. The controllers (`pools.rs`, `nodes.rs`, `jobs.rs`,
//! `tasks.rs`, ...) are `impl Core` blocks over this state; `mod.rs` runs the loop that
//! dispatches commands to them.
//!
//! # Invariants
//! After every command (checked by [`Core::assert_dispatchable_index`] after each command of
//! every core unit test, `core/tests/`, whose message names the invariant that broke):
//! 1. `hosted[node]` is exactly the actors whose `assignment` is on `node`.
//! 2. `pending` is exactly the actors in state `Pending`, keyed by (creation order, id).
//! 3. `occupancy`, while its version is `holdings_version`, is what a rebuild from the alive
//!    nodes and the placed actors gives.
//! 4. `alive_capacities`, once built, is what the alive, non-draining nodes offer now.
//! 5. Each pool's `dispatchable` is exactly its `Ready` actors that are not quarantined,
//!    crashed or on a draining node and have free credit, by (free credit, id), largest
//!    first.
//! 6. Each pool's usage `held` (GPUs and cores by price class) is what its actors'
//!    assignments hold.
//!
//! Also kept, not checked by that assertion: `placed` mirrors the store's placements
//! (an actor may be handed back only by the node it was started on), and `sessions`
//! maps each live agent session to its node.
//!
//! `hosted`, `pending`, `placed` and `holdings_version` are private to this file: only the
//! upkeep methods of `model/indices.rs` (`assign`, `release_assignment`, `index_pending`,
//! `record_placement`, `refresh_dispatchable`, ...) write them, and the controllers read
//! them through its accessors. Each pool's dispatch index (`dispatch_index.rs`) is written
//! only by `refresh_dispatchable`.

mod indices;

use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::sync::Arc;

use resident_proto::{ActorId, JobId, NodeId, PoolName, TaskId};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::config::CoreConfig;
use super::records::{ActorRecord, JobRecord, NodeRecord, PoolRecord, SessionId, TaskRecord};
use super::table;
use crate::budget::{BufferBudget, JobBuffer};
use crate::error::SchedulerError;
use crate::metrics::SchedulerMetrics;
use crate::store::{StoreWriter, WriteOutcome};

/// The answer to a command, once it is known.
pub(super) type Reply<T> = oneshot::Sender<Result<T, SchedulerError>>;

/// The scheduler's state, owned by the loop's thread.
pub(crate) struct Core {
    pub(super) config: CoreConfig,
    pub(super) store: StoreWriter,
    pub(super) nodes: table::Table<NodeId, NodeRecord>,
    pub(super) sessions: table::FastMap<SessionId, NodeId>,
    pub(super) next_session: u64,
    pub(super) pools: BTreeMap<PoolName, PoolRecord>,
    pub(super) actors: table::Table<ActorId, ActorRecord>,
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
    pub(super) placement_cursor: Option<(u64, ActorId)>,
    /// An actor became pending behind the cursor during a burst: once the burst reaches the
    /// end, another starts from the first pending actor.
    pub(super) pending_behind_cursor: bool,
    /// What placed actors take of the alive nodes, kept from one placement slice to the
    /// next while `holdings_version` stays the one it was built or last updated at (and
    /// dropped when the alive nodes change), so that a slice does not walk every actor.
    pub(super) occupancy: Option<(u64, crate::placement::Occupancy)>,
    /// Moves whenever an actor takes or leaves a place (`Core::assign`,
    /// `Core::release_assignment`).
    holdings_version: u64,
    /// What alive, non-draining nodes offer placement, built when placement first needs it
    /// and dropped whenever a node joins, dies, drains or its capacity moves
    /// ([`Core::node_capacities_changed`]): placing in slices then copies no node's
    /// capacity per slice.
    pub(super) alive_capacities:
        std::cell::OnceCell<BTreeMap<NodeId, crate::placement::NodeCapacity>>,
    pub(super) next_actor_order: u64,
    pub(super) tasks: table::FastMap<TaskId, TaskRecord>,
    pub(super) next_task: u64,
    /// Failed tasks waiting out their backoff, earliest first.
    pub(super) retries: BinaryHeap<std::cmp::Reverse<(Instant, TaskId)>>,
    pub(super) jobs: table::FastMap<JobId, JobRecord>,
    /// Finished jobs, oldest first, bounded by `finished_job_history`.
    pub(super) finished_jobs: VecDeque<JobId>,
    /// Set when nodes or actors changed; placement runs once after the current batch.
    pub(super) replan_needed: bool,
    /// The last placement stopped at its per-turn limit: the loop places more as soon as
    /// it has served what is queued.
    pub(super) more_to_place: bool,
    /// After a restart: placement waits for these nodes until then.
    pub(super) settle: Option<Settle>,
    /// When running jobs' counters were last written to the store.
    pub(super) last_job_flush: Instant,
    /// When running jobs were last charged for the GPUs their pools hold.
    pub(super) last_job_charge: Instant,
    /// When the pools' usage was last written to the store.
    pub(super) last_usage_save: Instant,
    /// When placed actors were last compared with what their nodes report.
    pub(super) last_reconcile: Instant,
    /// When running tasks were last checked against their deadlines.
    pub(super) last_deadline_check: Instant,
    /// Charges outcomes held for detached or restarted clients to the scheduler-wide byte
    /// budget (the handle's; a budget of its own from the config in unit tests).
    pub(super) held_outcomes: Arc<JobBuffer>,
    /// Where follow-ups (of store writes, of a job's buffer having room) come back to the
    /// loop (`core/acknowledged.rs`).
    pub(super) follow_ups: mpsc::UnboundedSender<FollowUp>,
    /// Taken by the loop (or a unit test) that runs the follow-ups.
    pub(super) follow_ups_rx: Option<FollowUpRx>,
    pub(super) metrics: SchedulerMetrics,
    pub(super) prices: resident_proto::prices::PriceTable,
}

/// What to do on the core once a write committed or failed.
type AfterWriteFn = Box<dyn FnOnce(&mut Core, WriteOutcome) + Send>;

/// Work handed back to the core from elsewhere (the store's writer thread, a task waiting
/// for a job's buffer to have room): the loop runs it like a command.
pub(super) enum FollowUp {
    /// The writes queued before it committed (or failed).
    AfterWrite {
        written: WriteOutcome,
        then: AfterWriteFn,
    },
    /// The job's result buffer has room again: its parked tasks may run.
    ResultsRoom(JobId),
}

impl FollowUp {
    pub fn run(self, core: &mut Core) {
        match self {
            FollowUp::AfterWrite { written, then } => then(core, written),
            FollowUp::ResultsRoom(job) => core.unpark_tasks(&job),
        }
    }
}

pub(super) type FollowUpRx = tokio::sync::mpsc::UnboundedReceiver<FollowUp>;

/// The settle window after a restart: the nodes that were alive before, still awaited.
#[derive(Debug)]
pub(super) struct Settle {
    pub(super) until: Instant,
    pub(super) awaited: std::collections::BTreeSet<NodeId>,
}

/// Task ids start from the boot time in milliseconds, shifted left by 20 bits, so ids of
/// one scheduler run never repeat those of an earlier run (whose outcomes agents may still
/// deliver after a restart) unless that run handed out a million tasks per millisecond.
fn first_task_id() -> u64 {
    (resident_proto::unix_ms_now() << 20).max(1)
}

impl Core {
    pub(super) fn new(config: CoreConfig, store: StoreWriter, metrics: SchedulerMetrics) -> Self {
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
            last_usage_save: Instant::now(),
            last_reconcile: Instant::now(),
            last_deadline_check: Instant::now(),
            held_outcomes,
            follow_ups,
            follow_ups_rx: Some(follow_ups_rx),
            metrics,
            prices: Default::default(),
        }
    }

    /// The core's unit tests check after every command that every kept index (`hosted`,
    /// `pending`, the capacity copy, each pool's `dispatchable` and `held`) is what a full
    /// scan gives. The scan's reads are not counted against the command
    /// (`core/tests/fleet_cost.rs`).
    #[cfg(test)]
    pub(super) fn assert_dispatchable_index(&self) {
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
        assert_eq!(indexed, scanned, "invariant 1: the hosted index");
        let pending: std::collections::BTreeSet<(u64, ActorId)> = self
            .actors
            .iter()
            .filter(|(_, a)| a.state == crate::state::ActorState::Pending)
            .map(|(id, a)| (a.order, id.clone()))
            .collect();
        assert_eq!(self.pending, pending, "invariant 2: the pending index");
        if let Some((version, kept)) = &self.occupancy
            && *version == self.holdings_version
        {
            let built =
                crate::placement::Occupancy::new(self.alive_node_capacities(), self.holdings());
            assert_eq!(
                kept, &built,
                "invariant 3: the occupancy kept between placement slices"
            );
        }
        if let Some(cached) = self.alive_capacities.get() {
            assert_eq!(
                cached,
                &self.alive_node_capacities_now(),
                "invariant 4: the capacity cache"
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
            assert_eq!(
                pool.dispatchable.entries(),
                &scanned,
                "invariant 5: pool {name}'s dispatchable actors"
            );
            let by_class = self.held_by_pool_now(name);
            let kept = &pool.usage.held;
            assert!(
                kept.len() == by_class.len()
                    && kept.iter().zip(&by_class).all(|((a, x), (b, y))| a == b
                        && (x.gpus - y.gpus).abs() < 1e-6
                        && (x.cpu_cores - y.cpu_cores).abs() < 1e-6),
                "invariant 6: pool {name}'s usage holds {kept:?}, counted {by_class:?}"
            );
        }
    }
}
