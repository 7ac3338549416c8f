//! A simulated fleet for scale runs: many agents in one process, each a tokio task with its
//! own gRPC session (and its own connection) to a real scheduler, simulated GPUs, and no-op
//! `echo` actors that load at once and answer every task at once. It speaks the agent
//! protocol itself instead of running `resident agent`, whose actors are OS threads: the
//! point is to load the scheduler, not this process.
//!
//! `scale-bench` runs a fleet of 1,000; the default suite runs the same code with 50
//! (`scale_run`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use resident_proto::connect::{BearerToken, ClientCredentials, scheduler_endpoint};
use resident_proto::pb;
use resident_proto::pb::node_agent_service_client::NodeAgentServiceClient;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::sync::CancellationToken;

/// What each simulated agent offers.
#[derive(Clone, Debug)]
pub struct FleetSpec {
    /// Simulated agents.
    pub agents: usize,
    /// GPUs each reports.
    pub gpus_per_agent: u32,
    /// VRAM of each GPU, bytes.
    pub vram_per_gpu: u64,
    /// Node ids are `{prefix}-{index:05}`.
    pub prefix: String,
    /// Each task's result: its payload echoed (`None`), or this many bytes (for measuring
    /// the results data plane with small inputs).
    pub result_bytes: Option<usize>,
}

/// Counters one simulated agent keeps, read by the scale run.
#[derive(Debug, Default)]
pub struct AgentCounters {
    /// Actors it hosts now.
    pub actors: AtomicU64,
    /// Tasks it answered.
    pub tasks_answered: AtomicU64,
    /// Heartbeats it sent.
    pub heartbeats: AtomicU64,
}

struct SimulatedAgent {
    node_id: String,
    counters: Arc<AgentCounters>,
    stop: CancellationToken,
}

/// The running fleet; dropping it ends every agent's session.
pub struct SimulatedFleet {
    agents: Vec<SimulatedAgent>,
}

impl Drop for SimulatedFleet {
    fn drop(&mut self) {
        for agent in &self.agents {
            agent.stop.cancel();
        }
    }
}

/// One actor a simulated agent hosts.
struct SimActor {
    incarnation: u64,
    gpu_indices: Vec<u32>,
    vram_bytes: u64,
    tasks_done: u64,
}

impl SimulatedFleet {
    /// Starts every agent at once and returns when all are registered (or the first one
    /// could not), with how long that took.
    pub async fn start(
        url: &str,
        credentials: &ClientCredentials,
        spec: &FleetSpec,
    ) -> anyhow::Result<(Self, Duration)> {
        let endpoint = scheduler_endpoint(url, credentials)?
            .connect_timeout(Duration::from_secs(30))
            .tcp_nodelay(true);
        let token = BearerToken::new(credentials.token.as_deref())?;
        let started = Instant::now();
        let (registered_tx, mut registered) = mpsc::unbounded_channel();
        let mut agents = Vec::with_capacity(spec.agents);
        for index in 0..spec.agents {
            let node_id = format!("{}-{index:05}", spec.prefix);
            let counters = Arc::new(AgentCounters::default());
            let stop = CancellationToken::new();
            let session = AgentSession {
                endpoint: endpoint.clone(),
                token: token.clone(),
                register: register_message(&node_id, spec),
                result: spec
                    .result_bytes
                    .map(|len| resident_sdk::Bytes::from(vec![0x5a; len])),
                counters: counters.clone(),
                stop: stop.clone(),
            };
            let registered_tx = registered_tx.clone();
            tokio::spawn(async move {
                let node = session.register.node_id.clone();
                if let Err(error) = session.run(&registered_tx).await {
                    let _ = registered_tx.send(Err(format!("{node}: {error:#}")));
                }
            });
            agents.push(SimulatedAgent {
                node_id,
                counters,
                stop,
            });
        }
        let fleet = Self { agents };
        for _ in 0..spec.agents {
            match registered.recv().await {
                Some(Ok(())) => {}
                Some(Err(error)) => anyhow::bail!("a simulated agent failed: {error}"),
                None => anyhow::bail!("the simulated agents stopped"),
            }
        }
        Ok((fleet, started.elapsed()))
    }

    /// Agents in the fleet.
    pub fn len(&self) -> usize {
        self.agents.len()
    }

    /// Whether the fleet has no agent.
    pub fn is_empty(&self) -> bool {
        self.agents.is_empty()
    }

