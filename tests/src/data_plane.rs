//! The results data plane, measured: results of one size flow from simulated agents through
//! one real scheduler process to one Rust client, which reads every one of them. For each
//! size it gives the client's MB/s, the scheduler's CPU seconds per GB relayed (and so the
//! MB it relays per second of one core), its RSS before and at its peak (sampled every
//! 10 ms), and the results the client got twice or never (both must be 0).
//!
//! Inputs are 8 bytes, so what is measured is the results' way back; each agent answers
//! with one shared buffer, so the agents' side costs no copy per result here.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use resident_proto::connect::ClientCredentials;
use resident_sdk::{Bytes, Cluster, PoolSpec, SubmitOptions};
use serde::Serialize;

use crate::fleet::{FleetSpec, SimulatedFleet};
use crate::scale_run::{process_cpu_seconds, process_rss_bytes};

/// How the results data plane is measured.
#[derive(Clone, Debug)]
pub struct DataPlaneConfig {
    /// Result sizes, each measured on its own (a fresh pool on a fresh fleet).
    pub result_sizes: Vec<usize>,
    /// Bytes of results per size (the task count is this over the size).
    pub bytes_per_size: u64,
    /// Simulated agents.
    pub agents: usize,
    /// Actors on each.
    pub actors_per_agent: u32,
    /// Tasks each actor holds at once.
    pub credit: u32,
    /// Gives up on a size after this long.
    pub timeout: Duration,
}

/// One size's figures; the names are `scale-bench --data-plane --json`'s.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DataPlaneRow {
    /// Bytes of each result.
    pub result_bytes: usize,
    /// Results read.
    pub results: u64,
    /// Seconds from the first task sent to the last result read.
    pub seconds: f64,
    /// Result bytes the client read per second (1 MB = 10^6 bytes).
    pub mb_per_s: f64,
    /// CPU seconds the scheduler process spent.
    pub scheduler_cpu_s: f64,
    /// Its CPU seconds per GB relayed.
    pub scheduler_cpu_s_per_gb: f64,
    /// MB relayed per CPU second of the scheduler: what one core of it carries.
    pub mb_per_scheduler_cpu_s: f64,
    /// The scheduler's resident memory before the run.
    pub scheduler_rss_before_bytes: u64,
    /// Its peak resident memory during it.
    pub scheduler_peak_rss_bytes: u64,
    /// Results the client got more than once (must be 0).
    pub duplicate_results: u64,
    /// Tasks it never got a result for (must be 0).
    pub missing_results: u64,
}

/// Measures every size of `config` against the scheduler at `url` (process `scheduler_pid`).
pub async fn run_data_plane(
    url: &str,
    scheduler_pid: u32,
    agent_credentials: &ClientCredentials,
    client: &Cluster,
    config: &DataPlaneConfig,
) -> anyhow::Result<Vec<DataPlaneRow>> {
    let mut rows = Vec::new();
    for &size in &config.result_sizes {
        let spec = FleetSpec {
            agents: config.agents,
            gpus_per_agent: config.actors_per_agent,
            vram_per_gpu: 16 << 30,
            prefix: format!("data{size}"),
            result_bytes: Some(size),
        };
        let (fleet, _) = SimulatedFleet::start(url, agent_credentials, &spec).await?;
        let replicas = config.agents as u32 * config.actors_per_agent;
        let pool = client
            .create_pool(
                PoolSpec::new(format!("data-{size}"), "echo")
                    .replicas(replicas)
                    .gpus(1.0)
                    .vram_gib(1.0)
                    .max_in_flight_per_actor(config.credit)
                    .spread(),
            )
            .await?;
        pool.wait_ready(config.timeout).await?;
        let row = measure_one_size(scheduler_pid, &pool, size, replicas, config).await?;
        tracing::info!(size, mb_per_s = row.mb_per_s, "data plane");
        rows.push(row);
        pool.delete().await?;
        drop(fleet);
    }
    Ok(rows)
}

