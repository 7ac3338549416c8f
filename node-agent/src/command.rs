//! The agent's command line as a library (feature `cli`): `resident agent` is
//! [`AgentArgs`] + [`run`] with the built-in kinds, and a custom agent is the same with its
//! own kinds added, in ten lines:
//!
//! ```no_run
//! use resident_node_agent::backends::ActorKindRegistry;
//!
//! fn main() -> std::process::ExitCode {
//!     let mut kinds = ActorKindRegistry::with_builtin_kinds();
//!     // kinds.register_actor::<MyActor>();
//!     resident_node_agent::command::agent_main("my-agent", kinds)
//! }
//! ```
//!
//! It takes every flag and environment variable of `resident agent` (TLS, tokens, labels,
//! GPU discovery, reconnects, drain, health and metrics ports, model roots and cache), plus
//! `--log-json` and `--compute-threads`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use clap::{Args, Parser};
use resident_models::roots::FileRoots;
use resident_proto::connect::ClientCredentials;
use resident_proto::health::{HealthReporter, serve_health_port};
use resident_storage::model_source::hf_hub_cache_dir;
use tokio_util::sync::CancellationToken;

use crate::backends::ActorKindRegistry;
use crate::gpu::{self, GpuProbe, RestartAfterGpuFailure, SimulatedGpus};
use crate::model_cache::default_model_cache_dir;
use crate::{AgentConfig, parse_labels, run_agent};

// The command's help is the `resident agent` variant's doc; a doc comment here would be
// read by clap as help text too.
#[allow(missing_docs)]
#[derive(Args)]
pub struct AgentArgs {
    /// Scheduler URL to dial out to (the agent opens no port); https:// is always TLS.
    #[arg(long, env = "RESIDENT_SCHEDULER")]
    scheduler: String,
    /// This node's stable name; a restart with the same id is a new generation.
    #[arg(long, env = "RESIDENT_NODE_ID")]
    node_id: String,
    /// CA certificate (PEM) that signed the scheduler's certificate, for https:// URLs
    /// (`resident certs init` writes ca.pem). Without it the system's roots are trusted.
    #[arg(long, env = "RESIDENT_CA")]
    ca: Option<PathBuf>,
    /// Token for a cluster with auth on (`resident token create --role agent` prints one).
    #[arg(long, env = "RESIDENT_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Send the token over plaintext http:// to a scheduler that is not on loopback (a
    /// network you trust); refused otherwise, since anyone on the path could read it.
    #[arg(long, env = "RESIDENT_INSECURE")]
    insecure: bool,
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
    /// Report simulated GPUs instead of real ones: `A6000:48GiB x8,T4:16GiB x4`; a leading
    /// `!` (`!T4:16GiB`) makes a GPU the host has and cannot open, as one another process
    /// holds.
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
    /// When GPUs fail while the agent runs (an Xid fault, an ECC error: their CUDA contexts
    /// stay failed until the process ends), drain and exit with an error so the service
    /// manager (Kubernetes, systemd's Restart=always) starts the agent again with fresh
    /// contexts: `all` once every GPU it offered has failed, `any` at the first (the
    /// healthy GPUs' actors reload), `never` to run on with what is left.
    #[arg(
        long,
        env = "RESIDENT_RESTART_AFTER_GPU_FAILURE",
        value_enum,
        default_value = "all"
    )]
    restart_after_gpu_failure: RestartAfterGpuFailure,
    /// Serve `grpc.health.v1` in plaintext on this address: `""` is SERVING while the
    /// process runs, `resident.v1.NodeAgentService` while it is registered with a scheduler.
    #[arg(long, env = "RESIDENT_HEALTH_LISTEN")]
    health_listen: Option<String>,
    /// Longest wait between registration attempts, in milliseconds. While the scheduler
    /// cannot be reached the agent also asks its health service every 500 ms and registers
    /// within about a second of an answer, however long the wait has grown.
    #[arg(long, env = "RESIDENT_RECONNECT_MAX_MS", default_value_t = 10_000)]
    reconnect_max_ms: u64,
    /// First wait between registration attempts, in milliseconds; each failure doubles it
    /// up to --reconnect-max-ms (with jitter).
    #[arg(long, env = "RESIDENT_RECONNECT_MIN_MS", default_value_t = 200, value_parser = clap::value_parser!(u64).range(10..))]
    reconnect_min_ms: u64,
    /// How often the agent pings its connection to the scheduler when nothing flows, and
    /// how long it waits for the answer: a silent network cut is noticed within twice this
    /// (`5s`, `10s`).
    #[arg(long, env = "RESIDENT_SCHEDULER_KEEPALIVE", default_value = "10s", value_parser = humantime::parse_duration)]
    scheduler_keepalive: std::time::Duration,
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
    /// Keep at most this many GiB of models in --model-cache: after each download the least
    /// recently used models go, never one an actor of this agent has loaded. Default: no
    /// limit.
    #[arg(long, env = "RESIDENT_MODEL_CACHE_MAX_GIB", value_parser = positive_gib)]
    model_cache_max_gib: Option<f64>,
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

