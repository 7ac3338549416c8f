//! What a job's pool held while it ran, and what that cost: two readings of the pool's usage
//! (`PoolStatus.usage`, counted by the scheduler as each actor takes and leaves its place),
//! their difference, priced. `report.json` (corpus jobs) and `summary.json` (sweeps) bill
//! from it.

use resident_proto::prices::PriceTable;
use resident_sdk::{Cluster, HeldUsage, PoolStatus, SdkError};

/// What pool `pool` has held so far: nothing when there is none yet (a job reads this before
/// it creates its pool, so that a pool kept from an earlier run counts from this run on).
pub async fn read_pool_usage(cluster: &Cluster, pool: &str) -> Result<UsageReading, SdkError> {
    match cluster.pool(pool).status().await {
        Ok(status) => Ok(UsageReading::of(&status)),
        Err(SdkError::NotFound(_)) => Ok(UsageReading::default()),
        Err(error) => Err(error),
    }
}

/// What a pool's actors held over a run, in hours, and its price.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PricedUsage {
    /// GPU-hours (each actor's GPU fraction times its GPUs).
    pub gpu_hours: f64,
    /// CPU core-hours of CPU actors.
    pub cpu_hours: f64,
    /// Both at the prices.
    pub cost_usd: f64,
}

impl PricedUsage {
    /// `held` (GPU- and core-seconds by price class) at `prices`: a GPU class by its node's
    /// `pool` label or the GPU's name, CPU cores at the core price.
    pub fn of(held: &[HeldUsage], prices: &PriceTable) -> Self {
        let mut usage = PricedUsage::default();
        for class in held {
            let label = Some(&class.node_pool_label).filter(|l| !l.is_empty());
            let gpu_hours = class.gpu_seconds / 3600.0;
            let cpu_hours = class.cpu_core_seconds / 3600.0;
            usage.gpu_hours += gpu_hours;
            usage.cpu_hours += cpu_hours;
            usage.cost_usd += gpu_hours * prices.gpu_hour(label, &class.gpu_name)
                + cpu_hours * prices.per_cpu_core;
        }
        usage
    }
}

/// One reading of a pool's usage: what its actors have held, and since when it was counted.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct UsageReading {
    /// When the counting began (the pool's creation), Unix ms; 0 when there was no pool yet
    /// or the scheduler does not say.
    pub since_unix_ms: u64,
    /// GPU- and core-seconds by price class.
    pub held: Vec<HeldUsage>,
}

impl UsageReading {
    /// The reading a pool's status carries.
    pub fn of(status: &PoolStatus) -> Self {
        Self {
            since_unix_ms: status.usage_since_unix_ms,
            held: status.usage.clone(),
        }
    }
}

/// What a pool's actors held between two readings of its usage: `after` less `before`,
/// class by class. Counted from the same start, a class that went down lost its last
/// unsaved seconds to a scheduler's kill -9 and held nothing more since: none. Counted from
/// another start (the pool was made anew between the readings), or from a scheduler that
/// does not say and started from zero on a restart, a class that went down counts from
/// zero: what `after` says.
pub fn held_between(before: &UsageReading, after: &UsageReading) -> Vec<HeldUsage> {
    let same_count = after.since_unix_ms != 0 && before.since_unix_ms == after.since_unix_ms;
    let less = |now: f64, earlier: f64| (now - earlier).max(0.0);
    after
        .held
        .iter()
        .map(|now| {
            let earlier = before
                .held
                .iter()
                .find(|b| b.gpu_name == now.gpu_name && b.node_pool_label == now.node_pool_label);
            match earlier {
                Some(b)
                    if same_count
                        || (b.gpu_seconds <= now.gpu_seconds
                            && b.cpu_core_seconds <= now.cpu_core_seconds) =>
                {
                    HeldUsage {
                        gpu_seconds: less(now.gpu_seconds, b.gpu_seconds),
                        cpu_core_seconds: less(now.cpu_core_seconds, b.cpu_core_seconds),
                        ..now.clone()
                    }
                }
                _ => now.clone(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(gpu: &str, label: &str, gpu_seconds: f64, cpu_core_seconds: f64) -> HeldUsage {
        HeldUsage {
            gpu_name: gpu.into(),
            node_pool_label: label.into(),
            gpu_seconds,
            cpu_core_seconds,
        }
    }

    fn reading(since_unix_ms: u64, held: &[HeldUsage]) -> UsageReading {
        UsageReading {
            since_unix_ms,
            held: held.to_vec(),
        }
    }

    /// A kept pool counts from this run's start; one made anew (or an older scheduler's
    /// after a restart) from zero.
    #[test]
    fn a_run_is_billed_what_the_pool_held_since_it_began() {
        let before = [
            held("NVIDIA A10G", "", 7200.0, 0.0),
            held("", "", 0.0, 100.0),
        ];
        let after = [
            held("NVIDIA A10G", "", 9000.0, 0.0),
            held("", "", 0.0, 40.0),
            held("Tesla T4", "spot", 360.0, 0.0),
        ];
        let billed = [
            held("NVIDIA A10G", "", 1800.0, 0.0),
            held("", "", 0.0, 40.0),
            held("Tesla T4", "spot", 360.0, 0.0),
        ];
        // Made anew between the readings; a scheduler that does not say when it began.
        assert_eq!(
            held_between(&reading(5, &before), &reading(6, &after)),
            billed
        );
        assert_eq!(
            held_between(&reading(0, &before), &reading(0, &after)),
            billed
        );
        // No pool before the run.
        assert_eq!(
            held_between(&UsageReading::default(), &reading(6, &after)),
            after
        );
    }

    /// Counted from the same start, a class that went down (a scheduler's kill -9 lost its
    /// last unsaved seconds, and the pool held no more of it since) bills nothing, not
    /// the pool's whole history.
    #[test]
    fn a_class_that_lost_unsaved_seconds_to_a_restart_bills_none() {
        let before = [
            held("NVIDIA A10G", "", 7200.0, 0.0),
            held("", "", 0.0, 100.0),
        ];
        let after = [
            held("NVIDIA A10G", "", 7195.0, 0.0),
            held("", "", 0.0, 130.0),
        ];
        assert_eq!(
            held_between(&reading(5, &before), &reading(5, &after)),
            [held("NVIDIA A10G", "", 0.0, 0.0), held("", "", 0.0, 30.0)]
        );
    }

    /// Each class at its price: the node's `pool` label first, then the GPU's model, CPU
    /// cores at the core price.
    #[test]
    fn each_class_is_priced_by_its_label_or_its_gpu() {
        let mut prices = PriceTable::default();
        prices.per_pool_label.insert("spot".into(), 0.2);
        let a10g = prices.gpu_hour(None, "NVIDIA A10G");
        let usage = PricedUsage::of(
            &[
                held("NVIDIA A10G", "", 1800.0, 0.0),
                held("Tesla T4", "spot", 3600.0, 0.0),
                held("", "", 0.0, 7200.0),
            ],
            &prices,
        );
        assert!((usage.gpu_hours - 1.5).abs() < 1e-12, "{usage:?}");
        assert!((usage.cpu_hours - 2.0).abs() < 1e-12, "{usage:?}");
        let cost = 0.5 * a10g + 0.2 + 2.0 * prices.per_cpu_core;
        assert!((usage.cost_usd - cost).abs() < 1e-12, "{usage:?} vs {cost}");
    }
}
