//! What the scheduler counts as it runs, for `/metrics` and the dashboard: counters and
//! histograms the core and the store writer add to (lock-free atomics, shared by clones),
//! and a short log of recent errors and refusals. Gauges (nodes, actors, queues, jobs) are
//! not kept here: they are read from the core's state at each scrape (`http::metrics`).

use std::collections::VecDeque;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use serde::Serialize;

use crate::state::ActorWork;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabel {
    pub pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActorLabels {
    pub pool: String,
    pub actor: String,
    pub node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolOutcomeLabels {
    pub pool: String,
    pub outcome: String,
}

/// How a task attempt ended, as `resident_tasks_total{outcome}` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskOutcomeKind {
    Succeeded,
    /// Failed for good (the client gets an error).
    Failed,
    /// Failed or lost, and goes round again.
    Retried,
}

impl TaskOutcomeKind {
    pub fn name(self) -> &'static str {
        match self {
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Retried => "retried",
        }
    }
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn task_items_histogram() -> Histogram {
    // 1 to 8192 documents per task.
    Histogram::new(exponential_buckets(1.0, 2.0, 14))
}

fn task_duration_histogram() -> Histogram {
    // 1 ms to about 4.5 minutes: a tiny call up to a long chunk.
    Histogram::new(exponential_buckets(0.001, 2.0, 19))
}

/// The scheduler's counters and histograms. Cheap to clone: every field shares its value.
#[derive(Clone)]
pub struct SchedulerMetrics {
    tasks: Family<PoolOutcomeLabels, Counter>,
    task_duration: HistogramFamily<PoolLabel>,
    model_loads: Family<PoolLabel, Counter>,
    task_items: HistogramFamily<PoolLabel>,
    actor_busy: Family<ActorLabels, Counter<f64, AtomicU64>>,
    actor_items: Family<ActorLabels, Counter>,
    actor_tokens: Family<ActorLabels, Counter>,
    loop_lag: Histogram,
    store_write: Histogram,
    store_write_errors: Counter,
    store_unwritten_ops: Gauge,
    store_failing: Gauge,
    pub events: EventLog,
}

impl Default for SchedulerMetrics {
    fn default() -> Self {
        Self {
            tasks: Family::default(),
            task_duration: Family::new_with_constructor(task_duration_histogram),
            model_loads: Family::default(),
            task_items: Family::new_with_constructor(task_items_histogram),
            actor_busy: Family::default(),
            actor_items: Family::default(),
            actor_tokens: Family::default(),
            // 100 µs to about 6.5 s.
            loop_lag: Histogram::new(exponential_buckets(0.0001, 2.0, 17)),
            store_write: Histogram::new(exponential_buckets(0.0001, 2.0, 17)),
            store_write_errors: Counter::default(),
            store_unwritten_ops: Gauge::default(),
            store_failing: Gauge::default(),
            events: EventLog::default(),
        }
    }
}

impl SchedulerMetrics {
    pub fn task_ended(&self, pool: &str, outcome: TaskOutcomeKind) {
        self.tasks
            .get_or_create(&PoolOutcomeLabels {
                pool: pool.to_owned(),
                outcome: outcome.name().to_owned(),
            })
            .inc();
    }

    /// How long an actor ran one attempt (as the agent measured it).
    pub fn task_ran(&self, pool: &str, run: Duration) {
        self.task_duration
            .get_or_create(&PoolLabel {
                pool: pool.to_owned(),
            })
            .observe(run.as_secs_f64());
    }

    pub fn models_loaded(&self, pool: &str, loads: u64) {
        if loads > 0 {
            self.model_loads
                .get_or_create(&PoolLabel {
                    pool: pool.to_owned(),
                })
                .inc_by(loads);
        }
    }

    /// A task succeeded with this many items (documents): the batch sizes actors see.
    pub fn task_items(&self, pool: &str, items: u32) {
        self.task_items
            .get_or_create(&PoolLabel {
                pool: pool.to_owned(),
            })
            .observe(f64::from(items));
    }

    /// Work an actor reported since its last report.
    pub fn actor_worked(&self, pool: &str, actor: &str, node: &str, work: ActorWork) {
        if work == ActorWork::default() {
            return;
        }
        let labels = ActorLabels {
            pool: pool.to_owned(),
            actor: actor.to_owned(),
            node: node.to_owned(),
        };
        self.actor_busy
            .get_or_create(&labels)
            .inc_by(work.busy_micros as f64 / 1e6);
        self.actor_items.get_or_create(&labels).inc_by(work.items);
        self.actor_tokens.get_or_create(&labels).inc_by(work.tokens);
    }

    /// Removes an actor's series on `node` (it left that node: stopped, failed, lost), so
    /// series do not pile up with actors that come and go.
    pub fn forget_actor(&self, pool: &str, actor: &str, node: &str) {
        let labels = ActorLabels {
            pool: pool.to_owned(),
            actor: actor.to_owned(),
            node: node.to_owned(),
        };
        self.actor_busy.remove(&labels);
        self.actor_items.remove(&labels);
        self.actor_tokens.remove(&labels);
    }

    /// Removes a deleted pool's series.
    pub fn forget_pool(&self, pool: &str) {
        for outcome in [
            TaskOutcomeKind::Succeeded,
            TaskOutcomeKind::Failed,
            TaskOutcomeKind::Retried,
        ] {
            self.tasks.remove(&PoolOutcomeLabels {
                pool: pool.to_owned(),
                outcome: outcome.name().to_owned(),
            });
        }
        let label = PoolLabel {
            pool: pool.to_owned(),
        };
        self.task_duration.remove(&label);
        self.model_loads.remove(&label);
        self.task_items.remove(&label);
    }

    /// How late the loop's periodic tick ran: the loop was busy that long.
    pub fn loop_lag(&self, lag: Duration) {
        self.loop_lag.observe(lag.as_secs_f64());
    }

    /// One batch written to the state store.
    pub fn store_write(&self, took: Duration, ok: bool) {
        self.store_write.observe(took.as_secs_f64());
        if !ok {
            self.store_write_errors.inc();
        }
    }

    /// Ops queued for the state store and not yet on disk, and whether its writes fail.
    pub fn store_backlog(&self, unwritten: usize, failing: bool) {
        self.store_unwritten_ops
            .set(i64::try_from(unwritten).unwrap_or(i64::MAX));
        self.store_failing.set(i64::from(failing));
    }

    /// The succeeded count of a pool so far (for tests and the dashboard).
    pub fn tasks_of(&self, pool: &str, outcome: TaskOutcomeKind) -> u64 {
        self.tasks
            .get_or_create(&PoolOutcomeLabels {
                pool: pool.to_owned(),
                outcome: outcome.name().to_owned(),
            })
            .get()
    }

    /// Adds every counter and histogram to a registry being built for one scrape.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "resident_tasks",
            "Task attempts by how they ended: succeeded, failed (for good) or retried",
            self.tasks.clone(),
        );
        registry.register(
            "resident_task_duration_seconds",
            "Time an actor spent on one task attempt",
            self.task_duration.clone(),
        );
        registry.register(
            "resident_model_loads",
            "Model loads by actors of each pool",
            self.model_loads.clone(),
        );
        registry.register(
            "resident_task_items",
            "Items (documents) per succeeded task: the batch sizes actors run",
            self.task_items.clone(),
        );
        registry.register(
            "resident_actor_busy_seconds",
            "Time each actor spent running tasks; its rate() is the actor's busy ratio",
            self.actor_busy.clone(),
        );
        registry.register(
            "resident_actor_items",
            "Items (documents) each actor processed; rate() is its docs/s",
            self.actor_items.clone(),
        );
        registry.register(
            "resident_actor_tokens",
            "Tokens each actor's model ran over; rate() is its tokens/s",
            self.actor_tokens.clone(),
        );
        registry.register(
            "resident_scheduler_loop_lag_seconds",
            "How late the scheduler loop's periodic tick ran (time spent busy)",
            self.loop_lag.clone(),
        );
        registry.register(
            "resident_store_write_seconds",
            "Time to write one batch to the state store",
            self.store_write.clone(),
        );
        registry.register(
            "resident_store_write_errors",
            "State store batches that failed to write",
            self.store_write_errors.clone(),
        );
        registry.register(
            "resident_store_unwritten_ops",
            "Changes queued for the state store and not yet on disk",
            self.store_unwritten_ops.clone(),
        );
        registry.register(
            "resident_store_failing",
            "1 while state store writes fail (the scheduler then refuses changes), else 0",
            self.store_failing.clone(),
        );
    }
}

