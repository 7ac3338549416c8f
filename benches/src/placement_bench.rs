//! The scheduler core at 10,000 nodes, in this process: how long it takes to place a
//! fleet-wide set of actors, and how late the loop answers meanwhile.
//!
//! The real scheduler loop (`spawn_scheduler_loop`, its production intervals, a redb store
//! in a temporary directory) hosts N simulated nodes of G GPUs. They are not gRPC sessions:
//! each node is the channel the loop sends its messages to, and one task plays every agent.
//! It reports each started actor ready at once, sends every node's heartbeat (listing its
//! actors) every 2 s, and stamps the node as heard. `scale-bench` covers the network side
//! with real sessions; this covers what gRPC cannot reach on one machine: 10,000 x 8.
//!
//! Measured, in order:
//! - registering the nodes;
//! - creating the pools and placing every actor, until each node was told to start its
//!   actors, while a probe asks the loop a cheap question (`GetJob`) every 10 ms and times
//!   the answer: that is the loop's lag as a client sees it;
//! - losing 10% of the nodes at once and placing their actors again.
//!
//! `cargo build --release -p resident-bench && target/release/placement-bench`

mod cpu_model;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use cpu_model::cpu_model;
use resident_proto::pb;
use resident_scheduler::core::{
    CoreConfig, LastHeard, SchedulerCommand, SchedulerHandle, SessionId, spawn_scheduler_loop,
};
use resident_scheduler::store::RedbStore;
use resident_tests::scale_run::{histogram_buckets, histogram_quantile_between, percentile_ms};
use tokio::sync::mpsc;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
struct Args {
    /// Simulated nodes.
    #[arg(long, default_value_t = 10_000)]
    nodes: usize,
    /// GPUs per node (24 GiB each).
    #[arg(long, default_value_t = 8)]
    gpus_per_node: u32,
    /// Actors placed per node, over all pools.
    #[arg(long, default_value_t = 8)]
    actors_per_node: u32,
    /// Pools the actors are split over.
    #[arg(long, default_value_t = 8)]
    pools: u32,
    /// Each actor's share of a GPU (below 1 leaves room to re-place lost actors).
    #[arg(long, default_value_t = 0.5)]
    actor_gpus: f64,
    /// `pack` or `spread`.
    #[arg(long, default_value = "spread")]
    strategy: String,
    /// Share of nodes lost at once.
    #[arg(long, default_value_t = 0.1)]
    lose: f64,
}

type AgentRx = mpsc::UnboundedReceiver<Result<pb::SchedulerMessage, tonic::Status>>;

/// One simulated node: the loop's channel to it and the actors it hosts.
struct SimulatedNode {
    session: SessionId,
    rx: AgentRx,
    heard: LastHeard,
    actors: Vec<(String, u64)>,
    gpus: Vec<pb::GpuInfo>,
}

/// How many actors the loop has asked the nodes to start, in all, and how many each node
/// hosts now.
struct Started {
    total: AtomicU64,
    hosted: Vec<AtomicU64>,
}

