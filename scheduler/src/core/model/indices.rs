//! Upkeep of the indices [`Core`] keeps beside its records: the only code that writes
//! `hosted` (invariant 1 of `model.rs`), `pending` (invariant 2), `holdings_version`
//! (invariant 3's clock), each pool's dispatch index (invariant 5) and the `placed` mirror.
//! Those fields are private to `model.rs` and this child module, so the compiler holds every
//! controller to the methods here; a controller reads them through the accessors below.

use std::ops::Bound;

use resident_proto::{ActorId, NodeId, PoolName};

use super::Core;
use crate::placement::Assignment;
use crate::state::ActorState;
use crate::store::StoreOp;

impl Core {
    /// Gives a placed actor its node and GPUs (taken back by [`Self::release_assignment`]
    /// once it is no longer placed).
    pub(in crate::core) fn assign(&mut self, id: &ActorId, assignment: Assignment) {
        let actor = self.actors.get_mut(id).expect("actor exists");
        if let Some(before) = actor.assignment.take() {
            self.unhost(id, &before.node);
        }
        self.holdings_version += 1;
        self.hosted
            .entry(assignment.node.clone())
            .or_default()
            .insert(id.clone());
        self.actors.get_mut(id).expect("actor exists").assignment = Some(assignment);
        self.start_charging(id);
    }

    /// Takes the actor's assignment away (it left its place), if it had one.
    pub(in crate::core) fn release_assignment(&mut self, id: &ActorId) -> Option<Assignment> {
        let left = self.actors.get_mut(id)?.assignment.take()?;
        self.unhost(id, &left.node);
        Some(left)
    }

    fn unhost(&mut self, id: &ActorId, node: &NodeId) {
        self.holdings_version += 1;
        self.stop_charging(id);
        if let Some(here) = self.hosted.get_mut(node) {
            here.remove(id);
            if here.is_empty() {
                self.hosted.remove(node);
            }
        }
    }

    /// The actors with an assignment on `node`.
    pub(in crate::core) fn hosted_on(&self, node: &NodeId) -> Vec<ActorId> {
        self.hosted_here(node).cloned().collect()
    }

    /// The actors with an assignment on `node`, borrowed.
    pub(in crate::core) fn hosted_here(&self, node: &NodeId) -> impl Iterator<Item = &ActorId> {
        self.hosted.get(node).into_iter().flatten()
    }

    /// Moves whenever an actor takes or leaves a place: the occupancy kept between
    /// placement slices is current while this stays what it was built at.
    pub(in crate::core) fn holdings_version(&self) -> u64 {
        self.holdings_version
    }

    /// Puts an actor in the pending index; one that lands behind the cursor of a burst of
    /// placement going on is placed by a burst from the start once this one is done.
    pub(in crate::core) fn index_pending(&mut self, order: u64, id: ActorId) {
        let key = (order, id);
        if self
            .placement_cursor
            .as_ref()
            .is_some_and(|cursor| key <= *cursor)
        {
            self.pending_behind_cursor = true;
        }
        self.pending.insert(key);
    }

    /// Takes an actor out of the pending index; whether it was there.
    pub(in crate::core) fn unindex_pending(&mut self, order: u64, id: &ActorId) -> bool {
        self.pending.remove(&(order, id.clone()))
    }

    /// The pending actors after `cursor` (all of them for `None`), in placement order.
    pub(in crate::core) fn pending_after(
        &self,
        cursor: Option<&(u64, ActorId)>,
    ) -> impl Iterator<Item = &ActorId> {
        let after = cursor.map_or(Bound::Unbounded, |cursor| Bound::Excluded(cursor.clone()));
        self.pending
            .range((after, Bound::Unbounded))
            .map(|(_, id)| id)
    }

    /// How many actors wait for a place.
    #[cfg(test)]
    pub(in crate::core) fn pending_count(&self) -> usize {
        self.pending.len()
    }

    /// Where the actor was last started, for which pool.
    pub(in crate::core) fn placement_of(&self, id: &ActorId) -> Option<&(PoolName, NodeId)> {
        self.placed.get(id)
    }

    /// Remembers (and saves) where the actor is being started.
    pub(in crate::core) fn record_placement(&mut self, id: &ActorId, pool: PoolName, node: NodeId) {
        self.store.write(StoreOp::PutPlacement {
            actor: id.clone(),
            pool: pool.clone(),
            node: node.clone(),
        });
        self.placed.insert(id.clone(), (pool, node));
    }

    /// Takes back a placement the store already holds (a restart's restore).
    pub(in crate::core) fn restore_placement(&mut self, id: ActorId, pool: PoolName, node: NodeId) {
        self.placed.insert(id, (pool, node));
    }

    /// Forgets (and deletes from the store) where a dead actor was started: no node may hand
    /// it back after a restart.
    pub(in crate::core) fn forget_placement(&mut self, id: &ActorId) {
        if self.placed.remove(id).is_some() {
            self.store.write(StoreOp::DeletePlacement(id.clone()));
        }
    }

    /// The ready actor of the pool with the most free credit (the largest id among equals).
    pub(in crate::core) fn freest_actor(&self, pool_name: &PoolName) -> Option<ActorId> {
        self.pools.get(pool_name)?.dispatchable.freest().cloned()
    }

    /// Puts the actor in its pool's dispatch index, at its free credit, or takes it out.
    /// Called after every change to what decides it: the actor's state (in
    /// `change_actor`), its tasks in flight, inherited tasks, and its node draining.
    pub(in crate::core) fn refresh_dispatchable(&mut self, id: &ActorId) {
        let Some(actor) = self.actors.get(id) else {
            return;
        };
        let takes_tasks = actor.state == ActorState::Ready
            && actor.quarantine.is_none()
            && actor.crash.is_none()
            && !self.on_draining_node(actor.assignment.as_ref());
        let busy = actor.in_flight.len() + actor.inherited_in_flight as usize;
        let Some(pool) = self.pools.get_mut(&actor.pool) else {
            return;
        };
        let free = (pool.in_flight_per_actor as usize).saturating_sub(busy) as u32;
        pool.dispatchable
            .set_credit(id, (takes_tasks && free > 0).then_some(free));
    }
}