    /// Tasks answered by every agent, killed ones included.
    pub fn tasks_answered(&self) -> u64 {
        self.agents
            .iter()
            .map(|a| a.counters.tasks_answered.load(Ordering::Relaxed))
            .sum()
    }

    /// Actors hosted by the agents still running.
    pub fn actors(&self) -> u64 {
        self.agents
            .iter()
            .filter(|a| !a.stop.is_cancelled())
            .map(|a| a.counters.actors.load(Ordering::Relaxed))
            .sum()
    }

    /// Ends the sessions of the first `count` agents at once, as if their hosts died;
    /// returns their node ids and how many actors they hosted.
    pub fn kill_first(&self, count: usize) -> (Vec<String>, u64) {
        let mut actors = 0;
        let killed = self
            .agents
            .iter()
            .take(count)
            .map(|agent| {
                actors += agent.counters.actors.load(Ordering::Relaxed);
                agent.stop.cancel();
                agent.node_id.clone()
            })
            .collect();
        (killed, actors)
    }
}

fn register_message(node_id: &str, spec: &FleetSpec) -> pb::RegisterNode {
    pb::RegisterNode {
        node_id: node_id.to_owned(),
        generation: format!("{node_id}-{}", std::process::id()),
        hostname: node_id.to_owned(),
        labels: Default::default(),
        gpus: (0..spec.gpus_per_agent)
            .map(|index| pb::GpuInfo {
                index,
                uuid: format!("GPU-{node_id}-{index}"),
                name: "Tesla T4".into(),
                total_vram_bytes: spec.vram_per_gpu,
                free_vram_bytes: spec.vram_per_gpu,
                compute_major: 7,
                compute_minor: 5,
                simulated: true,
                utilization_ratio: None,
            })
            .collect(),
        cpu_cores: 32,
        ram_bytes: 256 << 30,
        actor_kinds: vec!["echo".into()],
        unavailable_gpus: Vec::new(),
        inventory: Vec::new(),
    }
}

/// One agent's session: register, then answer the scheduler and send heartbeats.
struct AgentSession {
    endpoint: tonic::transport::Endpoint,
    token: BearerToken,
    register: pb::RegisterNode,
    /// Every task's result when set (shared, so answering copies nothing here).
    result: Option<resident_sdk::Bytes>,
    counters: Arc<AgentCounters>,
    stop: CancellationToken,
}

type Uplink = mpsc::UnboundedSender<pb::AgentMessage>;

fn send(uplink: &Uplink, body: pb::agent_message::Body) {
    let _ = uplink.send(pb::AgentMessage { body: Some(body) });
}