impl Started {
    fn new(nodes: usize) -> Self {
        Self {
            total: AtomicU64::new(0),
            hosted: (0..nodes).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn count(&self) -> u64 {
        self.total.load(Ordering::SeqCst)
    }

    /// The actors the first `nodes` nodes host now.
    fn hosted_by_first(&self, nodes: usize) -> u64 {
        self.hosted[..nodes]
            .iter()
            .map(|count| count.load(Ordering::SeqCst))
            .sum()
    }
}

fn gpus(count: u32) -> Vec<pb::GpuInfo> {
    (0..count)
        .map(|index| pb::GpuInfo {
            index,
            name: "NVIDIA A10G".into(),
            total_vram_bytes: 24 << 30,
            free_vram_bytes: 24 << 30,
            compute_major: 8,
            compute_minor: 6,
            ..Default::default()
        })
        .collect()
}

async fn register(
    handle: &SchedulerHandle,
    index: usize,
    gpu_count: u32,
) -> anyhow::Result<SimulatedNode> {
    let (outbound, rx) = mpsc::unbounded_channel();
    let heard = LastHeard::now();
    let gpus = gpus(gpu_count);
    let register = pb::RegisterNode {
        node_id: format!("node-{index:05}"),
        generation: format!("gen-{index}"),
        cpu_cores: 32,
        gpus: gpus.clone(),
        actor_kinds: vec!["echo".into()],
        ..Default::default()
    };
    let session = handle
        .call(|reply| SchedulerCommand::RegisterNode {
            register,
            credential: "anonymous".into(),
            outbound,
            last_heard: heard.clone(),
            reply,
        })
        .await?;
    Ok(SimulatedNode {
        session,
        rx,
        heard,
        actors: Vec::new(),
        gpus,
    })
}

/// Plays every node's agent until `stop`: starts (at once) and stops what the loop asks,
/// and sends each node's heartbeat every `heartbeat`, spread evenly over that period.
async fn play_agents(
    handle: SchedulerHandle,
    mut nodes: Vec<SimulatedNode>,
    started: Arc<Started>,
    heartbeat: Duration,
    stop: Arc<AtomicBool>,
) -> Vec<SimulatedNode> {
    const TURN: Duration = Duration::from_millis(20);
    let phases = (heartbeat.as_millis() / TURN.as_millis()).max(1) as usize;
    let mut turn = 0usize;
    while !stop.load(Ordering::SeqCst) {
        let phase = turn % phases;
        for (index, node) in nodes.iter_mut().enumerate() {
            let mut reports = Vec::new();
            while let Ok(Ok(message)) = node.rx.try_recv() {
                match message.body {
                    Some(pb::scheduler_message::Body::StartActor(start)) => {
                        node.actors
                            .push((start.actor_id.clone(), start.incarnation));
                        reports.push(ready(&start.actor_id, start.incarnation));
                        started.total.fetch_add(1, Ordering::SeqCst);
                    }
                    Some(pb::scheduler_message::Body::StopActor(stop)) => {
                        node.actors.retain(|(id, _)| *id != stop.actor_id);
                    }
                    _ => {}
                }
            }
            started.hosted[index].store(node.actors.len() as u64, Ordering::SeqCst);
            for report in reports {
                let message = pb::agent_message::Body::ActorReport(report);
                let _ = handle.send(agent_message(node.session, message)).await;
            }
            if index % phases == phase {
                node.heard.heard();
                let beat = pb::Heartbeat {
                    gpus: node.gpus.clone(),
                    actors: node
                        .actors
                        .iter()
                        .map(|(id, inc)| ready(id, *inc))
                        .collect(),
                };
                let message = pb::agent_message::Body::Heartbeat(beat);
                let _ = handle.send(agent_message(node.session, message)).await;
            }
        }
        turn += 1;
        tokio::time::sleep(TURN).await;
    }
    nodes
}

fn agent_message(session: SessionId, message: pb::agent_message::Body) -> SchedulerCommand {
    SchedulerCommand::AgentMessage { session, message }
}

fn ready(actor_id: &str, incarnation: u64) -> pb::ActorReport {
    pb::ActorReport {
        actor_id: actor_id.to_owned(),
        incarnation,
        state: pb::ActorState::Ready as i32,
        model_loads: 1,
        ..Default::default()
    }
}

/// Times a cheap question to the loop every 10 ms until `stop`; the answer times in µs.
async fn probe_loop(handle: SchedulerHandle, stop: Arc<AtomicBool>) -> Vec<u32> {
    let mut times = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        let asked = Instant::now();
        let _ = handle
            .call(|reply| SchedulerCommand::GetJob {
                job: resident_proto::JobId::new("probe"),
                reply,
            })
            .await;
        times.push(asked.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    times
}

/// Waits until `started` reaches `want`, giving up after ten minutes.
async fn until_started(started: &Started, want: u64) -> anyhow::Result<Duration> {
    let begun = Instant::now();
    while started.count() < want {
        anyhow::ensure!(
            begun.elapsed() < Duration::from_secs(600),
            "only {} of {want} actors started after 10 minutes",
            started.count()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(begun.elapsed())
}

/// What a phase cost the loop: the probe's answer times (µs, sorted) and the loop's own lag
/// histogram over the phase (its timer, every 20 ms, measures how late the loop runs).
struct LoopCost {
    answers: Vec<u32>,
    lag_before: Vec<(f64, u64)>,
    lag_after: Vec<(f64, u64)>,
}

impl LoopCost {
    fn answer_cell(&self) -> String {
        format!(
            "{:.1} / {:.1} / {:.1} ms ({} questions)",
            percentile_ms(&self.answers, 0.50),
            percentile_ms(&self.answers, 0.99),
            percentile_ms(&self.answers, 1.0),
            self.answers.len()
        )
    }

    fn lag_cell(&self) -> String {
        let ms = |q| histogram_quantile_between(&self.lag_before, &self.lag_after, q) * 1e3;
        format!("{:.1} / {:.1} ms", ms(0.50), ms(0.99))
    }
}

const LOOP_LAG: &str = "resident_scheduler_loop_lag_seconds";

fn scrape(registry: &prometheus_client::registry::Registry) -> anyhow::Result<String> {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry)?;
    Ok(text)
}

/// Runs `phase` with the loop probe going; its result, and what it cost the loop.
async fn probed<T>(
    handle: &SchedulerHandle,
    registry: &prometheus_client::registry::Registry,
    phase: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<(T, LoopCost)> {
    let lag_before = histogram_buckets(&scrape(registry)?, LOOP_LAG);
    let stop = Arc::new(AtomicBool::new(false));
    let probe = tokio::spawn(probe_loop(handle.clone(), stop.clone()));
    let result = phase.await;
    stop.store(true, Ordering::SeqCst);
    let mut answers = probe.await?;
    answers.sort_unstable();
    let lag_after = histogram_buckets(&scrape(registry)?, LOOP_LAG);
    Ok((
        result?,
        LoopCost {
            answers,
            lag_before,
            lag_after,
        },
    ))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let state = tempfile::tempdir()?;
    let config = CoreConfig::default();
    let heartbeat = config.heartbeat_interval;
    let store = Arc::new(RedbStore::open(state.path())?);
    let cancel = tokio_util::sync::CancellationToken::new();
    let (handle, loop_task) = spawn_scheduler_loop(config, store, cancel.clone())?;
    let mut registry = prometheus_client::registry::Registry::default();
    handle.metrics().register(&mut registry);

    let registering = Instant::now();
    let mut nodes = Vec::with_capacity(args.nodes);
    for index in 0..args.nodes {
        nodes.push(register(&handle, index, args.gpus_per_node).await?);
    }
    let register_s = registering.elapsed().as_secs_f64();
    eprintln!("registered {} nodes in {register_s:.2} s", args.nodes);
    let sessions: Vec<SessionId> = nodes.iter().map(|n| n.session).collect();

    let started = Arc::new(Started::new(args.nodes));
    let stop_agents = Arc::new(AtomicBool::new(false));
    let agents = tokio::spawn(play_agents(
        handle.clone(),
        nodes,
        started.clone(),
        heartbeat,
        stop_agents.clone(),
    ));

    let total = args.nodes as u64 * u64::from(args.actors_per_node);
    let place_started = Instant::now();
    let ((), placing) = probed(&handle, &registry, async {
        create_pools(&handle, &args, total).await?;
        until_started(&started, total).await?;
        Ok(())
    })
    .await?;
    let place_s = place_started.elapsed().as_secs_f64();
    eprintln!("placed {total} actors in {place_s:.2} s");

    let lose = ((args.nodes as f64 * args.lose).ceil() as usize).min(args.nodes);
    let before = started.count();
    let lost_actors = started.hosted_by_first(lose);
    let losing = Instant::now();
    let (_, replacing) = probed(&handle, &registry, async {
        for &session in sessions.iter().take(lose) {
            handle.send(SchedulerCommand::AgentGone { session }).await?;
        }
        until_started(&started, before + lost_actors).await
    })
    .await?;
    let replace_s = losing.elapsed().as_secs_f64();

    stop_agents.store(true, Ordering::SeqCst);
    drop(agents.await?);
    cancel.cancel();
    loop_task.await?;

    print_table(
        &args,
        Figures {
            register_s,
            total,
            place_s,
            placing,
            lose,
            lost_actors,
            replace_s,
            replacing,
        },
    );
    Ok(())
}

/// What one run measured.
struct Figures {
    register_s: f64,
    total: u64,
    place_s: f64,
    placing: LoopCost,
    lose: usize,
    lost_actors: u64,
    replace_s: f64,
    replacing: LoopCost,
}

/// Asks for `total` actors over `args.pools` pools of the echo kind.
async fn create_pools(handle: &SchedulerHandle, args: &Args, total: u64) -> anyhow::Result<()> {
    let strategy = match args.strategy.as_str() {
        "pack" => pb::PlacementStrategy::Pack,
        "spread" => pb::PlacementStrategy::Spread,
        other => anyhow::bail!("--strategy {other}: use pack or spread"),
    };
    for index in 0..args.pools {
        let replicas = total / u64::from(args.pools)
            + u64::from(u64::from(index) < total % u64::from(args.pools));
        let spec = pb::PoolSpec {
            name: format!("fleet-{index}"),
            actor_kind: "echo".into(),
            replicas: replicas as u32,
            resources: Some(pb::ResourceRequest {
                gpus: args.actor_gpus,
                vram_bytes: 2 << 30,
                strategy: strategy as i32,
                ..Default::default()
            }),
            ..Default::default()
        };
        handle
            .call(|reply| SchedulerCommand::CreatePool {
                spec,
                requester: resident_scheduler::auth::Principal::anonymous(),
                reply,
            })
            .await?;
    }
    Ok(())
}

/// Prints the run's table.
fn print_table(args: &Args, f: Figures) {
    let cpu = cpu_model();
    let rows = [
        ("CPU", cpu),
        (
            "nodes x GPUs",
            format!("{} x {}", args.nodes, args.gpus_per_node),
        ),
        ("time to register them", format!("{:.2} s", f.register_s)),
        (
            "actors placed",
            format!(
                "{} in {} pools ({}, {} GPU each)",
                f.total, args.pools, args.strategy, args.actor_gpus
            ),
        ),
        (
            "time from the first CreatePool to every actor started",
            format!("{:.2} s", f.place_s),
        ),
        ("loop lag while placing, p50 / p99", f.placing.lag_cell()),
        (
            "a question's answer time while placing, p50 / p99 / max",
            f.placing.answer_cell(),
        ),
        (
            "nodes lost at once / their actors",
            format!("{} / {}", f.lose, f.lost_actors),
        ),
        ("time to place them again", format!("{:.2} s", f.replace_s)),
        (
            "loop lag while re-placing, p50 / p99",
            f.replacing.lag_cell(),
        ),
        (
            "a question's answer time while re-placing, p50 / p99 / max",
            f.replacing.answer_cell(),
        ),
    ];
    println!("| measure | value |\n|---|---|");
    for (measure, value) in rows {
        println!("| {measure} | {value} |");
    }
}
