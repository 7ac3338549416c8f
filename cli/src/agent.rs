use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use resident_models::roots::FileRoots;
use resident_node_agent::backends::ActorKindRegistry;
use resident_node_agent::gpu::{self, GpuProbe, SimulatedGpus, parse_simulated_gpus};
use resident_node_agent::model_cache::default_model_cache_dir;
use resident_node_agent::{AgentConfig, parse_labels, run_agent};
use resident_storage::model_source::hf_hub_cache_dir;

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
    /// A file of labels (`key=value`, by commas or lines) merged under --labels: how a
    /// Kubernetes agent takes its zone, instance type and pool from its node (an init
    /// container writes them). Empty values are dropped.
    #[arg(long, env = "RESIDENT_LABELS_FILE")]
    labels_file: Option<PathBuf>,
    /// Report simulated GPUs instead of real ones: `A6000:48GiB x8,T4:16GiB x4`.
    #[arg(long, env = "RESIDENT_SIMULATE_GPUS")]
    simulate_gpus: Option<String>,
    /// How long actors keep their models loaded while no scheduler is reachable (a
    /// restart, a network cut): a scheduler back within it adopts them without a reload.
    /// `90s`, `15m`, `1h`.
    #[arg(long, env = "RESIDENT_ACTOR_GRACE", default_value = "15m", value_parser = humantime::parse_duration)]
    actor_grace: std::time::Duration,
    /// On SIGTERM (a scale-in, a spot interruption, an upgrade) the agent takes no new
    /// tasks and finishes those in hand for at most this long, then hands the rest back to
    /// the scheduler's queue and exits. Keep it under the platform's notice (Kubernetes'
    /// terminationGracePeriodSeconds, systemd's TimeoutStopSec, a spot's 2 minutes).
    #[arg(long, env = "RESIDENT_DRAIN_TIMEOUT", default_value = "90s", value_parser = humantime::parse_duration)]
    drain_timeout: std::time::Duration,
    /// Serve `grpc.health.v1` in plaintext on this address: `""` is SERVING while the
    /// process runs, `resident.v1.NodeAgentService` while it is registered with a scheduler.
    #[arg(long, env = "RESIDENT_HEALTH_LISTEN")]
    health_listen: Option<String>,
    /// Longest wait between reconnect attempts, in milliseconds.
    #[arg(long, env = "RESIDENT_RECONNECT_MAX_MS", default_value_t = 10_000)]
    reconnect_max_ms: u64,
    /// A directory models may be loaded from (repeatable; symlinks out of it are refused).
    /// Default: the Hugging Face hub cache. The --model-cache is always one.
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
    /// Where models named by `s3://` or a Hugging Face id are downloaded, once per node, and
    /// checked against their SHA-256 manifest; always a model root. Keep it on a volume that
    /// outlives the agent. Default: ~/.cache/resident/models.
    #[arg(long, env = "RESIDENT_MODEL_CACHE")]
    model_cache: Option<PathBuf>,
    /// An S3-compatible endpoint for `s3://` models (MinIO, Ceph); default AWS. Credentials
    /// come from the standard AWS chain (environment, profile, instance or pod role).
    #[arg(long, env = "RESIDENT_S3_ENDPOINT")]
    s3_endpoint: Option<String>,
    /// Serve this agent's own `/metrics` (its actors' busy time, documents, tokens and batch
    /// sizes; its GPUs' VRAM and utilisation) and `/healthz` here, in plaintext. Loopback
    /// only unless --http-insecure: the scheduler's `/metrics`, behind TLS and tokens,
    /// carries the same figures for every agent.
    #[arg(long, env = "RESIDENT_HTTP_LISTEN")]
    http_listen: Option<std::net::SocketAddr>,
    /// Let --http-listen bind beyond loopback (a trusted node network, such as a node-local
    /// collector scraping the pod IP).
    #[arg(long, env = "RESIDENT_HTTP_INSECURE")]
    http_insecure: bool,
}

