//! A pool's dispatch index (invariant 5 of `model.rs`): its actors that take tasks now, by
//! free credit. A leaf, so that `records.rs` can hold one per pool; it is written only
//! through `Core::refresh_dispatchable` (`model/indices.rs`).

use std::cmp::Reverse;
use std::collections::BTreeSet;

use resident_proto::ActorId;

use super::table::FastMap;

/// A pool's actors that take tasks now (ready, on a node that is not draining, with credit
/// left), freest first (then the largest id): dispatch reads the first instead of scanning
/// the pool. Written only by `Core::refresh_dispatchable`.
#[derive(Debug, Default)]
pub(super) struct DispatchIndex {
    by_credit: BTreeSet<(Reverse<u32>, Reverse<ActorId>)>,
    /// Each indexed actor's free credit, as `by_credit` holds it.
    credit: FastMap<ActorId, u32>,
}

impl DispatchIndex {
    /// The actor with the most free credit (the largest id among equals).
    pub(super) fn freest(&self) -> Option<&ActorId> {
        self.by_credit.first().map(|(_, Reverse(id))| id)
    }

    /// Every indexed actor with its free credit, freest first.
    #[cfg(test)]
    pub(super) fn entries(&self) -> &BTreeSet<(Reverse<u32>, Reverse<ActorId>)> {
        &self.by_credit
    }

    /// Indexes the actor at `now` free credit, or takes it out (`None`). Only
    /// `Core::refresh_dispatchable` (`model/indices.rs`) calls it.
    pub(super) fn set_credit(&mut self, id: &ActorId, now: Option<u32>) {
        let was = self.credit.get(id).copied();
        if was == now {
            return;
        }
        if let Some(was) = was {
            self.by_credit.remove(&(Reverse(was), Reverse(id.clone())));
            self.credit.remove(id);
        }
        if let Some(now) = now {
            self.by_credit.insert((Reverse(now), Reverse(id.clone())));
            self.credit.insert(id.clone(), now);
        }
    }
}
