//! Starts a local cluster, creates a pool of two `echo` actors and pushes 10,000 tasks through it.
//!
//! `cargo run --release -p resident-examples --bin noop-pool`

use std::time::{Duration, Instant};

use futures::StreamExt;
use resident_sdk::{Bytes, Cluster, LocalConfig, PoolSpec};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cluster = Cluster::local(LocalConfig::default()).await?;
    let pool = cluster
        .create_pool(PoolSpec::new("noop", "echo").replicas(2))
        .await?;
    pool.wait_ready(Duration::from_secs(30)).await?;

    let started = Instant::now();
    let inputs =
        futures::stream::iter((0..10_000u32).map(|i| Bytes::from(i.to_le_bytes().to_vec())));
    let mut job = pool.submit("noop-example", inputs).await?;
    let mut done = 0;
    while let Some(result) = job.next().await {
        result?.output.map_err(anyhow::Error::msg)?;
        done += 1;
    }
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "{done} tasks in {seconds:.2} s: {:.0} tasks/s",
        f64::from(done) / seconds
    );
    for actor in cluster.list_actors().await? {
        println!(
            "{} on {}: {} tasks, {} model load(s)",
            actor.actor_id,
            actor.node_id.as_ref().map_or("-", |n| n.as_str()),
            actor.tasks_done,
            actor.model_loads
        );
    }
    Ok(())
}