async fn measure_one_size(
    scheduler_pid: u32,
    pool: &resident_sdk::Pool,
    size: usize,
    replicas: u32,
    config: &DataPlaneConfig,
) -> anyhow::Result<DataPlaneRow> {
    let tasks = (config.bytes_per_size / size as u64).max(1);
    let rss_before = process_rss_bytes(scheduler_pid)?;
    let sampling = Arc::new(AtomicBool::new(true));
    let peak_rss = Arc::new(AtomicU64::new(rss_before));
    let sampler = tokio::spawn(sample_peak_rss(
        scheduler_pid,
        sampling.clone(),
        peak_rss.clone(),
    ));
    let cpu_before = process_cpu_seconds(scheduler_pid)?;
    let started = Instant::now();
    let inputs = futures::stream::iter(0..tasks).map(|seq| Bytes::from(seq.to_le_bytes().to_vec()));
    let options = SubmitOptions {
        window: replicas * config.credit,
        expected_tasks: tasks,
        ..Default::default()
    };
    let mut stream = pool
        .submit_payloads("data-plane", inputs.map(Into::into), options)
        .await?;
    let mut seen = vec![false; tasks as usize];
    let (mut duplicates, mut bytes) = (0u64, 0u64);
    let read = tokio::time::timeout(config.timeout, async {
        while let Some(output) = stream.next().await {
            let output = output?;
            let result = output
                .output
                .map_err(|e| anyhow::anyhow!("task {} failed: {e}", output.seq))?;
            anyhow::ensure!(result.len() == size, "a result of {} bytes", result.len());
            bytes += result.len() as u64;
            match seen.get_mut(output.seq as usize) {
                Some(seen) if *seen => duplicates += 1,
                Some(seen) => *seen = true,
                None => anyhow::bail!("a result for task {} never sent", output.seq),
            }
        }
        anyhow::Ok(())
    })
    .await;
    let seconds = started.elapsed().as_secs_f64();
    let cpu = process_cpu_seconds(scheduler_pid)? - cpu_before;
    sampling.store(false, Ordering::Relaxed);
    sampler.await??;
    read.map_err(|_| {
        anyhow::anyhow!(
            "results of {size} bytes: not all read within {:?}",
            config.timeout
        )
    })??;
    let gb = bytes as f64 / 1e9;
    Ok(DataPlaneRow {
        result_bytes: size,
        results: tasks,
        seconds,
        mb_per_s: bytes as f64 / 1e6 / seconds,
        scheduler_cpu_s: cpu,
        scheduler_cpu_s_per_gb: cpu / gb,
        mb_per_scheduler_cpu_s: bytes as f64 / 1e6 / cpu.max(1e-9),
        scheduler_rss_before_bytes: rss_before,
        scheduler_peak_rss_bytes: peak_rss.load(Ordering::Relaxed),
        duplicate_results: duplicates,
        missing_results: seen.iter().filter(|s| !**s).count() as u64,
    })
}

/// Keeps the largest RSS of the process seen every 10 ms in `peak`, while `sampling`.
async fn sample_peak_rss(
    pid: u32,
    sampling: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
) -> anyhow::Result<()> {
    while sampling.load(Ordering::Relaxed) {
        peak.fetch_max(process_rss_bytes(pid)?, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// The rows as a markdown table.
pub fn data_plane_table(rows: &[DataPlaneRow]) -> String {
    let mut out = String::from(
        "| result size | results | MB/s (client) | scheduler CPU-s per GB | MB per scheduler CPU-s | scheduler RSS before / peak MiB | duplicate / missing |\n|---|---|---|---|---|---|---|\n",
    );
    for row in rows {
        let size = match row.result_bytes {
            n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
            n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
            n => format!("{n} B"),
        };
        out.push_str(&format!(
            "| {size} | {} | {:.0} | {:.2} | {:.0} | {:.0} / {:.0} | {} / {} |\n",
            row.results,
            row.mb_per_s,
            row.scheduler_cpu_s_per_gb,
            row.mb_per_scheduler_cpu_s,
            row.scheduler_rss_before_bytes as f64 / (1 << 20) as f64,
            row.scheduler_peak_rss_bytes as f64 / (1 << 20) as f64,
            row.duplicate_results,
            row.missing_results,
        ));
    }
    out
}
