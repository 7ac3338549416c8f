//! The call counts the runtime benchmarks share (`runtime-bench`, `typed-bench`).

/// How many calls to time.
#[derive(clap::Args)]
pub struct CallCounts {
    /// One-at-a-time calls to time.
    #[arg(long, default_value_t = 5_000)]
    pub sync_calls: u32,
    /// Pipelined calls to time.
    #[arg(long, default_value_t = 100_000)]
    pub pipelined_calls: u32,
}