pub use resident_proto::unix_ms_now;

/// One error or refusal worth showing an operator.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ClusterEvent {
    pub unix_ms: u64,
    /// What it is about: `node`, `actor`, `pool`, `task`, `job` or `auth`.
    pub subject: String,
    /// Which one (a node id, pool name, job id; empty when none).
    pub name: String,
    pub message: String,
}

/// The most recent events, newest last, at most [`EventLog::CAPACITY`].
#[derive(Clone, Default)]
pub struct EventLog(Arc<Mutex<VecDeque<ClusterEvent>>>);

impl EventLog {
    pub const CAPACITY: usize = 200;

    pub fn record(&self, subject: &str, name: &str, message: impl Into<String>) {
        let event = ClusterEvent {
            unix_ms: unix_ms_now(),
            subject: subject.to_owned(),
            name: name.to_owned(),
            message: message.into(),
        };
        let mut events = self.0.lock().unwrap_or_else(|p| p.into_inner());
        // The same thing said again (an actor that keeps failing to place) counts once.
        if events.back().is_some_and(|last| {
            last.subject == event.subject
                && last.name == event.name
                && last.message == event.message
        }) {
            events.pop_back();
        }
        events.push_back(event);
        while events.len() > Self::CAPACITY {
            events.pop_front();
        }
    }

