//! Runtime overhead benchmark: no-op actor calls through SDK -> scheduler -> agent -> actor,
//! `Cluster::local()` start time, and time to create 20 actors and hear from each.
//! Prints a markdown table. `cargo run --release -p resident-bench --bin runtime-bench`;
//! `-- --tls` compares plaintext with TLS and tokens instead; `-- --ack-latency N` times
//! durable acknowledgements (pool creation and deletion) instead.

mod ack_latency;
mod call_counts;
mod tls_compare;

use std::time::{Duration, Instant};

use clap::Parser;
use futures::StreamExt;
use resident_sdk::{Bytes, Cluster, LocalConfig, PoolSpec};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
struct Args {
    #[command(flatten)]
    calls: call_counts::CallCounts,
    /// Local cluster starts to average.
    #[arg(long, default_value_t = 5)]
    starts: u32,
    /// Only compare a plaintext cluster with a TLS + token one (same calls, one run).
    #[arg(long)]
    tls: bool,
    /// Only time durable acknowledgements: create and delete this many pools on a
    /// cluster that keeps its state on disk.
    #[arg(long)]
    ack_latency: Option<u32>,
}

fn row(name: &str, value: f64, unit: &str) {
    println!("| {name} | {value:.0} | {unit} |");
}

async fn pipelined(pool: &resident_sdk::Pool, calls: u32) -> anyhow::Result<f64> {
    let started = Instant::now();
    let inputs = futures::stream::iter((0..calls).map(|i| Bytes::from(i.to_le_bytes().to_vec())));
    let mut job = pool.submit("bench", inputs).await?;
    let mut done = 0u32;
    while let Some(result) = job.next().await {
        result?.output.map_err(anyhow::Error::msg)?;
        done += 1;
    }
    anyhow::ensure!(done == calls, "only {done} of {calls} answered");
    Ok(f64::from(calls) / started.elapsed().as_secs_f64())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.tls {
        return tls_compare::run(args.calls.sync_calls, args.calls.pipelined_calls).await;
    }
    if let Some(pools) = args.ack_latency {
        return ack_latency::run(pools.max(1)).await;
    }
    println!("| measurement | value | unit |");
    println!("|---|---:|---|");

    let mut start_total = Duration::ZERO;
    for _ in 0..args.starts {
        let started = Instant::now();
        let cluster = Cluster::local(LocalConfig::default()).await?;
        start_total += started.elapsed();
        drop(cluster);
    }
    row(
        "Cluster::local() start (mean)",
        (start_total / args.starts).as_secs_f64() * 1000.0,
        "ms",
    );

    let cluster = Cluster::local(LocalConfig::default()).await?;
    let one = cluster.create_pool(PoolSpec::new("one", "echo")).await?;
    one.wait_ready(Duration::from_secs(10)).await?;
    let mut session = one.session().await?;
    for _ in 0..200 {
        session.call(Bytes::from_static(b"warm")).await?;
    }
    let started = Instant::now();
    for i in 0..args.calls.sync_calls {
        session.call(Bytes::from(i.to_le_bytes().to_vec())).await?;
    }
    let sync_rate = f64::from(args.calls.sync_calls) / started.elapsed().as_secs_f64();
    row("1 actor, one call at a time", sync_rate, "calls/s");
    row(
        "1 actor, pipelined (credit 2)",
        pipelined(&one, args.calls.pipelined_calls).await?,
        "calls/s",
    );

    let deep = cluster
        .create_pool(PoolSpec::new("deep", "echo").max_in_flight_per_actor(64))
        .await?;
    deep.wait_ready(Duration::from_secs(10)).await?;
    row(
        "1 actor, pipelined (credit 64)",
        pipelined(&deep, args.calls.pipelined_calls).await?,
        "calls/s",
    );

    let started = Instant::now();
    let twenty = cluster
        .create_pool(PoolSpec::new("twenty", "echo").replicas(20))
        .await?;
    twenty.wait_ready(Duration::from_secs(30)).await?;
    row(
        "create 20 actors and hear from each",
        started.elapsed().as_secs_f64() * 1000.0,
        "ms",
    );
    row(
        "20 actors, pipelined (credit 2)",
        pipelined(&twenty, args.calls.pipelined_calls).await?,
        "calls/s",
    );
    Ok(())
}
