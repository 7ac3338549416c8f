//! What pools hold and running jobs cost. Each pool keeps what its placed actors hold now
//! and have held since, by price class (GPU model, node `pool` label: [`PoolUsage`]),
//! accrued at every change of what they hold rather than on the tick: an actor counts
//! exactly from taking its place until leaving it (its GPU failed, its node left).
//! `PoolStatus.usage` reads it; a corpus job bills the difference over its run at its own
//! prices. Every tick, each running job is charged for what its pool holds now, at the
//! scheduler's price table. Two jobs on one pool are each charged the pool's whole holding:
//! a pool's actors are resident for whichever job uses them.
//!
//! A pool's usage is written to the store every [`USAGE_SAVE_PERIOD`] while it changes
//! (what is held accrues) and at a clean stop, and a restarted scheduler takes it back: a
//! kill -9 forgets at most that period of holding, and the time the scheduler was down
//! (its agents' actors kept their GPUs meanwhile) is not counted.

use std::collections::BTreeMap;
use std::time::Duration;

use resident_proto::prices::PriceTable;
use resident_proto::{ActorId, PoolName, pb};
use tokio::time::Instant;

use super::Core;
use super::records::{ActorRecord, GpusAndCores, Holding, NodeRecord, PoolUsage, PriceClass};
use crate::store::{StoreOp, StoredUsage};

/// How often a pool's usage is written while its actors hold something: what a scheduler
/// killed without warning forgets. One small record per such pool each period.
pub(super) const USAGE_SAVE_PERIOD: Duration = Duration::from_secs(5);

/// What one placed actor holds and its price class (nothing when it is not placed).
fn actor_holding(actor: &ActorRecord, node: Option<&NodeRecord>) -> Holding {
    let Some(assignment) = actor
        .assignment
        .as_ref()
        .filter(|_| actor.state.is_placed())
    else {
        return Holding::default();
    };
    let pool_label = node
        .and_then(|n| n.labels.get("pool"))
        .cloned()
        .unwrap_or_default();
    if assignment.gpus.is_empty() {
        return Holding {
            class: PriceClass {
                gpu_name: String::new(),
                pool_label,
            },
            held: GpusAndCores {
                gpus: 0.0,
                cpu_cores: actor.request.cpu_millicores.max(1000) as f64 / 1000.0,
            },
        };
    }
    let gpu_name = node
        .and_then(|n| n.gpus.iter().find(|g| g.index == assignment.gpus[0]))
        .map_or("", |g| g.name.as_str());
    Holding {
        class: PriceClass {
            gpu_name: gpu_name.to_owned(),
            pool_label,
        },
        held: GpusAndCores {
            gpus: assignment.share_per_gpu.as_gpus() * assignment.gpus.len() as f64,
            cpu_cores: 0.0,
        },
    }
}

impl PoolUsage {
    /// Nothing held, nothing used, from `now` (a new pool: unsaved, so its start is written).
    pub fn since(now: Instant) -> Self {
        Self {
            held: BTreeMap::new(),
            seconds: BTreeMap::new(),
            accrued_at: now,
            since_unix_ms: resident_proto::unix_ms_now(),
            unsaved: true,
        }
    }

    /// What an earlier scheduler process saved, taken back at `now`: nothing is held until
    /// the pool's actors are adopted or placed again.
    pub fn restored(saved: StoredUsage, now: Instant) -> Self {
        let seconds = saved
            .classes
            .into_iter()
            .map(|class| {
                let key = PriceClass {
                    gpu_name: class.gpu_name,
                    pool_label: class.node_pool_label,
                };
                let used = GpusAndCores {
                    gpus: class.gpu_seconds,
                    cpu_cores: class.cpu_core_seconds,
                };
                (key, used)
            })
            .collect();
        Self {
            held: BTreeMap::new(),
            seconds,
            accrued_at: now,
            since_unix_ms: saved.since_unix_ms,
            unsaved: false,
        }
    }

    /// Whether a save at the next period would write anything new: it changed, or what it
    /// holds has accrued since.
    pub fn needs_saving(&self) -> bool {
        self.unsaved || !self.held.is_empty()
    }

    /// What to write to the store for `pool`, counted up to `now`; it is then saved.
    pub fn take_for_saving(&mut self, pool: &PoolName, now: Instant) -> StoredUsage {
        self.unsaved = false;
        StoredUsage {
            pool: pool.to_string(),
            since_unix_ms: self.since_unix_ms,
            classes: self.until(now),
        }
    }

