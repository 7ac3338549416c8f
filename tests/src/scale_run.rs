//! One scale run against a real scheduler process, measured in order: a simulated fleet
//! registers; pools totalling `actors_per_agent` actors per agent are placed and become
//! ready; no-op tasks flow through all of them (credit 2 per actor); the scheduler idles
//! with heartbeats flowing (its CPU and RSS are read from `/proc`); then a share of the
//! agents dies at once and their actors are placed on the others.
//!
//! `scale-bench` prints what it measures; the default suite runs it with 50 agents and checks
//! its invariants (every actor placed, every task answered exactly once, the lost actors
//! placed again elsewhere).

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use resident_proto::connect::ClientCredentials;
use resident_sdk::{Bytes, Cluster, PoolSpec, PoolStatus, SubmitOptions};
use serde::Serialize;

use crate::fleet::{FleetSpec, SimulatedFleet};

/// What a scale run simulates and measures.
#[derive(Clone, Debug)]
pub struct ScaleConfig {
    /// Simulated agents.
    pub agents: usize,
    /// GPUs each reports.
    pub gpus_per_agent: u32,
    /// Actors placed on each.
    pub actors_per_agent: u32,
    /// Each actor's share of a GPU. Below 1 leaves the room that re-placing lost actors
    /// needs: with a whole GPU each and 8 actors on 8 GPUs, the fleet is full.
    pub actor_gpus: f64,
    /// The actors are split evenly over this many pools, one job each.
    pub pools: usize,
    /// Tasks run through the placed actors.
    pub tasks: u64,
    /// How long the scheduler's idle CPU is measured.
    pub idle_window: Duration,
    /// The share of agents killed at once.
    pub lost_share: f64,
    /// Gives up on a phase after this long.
    pub phase_timeout: Duration,
    /// The scheduler's plain-HTTP port on loopback (`--http-listen`), when the run reads
    /// the loop's lag from `/metrics` while it places the actors.
    pub metrics_port: Option<u16>,
}

impl ScaleConfig {
    /// Actors over the whole fleet.
    pub fn total_actors(&self) -> u64 {
        self.agents as u64 * u64::from(self.actors_per_agent)
    }
}

/// What a run measured; the names are `scale-bench --json`'s.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ScaleReport {
    /// Agents registered.
    pub agents: usize,
    /// GPUs they report.
    pub gpus: u64,
    /// Actors placed.
    pub actors_placed: u64,
    /// Seconds until every agent registered.
    pub register_s: f64,
    /// Seconds from the pools' creation to every actor started.
    pub placement_s: f64,
    /// The scheduler loop's lag while it placed them (`resident_scheduler_loop_lag_seconds`,
    /// read before and after), when `metrics_port` is set.
    pub placement_loop_lag_p50_ms: f64,
    /// The loop lag's 99th percentile while placing.
    pub placement_loop_lag_p99_ms: f64,
    /// Tasks run.
    pub tasks: u64,
    /// Tasks per second with every job's window full.
    pub tasks_per_s: f64,
    /// The scheduler process's CPU time over the task phase, per task.
    pub scheduler_cpu_us_per_task: f64,
    /// Client send to result with every job's window full: queueing included.
    pub p50_task_ms: f64,
    /// The 99th percentile of the same.
    pub p99_task_ms: f64,
    /// One task at a time through an idle cluster: the round trip alone.
    pub p50_idle_task_ms: f64,
    /// The 99th percentile of the same.
    pub p99_idle_task_ms: f64,
    /// Results the client got more than once (must be 0), and tasks it never got (must be 0).
    pub duplicate_results: u64,
    /// Tasks never answered (must be 0).
    pub missing_results: u64,
    /// The scheduler's CPU use while the fleet idles, in cores.
    pub idle_cpu_ratio: f64,
    /// The scheduler's resident memory at the end.
    pub scheduler_rss_bytes: u64,
    /// Agents killed at once.
    pub agents_lost: usize,
    /// Actors they hosted.
    pub actors_lost: u64,
    /// Seconds until those actors were placed again.
    pub replace_after_loss_s: f64,
    /// Ready actors once the lost ones were placed again.
    pub actors_after_loss: u64,
}

