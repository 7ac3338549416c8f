//! The scheduler loop's settings ([`CoreConfig`]) and their defaults. A leaf.

use std::time::Duration;

use crate::policy::backoff::RetryBackoff;

/// Timing and default limits of the scheduler loop.
#[derive(Clone, Debug)]
pub struct CoreConfig {
    /// How often agents send heartbeats.
    pub heartbeat_interval: Duration,
    /// Least time between two progress reports of one actor inside a task (zero: none).
    pub task_progress_interval: Duration,
    /// A node whose last message is older than this is dead.
    pub node_dead_after: Duration,
    /// How long a failed task waits before its next attempt.
    pub retry_backoff: RetryBackoff,
    /// Tasks an actor holds at once when its pool does not say.
    pub default_in_flight_per_actor: u32,
    /// Restarts of an actor before its pool gives up on it, when the pool does not say.
    pub default_max_restarts: u32,
    /// Attempts of a task before it fails, when the pool does not say.
    pub default_max_task_attempts: u32,
    /// A task re-queued this many times because its node died fails instead.
    pub max_node_losses_per_task: u32,
    /// Finished jobs kept (in memory and in the store) for `GetJob`; older ones are
    /// forgotten, with their recorded outcomes.
    pub finished_job_history: usize,
    /// After a restart, placement waits this long for the nodes that were alive before
    /// (less once all are back), so replicas do not pile onto the first node to return.
    pub settle_window: Duration,
    /// How long an actor may load before it is stopped and started again, for pools that
    /// set no `load_timeout_ms`.
    pub default_load_timeout: Duration,
    /// How often the loop compares placed actors with what their nodes report.
    pub reconcile_interval: Duration,
    /// A node dead this long, hosting nothing, is forgotten (its record and listing go; it
    /// may come back as new).
    pub dead_node_ttl: Duration,
    /// Bytes all running jobs may buffer together (payloads not finished, results not
    /// read); new jobs are refused beyond it.
    pub max_buffered_bytes: u64,
    /// Bytes one job may buffer; its client's stream is read no further beyond it.
    pub max_job_buffered_bytes: u64,
    /// Running jobs one principal may have at once.
    pub max_jobs_per_principal: usize,
    /// How long a job whose client stream broke runs on, waiting for the client to
    /// reattach, before what is left of it is cancelled (zero: cancelled at once).
    pub detach_grace: Duration,
}

/// A quarter of this machine's memory (4 GiB where it cannot be read).
pub fn default_max_buffered_bytes() -> u64 {
    resident_proto::host::total_ram_bytes().unwrap_or(16 << 30) / 4
}

/// One job's default buffer: 256 MiB.
pub const DEFAULT_MAX_JOB_BUFFERED_BYTES: u64 = 256 << 20;
/// How long a job waits for its client to reattach after its stream broke, by default.
pub const DEFAULT_DETACH_GRACE: Duration = Duration::from_secs(60);
/// How long a dead node stays listed, by default.
pub const DEFAULT_DEAD_NODE_TTL: Duration = Duration::from_secs(3600);
/// Running jobs one principal may have at once, by default.
pub const DEFAULT_MAX_JOBS_PER_PRINCIPAL: usize = 64;

impl Default for CoreConfig {
    fn default() -> Self {
        Self {
            heartbeat_interval: Duration::from_secs(2),
            task_progress_interval: Duration::from_millis(500),
            node_dead_after: Duration::from_secs(10),
            retry_backoff: RetryBackoff {
                base: Duration::from_millis(200),
                max: Duration::from_secs(10),
            },
            default_in_flight_per_actor: 2,
            default_max_restarts: 3,
            default_max_task_attempts: 3,
            max_node_losses_per_task: 10,
            finished_job_history: 1000,
            settle_window: Duration::from_secs(15),
            default_load_timeout: Duration::from_secs(15 * 60),
            reconcile_interval: Duration::from_secs(5),
            dead_node_ttl: DEFAULT_DEAD_NODE_TTL,
            max_buffered_bytes: default_max_buffered_bytes(),
            max_job_buffered_bytes: DEFAULT_MAX_JOB_BUFFERED_BYTES,
            max_jobs_per_principal: DEFAULT_MAX_JOBS_PER_PRINCIPAL,
            detach_grace: DEFAULT_DETACH_GRACE,
        }
    }
}

impl CoreConfig {
    /// Short intervals for tests.
    pub fn for_test() -> Self {
        Self {
            heartbeat_interval: Duration::from_millis(100),
            task_progress_interval: Duration::from_millis(100),
            // Generous: a loaded 2-core CI machine can stall a heartbeat for a while; a
            // killed agent is noticed at once anyway (its stream closes).
            node_dead_after: Duration::from_millis(2000),
            retry_backoff: RetryBackoff {
                base: Duration::from_millis(20),
                max: Duration::from_millis(200),
            },
            reconcile_interval: Duration::from_millis(200),
            // A broken stream cancels at once unless a test asks for a grace.
            detach_grace: Duration::ZERO,
            ..Self::default()
        }
    }
}
