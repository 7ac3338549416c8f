//! Operating a running cluster from another terminal: `resident jobs`, `resident job
//! cancel`, `resident pools` and `resident pool delete`, each with `--json`.

use clap::{Args, Subcommand};
use resident_proto::unix_ms_now;
use resident_sdk::json::{job_json, pool_json};
use resident_sdk::{Cluster, JobId, JobStatus, PoolStatus};
use serde_json::json;

use crate::credentials::CredentialArgs;

/// How to reach the cluster, shared by every command here.
#[derive(Args)]
pub struct ClusterArgs {
    /// Scheduler URL.
    #[arg(long, env = "RESIDENT_CLUSTER")]
    cluster: String,
    #[command(flatten)]
    credentials: CredentialArgs,
    /// Print JSON instead of a table.
    #[arg(long, env = "RESIDENT_JSON")]
    json: bool,
}

impl ClusterArgs {
    async fn connect(&self) -> anyhow::Result<Cluster> {
        self.credentials.connect(&self.cluster).await
    }
}

#[derive(Subcommand)]
pub enum JobCommand {
    /// Cancel what is left of a job; finished tasks keep their results.
    Cancel {
        /// The job's id (`resident jobs` lists them).
        id: String,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
}

#[derive(Subcommand)]
pub enum PoolCommand {
    /// Delete a pool: its actors stop and free their GPUs; its queued tasks fail.
    Delete {
        /// The pool's name (`resident pools` lists them).
        name: String,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
}

fn print_json(value: &serde_json::Value) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

pub(crate) fn print_jobs(jobs: &[JobStatus]) {
    let now = unix_ms_now();
    println!(
        "{:<38} {:<24} {:<16} {:<11} {:>6} {:>11} {:>7} {:>10} {:>8} {:>9}  OWNER",
        "JOB", "NAME", "POOL", "STATE", "DONE", "TASKS", "FAILED", "DOCS", "DOCS/S", "COST"
    );
    for job in jobs {
        println!(
            "{:<38} {:<24} {:<16} {:<11} {:>6} {:>11} {:>7} {:>10} {:>8.1} {:>9}  {}",
            job.job_id.as_str(),
            job.name,
            job.pool.as_str(),
            job.state.name(),
            format!("{:.1}%", job.progress() * 100.0),
            format!(
                "{}/{}",
                job.succeeded,
                job.expected_tasks.max(job.submitted)
            ),
            job.failed,
            job.items_done + job.items_running,
            job.items_per_second(now),
            format!("${:.4}", job.cost_usd),
            job.owner
        );
    }
}

/// GPU-HOURS and CORE-HOURS: what each pool's actors have held since it was made, through
/// scheduler restarts.
fn print_pools(pools: &[PoolStatus]) {
    println!(
        "{:<24} {:<10} {:<12} {:>7} {:>6} {:>9} {:>10}  NOTE",
        "POOL", "KIND", "OWNER", "READY", "LOADS", "GPU-HOURS", "CORE-HOURS"
    );
    for pool in pools {
        let gpu_seconds: f64 = pool.usage.iter().map(|u| u.gpu_seconds).sum();
        let core_seconds: f64 = pool.usage.iter().map(|u| u.cpu_core_seconds).sum();
        println!(
            "{:<24} {:<10} {:<12} {:>7} {:>6} {:>9.3} {:>10.3}  {}",
            pool.spec.name(),
            pool.spec.kind(),
            pool.spec.owner(),
            format!("{}/{}", pool.ready_actors, pool.replicas()),
            pool.actors.iter().map(|a| a.model_loads).sum::<u64>(),
            gpu_seconds / 3600.0,
            core_seconds / 3600.0,
            pool.unplaced_reason.as_deref().unwrap_or("")
        );
    }
}

/// `resident jobs`.
pub async fn list_jobs(args: ClusterArgs) -> anyhow::Result<()> {
    let jobs = args.connect().await?.list_jobs().await?;
    match args.json {
        true => print_json(&json!({ "jobs": jobs.iter().map(job_json).collect::<Vec<_>>() })),
        false => {
            print_jobs(&jobs);
            Ok(())
        }
    }
}

/// `resident pools`.
pub async fn list_pools(args: ClusterArgs) -> anyhow::Result<()> {
    let pools = args.connect().await?.list_pools().await?;
    match args.json {
        true => print_json(&json!({ "pools": pools.iter().map(pool_json).collect::<Vec<_>>() })),
        false => {
            print_pools(&pools);
            Ok(())
        }
    }
}

/// `resident job ...`.
pub async fn job(command: JobCommand) -> anyhow::Result<()> {
    match command {
        JobCommand::Cancel { id, cluster } => {
            let job = cluster.connect().await?.cancel_job(&JobId::new(id)).await?;
            match cluster.json {
                true => print_json(&job_json(&job)),
                false => {
                    print_jobs(std::slice::from_ref(&job));
                    Ok(())
                }
            }
        }
    }
}

/// `resident pool ...`.
pub async fn pool(command: PoolCommand) -> anyhow::Result<()> {
    match command {
        PoolCommand::Delete { name, cluster } => {
            cluster.connect().await?.pool(&name).delete().await?;
            match cluster.json {
                true => print_json(&json!({ "deleted": name })),
                false => {
                    println!("deleted pool {name}");
                    Ok(())
                }
            }
        }
    }
}
