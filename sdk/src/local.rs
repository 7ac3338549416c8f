//! `Cluster::local`: a scheduler and one agent in this process on ephemeral loopback ports,
//! like `ray.init()`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use resident_node_agent::backends::ActorKindRegistry;
use resident_node_agent::gpu::{self, GpuProbe, SimulatedGpus};
use resident_node_agent::model_cache::ModelCacheConfig;
use resident_node_agent::{AgentConfig, parse_labels, run_agent};
use resident_scheduler::core::CoreConfig;
use resident_scheduler::http::{HttpLimits, serve_http};
use resident_scheduler::server::{ServerSecurity, start_scheduler};
use resident_scheduler::store::{DurableStore, MemoryStore, RedbStore};
use tokio_util::sync::CancellationToken;

use crate::client::{ClientCredentials, Cluster};
use crate::error::SdkError;

/// How to start an in-process cluster.
///
/// `LocalConfig::default().simulate_gpus("T4:16GiB x2")` gives the agent simulated GPUs (the
/// `--simulate-gpus` spec), so pools that ask for GPUs run, on CPU, on a laptop.
#[derive(Clone)]
pub struct LocalConfig {
    /// Address to serve on; port 0 picks a free one.
    pub listen: std::net::SocketAddr,
    /// The agent's node id.
    pub node_id: String,
    /// `A6000:48GiB x8`-style simulated GPUs; `None` discovers real ones.
    pub simulate_gpus: Option<String>,
    /// The agent's labels, `key=value,key=value`.
    pub labels: String,
    /// Where pools and jobs persist; `None` keeps them in memory.
    pub state_dir: Option<PathBuf>,
    /// The scheduler's settings.
    pub core: CoreConfig,
    /// The actor kinds the agent offers.
    pub kinds: ActorKindRegistry,
    /// Where the agent downloads `s3://` and Hugging Face models, and how it reaches S3.
    pub models: ModelCacheConfig,
    /// Serve the scheduler's HTTP port here too: the dashboard, `/metrics`, `/healthz`
    /// (port 0 picks a free one; see [`Cluster::local_http_url`]).
    pub http_listen: Option<std::net::SocketAddr>,
}

impl LocalConfig {
    /// Reports simulated GPUs (`NAME:SIZE[@MAJOR.MINOR] [xCOUNT]`, comma-separated) instead
    /// of discovering real ones; the work runs on CPU.
    pub fn simulate_gpus(mut self, spec: impl Into<String>) -> Self {
        self.simulate_gpus = Some(spec.into());
        self
    }

    /// Each `embed` actor computes on `threads` threads of its own (1 with an actor per
    /// core is the fastest CPU setup for encoders), whatever `RAYON_NUM_THREADS` says: for
    /// programs that should not change their environment (the Python package).
    pub fn embed_compute_threads(mut self, threads: usize) -> Self {
        self.kinds = std::mem::take(&mut self.kinds).with_embed_compute_threads(threads);
        self
    }

    /// Actor kinds the agent offers (default: the built-in kinds).
    pub fn kinds(mut self, kinds: ActorKindRegistry) -> Self {
        self.kinds = kinds;
        self
    }
}

impl Default for LocalConfig {
    fn default() -> Self {
        Self {
            listen: ([127, 0, 0, 1], 0).into(),
            node_id: "local".into(),
            simulate_gpus: None,
            labels: String::new(),
            state_dir: None,
            core: CoreConfig::default(),
            kinds: ActorKindRegistry::with_builtin_kinds(),
            models: ModelCacheConfig::default(),
            http_listen: None,
        }
    }
}

/// Stops the in-process scheduler and agent when the last `Cluster` handle goes.
struct LocalGuard {
    cancel: CancellationToken,
    http_url: Option<String>,
}

impl Drop for LocalGuard {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

impl Cluster {
    /// The HTTP port's base URL (dashboard, `/metrics`) of an in-process cluster started
    /// with [`LocalConfig::http_listen`].
    pub fn local_http_url(&self) -> Option<String> {
        self.local_guard()?
            .downcast_ref::<LocalGuard>()?
            .http_url
            .clone()
    }

    /// Starts a scheduler and one agent in this process and connects to them.
    pub async fn local(config: LocalConfig) -> Result<Cluster, SdkError> {
        let start = |e: String| SdkError::LocalStart(e);
        let probe: Arc<dyn GpuProbe> = match &config.simulate_gpus {
            Some(spec) => Arc::new(SimulatedGpus::parse(spec).map_err(|e| start(e.to_string()))?),
            None => Arc::from(gpu::discover()),
        };
        let labels = parse_labels(&config.labels).map_err(|e| start(e.to_string()))?;
        let store: Arc<dyn DurableStore> = match &config.state_dir {
            Some(dir) => Arc::new(RedbStore::open(dir).map_err(|e| start(e.to_string()))?),
            None => Arc::new(MemoryStore::default()),
        };
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|e| start(format!("cannot listen on {}: {e}", config.listen)))?;
        let cancel = CancellationToken::new();
        let server = start_scheduler(
            listener,
            config.core.clone(),
            store,
            ServerSecurity::open(),
            cancel.clone(),
        )
        .map_err(|e| start(e.to_string()))?;
        let url = server.url.clone();
        let http_url = match config.http_listen {
            Some(addr) => {
                let listener = tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|e| start(format!("cannot listen on {addr} for HTTP: {e}")))?;
                let bound = listener.local_addr().map_err(|e| start(e.to_string()))?;
                serve_http(
                    listener,
                    server.handle.clone(),
                    &ServerSecurity::open(),
                    HttpLimits::default(),
                    cancel.clone(),
                )
                .map_err(|e| start(e.to_string()))?;
                Some(format!("http://{bound}"))
            }
            None => None,
        };
        let mut agent = AgentConfig::new(url.clone(), config.node_id.clone());
        agent.labels = labels;
        agent.models = config.models.clone();
        agent.reconnect_min = Duration::from_millis(20);
        tokio::spawn(run_agent(
            agent,
            config.kinds.clone(),
            probe,
            cancel.clone(),
        ));
        let guard = Arc::new(LocalGuard { cancel, http_url });
        let cluster = Cluster::connect_with(&url, ClientCredentials::default())
            .await?
            .keep_alive(guard);
        cluster.wait_for_nodes(1, Duration::from_secs(10)).await?;
        tracing::info!(%url, "local cluster ready");
        Ok(cluster)
    }
}
