//! What becomes of the pool a job (`resident embed`, `resident sweep`) creates.

use std::time::Duration;

use clap::Args;
use resident_jobs::pools::PoolRetention;

#[derive(Args, Clone, Debug)]
pub struct PoolRetentionArgs {
    /// Keep the job's pool when it ends, its actors loaded, so the next run starts at once
    /// (`resident pool delete NAME` removes it). Without it the pool is deleted at the end,
    /// unless another running job uses it.
    #[arg(long, env = "RESIDENT_KEEP_POOL")]
    pub keep_pool: bool,
    /// Delete the pool once it has been unused this long (`30m`, `2h`). Default: never with
    /// --keep-pool; 10m otherwise, for a pool whose job was killed before deleting it.
    #[arg(long, env = "RESIDENT_IDLE_TTL", value_parser = humantime::parse_duration)]
    pub idle_ttl: Option<Duration>,
}

impl PoolRetentionArgs {
    pub fn retention(&self) -> PoolRetention {
        PoolRetention {
            keep: self.keep_pool,
            idle_ttl: self.idle_ttl,
        }
    }
}