/// Runs the phases against the scheduler at `url` (process `scheduler_pid`, for `/proc`).
pub async fn run_scale(
    url: &str,
    scheduler_pid: u32,
    agent_credentials: &ClientCredentials,
    client: &Cluster,
    config: &ScaleConfig,
) -> anyhow::Result<ScaleReport> {
    let mut report = ScaleReport {
        agents: config.agents,
        gpus: config.agents as u64 * u64::from(config.gpus_per_agent),
        ..Default::default()
    };
    let spec = FleetSpec {
        agents: config.agents,
        gpus_per_agent: config.gpus_per_agent,
        vram_per_gpu: 16 << 30,
        prefix: "sim".into(),
        result_bytes: None,
    };
    let (fleet, registered) = SimulatedFleet::start(url, agent_credentials, &spec).await?;
    report.register_s = registered.as_secs_f64();
    tracing::info!(
        agents = fleet.len(),
        seconds = report.register_s,
        "registered"
    );

    let lag_before = loop_lag(config.metrics_port)?;
    let started = Instant::now();
    let pools = create_pools(client, config).await?;
    let total = config.total_actors();
    report.actors_placed = wait_for_ready(client, &pools, total, &HashSet::new(), config).await?;
    report.placement_s = started.elapsed().as_secs_f64();
    let lag_after = loop_lag(config.metrics_port)?;
    report.placement_loop_lag_p50_ms =
        histogram_quantile_between(&lag_before, &lag_after, 0.5) * 1e3;
    report.placement_loop_lag_p99_ms =
        histogram_quantile_between(&lag_before, &lag_after, 0.99) * 1e3;
    tracing::info!(
        actors = report.actors_placed,
        seconds = report.placement_s,
        "placed"
    );

    let cpu_before = process_cpu_seconds(scheduler_pid)?;
    let mut latencies = run_tasks(client, &pools, config, &mut report).await?;
    report.scheduler_cpu_us_per_task =
        (process_cpu_seconds(scheduler_pid)? - cpu_before) * 1e6 / report.tasks.max(1) as f64;
    latencies.sort_unstable();
    report.p50_task_ms = percentile_ms(&latencies, 0.50);
    report.p99_task_ms = percentile_ms(&latencies, 0.99);
    tracing::info!(
        per_s = report.tasks_per_s,
        p99_ms = report.p99_task_ms,
        "tasks"
    );
    let mut idle = idle_round_trips(client, &pools[0], 1000).await?;
    idle.sort_unstable();
    report.p50_idle_task_ms = percentile_ms(&idle, 0.50);
    report.p99_idle_task_ms = percentile_ms(&idle, 0.99);

    tokio::time::sleep(Duration::from_millis(500)).await;
    let cpu_before = process_cpu_seconds(scheduler_pid)?;
    tokio::time::sleep(config.idle_window).await;
    let cpu_after = process_cpu_seconds(scheduler_pid)?;
    report.idle_cpu_ratio = (cpu_after - cpu_before) / config.idle_window.as_secs_f64();
    report.scheduler_rss_bytes = process_rss_bytes(scheduler_pid)?;

    let lose = ((config.agents as f64 * config.lost_share).ceil() as usize).min(fleet.len());
    let started = Instant::now();
    let (lost_nodes, lost_actors) = fleet.kill_first(lose);
    report.agents_lost = lose;
    report.actors_lost = lost_actors;
    let lost: HashSet<String> = lost_nodes.into_iter().collect();
    report.actors_after_loss = wait_for_ready(client, &pools, total, &lost, config).await?;
    report.replace_after_loss_s = started.elapsed().as_secs_f64();
    tracing::info!(
        seconds = report.replace_after_loss_s,
        "re-placed after loss"
    );
    drop(fleet);
    Ok(report)
}

async fn create_pools(client: &Cluster, config: &ScaleConfig) -> anyhow::Result<Vec<String>> {
    let total = config.total_actors();
    let pools = config.pools.max(1) as u64;
    let mut names = Vec::new();
    for index in 0..pools {
        let replicas = total / pools + u64::from(index < total % pools);
        let name = format!("scale-{index}");
        client
            .create_pool(
                PoolSpec::new(&name, "echo")
                    .replicas(replicas as u32)
                    .gpus(config.actor_gpus)
                    .vram_gib(2.0)
                    .max_in_flight_per_actor(2)
                    .spread(),
            )
            .await?;
        names.push(name);
    }
    Ok(names)
}

