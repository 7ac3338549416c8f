//! The pool of `embed` actors a job asks for, built one way for every job.

use std::collections::BTreeMap;
use std::time::Duration;

use resident_sdk::{Cluster, EmbedPoolSpec};

/// A pool the job made and did not keep is deleted after this long unused, if the job
/// could not delete it itself (killed): long enough for a rerun to find its actors loaded.
pub const ABANDONED_POOL_TTL: Duration = Duration::from_secs(10 * 60);

/// What becomes of a job's pool when the job ends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolRetention {
    /// Keep it (its actors stay loaded for the next run).
    pub keep: bool,
    /// Delete it after this long unused; `None` = the default: never for a kept pool,
    /// [`ABANDONED_POOL_TTL`] for one the job deletes at its end.
    pub idle_ttl: Option<Duration>,
}

impl PoolRetention {
    /// The pool's idle TTL (zero = never).
    pub fn idle_ttl(self) -> Duration {
        match (self.keep, self.idle_ttl) {
            (_, Some(ttl)) => ttl,
            (true, None) => Duration::ZERO,
            (false, None) => ABANDONED_POOL_TTL,
        }
    }

    /// At the job's end: deletes the pool unless kept or used by another running job.
    pub async fn job_ended(self, cluster: &Cluster, pool: &str) {
        if self.keep {
            tracing::info!(
                pool,
                "keeping the pool (--keep-pool, or for a suite's next task); its actors stay loaded"
            );
            return;
        }
        match cluster.pool(pool).delete_if_unused().await {
            Ok(None) => tracing::info!(pool, "deleted the job's pool"),
            Ok(Some(why)) => tracing::info!(pool, %why, "kept the job's pool: it is in use"),
            Err(resident_sdk::SdkError::PermissionDenied(why)) => {
                tracing::info!(pool, %why, "kept the job's pool: another principal created it")
            }
            // A job refused before its pool was made (another job's output), or a pool
            // someone deleted: nothing to do.
            Err(resident_sdk::SdkError::NotFound(_)) => tracing::debug!(pool, "no pool to delete"),
            Err(error) => {
                tracing::warn!(pool, %error, "could not delete the job's pool; its idle TTL will")
            }
        }
    }
}

/// What a job needs of its embed actors.
#[derive(Clone, Debug)]
pub struct EmbedActors<'a> {
    /// The pool's name.
    pub pool: String,
    /// The model as named.
    pub model: &'a str,
    /// The pin every agent must load (`model_pin`): a hub commit or an S3 manifest digest.
    pub revision: Option<&'a str>,
    /// Actors.
    pub replicas: u32,
    /// GPUs per actor; 0 for CPU actors.
    pub gpus_per_actor: f64,
    /// VRAM each GPU actor reserves, in GiB.
    pub vram_gib_per_actor: f64,
    /// Only nodes with these labels.
    pub selector: &'a BTreeMap<String, String>,
    /// Whether the pool outlives the job.
    pub retention: PoolRetention,
    /// See `PoolSpec::task_timeout`.
    pub task_timeout: Option<std::time::Duration>,
    /// Cuts texts shorter than the model's max_seq_length.
    pub max_seq_length: Option<usize>,
    /// Padded tokens per model batch (the actor's default when `None`).
    pub max_batch_tokens: Option<usize>,
}

impl EmbedActors<'_> {
    /// The pool spec these ask for.
    pub fn spec(&self) -> EmbedPoolSpec {
        let mut spec = EmbedPoolSpec::new(self.pool.clone(), self.model).replicas(self.replicas);
        if self.gpus_per_actor > 0.0 {
            spec = spec.gpus(self.gpus_per_actor, self.vram_gib_per_actor);
        }
        if let Some(revision) = self.revision {
            spec = spec.model_revision(revision);
        }
        for (key, value) in self.selector {
            spec = spec.selector(key, value);
        }
        if let Some(timeout) = self.task_timeout {
            spec = spec.task_timeout(timeout);
        }
        if let Some(length) = self.max_seq_length {
            spec = spec.max_seq_length(length);
        }
        if let Some(tokens) = self.max_batch_tokens {
            spec = spec.max_batch_tokens(tokens);
        }
        spec.idle_ttl(self.retention.idle_ttl())
    }
}