    /// The newest `limit` events, newest first.
    pub fn recent(&self, limit: usize) -> Vec<ClusterEvent> {
        let events = self.0.lock().unwrap_or_else(|p| p.into_inner());
        events.iter().rev().take(limit).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;

    #[test]
    fn a_forgotten_pool_and_actor_leave_no_series() {
        let metrics = SchedulerMetrics::default();
        let work = crate::state::ActorWork {
            busy_micros: 1_000,
            items: 3,
            tokens: 9,
        };
        for pool in ["gone", "kept"] {
            metrics.task_ended(pool, TaskOutcomeKind::Succeeded);
            metrics.task_ran(pool, Duration::from_millis(3));
            metrics.models_loaded(pool, 1);
            metrics.task_items(pool, 3);
            metrics.actor_worked(pool, &format!("{pool}-a"), "n1", work);
        }
        metrics.forget_pool("gone");
        metrics.forget_actor("gone", "gone-a", "n1");
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        assert!(!text.contains("\"gone"), "{text}");
        assert!(text.contains("pool=\"kept\""), "{text}");
        assert!(text.contains("actor=\"kept-a\""), "{text}");
    }

    #[test]
    fn counters_encode_with_prometheus_names() {
        let metrics = SchedulerMetrics::default();
        metrics.task_ended("emb", TaskOutcomeKind::Succeeded);
        metrics.task_ended("emb", TaskOutcomeKind::Succeeded);
        metrics.task_ended("emb", TaskOutcomeKind::Retried);
        metrics.task_ran("emb", Duration::from_millis(30));
        metrics.models_loaded("emb", 2);
        metrics.models_loaded("emb", 0);
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("resident_tasks_total{pool=\"emb\",outcome=\"succeeded\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("resident_tasks_total{pool=\"emb\",outcome=\"retried\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("resident_model_loads_total{pool=\"emb\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("resident_task_duration_seconds_count{pool=\"emb\"} 1"),
            "{text}"
        );
        assert_eq!(metrics.tasks_of("emb", TaskOutcomeKind::Succeeded), 2);
    }

    #[test]
    fn the_event_log_keeps_the_newest_and_folds_repeats() {
        let log = EventLog::default();
        for i in 0..EventLog::CAPACITY + 10 {
            log.record("task", "j", format!("error {i}"));
        }
        log.record("pool", "p", "cannot place");
        log.record("pool", "p", "cannot place");
        let recent = log.recent(3);
        assert_eq!(recent[0].message, "cannot place");
        assert_eq!(
            recent[1].message,
            format!("error {}", EventLog::CAPACITY + 9)
        );
        assert_eq!(log.recent(usize::MAX).len(), EventLog::CAPACITY);
    }
}
