//! What an actor did, as its agent counts it.

use resident_proto::pb;

/// An actor's work counters as its agent reports them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ActorWork {
    pub busy_micros: u64,
    pub items: u64,
    pub tokens: u64,
}

impl ActorWork {
    pub fn of(report: &pb::ActorReport) -> Self {
        Self {
            busy_micros: report.busy_micros,
            items: report.items_done,
            tokens: report.tokens_done,
        }
    }

    /// What `later` adds to `self` (all of it when the counters went back: a restart).
    pub fn added_by(self, later: Self) -> Self {
        if later.busy_micros < self.busy_micros
            || later.items < self.items
            || later.tokens < self.tokens
        {
            return later;
        }
        Self {
            busy_micros: later.busy_micros - self.busy_micros,
            items: later.items - self.items,
            tokens: later.tokens - self.tokens,
        }
    }
}
