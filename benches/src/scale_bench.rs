//! How one scheduler holds up under a fleet: a real `resident scheduler` process (its own
//! default intervals: heartbeats every 2 s) and N simulated agents in this process, each a
//! tokio task with its own gRPC session, G simulated GPUs and no-op actors that answer at
//! once (`resident_tests::fleet`). Measures, in order: registration, placing 8 actors per
//! agent until all are ready, no-op task throughput and latency (credit 2 per actor), the
//! scheduler's CPU at idle and its RSS, and re-placing the actors of 10% of the agents
//! killed at once. Prints a markdown table; `--json` adds one JSON object as the last line.
//!
//! With `--data-plane` it measures the results data plane instead
//! (`resident_tests::data_plane`): results of 4 KiB, 64 KiB and 1 MiB from 16 actors on 4
//! agents through the scheduler to one client, with MB/s, the scheduler's CPU per GB and
//! its peak RSS.
//!
//! `cargo build --release --workspace --bins && target/release/scale-bench --agents 1000`
//! `target/release/scale-bench --data-plane`

use std::time::Duration;

use clap::Parser;
use resident_sdk::Cluster;
use resident_tests::data_plane::{DataPlaneConfig, data_plane_table, run_data_plane};
use resident_tests::scale_run::{ScaleConfig, ScaleReport, run_scale};
use resident_tests::spawn_scheduler_exactly;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
struct Args {
    /// Simulated agents.
    #[arg(long, default_value_t = 1000)]
    agents: usize,
    /// Simulated GPUs per agent.
    #[arg(long, default_value_t = 8)]
    gpus_per_agent: u32,
    /// Actors placed per agent, over all pools.
    #[arg(long, default_value_t = 8)]
    actors_per_agent: u32,
    /// Each actor's share of a GPU (below 1 leaves room to re-place lost actors).
    #[arg(long, default_value_t = 0.5)]
    actor_gpus: f64,
    /// Pools the actors are split over (one job each).
    #[arg(long, default_value_t = 8)]
    pools: usize,
    /// No-op tasks, over all jobs.
    #[arg(long, default_value_t = 200_000)]
    tasks: u64,
    /// Seconds the scheduler's idle CPU is measured over.
    #[arg(long, default_value_t = 10)]
    idle_seconds: u64,
    /// Share of agents killed at once.
    #[arg(long, default_value_t = 0.1)]
    lose: f64,
    /// Extra `resident scheduler` arguments, e.g. `--heartbeat-ms=5000`.
    #[arg(long, allow_hyphen_values = true)]
    scheduler_arg: Vec<String>,
    /// Print the results as one JSON object on the last line too.
    #[arg(long)]
    json: bool,
    /// Measure the results data plane instead of the fleet (the options above but
    /// `--scheduler-arg` and `--json` are then unused).
    #[arg(long)]
    data_plane: bool,
    /// Result sizes for `--data-plane`, in bytes.
    #[arg(long, value_delimiter = ',', default_values_t = [4096usize, 65536, 1 << 20])]
    result_bytes: Vec<usize>,
    /// MiB of results per size for `--data-plane`.
    #[arg(long, default_value_t = 1024)]
    data_plane_mib: u64,
}

fn table(report: &ScaleReport) -> String {
    let rows = [
        (
            "agents x GPUs",
            format!(
                "{} x {}",
                report.agents,
                report.gpus / report.agents.max(1) as u64
            ),
        ),
        (
            "time to register all agents",
            format!("{:.2} s", report.register_s),
        ),
        ("actors placed and ready", report.actors_placed.to_string()),
        ("time to place them", format!("{:.2} s", report.placement_s)),
        (
            "scheduler loop lag while placing, p50 / p99",
            format!(
                "{:.1} / {:.1} ms",
                report.placement_loop_lag_p50_ms, report.placement_loop_lag_p99_ms
            ),
        ),
        ("no-op tasks", report.tasks.to_string()),
        ("tasks/s", format!("{:.0}", report.tasks_per_s)),
        (
            "scheduler CPU per task",
            format!("{:.1} µs", report.scheduler_cpu_us_per_task),
        ),
        (
            "task latency with every window full, p50 / p99",
            format!("{:.1} / {:.1} ms", report.p50_task_ms, report.p99_task_ms),
        ),
        (
            "task latency one at a time, p50 / p99",
            format!(
                "{:.2} / {:.2} ms",
                report.p50_idle_task_ms, report.p99_idle_task_ms
            ),
        ),
        (
            "duplicate / missing results",
            format!("{} / {}", report.duplicate_results, report.missing_results),
        ),
        (
            "scheduler CPU at idle",
            format!("{:.1}% of a core", report.idle_cpu_ratio * 100.0),
        ),
        (
            "scheduler RSS",
            format!(
                "{:.0} MiB",
                report.scheduler_rss_bytes as f64 / (1 << 20) as f64
            ),
        ),
        (
            "agents killed at once / their actors",
            format!("{} / {}", report.agents_lost, report.actors_lost),
        ),
        (
            "time to re-place and ready them",
            format!("{:.2} s", report.replace_after_loss_s),
        ),
    ];
    let mut out = String::from("| measure | value |\n|---|---|\n");
    for (measure, value) in rows {
        out.push_str(&format!("| {measure} | {value} |\n"));
    }
    out
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RESIDENT_LOG")
                .unwrap_or_else(|_| "warn,resident_tests=info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let state = tempfile::tempdir()?;
    // A free loopback port for `/metrics`, from which the run reads the loop's lag.
    let metrics_port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut scheduler_args: Vec<std::ffi::OsString> =
        args.scheduler_arg.iter().map(Into::into).collect();
    scheduler_args.push(format!("--http-listen=127.0.0.1:{metrics_port}").into());
    let (scheduler, url) = spawn_scheduler_exactly(0, state.path(), &scheduler_args);
    let client = Cluster::connect(&url).await?;
    if args.data_plane {
        let config = DataPlaneConfig {
            result_sizes: args.result_bytes.clone(),
            bytes_per_size: args.data_plane_mib << 20,
            agents: 4,
            actors_per_agent: 4,
            credit: 4,
            timeout: Duration::from_secs(300),
        };
        let rows =
            run_data_plane(&url, scheduler.pid(), &Default::default(), &client, &config).await?;
        print!("{}", data_plane_table(&rows));
        if args.json {
            println!("{}", serde_json::to_string(&rows)?);
        }
        drop(scheduler);
        return Ok(());
    }
    let config = ScaleConfig {
        agents: args.agents,
        gpus_per_agent: args.gpus_per_agent,
        actors_per_agent: args.actors_per_agent,
        actor_gpus: args.actor_gpus,
        pools: args.pools,
        tasks: args.tasks,
        idle_window: Duration::from_secs(args.idle_seconds),
        lost_share: args.lose,
        phase_timeout: Duration::from_secs(300),
        metrics_port: Some(metrics_port),
    };
    let report = run_scale(&url, scheduler.pid(), &Default::default(), &client, &config).await?;
    print!("{}", table(&report));
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    }
    drop(scheduler);
    Ok(())
}