impl AgentArgs {
    /// Where the CUDA driver keeps the kernels it compiles from PTX: beside the model cache,
    /// which deployments keep on the host ([`resident_models::device::set_cuda_jit_cache`]).
    pub fn cuda_jit_cache_dir(&self) -> PathBuf {
        self.model_cache
            .clone()
            .unwrap_or_else(default_model_cache_dir)
            .join("cuda-jit")
    }
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

/// Runs the agent as `args` say, offering the kinds of `registry`, until `cancel` fires
/// (SIGTERM: see [`shutdown_token`]).
pub async fn run(
    args: AgentArgs,
    registry: ActorKindRegistry,
    cancel: CancellationToken,
) -> anyhow::Result<()> {
    let probe: Arc<dyn GpuProbe> = match &args.simulate_gpus {
        Some(spec) => Arc::new(SimulatedGpus::parse(spec)?),
        None => Arc::from(gpu::discover()),
    };
    let mut config = AgentConfig::new(args.scheduler, args.node_id);
    config.labels = labels(&args.labels, args.labels_file.as_deref())?;
    config.reconnect_min = std::time::Duration::from_millis(args.reconnect_min_ms);
    config.reconnect_max =
        std::time::Duration::from_millis(args.reconnect_max_ms.max(50)).max(config.reconnect_min);
    anyhow::ensure!(
        args.scheduler_keepalive >= std::time::Duration::from_millis(100),
        "--scheduler-keepalive must be at least 100ms"
    );
    config.keepalive = args.scheduler_keepalive;
    config.actor_grace = args.actor_grace;
    config.drain_timeout = args.drain_timeout;
    config.restart_after_gpu_failure = args.restart_after_gpu_failure;
    config.credentials = client_credentials(args.ca.as_deref(), args.token.clone())?
        .allow_token_over_plaintext(args.insecure);
    if let (Some(cert), Some(key)) = (&args.client_cert, &args.client_key) {
        config.credentials = config
            .credentials
            .with_client_identity_files(cert, key)
            .context("--client-cert/--client-key")?;
    }
    config.models.dir = args.model_cache.unwrap_or_else(default_model_cache_dir);
    config.models.s3.endpoint = args.s3_endpoint;
    config.models.max_bytes = args
        .model_cache_max_gib
        .map(|gib| (gib * (1u64 << 30) as f64) as u64);
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
        let observer = crate::observe::AgentObserver::default();
        config.observer = Some(observer.clone());
        let cancel = cancel.clone();
        tokio::spawn(async move {
            if let Err(error) = crate::observe::serve_metrics(listener, observer, cancel).await {
                tracing::error!(%error, "agent HTTP port stopped");
            }
        });
        tracing::info!(%addr, "agent HTTP port: /metrics, /healthz");
    }
    if let Some(addr) = &args.health_listen {
        serve_health_on(addr, config.health.clone(), cancel.clone()).await?;
    }
    tracing::info!(kinds = ?registry.names(), "actor kinds offered");
    run_agent(config, registry, probe, cancel).await?;
    Ok(())
}

