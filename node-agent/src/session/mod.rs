//! The agent's one outbound session with the scheduler: register, heartbeat, obey commands,
//! reconnect with backoff. [`run_agent`] runs a `Session`, whose link to the scheduler is one
//! explicit state (`link.rs`: starting, connecting, registered, draining until). The actors outlive a session: when the scheduler goes away they
//! keep their models for `actor_grace`, and the next registration reports them (with the
//! tasks they hold) so the scheduler, restarted or not, adopts them instead of reloading.

mod backoff;
mod link;
mod rejoin;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use resident_models::roots::FileRoots;
use resident_proto::connect::{
    BearerToken, ClientCredentials, is_transport_failure, plaintext_hint, scheduler_endpoint,
    transport_hint,
};
use resident_proto::health::{
    AGENT_HEALTH_SERVICE, HealthReporter, SCHEDULER_HEALTH_SERVICE, ServingStatus, check_service,
    set_health,
};
use resident_proto::pb::node_agent_service_client::NodeAgentServiceClient;
use resident_proto::{ActorId, pb};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::sync::CancellationToken;

pub use backoff::ReconnectBackoff;
use link::{Link, LinkEvent};

use crate::backends::ActorKindRegistry;
use crate::error::AgentError;
use crate::gpu::{GpuHealth, GpuProbe, RestartAfterGpuFailure};
use crate::host::ActorHost;
use crate::model_cache::{ModelCache, ModelCacheConfig};

/// How an agent reaches its scheduler and what it offers.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// `http(s)://host:port` of the scheduler.
    pub scheduler_url: String,
    /// This node's id: one live agent per id.
    pub node_id: String,
    /// The node's labels, for pools' selectors.
    pub labels: BTreeMap<String, String>,
    /// The CA to trust for `https://` and the agent token to present.
    pub credentials: ClientCredentials,
    /// Where actors may read model files and sweep datasets (unrestricted by default; the
    /// `resident agent` command restricts it).
    pub roots: FileRoots,
    /// Where remote models are downloaded to, and how S3 is reached.
    pub models: ModelCacheConfig,
    /// The most a dial may take.
    pub connect_timeout: Duration,
    /// How often the agent pings its scheduler connection when nothing flows, and how long
    /// it waits for the answer: a silent cut is noticed within twice this. A registration
    /// must be answered within `connect_timeout` plus twice this.
    pub keepalive: Duration,
    /// The first wait before dialling again after a lost session.
    pub reconnect_min: Duration,
    /// The longest wait between dials.
    pub reconnect_max: Duration,
    /// How long actors stay loaded while no scheduler is reachable; past it they stop and
    /// free their memory.
    pub actor_grace: Duration,
    /// After a shutdown signal, how long the agent keeps finishing the tasks in hand (it
    /// takes no new ones); what is still running then goes back to the scheduler's queue.
    pub drain_timeout: Duration,
    /// `grpc.health.v1` statuses: [`AGENT_HEALTH_SERVICE`] is SERVING while registered.
    pub health: HealthReporter,
    /// Where each heartbeat's figures go for the agent's own `/metrics` (`--http-listen`);
    /// `None`: nobody reads them, so they are not copied.
    pub observer: Option<crate::observe::AgentObserver>,
    /// When the agent drains and exits (an error) after its GPUs fail, for its service
    /// manager to start it again with fresh CUDA contexts; never by default.
    pub restart_after_gpu_failure: RestartAfterGpuFailure,
}

/// Actors stay loaded this long without a scheduler (a restart, a network cut).
pub const DEFAULT_ACTOR_GRACE: Duration = Duration::from_secs(15 * 60);
/// A shut-down agent finishes its tasks in hand for at most this long: inside a spot
/// interruption's two-minute notice and Kubernetes' grace period as `deploy/` sets it.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(90);
/// How long a leaving agent waits for the scheduler to close the session after `Leave`,
/// so the last outcomes are flushed before the process exits.
const LEAVE_FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