/// The labels of `--labels-file`, overridden by `--labels`.
fn labels(
    flag: &str,
    file: Option<&std::path::Path>,
) -> anyhow::Result<std::collections::BTreeMap<String, String>> {
    let mut labels = match file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--labels-file {}", path.display()))?;
            parse_labels(&text.replace('\n', ","))
                .with_context(|| format!("--labels-file {}", path.display()))?
        }
        None => Default::default(),
    };
    labels.retain(|_, value| !value.is_empty());
    labels.extend(parse_labels(flag)?);
    Ok(labels)
}

pub async fn run(args: AgentArgs) -> anyhow::Result<()> {
    let probe: Arc<dyn GpuProbe> = match &args.simulate_gpus {
        Some(spec) => Arc::new(SimulatedGpus::new(parse_simulated_gpus(spec)?)),
        None => Arc::from(gpu::discover()),
    };
    let mut config = AgentConfig::new(args.scheduler, args.node_id);
    config.labels = labels(&args.labels, args.labels_file.as_deref())?;
    config.reconnect_max = std::time::Duration::from_millis(args.reconnect_max_ms.max(50));
    config.actor_grace = args.actor_grace;
    config.drain_timeout = args.drain_timeout;
    config.credentials = args.credentials.credentials()?;
    if let (Some(cert), Some(key)) = (&args.client_cert, &args.client_key) {
        config.credentials = config
            .credentials
            .with_client_identity_files(cert, key)
            .context("--client-cert/--client-key")?;
    }
    config.models.dir = args.model_cache.unwrap_or_else(default_model_cache_dir);
    config.models.s3.endpoint = args.s3_endpoint;
    std::fs::create_dir_all(&config.models.dir)
        .with_context(|| format!("--model-cache {}", config.models.dir.display()))?;
    // By default the node's Hugging Face hub cache; the model cache always.
    let mut model_roots = if args.model_roots.is_empty() {
        hf_hub_cache_dir().into_iter().collect()
    } else {
        args.model_roots
    };
    model_roots.push(config.models.dir.clone());
    // Sweep datasets fetched from S3 land in the model cache's datasets/.
    let mut data_roots = args.data_roots;
    data_roots.push(config.models.dir.join("datasets"));
    tracing::info!(?model_roots, ?data_roots, "agent file roots");
    config.roots = FileRoots::restricted(&model_roots, &data_roots);
    let cancel = crate::shutdown_token();
    if let Some(addr) = args.http_listen {
        if !addr.ip().is_loopback() && !args.http_insecure {
            anyhow::bail!(
                "refusing to serve --http-listen {addr} beyond loopback in plaintext; bind \
                 127.0.0.1, pass --http-insecure on a node network you trust, or scrape the \
                 scheduler's /metrics (TLS and tokens), which carries this agent's figures"
            );
        }
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on --http-listen {addr}"))?;
        let observer = resident_node_agent::observe::AgentObserver::default();
        config.observer = Some(observer.clone());
        let cancel = cancel.clone();
        tokio::spawn(async move {
            if let Err(error) =
                resident_node_agent::observe::serve_metrics(listener, observer, cancel).await
            {
                tracing::error!(%error, "agent HTTP port stopped");
            }
        });
        tracing::info!(%addr, "agent HTTP port: /metrics, /healthz");
    }
    if let Some(addr) = &args.health_listen {
        crate::health::serve_health_on(addr, config.health.clone(), cancel.clone()).await?;
    }
    run_agent(
        config,
        ActorKindRegistry::with_builtin_kinds(),
        probe,
        cancel,
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn file_labels_merge_under_flag_labels_and_empty_ones_drop() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("labels");
        std::fs::write(&path, "zone=us-east-1a\ninstance_type=g5.xlarge,pool=\n").unwrap();
        let labels = super::labels("pool=eks-a10g", Some(&path)).unwrap();
        assert_eq!(labels["zone"], "us-east-1a");
        assert_eq!(labels["instance_type"], "g5.xlarge");
        assert_eq!(labels["pool"], "eks-a10g");
        let missing = super::labels("", Some(&dir.path().join("nope"))).unwrap_err();
        assert!(
            format!("{missing:#}").contains("--labels-file"),
            "{missing:#}"
        );
    }
}