/// The client credentials of `--ca` and `--token`.
pub fn client_credentials(
    ca: Option<&Path>,
    token: Option<String>,
) -> anyhow::Result<ClientCredentials> {
    let mut credentials = ClientCredentials::default().with_token(token);
    if let Some(ca) = ca.filter(|p| !p.as_os_str().is_empty()) {
        credentials = credentials.with_ca_file(ca).context("--ca")?;
    }
    Ok(credentials)
}

/// Binds `addr` and serves `grpc.health.v1` there in plaintext until `cancel` fires.
pub async fn serve_health_on(
    addr: &str,
    reporter: HealthReporter,
    cancel: CancellationToken,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on --health-listen {addr}"))?;
    tracing::info!(addr = %listener.local_addr()?, "health port (grpc.health.v1, plaintext)");
    serve_health_port(listener, reporter, cancel);
    Ok(())
}

/// Cancels on Ctrl-C or SIGTERM.
pub fn shutdown_token() -> CancellationToken {
    let token = CancellationToken::new();
    let trigger = token.clone();
    tokio::spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("install SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        tracing::info!("shutting down");
        trigger.cancel();
    });
    token
}

/// Logs to stderr, filtered by `RESIDENT_LOG` (or `RUST_LOG`; default `info`), as text or
/// JSON lines.
pub fn init_logging(json: bool) {
    init_logging_at(json, "info");
}

/// [`init_logging`] at `default` (an `EnvFilter` directive: `warn`, `info`, `debug`) when
/// neither `RESIDENT_LOG` nor `RUST_LOG` says.
pub fn init_logging_at(json: bool, default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("RESIDENT_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only on a terminal: not in files, journald or container logs.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// A custom agent's whole command line: the agent's flags plus logging and threads.
#[derive(Parser)]
struct AgentCommand {
    /// Log as JSON lines instead of text.
    #[arg(long, env = "RESIDENT_LOG_JSON")]
    log_json: bool,
    /// Threads one model operation may use on CPU; RAYON_NUM_THREADS, when set, wins.
    #[arg(long, env = "RESIDENT_COMPUTE_THREADS", default_value_t = 1)]
    compute_threads: usize,
    #[command(flatten)]
    agent: AgentArgs,
}

/// The `main` of a custom agent named `name` (its `--help` and `--version` say so): parses
/// the command line, logs, runs the agent with `kinds` until SIGTERM, and returns the exit
/// status (0, or 1 with the error on stderr).
pub fn agent_main(name: &'static str, kinds: ActorKindRegistry) -> std::process::ExitCode {
    use clap::CommandFactory;
    let command = AgentCommand::command()
        .name(name)
        .about("A Resident node agent: dials out to a scheduler and hosts resident actors");
    let parsed = match command.try_get_matches() {
        Ok(matches) => <AgentCommand as clap::FromArgMatches>::from_arg_matches(&matches),
        Err(error) => Err(error),
    };
    let parsed = match parsed {
        Ok(parsed) => parsed,
        Err(error) => error.exit(),
    };
    resident_models::device::set_compute_threads(parsed.compute_threads);
    resident_models::device::set_cuda_jit_cache(&parsed.agent.cuda_jit_cache_dir());
    init_logging(parsed.log_json);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(async {
        let cancel = shutdown_token();
        run(parsed.agent, kinds, cancel).await
    });
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// A size in GiB above zero.
fn positive_gib(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(gib) if gib.is_finite() && gib > 0.0 => Ok(gib),
        _ => Err(format!(
            "`{text}` is not a size in GiB above zero (e.g. 200 or 0.5)"
        )),
    }
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

    #[test]
    fn a_cache_limit_is_a_positive_number_of_gib() {
        assert_eq!(super::positive_gib("0.5"), Ok(0.5));
        for bad in ["0", "-3", "many", "NaN", "inf"] {
            let refusal = super::positive_gib(bad).unwrap_err();
            assert!(refusal.contains("above zero"), "{refusal}");
        }
    }
}