/// Polls the pools until `want` actors are ready, none of them on a `lost` node; returns
/// how many are. With no lost node it reads only the pools' ready counts (a full listing
/// of 80,000 actors every 20 ms would be most of what the scheduler's loop does).
async fn wait_for_ready(
    client: &Cluster,
    pools: &[String],
    want: u64,
    lost: &HashSet<String>,
    config: &ScaleConfig,
) -> anyhow::Result<u64> {
    let started = Instant::now();
    loop {
        let listed = match lost.is_empty() {
            true => client.list_pool_summaries().await?,
            false => client.list_pools().await?,
        };
        let statuses: Vec<PoolStatus> = listed
            .into_iter()
            .filter(|p| pools.iter().any(|name| name == p.spec.name()))
            .collect();
        let ready = match lost.is_empty() {
            true => statuses.iter().map(|p| u64::from(p.ready_actors)).sum(),
            false => statuses
                .iter()
                .flat_map(|p| &p.actors)
                .filter(|a| a.state == resident_sdk::ActorState::Ready)
                .filter(|a| {
                    a.node_id
                        .as_ref()
                        .is_none_or(|n| !lost.contains(n.as_str()))
                })
                .count() as u64,
        };
        if ready >= want {
            return Ok(ready);
        }
        if started.elapsed() > config.phase_timeout {
            let why: Vec<&str> = statuses
                .iter()
                .filter_map(|p| p.unplaced_reason.as_deref())
                .collect();
            anyhow::bail!(
                "{ready} of {want} actors ready after {:?}; unplaced: {why:?}",
                config.phase_timeout
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One job per pool, all at once; returns each task's latency (client send to result) in
/// microseconds, and counts duplicates and missing results into `report`.
async fn run_tasks(
    client: &Cluster,
    pools: &[String],
    config: &ScaleConfig,
    report: &mut ScaleReport,
) -> anyhow::Result<Vec<u32>> {
    let per_pool = config.tasks / pools.len() as u64;
    let replicas = config.total_actors() / pools.len() as u64;
    let base = Instant::now();
    let started = Instant::now();
    let mut jobs = Vec::new();
    for name in pools {
        let sent: Arc<Vec<AtomicU64>> =
            Arc::new((0..per_pool).map(|_| AtomicU64::new(0)).collect());
        let stamps = sent.clone();
        let inputs = futures::stream::iter(0..per_pool).map(move |seq| {
            stamps[seq as usize].store(base.elapsed().as_micros() as u64, Ordering::Relaxed);
            Bytes::from(seq.to_le_bytes().to_vec())
        });
        let options = SubmitOptions {
            window: (replicas * 2).min(u64::from(u32::MAX)) as u32,
            expected_tasks: per_pool,
            ..Default::default()
        };
        let stream = client
            .pool(name.clone())
            .submit_payloads("scale", inputs.map(Into::into), options)
            .await?;
        jobs.push(tokio::spawn(async move {
            let mut stream = stream;
            let mut seen = vec![false; per_pool as usize];
            let mut latencies = Vec::with_capacity(per_pool as usize);
            let mut duplicates = 0u64;
            while let Some(output) = stream.next().await {
                let output = output?;
                let now = base.elapsed().as_micros() as u64;
                if output.output.is_err() {
                    anyhow::bail!("task {} failed: {:?}", output.seq, output.output);
                }
                match seen.get_mut(output.seq as usize) {
                    Some(seen) if *seen => duplicates += 1,
                    Some(seen) => *seen = true,
                    None => anyhow::bail!("a result for task {} never sent", output.seq),
                }
                let sent_at = sent[output.seq as usize].load(Ordering::Relaxed);
                latencies.push(now.saturating_sub(sent_at).min(u64::from(u32::MAX)) as u32);
            }
            let missing = seen.iter().filter(|s| !**s).count() as u64;
            anyhow::Ok((latencies, duplicates, missing))
        }));
    }
    let mut latencies = Vec::new();
    for job in jobs {
        let (mut job_latencies, duplicates, missing) = job.await??;
        latencies.append(&mut job_latencies);
        report.duplicate_results += duplicates;
        report.missing_results += missing;
    }
    report.tasks = per_pool * pools.len() as u64;
    report.tasks_per_s = report.tasks as f64 / started.elapsed().as_secs_f64();
    Ok(latencies)
}

/// `count` tasks one after another on one call session, each timed alone (microseconds).
async fn idle_round_trips(client: &Cluster, pool: &str, count: usize) -> anyhow::Result<Vec<u32>> {
    let mut session = client.pool(pool).session().await?;
    let mut latencies = Vec::with_capacity(count);
    for i in 0..count {
        let started = Instant::now();
        session.call(Bytes::from(i.to_le_bytes().to_vec())).await?;
        latencies.push(started.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
    }
    Ok(latencies)
}

/// The `quantile` (0 to 1) of sorted latencies in microseconds, in milliseconds (the
/// nearest rank; 0 when there are none).
pub fn percentile_ms(sorted_micros: &[u32], quantile: f64) -> f64 {
    if sorted_micros.is_empty() {
        return 0.0;
    }
    let index = ((sorted_micros.len() - 1) as f64 * quantile).round() as usize;
    f64::from(sorted_micros[index]) / 1000.0
}

/// User plus system CPU seconds of a process (`/proc/PID/stat`, in clock ticks of 1/100 s).
pub fn process_cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name may hold spaces; the fields after it are fixed.
    let after_name = stat
        .rsplit_once(')')
        .ok_or_else(|| anyhow::anyhow!("unexpected /proc/{pid}/stat"))?
        .1;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |i: usize| -> anyhow::Result<f64> { Ok(fields[i].parse::<f64>()?) };
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 after the name.
    Ok((ticks(11)? + ticks(12)?) / 100.0)
}

/// Resident set size of a process (`VmRSS` in `/proc/PID/status`).
pub fn process_rss_bytes(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .ok_or_else(|| anyhow::anyhow!("no VmRSS in /proc/{pid}/status"))?
        .parse::<u64>()?;
    Ok(kib * 1024)
}

/// The scheduler loop's lag histogram from `/metrics` on loopback `port` (empty without one).
fn loop_lag(port: Option<u16>) -> anyhow::Result<Vec<(f64, u64)>> {
    use std::io::{Read, Write};
    let Some(port) = port else {
        return Ok(Vec::new());
    };
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    anyhow::ensure!(
        response.starts_with("HTTP/1.0 200") || response.starts_with("HTTP/1.1 200"),
        "GET /metrics: {}",
        response.lines().next().unwrap_or("no answer")
    );
    Ok(histogram_buckets(
        &response,
        "resident_scheduler_loop_lag_seconds",
    ))
}

/// One Prometheus histogram as `/metrics` shows it: `(upper bound, cumulative count)` per
/// bucket, `+Inf` last.
pub fn histogram_buckets(metrics_text: &str, name: &str) -> Vec<(f64, u64)> {
    let prefix = format!("{name}_bucket{{le=\"");
    metrics_text
        .lines()
        .filter_map(|line| line.strip_prefix(&prefix))
        .filter_map(|rest| {
            let (bound, count) = rest.split_once("\"} ")?;
            let bound = if bound == "+Inf" {
                f64::INFINITY
            } else {
                bound.parse().ok()?
            };
            Some((bound, count.trim().parse().ok()?))
        })
        .collect()
}

/// The `quantile` of what a histogram observed between two reads of it (`before`, `after`:
/// [`histogram_buckets`]), interpolated inside its bucket as Prometheus' `histogram_quantile`
/// does; the largest finite bound when it falls in `+Inf`, 0 when nothing was observed.
pub fn histogram_quantile_between(
    before: &[(f64, u64)],
    after: &[(f64, u64)],
    quantile: f64,
) -> f64 {
    let counted = |bound: f64| {
        let of = |buckets: &[(f64, u64)]| {
            buckets
                .iter()
                .find(|(b, _)| *b == bound)
                .map_or(0, |(_, c)| *c)
        };
        of(after).saturating_sub(of(before))
    };
    let total = after.last().map_or(0, |(bound, _)| counted(*bound));
    if total == 0 {
        return 0.0;
    }
    let rank = quantile * total as f64;
    let mut lower = (0.0, 0u64);
    for &(bound, _) in after {
        let count = counted(bound);
        if count as f64 >= rank {
            if bound.is_infinite() {
                return lower.0;
            }
            let inside = (count - lower.1).max(1) as f64;
            return lower.0 + (bound - lower.0) * (rank - lower.1 as f64) / inside;
        }
        lower = (bound, count);
    }
    lower.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_quantile_is_read_between_two_scrapes() {
        let text = |counts: [u64; 4]| {
            format!(
                "# TYPE lag histogram\nlag_sum 1.0\nlag_count {}\nlag_bucket{{le=\"0.01\"}} {}\n\
                 lag_bucket{{le=\"0.1\"}} {}\nlag_bucket{{le=\"1.0\"}} {}\nlag_bucket{{le=\"+Inf\"}} {}\n",
                counts[3], counts[0], counts[1], counts[2], counts[3]
            )
        };
        let before = histogram_buckets(&text([5, 5, 5, 5]), "lag");
        assert_eq!(before.len(), 4);
        // 100 new observations: 90 under 10 ms, 10 between 100 ms and 1 s.
        let after = histogram_buckets(&text([95, 95, 105, 105]), "lag");
        let p50 = histogram_quantile_between(&before, &after, 0.5);
        assert!((p50 - 0.01 * 50.0 / 90.0).abs() < 1e-9, "{p50}");
        let p99 = histogram_quantile_between(&before, &after, 0.99);
        assert!((p99 - (0.1 + 0.9 * 9.0 / 10.0)).abs() < 1e-9, "{p99}");
        assert_eq!(histogram_quantile_between(&after, &after, 0.99), 0.0);
        // Past the last finite bound: that bound.
        let spilled = histogram_buckets(&text([5, 5, 5, 25]), "lag");
        assert_eq!(histogram_quantile_between(&before, &spilled, 0.99), 1.0);
    }
}
