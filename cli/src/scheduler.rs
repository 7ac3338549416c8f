use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use resident_scheduler::core::CoreConfig;
use resident_scheduler::server::start_scheduler;
use resident_scheduler::store::RedbStore;

#[derive(Args)]
pub struct SchedulerArgs {
    /// Address to serve agents and clients on.
    #[arg(long, env = "RESIDENT_LISTEN", default_value = "0.0.0.0:50051")]
    listen: String,
    /// Where pools, jobs and task outcomes persist across restarts.
    #[arg(long, env = "RESIDENT_STATE_DIR", default_value = "resident-state")]
    state_dir: PathBuf,
    /// How often agents send heartbeats.
    #[arg(long, env = "RESIDENT_HEARTBEAT_MS", default_value_t = 2000)]
    heartbeat_ms: u64,
    /// A node silent for this long is dead and its actors are placed elsewhere.
    #[arg(long, env = "RESIDENT_NODE_DEAD_MS", default_value_t = 10_000)]
    node_dead_ms: u64,
    /// Attempts per task before it fails (pools may override).
    #[arg(long, env = "RESIDENT_MAX_TASK_ATTEMPTS", default_value_t = 3)]
    max_task_attempts: u32,
    /// Finished jobs kept for `GetJob` (in memory and in the state dir); older ones are
    /// forgotten with their recorded outcomes.
    #[arg(long, env = "RESIDENT_JOB_HISTORY", default_value_t = 1000)]
    job_history: usize,
}

impl SchedulerArgs {
    fn core_config(&self) -> anyhow::Result<CoreConfig> {
        anyhow::ensure!(self.heartbeat_ms > 0, "--heartbeat-ms must be above zero");
        anyhow::ensure!(
            self.node_dead_ms > self.heartbeat_ms,
            "--node-dead-ms ({}) must exceed --heartbeat-ms ({})",
            self.node_dead_ms,
            self.heartbeat_ms
        );
        anyhow::ensure!(
            self.max_task_attempts > 0,
            "--max-task-attempts must be at least 1"
        );
        Ok(CoreConfig {
            heartbeat_interval: Duration::from_millis(self.heartbeat_ms),
            node_dead_after: Duration::from_millis(self.node_dead_ms),
            default_max_task_attempts: self.max_task_attempts,
            finished_job_history: self.job_history,
            ..CoreConfig::default()
        })
    }
}

pub async fn run(args: SchedulerArgs) -> anyhow::Result<()> {
    let config = args.core_config()?;
    let store = RedbStore::open(&args.state_dir)
        .with_context(|| format!("opening state dir {}", args.state_dir.display()))?;
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let cancel = crate::shutdown_token();
    let server = start_scheduler(listener, config, Arc::new(store), cancel)?;
    // Printed on stdout so scripts and tests can read the bound address.
    println!(
        "resident scheduler listening on http://{}",
        server.local_addr
    );
    server.task.await?;
    Ok(())
}