    /// Adds what is held now, for the time since the last accrual, to the seconds.
    fn accrue(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.accrued_at).as_secs_f64();
        self.accrued_at = self.accrued_at.max(now);
        if elapsed == 0.0 {
            return;
        }
        for (class, held) in &self.held {
            let seconds = self.seconds.entry(class.clone()).or_default();
            seconds.gpus += held.gpus * elapsed;
            seconds.cpu_cores += held.cpu_cores * elapsed;
        }
    }

    /// An actor took its place holding `holding`, at `now`.
    pub fn add(&mut self, holding: &Holding, now: Instant) {
        if holding.held == GpusAndCores::default() {
            return;
        }
        self.accrue(now);
        self.unsaved = true;
        let held = self.held.entry(holding.class.clone()).or_default();
        held.gpus += holding.held.gpus;
        held.cpu_cores += holding.held.cpu_cores;
    }

    /// An actor holding `holding` left its place at `now`. A class the pool does not hold
    /// (the actor of a deleted pool of the same name) changes nothing.
    pub fn remove(&mut self, holding: &Holding, now: Instant) {
        self.accrue(now);
        let Some(held) = self.held.get_mut(&holding.class) else {
            return;
        };
        self.unsaved = true;
        held.gpus = (held.gpus - holding.held.gpus).max(0.0);
        held.cpu_cores = (held.cpu_cores - holding.held.cpu_cores).max(0.0);
        if held.gpus < 1e-9 && held.cpu_cores < 1e-9 {
            self.held.remove(&holding.class);
        }
    }

    /// GPUs held now, and what all it holds costs an hour at `prices` (a GPU class by its
    /// node's `pool` label or its GPU's model, cores at the core price).
    fn rate(&self, prices: &PriceTable) -> (f64, f64) {
        let (mut gpus, mut usd_per_hour) = (0.0, 0.0);
        for (class, held) in &self.held {
            let label = Some(&class.pool_label).filter(|l| !l.is_empty());
            gpus += held.gpus;
            usd_per_hour += held.gpus * prices.gpu_hour(label, &class.gpu_name)
                + held.cpu_cores * prices.per_cpu_core;
        }
        (gpus, usd_per_hour)
    }

    /// GPU- and core-seconds by class up to `now` (what is held counted to `now`), without
    /// accruing.
    pub fn until(&self, now: Instant) -> Vec<pb::HeldUsage> {
        let elapsed = now.saturating_duration_since(self.accrued_at).as_secs_f64();
        let mut seconds = self.seconds.clone();
        for (class, held) in &self.held {
            let used = seconds.entry(class.clone()).or_default();
            used.gpus += held.gpus * elapsed;
            used.cpu_cores += held.cpu_cores * elapsed;
        }
        seconds
            .into_iter()
            .map(|(class, used)| pb::HeldUsage {
                gpu_name: class.gpu_name,
                node_pool_label: class.pool_label,
                gpu_seconds: used.gpus,
                cpu_core_seconds: used.cpu_cores,
            })
            .collect()
    }
}

impl Core {
    /// Actor `id` took its place: what it holds there is added to its pool's usage.
    pub(super) fn start_charging(&mut self, id: &ActorId) {
        let actor = &self.actors[id];
        let node = actor
            .assignment
            .as_ref()
            .and_then(|a| self.nodes.get(&a.node));
        let holding = actor_holding(actor, node);
        let pool = actor.pool.clone();
        if let Some(record) = self.pools.get_mut(&pool) {
            record.usage.add(&holding, Instant::now());
        }
        self.actors.get_mut(id).expect("actor exists").holding = holding;
    }

    /// Actor `id` left its place: its pool's usage counts it until now, and no longer.
    pub(super) fn stop_charging(&mut self, id: &ActorId) {
        let Some(actor) = self.actors.get_mut(id) else {
            return;
        };
        let holding = std::mem::take(&mut actor.holding);
        if let Some(record) = self.pools.get_mut(&actor.pool) {
            record.usage.remove(&holding, Instant::now());
        }
    }

    /// Saves the pools' usage once per [`USAGE_SAVE_PERIOD`] (on the tick). Not while the
    /// store fails or lags: each save holds the whole count, so the first one after it
    /// heals writes what the skipped ones would have, without piling up in its queue.
    pub(super) fn save_pool_usage_when_due(&mut self, now: Instant) {
        let due = now.saturating_duration_since(self.last_usage_save) >= USAGE_SAVE_PERIOD;
        if due && self.store.refusal().is_none() {
            self.save_pool_usage(now);
        }
    }

    /// Writes the usage of every pool that changed since it was last written (what its
    /// actors hold accrues, so a pool holding anything always has), accrued up to `now`.
    pub(super) fn save_pool_usage(&mut self, now: Instant) {
        self.last_usage_save = now;
        for (name, record) in self.pools.iter_mut() {
            if record.saved && record.usage.needs_saving() {
                let usage = record.usage.take_for_saving(name, now);
                self.store.write(StoreOp::PutPoolUsage(usage));
            }
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
            let (gpus, usd_per_hour) = record.usage.rate(&self.prices);
            job.status.gpu_seconds += gpus * seconds;
            job.status.cost_usd += usd_per_hour * seconds / 3600.0;
        }
    }