impl AgentConfig {
    /// A config with the defaults for `scheduler_url` and `node_id`.
    pub fn new(scheduler_url: impl Into<String>, node_id: impl Into<String>) -> Self {
        Self {
            scheduler_url: scheduler_url.into(),
            node_id: node_id.into(),
            labels: BTreeMap::new(),
            credentials: ClientCredentials::default(),
            roots: FileRoots::unrestricted(),
            models: ModelCacheConfig::default(),
            connect_timeout: Duration::from_secs(5),
            keepalive: Duration::from_secs(10),
            reconnect_min: Duration::from_millis(200),
            reconnect_max: Duration::from_secs(10),
            actor_grace: DEFAULT_ACTOR_GRACE,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            health: HealthReporter::new(),
            observer: None,
            restart_after_gpu_failure: RestartAfterGpuFailure::Never,
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

/// Runs the agent until `cancel` fires, reconnecting whenever the session breaks; or until
/// its GPUs fail as `config.restart_after_gpu_failure` says, when it drains and returns
/// [`AgentError::RestartForFailedGpus`].
pub async fn run_agent(
    config: AgentConfig,
    registry: ActorKindRegistry,
    probe: Arc<dyn GpuProbe>,
    cancel: CancellationToken,
) -> Result<(), AgentError> {
    let session = Session::new(config, registry, probe, cancel)?;
    let gpu_health = session.gpu_health.clone();
    session.run().await?;
    match gpu_health.restart_reason() {
        Some(reason) => Err(AgentError::RestartForFailedGpus(reason.to_owned())),
        None => Ok(()),
    }
}

/// The agent's side of its link to the scheduler: what outlives one session (the actors,
/// their uplink, the backoff) and where the link stands ([`Link`]).
struct Session {
    config: AgentConfig,
    dialer: Dialer,
    /// This process's registration generation: a restarted agent is a new one.
    generation: String,
    registry: ActorKindRegistry,
    probe: Arc<dyn GpuProbe>,
    /// The GPUs that failed while the agent ran: left out of heartbeats, listed as
    /// unavailable in registrations.
    gpu_health: Arc<GpuHealth>,
    cancel: CancellationToken,
    backoff: ReconnectBackoff,
    /// The actors, loaded across sessions.
    host: ActorHost,
    /// What the actors send the scheduler: outcomes wait here between sessions (no tasks
    /// arrive then, so it holds at most the tasks in hand).
    uplink: mpsc::UnboundedReceiver<pb::AgentMessage>,
    link: Link,
}

/// How a wait between two attempts ended.
enum Retry {
    Dial,
    Cancelled,
}

impl Session {
    fn new(
        config: AgentConfig,
        registry: ActorKindRegistry,
        probe: Arc<dyn GpuProbe>,
        cancel: CancellationToken,
    ) -> Result<Self, AgentError> {
        let dialer = Dialer {
            endpoint: scheduler_endpoint(&config.scheduler_url, &config.credentials)?
                .connect_timeout(config.connect_timeout)
                .tcp_nodelay(true)
                .http2_keep_alive_interval(config.keepalive)
                .keep_alive_timeout(config.keepalive)
                .keep_alive_while_idle(true),
            token: BearerToken::new(config.credentials.token.as_deref())?,
        };
        let generation_id = uuid::Uuid::new_v4();
        let generation = generation_id.to_string();
        let backoff = ReconnectBackoff::new(
            config.reconnect_min,
            config.reconnect_max,
            generation_id.as_u64_pair().0,
        );
        tracing::info!(node_id = %config.node_id, %generation, scheduler = %config.scheduler_url, "agent starting");
        set_health(
            &config.health,
            AGENT_HEALTH_SERVICE,
            ServingStatus::NotServing,
        );
        let (uplink_tx, uplink) = mpsc::unbounded_channel();
        // Cancelled by a shutdown signal, or by the GPUs' restart policy.
        let cancel = cancel.child_token();
        let gpu_health = Arc::new(
            GpuHealth::new(probe.clone(), uplink_tx.clone())
                .map_err(AgentError::FaultInjection)?
                .restart_when(config.restart_after_gpu_failure, cancel.clone()),
        );
        let health = Arc::downgrade(&gpu_health);
        let sink: std::sync::Weak<dyn crate::gpu::GpuFaultSink> = health;
        probe.watch_faults(sink);
        let host = ActorHost::new(
            registry.clone(),
            uplink_tx,
            gpu_health.clone(),
            config.roots.clone(),
            Arc::new(ModelCache::new(config.models.clone())),
        );
        Ok(Self {
            config,
            dialer,
            generation,
            registry,
            probe,
            gpu_health,
            cancel,
            backoff,
            host,
            uplink,
            link: Link::Starting,
        })
    }

    /// Sessions one after another until cancelled: after each, say why it ended, stop the
    /// actors once away past their grace, and wait (the backoff, or less when a probe finds
    /// the scheduler back).
    async fn run(mut self) -> Result<(), AgentError> {
        loop {
            let ended = self.serve_once().await;
            set_health(
                &self.config.health,
                AGENT_HEALTH_SERVICE,
                ServingStatus::NotServing,
            );
            let was_up = !matches!(self.link, Link::Connecting { .. });
            self.link = self.link.apply(LinkEvent::Ended(Instant::now()));
            let error = match ended {
                Ok(()) => {
                    self.host.stop_all();
                    return Ok(());
                }
                Err(error) => error,
            };
            let unreachable = match &error {
                AgentError::Connect(_) | AgentError::RegisterTimeout(_) => true,
                AgentError::Refused(status) => is_transport_failure(status),
                _ => false,
            };
            self.say_why_it_ended(error, was_up);
            self.stop_actors_past_grace();
            if let Retry::Cancelled = self.wait_to_retry(unreachable).await {
                self.host.stop_all();
                return Ok(());
            }
        }
    }

    /// One session: register, then serve (tasks, heartbeats, a drain) until it ends. `Ok`
    /// once the agent left or was cancelled.
    async fn serve_once(&mut self) -> Result<(), AgentError> {
        let cancel = self.cancel.clone();
        let register_timeout = self.config.connect_timeout + self.config.keepalive * 2;
        let Registration {
            _client,
            outbound,
            mut inbound,
            heartbeat_ms,
            reported,
        } = tokio::select! {
            registered = tokio::time::timeout(register_timeout, self.register()) => {
                registered.map_err(|_| AgentError::RegisterTimeout(register_timeout))??
            }
            _ = cancel.cancelled() => return Ok(()),
        };
        self.backoff.reset();
        self.link = self.link.apply(LinkEvent::Registered);
        let node_id = self.config.node_id.clone();
        set_health(
            &self.config.health,
            AGENT_HEALTH_SERVICE,
            ServingStatus::Serving,
        );
        tracing::info!(%node_id, heartbeat_ms, actors = reported, "registered with scheduler");
        let mut heartbeat = tokio::time::interval(Duration::from_millis(heartbeat_ms));
        loop {
            let drain = self.link.draining();
            let give_up_at = drain.unwrap_or_else(Instant::now);
            tokio::select! {
                message = inbound.message() => match message {
                    Ok(Some(message)) => obey(&mut self.host, message, drain.is_some()),
                    Ok(None) => return Err(AgentError::SessionClosed),
                    Err(status) => return Err(AgentError::Refused(status)),
                },
                Some(message) = self.uplink.recv() => forward(&mut self.host, &outbound, message),
                _ = heartbeat.tick() => self.send_heartbeat(&outbound).await,
                _ = cancel.cancelled(), if drain.is_none() => {
                    // What the actors said first (a GPU's failure that ends the agent).
                    forward_queued(&mut self.host, &outbound, &mut self.uplink);
                    if self.start_drain(&outbound) == 0 {
                        return leave(outbound, inbound, 0, &node_id).await;
                    }
                }
                _ = tokio::time::sleep_until(give_up_at), if drain.is_some() => {
                    let abandoned = self.host.tasks_in_hand();
                    tracing::warn!(
                        %node_id,
                        abandoned,
                        "drain deadline passed; handing the unfinished tasks back to the scheduler"
                    );
                    return leave(outbound, inbound, abandoned as u32, &node_id).await;
                }
            }
            // Draining, and the last outcome in hand is on its way (by the uplink or ahead of
            // a heartbeat): leave.
            if self.link.draining().is_some() && self.host.tasks_in_hand() == 0 {
                return leave(outbound, inbound, 0, &node_id).await;
            }
        }
    }

    /// Sends a heartbeat (the GPUs read now, the actors' reports) after what the actors
    /// said before it, and shows it to the observer.
    async fn send_heartbeat(&mut self, outbound: &mpsc::UnboundedSender<pb::AgentMessage>) {
        let gpus = self.gpu_health.in_service(read_gpus(&self.probe).await);
        let message = heartbeat_message(&self.host, self.probe.as_ref(), gpus);
        // The heartbeat's reports are read now, while what the actors said before may still
        // wait in the uplink: an actor that died of a panic sent its task's outcome first.
        // Those go ahead of the heartbeat, so the scheduler never hears of the death before
        // the outcome that explains it.
        forward_queued(&mut self.host, outbound, &mut self.uplink);
        if let (Some(observer), Some(pb::agent_message::Body::Heartbeat(beat))) =
            (&self.config.observer, &message.body)
        {
            observer.publish(
                &self.config.node_id,
                self.host.observed(&beat.actors),
                beat.gpus.clone(),
            );
        }
        let _ = outbound.send(message);
    }

    /// Tells the scheduler this agent drains (no new tasks; those in hand finish within
    /// the drain timeout) and returns the tasks in hand; with some, the link drains until
    /// the deadline.
    fn start_drain(&mut self, outbound: &mpsc::UnboundedSender<pb::AgentMessage>) -> usize {
        let in_hand = self.host.tasks_in_hand();
        let drain_timeout = self.config.drain_timeout;
        let reason = match self.gpu_health.restart_reason() {
            Some(_) => "the agent restarts after its GPUs failed",
            None => "the agent is shutting down (SIGTERM or Ctrl-C)",
        };
        tracing::info!(
            node_id = %self.config.node_id,
            tasks_in_hand = in_hand,
            drain_timeout = ?drain_timeout,
            reason,
            "shutting down: draining (no new tasks; finishing those in hand)"
        );
        let _ = outbound.send(pb::AgentMessage {
            body: Some(pb::agent_message::Body::Drain(pb::Drain {
                deadline_ms: drain_timeout.as_millis() as u64,
                reason: reason.into(),
            })),
        });
        if in_hand > 0 {
            self.link = self
                .link
                .apply(LinkEvent::DrainUntil(Instant::now() + drain_timeout));
        }
        in_hand
    }

    /// Dials, registers this node (listing what the host holds) and reads the answer.
    async fn register(&mut self) -> Result<Registration, AgentError> {
        let channel = self.dialer.endpoint.connect().await?;
        let mut client =
            NodeAgentServiceClient::with_interceptor(channel, self.dialer.token.clone())
                .max_decoding_message_size(resident_proto::MAX_MESSAGE_BYTES)
                .max_encoding_message_size(resident_proto::MAX_MESSAGE_BYTES);
        let (outbound, outbound_rx) = mpsc::unbounded_channel();
        let register = pb::RegisterNode {
            node_id: self.config.node_id.clone(),
            generation: self.generation.clone(),
            hostname: hostname::get()
                .map(|h| h.to_string_lossy().into_owned())
                .unwrap_or_default(),
            labels: self.config.labels.clone().into_iter().collect(),
            gpus: self.gpu_health.in_service(read_gpus(&self.probe).await),
            cpu_cores: std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
            ram_bytes: resident_proto::host::total_ram_bytes().unwrap_or(0),
            actor_kinds: self.registry.names(),
            inventory: self.host.inventory(),
            unavailable_gpus: [self.probe.unavailable(), self.gpu_health.failed()].concat(),
        };
        let reported = register.inventory.len();
        let _ = outbound.send(pb::AgentMessage {
            body: Some(pb::agent_message::Body::Register(register)),
        });
        let mut inbound = client
            .session(UnboundedReceiverStream::new(outbound_rx))
            .await?
            .into_inner();
        let heartbeat_ms = match inbound.message().await?.and_then(|m| m.body) {
            Some(pb::scheduler_message::Body::Registered(registered)) => {
                self.host.set_progress_interval(Duration::from_millis(
                    registered.task_progress_interval_ms,
                ));
                registered.heartbeat_interval_ms.max(10)
            }
            _ => return Err(AgentError::SessionClosed),
        };
        Ok(Registration {
            _client: client,
            outbound,
            inbound,
            heartbeat_ms,
            reported,
        })
    }

    /// One log line on why a session (or an attempt) ended, as loud as it needs to be.
    fn say_why_it_ended(&self, error: AgentError, was_up: bool) {
        let config = &self.config;
        match error {
            AgentError::Refused(status)
                if matches!(
                    status.code(),
                    tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
                ) =>
            {
                // Retried (a token may be added to the scheduler's auth file meanwhile), but
                // loudly: this needs the operator.
                tracing::error!(
                    node_id = %config.node_id,
                    code = ?status.code(),
                    reason = status.message(),
                    "the scheduler refused this agent; check --token (RESIDENT_TOKEN) and --node-id"
                );
            }
            AgentError::Refused(status) if is_transport_failure(&status) && was_up => {
                tracing::warn!(
                    node_id = %config.node_id,
                    error = %status,
                    actors = self.host.len(),
                    grace = ?config.actor_grace,
                    "scheduler session broke; the actors stay loaded while reconnecting"
                );
            }
            AgentError::Refused(status) if is_transport_failure(&status) => {
                let hint = transport_hint(&config.scheduler_url, &status)
                    .or_else(|| plaintext_hint(&config.scheduler_url))
                    .unwrap_or_default();
                tracing::warn!(node_id = %config.node_id, error = %status, hint, "scheduler session broke");
            }
            AgentError::Connect(error) => {
                let hint = transport_hint(&config.scheduler_url, &error).unwrap_or_default();
                tracing::warn!(node_id = %config.node_id, error = %format_chain(&error), hint, "cannot reach the scheduler");
            }
            error @ AgentError::RegisterTimeout(_) => {
                tracing::warn!(node_id = %config.node_id, %error, "cannot reach the scheduler")
            }
            error => {
                tracing::warn!(node_id = %config.node_id, %error, "scheduler session ended")
            }
        }
    }

    /// Away from the scheduler for longer than the actor grace: every actor stops and frees
    /// its memory, and what they had queued for the scheduler goes with them.
    fn stop_actors_past_grace(&mut self) {
        let away_for = self.link.away_since().map(|since| since.elapsed());
        if !self.host.is_empty() && away_for.is_some_and(|away| away > self.config.actor_grace) {
            tracing::warn!(
                node_id = %self.config.node_id,
                grace = ?self.config.actor_grace,
                "no scheduler for longer than the actor grace period; stopping every actor"
            );
            self.host.stop_all();
            while self.uplink.try_recv().is_ok() {}
        }
    }

    /// Waits out the backoff before the next attempt; while the scheduler cannot be
    /// reached, a health probe may end the wait early (`rejoin.rs`), once per registration.
    async fn wait_to_retry(&mut self, unreachable: bool) -> Retry {
        let delay = self.backoff.next_delay();
        let probing = unreachable && self.link.may_cut_wait_short();
        let jitter = if probing {
            self.backoff.jitter(rejoin::REJOIN_JITTER_MAX)
        } else {
            Duration::ZERO
        };
        let endpoint = &self.dialer.endpoint;
        let wait = async {
            if !probing {
                tokio::time::sleep(delay).await;
                return rejoin::WaitEnded::BackoffOver;
            }
            let probe = || async {
                let answer =
                    check_service(endpoint, SCHEDULER_HEALTH_SERVICE, rejoin::PROBE_TIMEOUT).await;
                matches!(answer, Ok(ServingStatus::Serving))
            };
            rejoin::wait_probing(delay, probe, jitter).await
        };
        let ended = tokio::select! {
            ended = wait => Some(ended),
            _ = self.cancel.cancelled() => None,
        };
        match ended {
            None => Retry::Cancelled,
            Some(rejoin::WaitEnded::SchedulerAnswered) => {
                tracing::info!(node_id = %self.config.node_id, "the scheduler answers again; registering");
                self.link = self.link.apply(LinkEvent::WaitCutShort);
                Retry::Dial
            }
            Some(rejoin::WaitEnded::BackoffOver) => Retry::Dial,
        }
    }
}

/// An error and its sources on one line.
fn format_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut next = error.source();
    while let Some(source) = next {
        text.push_str(": ");
        text.push_str(&source.to_string());
        next = source.source();
    }
    text
}

/// How the agent reaches the scheduler: the endpoint (TLS decided by the URL) and the token.
struct Dialer {
    endpoint: tonic::transport::Endpoint,
    token: BearerToken,
}

/// An open session: the stream to the scheduler, its answers, and what it said.
struct Registration {
    /// Holds the connection the session runs on.
    _client: NodeAgentServiceClient<
        tonic::service::interceptor::InterceptedService<tonic::transport::Channel, BearerToken>,
    >,
    outbound: mpsc::UnboundedSender<pb::AgentMessage>,
    inbound: tonic::Streaming<pb::SchedulerMessage>,
    heartbeat_ms: u64,
    /// Actors listed in the registration's inventory.
    reported: usize,
}

/// Sends one message from the uplink on to the scheduler.
fn forward(
    host: &mut ActorHost,
    outbound: &mpsc::UnboundedSender<pb::AgentMessage>,
    message: pb::AgentMessage,
) {
    host.forwarded(&message);
    let _ = outbound.send(message);
}

/// Sends on every message already waiting in the uplink, in order.
fn forward_queued(
    host: &mut ActorHost,
    outbound: &mpsc::UnboundedSender<pb::AgentMessage>,
    uplink: &mut mpsc::UnboundedReceiver<pb::AgentMessage>,
) {
    while let Ok(message) = uplink.try_recv() {
        forward(host, outbound, message);
    }
}

/// Says goodbye after a drain and waits (briefly) for the scheduler to close the session,
/// so every outcome sent before is delivered before the process exits.
async fn leave(
    outbound: mpsc::UnboundedSender<pb::AgentMessage>,
    mut inbound: tonic::Streaming<pb::SchedulerMessage>,
    abandoned_tasks: u32,
    node_id: &str,
) -> Result<(), AgentError> {
    let _ = outbound.send(pb::AgentMessage {
        body: Some(pb::agent_message::Body::Leave(pb::Leave {
            abandoned_tasks,
        })),
    });
    drop(outbound);
    let closed = tokio::time::timeout(LEAVE_FLUSH_TIMEOUT, async {
        while let Ok(Some(_)) = inbound.message().await {}
    })
    .await;
    if closed.is_err() {
        tracing::warn!(
            node_id,
            "the scheduler did not close the session after Leave"
        );
    }
    tracing::info!(node_id, abandoned_tasks, "drained; left the cluster");
    Ok(())
}

fn obey(host: &mut ActorHost, message: pb::SchedulerMessage, draining: bool) {
    use pb::scheduler_message::Body;
    match message.body {
        Some(Body::RunTask(task)) => host.run(task),
        // Sent before the scheduler saw the drain: refused, so it is placed elsewhere.
        Some(Body::StartActor(start)) if draining => {
            host.refuse_start(&start, "the node is draining")
        }
        Some(Body::StartActor(start)) => host.start(start),
        Some(Body::StopActor(stop)) => {
            host.stop_asked(&ActorId::new(stop.actor_id), stop.incarnation)
        }
        Some(Body::CancelTask(cancel)) => host.cancel(cancel),
        Some(Body::Registered(_)) | None => {}
    }
}

/// The GPUs with their free memory, read on tokio's blocking pool: NVML and
/// `cuMemGetInfo` can block for a long time on a busy or failing GPU, and must not stall a
/// runtime thread (the session's uplink and heartbeats run there).
async fn read_gpus(probe: &Arc<dyn GpuProbe>) -> Vec<pb::GpuInfo> {
    let probe = probe.clone();
    tokio::task::spawn_blocking(move || probe.gpus())
        .await
        .unwrap_or_else(|panic| {
            tracing::error!(%panic, "reading the GPUs panicked; reporting none this time");
            Vec::new()
        })
}

fn heartbeat_message(
    host: &ActorHost,
    probe: &dyn GpuProbe,
    mut gpus: Vec<pb::GpuInfo>,
) -> pb::AgentMessage {
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

#[cfg(test)]
mod gpu_read_tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    use super::*;

    /// A probe whose driver call takes 300 ms, as NVML can on a busy or failing GPU.
    struct SlowProbe;

    impl GpuProbe for SlowProbe {
        fn gpus(&self) -> Vec<pb::GpuInfo> {
            std::thread::sleep(Duration::from_millis(300));
            vec![pb::GpuInfo::default()]
        }
        fn simulated(&self) -> bool {
            false
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_slow_gpu_read_does_not_stall_the_runtime_thread() {
        let probe: Arc<dyn GpuProbe> = Arc::new(SlowProbe);
        let ticks = Arc::new(AtomicU32::new(0));
        let ticker = tokio::spawn({
            let ticks = ticks.clone();
            async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    ticks.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
        let gpus = read_gpus(&probe).await;
        ticker.abort();
        assert_eq!(gpus.len(), 1);
        // On the only runtime thread, a read made in place would allow no tick at all.
        let ticked = ticks.load(Ordering::SeqCst);
        assert!(
            ticked >= 1,
            "the runtime thread never ticked during the 300 ms read"
        );
    }
}
