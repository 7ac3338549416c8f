//! What running jobs cost: every tick, each running job is charged for the GPUs (or CPU
//! cores) its pool's placed actors hold, at the price table's rate for the GPU model or the
//! node's `pool` label. Two jobs on one pool are each charged the pool's whole holding: a
//! pool's actors are resident for whichever job uses them.

use std::time::Duration;

use resident_proto::PoolName;
use resident_proto::prices::PriceTable;
use tokio::time::Instant;

use super::Core;
use super::records::{ActorRecord, NodeRecord};

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
            for id in &record.actors {
                let actor = &self.actors[id];
                let node = actor
                    .assignment
                    .as_ref()
                    .and_then(|a| self.nodes.get(&a.node));
                let (gpus, usd_per_hour) = actor_rate(actor, node, &self.prices);
                job.status.gpu_seconds += gpus * seconds;
                job.status.cost_usd += usd_per_hour * seconds / 3600.0;
            }
        }
    }
}
