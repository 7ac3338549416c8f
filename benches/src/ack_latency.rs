//! How long a durable acknowledgement takes: pools created and deleted one at a time, and
//! created 32 at a time (their writes share fsyncs), on a local cluster whose scheduler
//! keeps its state in a redb file (`state_dir`), so every answer waits for an fsync.

use std::time::{Duration, Instant};

use resident_sdk::{Cluster, LocalConfig, PoolSpec};
use resident_tests::scale_run::percentile_ms;

fn row(name: &str, samples: &[Duration]) {
    let mut micros: Vec<u32> = samples
        .iter()
        .map(|d| d.as_micros().min(u128::from(u32::MAX)) as u32)
        .collect();
    micros.sort_unstable();
    println!(
        "| {name} | {} | {:.2} | {:.2} |",
        micros.len(),
        percentile_ms(&micros, 0.5),
        percentile_ms(&micros, 0.99)
    );
}

pub async fn run(pools: u32) -> anyhow::Result<()> {
    let state = tempfile::tempdir()?;
    let cluster = Cluster::local(LocalConfig {
        state_dir: Some(state.path().to_owned()),
        ..LocalConfig::default()
    })
    .await?;
    println!("state dir on: {}", state.path().display());
    println!("| call (durable ack) | calls | p50 (ms) | p99 (ms) |");
    println!("|---|---:|---:|---:|");
    let mut created = Vec::new();
    let mut deleted = Vec::new();
    for i in 0..pools {
        let started = Instant::now();
        let pool = cluster
            .create_pool(PoolSpec::new(format!("one-{i}"), "echo"))
            .await?;
        created.push(started.elapsed());
        let started = Instant::now();
        pool.delete().await?;
        deleted.push(started.elapsed());
    }
    row("create a pool, one at a time", &created);
    row("delete a pool, one at a time", &deleted);

    let mut concurrent = Vec::new();
    let mut creating = Duration::ZERO;
    for wave in 0..pools.div_ceil(32) {
        let started = Instant::now();
        let creates = (0..32).map(|i| {
            let cluster = cluster.clone();
            async move {
                let began = Instant::now();
                cluster
                    .create_pool(PoolSpec::new(format!("many-{wave}-{i}"), "echo"))
                    .await
                    .map(|_| began.elapsed())
            }
        });
        for latency in futures::future::join_all(creates).await {
            concurrent.push(latency?);
        }
        creating += started.elapsed();
        // Deleted between waves, so every wave starts from the same cluster.
        for i in 0..32 {
            cluster.pool(format!("many-{wave}-{i}")).delete().await?;
        }
    }
    let rate = concurrent.len() as f64 / creating.as_secs_f64();
    row("create a pool, 32 at a time", &concurrent);
    println!("creates per second, 32 at a time: {rate:.0}");
    Ok(())
}
