//! What running jobs cost: every tick, each running job is charged for the GPUs (or CPU
//! cores) its pool's placed actors hold, at the price table's rate for the GPU model or the
//! node's `pool` label. Two jobs on one pool are each charged the pool's whole holding: a
//! pool's actors are resident for whichever job uses them.

use std::time::Duration;

use resident_proto::prices::PriceTable;
use resident_proto::{ActorId, PoolName};
use tokio::time::Instant;

use super::Core;
use super::records::{ActorRecord, HeldRate, NodeRecord};

/// GPUs held (the fraction times the GPU count) and USD per hour, for one placed actor.
fn actor_rate(actor: &ActorRecord, node: Option<&NodeRecord>, prices: &PriceTable) -> (f64, f64) {
    let Some(assignment) = actor
        .assignment
        .as_ref()
        .filter(|_| actor.state.is_placed())
    else {
        return (0.0, 0.0);
    };
    if assignment.gpus.is_empty() {
        let cores = actor.request.cpu_millicores.max(1000) as f64 / 1000.0;
        return (0.0, cores * prices.per_cpu_core);
    }
    let held = assignment.share_per_gpu.as_gpus() * assignment.gpus.len() as f64;
    let name = node
        .and_then(|n| n.gpus.iter().find(|g| g.index == assignment.gpus[0]))
        .map_or("", |g| g.name.as_str());
    let price = prices.gpu_hour(node.and_then(|n| n.labels.get("pool")), name);
    (held, held * price)
}

impl Core {
    /// Actor `id` took its place: what it holds there is added to its pool's rate.
    pub(super) fn start_charging(&mut self, id: &ActorId) {
        let actor = &self.actors[id];
        let node = actor
            .assignment
            .as_ref()
            .and_then(|a| self.nodes.get(&a.node));
        let (gpus, usd_per_hour) = actor_rate(actor, node, &self.prices);
        let rate = HeldRate { gpus, usd_per_hour };
        let pool = actor.pool.clone();
        self.actors.get_mut(id).expect("actor exists").rate = rate;
        if let Some(record) = self.pools.get_mut(&pool) {
            record.held.gpus += rate.gpus;
            record.held.usd_per_hour += rate.usd_per_hour;
        }
    }

    /// Actor `id` left its place: its pool's rate no longer counts it.
    pub(super) fn stop_charging(&mut self, id: &ActorId) {
        let Some(actor) = self.actors.get_mut(id) else {
            return;
        };
        let rate = std::mem::take(&mut actor.rate);
        if let Some(record) = self.pools.get_mut(&actor.pool) {
            record.held.gpus = (record.held.gpus - rate.gpus).max(0.0);
            record.held.usd_per_hour = (record.held.usd_per_hour - rate.usd_per_hour).max(0.0);
        }
    }

    /// Charges each running job for what its pool's placed actors hold since the last
    /// charge: a read of the pool's rate per job, whatever the pool's size.
    pub(super) fn charge_running_jobs(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last_job_charge);
        self.last_job_charge = now;
        if elapsed.is_zero() || elapsed > Duration::from_secs(60) {
            // A stalled loop (or a suspended host) is not billed as if it held GPUs.
            return;
        }
        let seconds = elapsed.as_secs_f64();
        for job in self.jobs.values_mut().filter(|j| j.is_running()) {
            let pool = PoolName::new(job.status.pool.clone());
            let Some(record) = self.pools.get(&pool) else {
                continue;
            };
            job.status.gpu_seconds += record.held.gpus * seconds;
            job.status.cost_usd += record.held.usd_per_hour * seconds / 3600.0;
        }
    }

    /// What the pool's placed actors hold, added up afresh (the test-only check of
    /// [`PoolRecord::held`](super::records::PoolRecord::held)).
    #[cfg(test)]
    pub(super) fn held_by_pool_now(&self, pool: &PoolName) -> HeldRate {
        let mut held = HeldRate::default();
        for id in &self.pools[pool].actors {
            let actor = &self.actors.uncounted()[id];
            let node = actor
                .assignment
                .as_ref()
                .and_then(|a| self.nodes.uncounted().get(&a.node));
            let (gpus, usd_per_hour) = actor_rate(actor, node, &self.prices);
            held.gpus += gpus;
            held.usd_per_hour += usd_per_hour;
        }
        held
    }
}
