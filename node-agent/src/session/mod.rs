//! The agent's one outbound session with the scheduler: register, heartbeat, obey commands,
//! reconnect with backoff. Each new session starts with no actors (the scheduler re-places them).

mod backoff;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use resident_proto::pb::node_agent_service_client::NodeAgentServiceClient;
use resident_proto::{ActorId, pb};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::sync::CancellationToken;

pub use backoff::ReconnectBackoff;

use crate::backends::ActorKindRegistry;
use crate::error::AgentError;
use crate::gpu::GpuProbe;
use crate::host::ActorHost;

#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub scheduler_url: String,
    pub node_id: String,
    pub labels: BTreeMap<String, String>,
    pub connect_timeout: Duration,
    pub reconnect_min: Duration,
    pub reconnect_max: Duration,
}

impl AgentConfig {
    pub fn new(scheduler_url: impl Into<String>, node_id: impl Into<String>) -> Self {
        Self {
            scheduler_url: scheduler_url.into(),
            node_id: node_id.into(),
            labels: BTreeMap::new(),
            connect_timeout: Duration::from_secs(5),
            reconnect_min: Duration::from_millis(200),
            reconnect_max: Duration::from_secs(10),
        }
    }

    /// Short reconnect delays for tests.
    pub fn for_test(scheduler_url: impl Into<String>, node_id: impl Into<String>) -> Self {
        Self {
            reconnect_min: Duration::from_millis(50),
            reconnect_max: Duration::from_millis(500),
            ..Self::new(scheduler_url, node_id)
        }
    }
}

/// Parses `pool=onprem-a6000,zone=lab1`.
pub fn parse_labels(text: &str) -> Result<BTreeMap<String, String>, AgentError> {
    text.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.trim().to_owned())),
            _ => Err(AgentError::Label(pair.to_owned())),
        })
        .collect()
}

fn total_ram_bytes() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

/// Runs the agent until `cancel` fires, reconnecting whenever the session breaks.
pub async fn run_agent(
    config: AgentConfig,
    registry: ActorKindRegistry,
    probe: Arc<dyn GpuProbe>,
    cancel: CancellationToken,
) -> Result<(), AgentError> {
    let endpoint = tonic::transport::Endpoint::from_shared(config.scheduler_url.clone())
        .map_err(|source| AgentError::SchedulerUrl {
            url: config.scheduler_url.clone(),
            source,
        })?
        .connect_timeout(config.connect_timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_while_idle(true);
    let generation = uuid::Uuid::new_v4().to_string();
    let mut backoff = ReconnectBackoff::new(config.reconnect_min, config.reconnect_max);
    tracing::info!(node_id = %config.node_id, %generation, scheduler = %config.scheduler_url, "agent starting");
    loop {
        let session = run_session(
            &endpoint,
            &config,
            &generation,
            &registry,
            probe.as_ref(),
            &cancel,
            &mut backoff,
        );
        match session.await {
            Ok(()) => return Ok(()),
            Err(error) => {
                tracing::warn!(node_id = %config.node_id, %error, "scheduler session ended")
            }
        }
        let delay = backoff.next_delay();
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = cancel.cancelled() => return Ok(()),
        }
    }
}

async fn run_session(
    endpoint: &tonic::transport::Endpoint,
    config: &AgentConfig,
    generation: &str,
    registry: &ActorKindRegistry,
    probe: &dyn GpuProbe,
    cancel: &CancellationToken,
    backoff: &mut ReconnectBackoff,
) -> Result<(), AgentError> {
    let channel = tokio::select! {
        channel = endpoint.connect() => channel?,
        _ = cancel.cancelled() => return Ok(()),
    };
    let mut client = NodeAgentServiceClient::new(channel)
        .max_decoding_message_size(256 << 20)
        .max_encoding_message_size(256 << 20);
    let (outbound, outbound_rx) = mpsc::unbounded_channel();
    let register = pb::RegisterNode {
        node_id: config.node_id.clone(),
        generation: generation.to_owned(),
        hostname: hostname::get()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_default(),
        labels: config.labels.clone().into_iter().collect(),
        gpus: probe.gpus(),
        cpu_cores: std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
        ram_bytes: total_ram_bytes(),
        actor_kinds: registry.names(),
    };
    let _ = outbound.send(pb::AgentMessage {
        body: Some(pb::agent_message::Body::Register(register)),
    });
    let mut inbound = client
        .session(UnboundedReceiverStream::new(outbound_rx))
        .await?
        .into_inner();
    let heartbeat_ms = match inbound.message().await?.and_then(|m| m.body) {
        Some(pb::scheduler_message::Body::Registered(registered)) => {
            registered.heartbeat_interval_ms.max(10)
        }
        _ => return Err(AgentError::SessionClosed),
    };
    backoff.reset();
    tracing::info!(node_id = %config.node_id, heartbeat_ms, "registered with scheduler");
    let mut host = ActorHost::new(registry.clone(), outbound.clone(), probe.simulated());
    let mut heartbeat = tokio::time::interval(Duration::from_millis(heartbeat_ms));
    let result = loop {
        tokio::select! {
            message = inbound.message() => match message {
                Ok(Some(message)) => obey(&mut host, message),
                Ok(None) => break Err(AgentError::SessionClosed),
                Err(status) => break Err(AgentError::Refused(status)),
            },
            _ = heartbeat.tick() => {
                let _ = outbound.send(heartbeat_message(&host, probe));
            }
            _ = cancel.cancelled() => break Ok(()),
        }
    };
    host.stop_all();
    result
}

fn obey(host: &mut ActorHost, message: pb::SchedulerMessage) {
    use pb::scheduler_message::Body;
    match message.body {
        Some(Body::RunTask(task)) => host.run(task),
        Some(Body::StartActor(start)) => host.start(start),
        Some(Body::StopActor(stop)) => host.stop(&ActorId::new(stop.actor_id)),
        Some(Body::CancelTask(cancel)) => host.cancel(cancel),
        Some(Body::Registered(_)) | None => {}
    }
}

fn heartbeat_message(host: &ActorHost, probe: &dyn GpuProbe) -> pb::AgentMessage {
    let mut gpus = probe.gpus();
    if probe.simulated() {
        for gpu in &mut gpus {
            gpu.free_vram_bytes = gpu
                .total_vram_bytes
                .saturating_sub(host.reserved_vram(gpu.index));
        }
    }
    pb::AgentMessage {
        body: Some(pb::agent_message::Body::Heartbeat(pb::Heartbeat {
            gpus,
            actors: host.reports(),
        })),
    }
}
