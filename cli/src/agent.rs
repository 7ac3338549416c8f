use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use resident_models::roots::FileRoots;
use resident_node_agent::backends::ActorKindRegistry;
use resident_node_agent::gpu::{self, GpuProbe, SimulatedGpus, parse_simulated_gpus};
use resident_node_agent::{AgentConfig, parse_labels, run_agent};

use crate::credentials::CredentialArgs;

#[derive(Args)]
pub struct AgentArgs {
    /// Scheduler URL to dial out to (the agent opens no port); https:// is always TLS.
    #[arg(long, env = "RESIDENT_SCHEDULER")]
    scheduler: String,
    /// This node's stable name; a restart with the same id is a new generation.
    #[arg(long, env = "RESIDENT_NODE_ID")]
    node_id: String,
    #[command(flatten)]
    credentials: CredentialArgs,
    /// This agent's client certificate (PEM) for a scheduler that requires mutual TLS
    /// (`resident certs agent`); it must name --node-id.
    #[arg(long, env = "RESIDENT_CLIENT_CERT", requires = "client_key")]
    client_cert: Option<PathBuf>,
    /// The key of --client-cert (PEM).
    #[arg(long, env = "RESIDENT_CLIENT_KEY", requires = "client_cert")]
    client_key: Option<PathBuf>,
    /// Labels for placement selectors: `pool=onprem-a6000,zone=lab1`.
    #[arg(long, env = "RESIDENT_LABELS", default_value = "")]
    labels: String,
    /// Report simulated GPUs instead of real ones: `A6000:48GiB x8,T4:16GiB x4`.
    #[arg(long, env = "RESIDENT_SIMULATE_GPUS")]
    simulate_gpus: Option<String>,
    /// How long actors keep their models loaded while no scheduler is reachable (a
    /// restart, a network cut): a scheduler back within it adopts them without a reload.
    /// `90s`, `15m`, `1h`.
    #[arg(long, env = "RESIDENT_ACTOR_GRACE", default_value = "15m", value_parser = humantime::parse_duration)]
    actor_grace: std::time::Duration,
    /// Longest wait between reconnect attempts, in milliseconds.
    #[arg(long, env = "RESIDENT_RECONNECT_MAX_MS", default_value_t = 10_000)]
    reconnect_max_ms: u64,
    /// A directory models may be loaded from (repeatable; symlinks out of it are refused).
    /// Default: the Hugging Face hub cache and ~/.cache/resident/models.
    #[arg(
        long = "model-root",
        env = "RESIDENT_MODEL_ROOT",
        value_delimiter = ':'
    )]
    model_roots: Vec<PathBuf>,
    /// A directory sweep datasets may be read from (repeatable). Default: none, so remote
    /// sweeps are refused until the operator names where their data lives.
    #[arg(long = "data-root", env = "RESIDENT_DATA_ROOT", value_delimiter = ':')]
    data_roots: Vec<PathBuf>,
}

/// Where models land by default: the Hugging Face hub cache (`HF_HUB_CACHE`, `HF_HOME/hub`,
/// `~/.cache/huggingface/hub`) and Resident's own model cache.
fn default_model_roots() -> Vec<PathBuf> {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| home.as_ref().map(|h| h.join(".cache")));
    let hub = std::env::var_os("HF_HUB_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HF_HOME").map(|h| PathBuf::from(h).join("hub")))
        .or_else(|| cache.as_ref().map(|c| c.join("huggingface/hub")));
    hub.into_iter()
        .chain(cache.map(|c| c.join("resident/models")))
        .collect()
}

pub async fn run(args: AgentArgs) -> anyhow::Result<()> {
    let probe: Arc<dyn GpuProbe> = match &args.simulate_gpus {
        Some(spec) => Arc::new(SimulatedGpus::new(parse_simulated_gpus(spec)?)),
        None => Arc::from(gpu::discover()),
    };
    let mut config = AgentConfig::new(args.scheduler, args.node_id);
    config.labels = parse_labels(&args.labels)?;
    config.reconnect_max = std::time::Duration::from_millis(args.reconnect_max_ms.max(50));
    config.actor_grace = args.actor_grace;
    config.credentials = args.credentials.credentials()?;
    if let (Some(cert), Some(key)) = (&args.client_cert, &args.client_key) {
        config.credentials = config
            .credentials
            .with_client_identity_files(cert, key)
            .context("--client-cert/--client-key")?;
    }
    let model_roots = if args.model_roots.is_empty() {
        default_model_roots()
    } else {
        args.model_roots
    };
    tracing::info!(?model_roots, data_roots = ?args.data_roots, "agent file roots");
    config.roots = FileRoots::restricted(&model_roots, &args.data_roots);
    let cancel = crate::shutdown_token();
    run_agent(
        config,
        ActorKindRegistry::with_builtin_kinds(),
        probe,
        cancel,
    )
    .await?;
    Ok(())
}