    /// What the pool's placed actors hold by price class, added up afresh: the test-only
    /// check of what its [`PoolUsage`] holds.
    #[cfg(test)]
    pub(super) fn held_by_pool_now(&self, pool: &PoolName) -> BTreeMap<PriceClass, GpusAndCores> {
        let mut by_class: BTreeMap<PriceClass, GpusAndCores> = BTreeMap::new();
        for id in &self.pools[pool].actors {
            let actor = &self.actors.uncounted()[id];
            let node = actor
                .assignment
                .as_ref()
                .and_then(|a| self.nodes.uncounted().get(&a.node));
            let holding = actor_holding(actor, node);
            if holding.held != GpusAndCores::default() {
                let class = by_class.entry(holding.class).or_default();
                class.gpus += holding.held.gpus;
                class.cpu_cores += holding.held.cpu_cores;
            }
        }
        by_class
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu_holding(name: &str, label: &str, gpus: f64) -> Holding {
        Holding {
            class: PriceClass {
                gpu_name: name.to_owned(),
                pool_label: label.to_owned(),
            },
            held: GpusAndCores {
                gpus,
                cpu_cores: 0.0,
            },
        }
    }

    fn seconds(usage: &[pb::HeldUsage], name: &str) -> (f64, f64) {
        usage
            .iter()
            .find(|u| u.gpu_name == name)
            .map_or((0.0, 0.0), |u| (u.gpu_seconds, u.cpu_core_seconds))
    }

    #[test]
    fn each_actor_counts_from_taking_its_place_until_leaving_it() {
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let mut usage = PoolUsage::since(start);
        let whole = gpu_holding("NVIDIA A10G", "", 1.0);
        let quarter = gpu_holding("NVIDIA A10G", "", 0.25);
        let t4 = gpu_holding("Tesla T4", "spot", 1.0);
        usage.add(&whole, at(10));
        usage.add(&quarter, at(20));
        usage.add(&t4, at(20));
        // The whole-GPU actor's GPU fails at 40 s; the T4 actor's node leaves at 50 s.
        usage.remove(&whole, at(40));
        usage.remove(&t4, at(50));
        let now = usage.until(at(100));
        // A10G: 1 GPU for 30 s, and a quarter for 80 s.
        assert!(
            (seconds(&now, "NVIDIA A10G").0 - 50.0).abs() < 1e-9,
            "{now:?}"
        );
        assert!((seconds(&now, "Tesla T4").0 - 30.0).abs() < 1e-9, "{now:?}");
        let t4_row = now.iter().find(|u| u.gpu_name == "Tesla T4").unwrap();
        assert_eq!(t4_row.node_pool_label, "spot");
        // Reading accrues nothing: a later read counts on from the same point.
        let later = usage.until(at(200));
        assert!(
            (seconds(&later, "NVIDIA A10G").0 - 75.0).abs() < 1e-9,
            "{later:?}"
        );
        assert!(
            (seconds(&later, "Tesla T4").0 - 30.0).abs() < 1e-9,
            "{later:?}"
        );
    }

    #[test]
    fn cpu_actors_count_core_seconds_and_strangers_change_nothing() {
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let mut usage = PoolUsage::since(start);
        let cpu = Holding {
            held: GpusAndCores {
                gpus: 0.0,
                cpu_cores: 2.0,
            },
            ..Holding::default()
        };
        usage.add(&cpu, at(0));
        // An actor of a deleted pool of the same name, of a class this pool never held.
        usage.remove(&gpu_holding("NVIDIA L4", "", 1.0), at(5));
        // Nothing held is nothing added.
        usage.add(&Holding::default(), at(5));
        usage.remove(&cpu, at(10));
        let now = usage.until(at(60));
        assert_eq!(now.len(), 1, "{now:?}");
        assert_eq!(seconds(&now, ""), (0.0, 20.0));
        assert!(usage.held.is_empty(), "{:?}", usage.held);
    }

    /// A running job's charge an hour: each class of what the pool holds now at its price
    /// (the node's `pool` label first, then the GPU's model), cores at the core price.
    #[test]
    fn what_a_pool_holds_now_is_priced_by_label_gpu_model_and_core() {
        let mut prices = PriceTable::default();
        prices.per_pool_label.insert("spot".into(), 0.2);
        let now = Instant::now();
        let mut usage = PoolUsage::since(now);
        usage.add(&gpu_holding("NVIDIA A10G", "", 1.5), now);
        usage.add(&gpu_holding("Tesla T4", "spot", 1.0), now);
        let cpu = Holding {
            held: GpusAndCores {
                gpus: 0.0,
                cpu_cores: 4.0,
            },
            ..Holding::default()
        };
        usage.add(&cpu, now);
        let (gpus, usd_per_hour) = usage.rate(&prices);
        assert_eq!(gpus, 2.5);
        let expected = 1.5 * prices.gpu_hour(None, "NVIDIA A10G") + 0.2 + 4.0 * prices.per_cpu_core;
        assert!(
            (usd_per_hour - expected).abs() < 1e-12,
            "{usd_per_hour} vs {expected}"
        );
        usage.remove(&cpu, now);
        assert_eq!(usage.rate(&prices).0, 2.5);
    }
}