impl AgentSession {
    /// Dials and registers; a refused or reset connection (a full accept queue when
    /// thousands dial at once) is tried again after a growing, jittered pause, as real
    /// agents do.
    async fn register(
        &self,
    ) -> anyhow::Result<(Uplink, tonic::Streaming<pb::SchedulerMessage>, u64)> {
        let mut pause = Duration::from_millis(50);
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.try_register().await {
                Ok(registered) => return Ok(registered),
                Err(error) if attempt < 20 => {
                    tracing::debug!(node = %self.register.node_id, %error, "registration failed; retrying");
                    // Spread the retries by node id, so agents refused together do not
                    // all dial again in the same instant.
                    let jitter = self
                        .register
                        .node_id
                        .bytes()
                        .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)))
                        % 97;
                    tokio::time::sleep(pause + Duration::from_millis(jitter * attempt)).await;
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
                Err(error) => return Err(error),
            }
        }
    }

    async fn try_register(
        &self,
    ) -> anyhow::Result<(Uplink, tonic::Streaming<pb::SchedulerMessage>, u64)> {
        let channel = self.endpoint.connect().await?;
        let mut client = NodeAgentServiceClient::with_interceptor(channel, self.token.clone());
        let (uplink, uplink_rx) = mpsc::unbounded_channel();
        send(
            &uplink,
            pb::agent_message::Body::Register(self.register.clone()),
        );
        let mut inbound = client
            .session(UnboundedReceiverStream::new(uplink_rx))
            .await?
            .into_inner();
        let heartbeat_ms = match inbound.message().await?.and_then(|m| m.body) {
            Some(pb::scheduler_message::Body::Registered(r)) => r.heartbeat_interval_ms.max(10),
            other => anyhow::bail!("expected Registered, got {other:?}"),
        };
        Ok((uplink, inbound, heartbeat_ms))
    }

    async fn run(
        self,
        registered: &mpsc::UnboundedSender<Result<(), String>>,
    ) -> anyhow::Result<()> {
        let (uplink, mut inbound, heartbeat_ms) = self.register().await?;
        let _ = registered.send(Ok(()));
        let mut heartbeat = tokio::time::interval(Duration::from_millis(heartbeat_ms));
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut actors: HashMap<String, SimActor> = HashMap::new();
        loop {
            tokio::select! {
                _ = self.stop.cancelled() => return Ok(()),
                message = inbound.message() => match message {
                    Ok(Some(pb::SchedulerMessage { body: Some(body) })) => {
                        self.obey(body, &mut actors, &uplink);
                    }
                    Ok(Some(_)) => {}
                    // The scheduler ended the session; the run is over.
                    Ok(None) | Err(_) => return Ok(()),
                },
                _ = heartbeat.tick() => {
                    self.counters.heartbeats.fetch_add(1, Ordering::Relaxed);
                    send(&uplink, pb::agent_message::Body::Heartbeat(self.heartbeat(&actors)));
                }
            }
        }
    }

    fn obey(
        &self,
        body: pb::scheduler_message::Body,
        actors: &mut HashMap<String, SimActor>,
        uplink: &Uplink,
    ) {
        use pb::scheduler_message::Body;
        match body {
            Body::StartActor(start) => {
                let actor = SimActor {
                    incarnation: start.incarnation,
                    gpu_indices: start.gpu_indices,
                    vram_bytes: start.vram_bytes,
                    tasks_done: 0,
                };
                send(
                    uplink,
                    pb::agent_message::Body::ActorReport(report(&start.actor_id, &actor)),
                );
                actors.insert(start.actor_id, actor);
                self.counters
                    .actors
                    .store(actors.len() as u64, Ordering::Relaxed);
            }
            Body::StopActor(stop) => {
                if let Some(actor) = actors.remove(&stop.actor_id) {
                    send(
                        uplink,
                        pb::agent_message::Body::ActorReport(pb::ActorReport {
                            state: pb::ActorState::Dead as i32,
                            error: "stopped".into(),
                            ..report(&stop.actor_id, &actor)
                        }),
                    );
                }
                self.counters
                    .actors
                    .store(actors.len() as u64, Ordering::Relaxed);
            }
            Body::RunTask(task) => {
                let hosted = actors.get_mut(&task.actor_id);
                let not_run = hosted.is_none();
                let result = match hosted {
                    Some(actor) => {
                        actor.tasks_done += 1;
                        let output = self.result.clone().unwrap_or(task.payload);
                        pb::task_outcome::Result::Output(output)
                    }
                    None => pb::task_outcome::Result::Error(format!(
                        "actor {} is not running on this node",
                        task.actor_id
                    )),
                };
                self.counters.tasks_answered.fetch_add(1, Ordering::Relaxed);
                send(
                    uplink,
                    pb::agent_message::Body::TaskOutcome(pb::TaskOutcome {
                        task_id: task.task_id,
                        dispatch: task.dispatch,
                        actor_id: task.actor_id,
                        result: Some(result),
                        run_micros: 1,
                        permanent: false,
                        key: task.key,
                        crashed: false,
                        not_run,
                    }),
                );
            }
            Body::CancelTask(_) | Body::Registered(_) => {}
        }
    }

    /// Free VRAM is the total less what the hosted actors reserved, as on a real agent
    /// with simulated GPUs.
    fn heartbeat(&self, actors: &HashMap<String, SimActor>) -> pb::Heartbeat {
        let gpus = self
            .register
            .gpus
            .iter()
            .map(|gpu| {
                let reserved: u64 = actors
                    .values()
                    .filter(|a| a.gpu_indices.contains(&gpu.index))
                    .map(|a| a.vram_bytes)
                    .sum();
                pb::GpuInfo {
                    free_vram_bytes: gpu.total_vram_bytes.saturating_sub(reserved),
                    ..gpu.clone()
                }
            })
            .collect();
        pb::Heartbeat {
            gpus,
            actors: actors.iter().map(|(id, a)| report(id, a)).collect(),
        }
    }
}

fn report(actor_id: &str, actor: &SimActor) -> pb::ActorReport {
    pb::ActorReport {
        actor_id: actor_id.to_owned(),
        incarnation: actor.incarnation,
        state: pb::ActorState::Ready as i32,
        model_loads: 1,
        vram_bytes: actor.vram_bytes,
        tasks_done: actor.tasks_done,
        ..Default::default()
    }
}
