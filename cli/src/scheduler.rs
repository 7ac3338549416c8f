use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use resident_scheduler::auth::{AuthGate, watch_auth_file};
use resident_scheduler::connections::GrpcLimits;
use resident_scheduler::core::{CoreConfig, SchedulerCommand};
use resident_scheduler::http::{HttpLimits, serve_http};
use resident_scheduler::server::{ServerSecurity, TlsIdentity, start_scheduler};
use resident_scheduler::store::RedbStore;

#[derive(Args)]
pub struct SchedulerArgs {
    /// Address to serve agents and clients on. Beyond loopback it needs TLS and an auth file
    /// (or --insecure).
    #[arg(long, env = "RESIDENT_LISTEN", default_value = "0.0.0.0:50051")]
    listen: String,
    /// The scheduler's certificate chain (PEM); with --tls-key, the port speaks only TLS.
    #[arg(long, env = "RESIDENT_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, env = "RESIDENT_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// CA (PEM) of agents' client certificates (`resident certs agent`): every agent must
    /// then present one naming its node id (mutual TLS). Needs --tls-cert.
    #[arg(long, env = "RESIDENT_AGENT_CA", requires = "tls_cert")]
    agent_ca: Option<PathBuf>,
    /// Tokens and roles (`resident token create`); every call then needs a token. Re-read
    /// when it changes and on SIGHUP.
    #[arg(long, env = "RESIDENT_AUTH_FILE")]
    auth_file: Option<PathBuf>,
    /// Serve beyond loopback without TLS or tokens (trusted networks only; warns at start).
    #[arg(long, env = "RESIDENT_INSECURE")]
    insecure: bool,
    /// Also serve `grpc.health.v1` alone, in plaintext, on this address (Kubernetes' gRPC
    /// probes speak no TLS; `resident health` checks it). The API port serves it too.
    #[arg(long, env = "RESIDENT_HEALTH_LISTEN")]
    health_listen: Option<String>,
    /// Serve HTTP here: the dashboard at `/`, `/metrics` (Prometheus), `/v1/overview` and
    /// `/v1/demand` (JSON; the latter for autoscalers such as KEDA) and `/healthz`. It uses
    /// the API port's TLS and tokens (`Authorization: Bearer`, or the cookie `/login` sets;
    /// any role that may read).
    #[arg(long, env = "RESIDENT_HTTP_LISTEN")]
    http_listen: Option<String>,
    /// Connections the HTTP port serves at once; more wait to be accepted.
    #[arg(long, env = "RESIDENT_HTTP_MAX_CONNECTIONS", default_value_t = resident_scheduler::http::DEFAULT_MAX_CONNECTIONS as u32, value_parser = clap::value_parser!(u32).range(1..))]
    http_max_connections: u32,
    /// The longest an HTTP client may take over its TLS handshake, or to send a request's
    /// headers: a client that trickles them (slowloris) is cut off after this.
    #[arg(long, env = "RESIDENT_HTTP_HEADER_TIMEOUT_MS", default_value_t = resident_scheduler::http::DEFAULT_HEADER_TIMEOUT.as_millis() as u64, value_parser = clap::value_parser!(u64).range(1..))]
    http_header_timeout_ms: u64,
    /// Connections the gRPC port (agents and clients) serves at once; more wait to be
    /// accepted.
    #[arg(long, env = "RESIDENT_GRPC_MAX_CONNECTIONS", default_value_t = resident_scheduler::connections::DEFAULT_GRPC_MAX_CONNECTIONS as u32, value_parser = clap::value_parser!(u32).range(1..))]
    grpc_max_connections: u32,
    /// The longest a gRPC connection may take over its TLS handshake and HTTP/2 preface: a
    /// connection that sends nothing, or trickles its handshake, is cut off after this.
    #[arg(long, env = "RESIDENT_GRPC_HANDSHAKE_TIMEOUT_MS", default_value_t = resident_scheduler::connections::DEFAULT_GRPC_HANDSHAKE_TIMEOUT.as_millis() as u64, value_parser = clap::value_parser!(u64).range(1..))]
    grpc_handshake_timeout_ms: u64,
    /// Where pools, jobs and task outcomes persist across restarts.
    #[arg(long, env = "RESIDENT_STATE_DIR", default_value = "resident-state")]
    state_dir: PathBuf,
    /// How often agents send heartbeats.
    #[arg(long, env = "RESIDENT_HEARTBEAT_MS", default_value_t = 2000)]
    heartbeat_ms: u64,
    /// Least time between two progress reports of one actor inside a long task (embed
    /// bars move between chunk ends); 0 turns them off, for very large fleets.
    #[arg(long, env = "RESIDENT_TASK_PROGRESS_MS", default_value_t = 500)]
    task_progress_ms: u64,
    /// A node silent for this long is dead and its actors are placed elsewhere.
    #[arg(long, env = "RESIDENT_NODE_DEAD_MS", default_value_t = 10_000)]
    node_dead_ms: u64,
    /// A node dead this long that hosts nothing is forgotten: it leaves `resident nodes`
    /// and the scheduler's memory, and may come back as new (`30m`, `1h`, `1d`).
    #[arg(long, env = "RESIDENT_DEAD_NODE_TTL", default_value = "1h", value_parser = humantime::parse_duration)]
    dead_node_ttl: Duration,
    /// Attempts per task before it fails (pools may override).
    #[arg(long, env = "RESIDENT_MAX_TASK_ATTEMPTS", default_value_t = 3)]
    max_task_attempts: u32,
    /// Finished jobs kept for `GetJob` (in memory and in the state dir); older ones are
    /// forgotten with their recorded outcomes.
    #[arg(long, env = "RESIDENT_JOB_HISTORY", default_value_t = 1000)]
    job_history: usize,
    /// After a restart, placement waits up to this long for the nodes that were alive
    /// before (less once all are back), so replicas do not pile onto the first one back.
    #[arg(long, env = "RESIDENT_SETTLE_MS", default_value_t = 15_000)]
    settle_ms: u64,
    /// Bytes all running jobs may hold in the scheduler together: task payloads not yet
    /// finished and results their clients have not read. New jobs are refused
    /// (RESOURCE_EXHAUSTED) while it is full. Default: a quarter of this machine's memory.
    #[arg(long, env = "RESIDENT_MAX_BUFFERED_BYTES")]
    max_buffered_bytes: Option<u64>,
    /// Bytes one job may hold in the scheduler; beyond it the scheduler stops reading the
    /// job's tasks until its client reads results, so a client that never reads slows
    /// only itself.
    #[arg(long, env = "RESIDENT_MAX_JOB_BUFFERED_BYTES", default_value_t = resident_scheduler::core::DEFAULT_MAX_JOB_BUFFERED_BYTES)]
    max_job_buffered_bytes: u64,
    /// Running jobs one principal (token) may have at once; more are refused
    /// (RESOURCE_EXHAUSTED).
    #[arg(long, env = "RESIDENT_MAX_JOBS_PER_PRINCIPAL", default_value_t = resident_scheduler::core::DEFAULT_MAX_JOBS_PER_PRINCIPAL)]
    max_jobs_per_principal: usize,
    /// How long a job whose client stream broke runs on, waiting for the client to
    /// reattach (the SDK and the CLI do so by themselves), before the rest of it is
    /// cancelled. Results that finish meanwhile are held for the client, within the job's
    /// buffer. 0 cancels at once.
    #[arg(long, env = "RESIDENT_DETACH_GRACE_MS", default_value_t = resident_scheduler::core::DEFAULT_DETACH_GRACE.as_millis() as u64)]
    detach_grace_ms: u64,
}

impl SchedulerArgs {
    fn core_config(&self) -> anyhow::Result<CoreConfig> {
        anyhow::ensure!(self.heartbeat_ms > 0, "--heartbeat-ms must be above zero");
        anyhow::ensure!(
            self.node_dead_ms > self.heartbeat_ms,
            "--node-dead-ms ({}) must exceed --heartbeat-ms ({})",
            self.node_dead_ms,
            self.heartbeat_ms
        );
        anyhow::ensure!(
            self.max_job_buffered_bytes > 0 && self.max_buffered_bytes != Some(0),
            "--max-buffered-bytes and --max-job-buffered-bytes must be above zero"
        );
        anyhow::ensure!(
            self.max_jobs_per_principal > 0,
            "--max-jobs-per-principal must be at least 1"
        );
        anyhow::ensure!(
            self.max_task_attempts > 0,
            "--max-task-attempts must be at least 1"
        );
        Ok(CoreConfig {
            heartbeat_interval: Duration::from_millis(self.heartbeat_ms),
            task_progress_interval: Duration::from_millis(self.task_progress_ms),
            node_dead_after: Duration::from_millis(self.node_dead_ms),
            dead_node_ttl: self.dead_node_ttl,
            default_max_task_attempts: self.max_task_attempts,
            finished_job_history: self.job_history,
            settle_window: Duration::from_millis(self.settle_ms),
            max_buffered_bytes: self
                .max_buffered_bytes
                .unwrap_or_else(resident_scheduler::core::default_max_buffered_bytes),
            max_job_buffered_bytes: self.max_job_buffered_bytes,
            max_jobs_per_principal: self.max_jobs_per_principal,
            detach_grace: Duration::from_millis(self.detach_grace_ms),
            ..CoreConfig::default()
        })
    }

    fn security(&self) -> anyhow::Result<ServerSecurity> {
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(TlsIdentity {
                cert_pem: std::fs::read(cert)
                    .with_context(|| format!("--tls-cert {}", cert.display()))?,
                key_pem: std::fs::read(key)
                    .with_context(|| format!("--tls-key {}", key.display()))?,
            }),
            _ => None,
        };
        let auth = match &self.auth_file {
            Some(path) => AuthGate::from_file(path)?,
            None => AuthGate::open(),
        };
        let agent_ca_pem = self
            .agent_ca
            .as_ref()
            .map(|path| {
                std::fs::read(path).with_context(|| format!("--agent-ca {}", path.display()))
            })
            .transpose()?;
        Ok(ServerSecurity {
            tls,
            agent_ca_pem,
            auth,
            limits: GrpcLimits {
                max_connections: self.grpc_max_connections as usize,
                handshake_timeout: Duration::from_millis(self.grpc_handshake_timeout_ms),
            },
        })
    }
}

/// Whether the scheduler may serve on `addr` as configured: loopback always; beyond it only
/// with TLS and tokens, or with `--insecure` (then with a warning).
pub fn exposure_check(
    addr: SocketAddr,
    tls: bool,
    tokens: bool,
    insecure: bool,
) -> Result<Option<String>, String> {
    if addr.ip().is_loopback() || (tls && tokens) {
        return Ok(None);
    }
    let mut missing = Vec::new();
    if !tls {
        missing.push("TLS (--tls-cert and --tls-key; `resident certs init` makes them)");
    }
    if !tokens {
        missing.push("tokens (--auth-file; `resident token create` fills it)");
    }
    let missing = missing.join(" and ");
    if insecure {
        return Ok(Some(format!(
            "serving {addr} beyond loopback without {missing} (--insecure): anyone who reaches this port controls the cluster"
        )));
    }
    Err(format!(
        "refusing to serve {addr} beyond loopback without {missing}; bind 127.0.0.1, or pass --insecure on a network you trust"
    ))
}

pub async fn run(args: SchedulerArgs) -> anyhow::Result<()> {
    let config = args.core_config()?;
    let security = args.security()?;
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let local_addr = listener.local_addr()?;
    match exposure_check(
        local_addr,
        security.tls.is_some(),
        !security.auth.is_open(),
        args.insecure,
    ) {
        Ok(None) => {}
        Ok(Some(warning)) => tracing::warn!("{warning}"),
        Err(refusal) => anyhow::bail!(refusal),
    }
    let http_listener = match &args.http_listen {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on --http-listen {addr}"))?;
            match exposure_check(
                listener.local_addr()?,
                security.tls.is_some(),
                !security.auth.is_open(),
                args.insecure,
            ) {
                Ok(None) => {}
                Ok(Some(warning)) => tracing::warn!("--http-listen: {warning}"),
                Err(refusal) => anyhow::bail!("--http-listen: {refusal}"),
            }
            Some(listener)
        }
        None => None,
    };
    let store = RedbStore::open(&args.state_dir)
        .with_context(|| format!("opening state dir {}", args.state_dir.display()))?;
    let cancel = crate::shutdown_token();
    let gate = security.auth.clone();
    let http_security = security.clone();
    let server = start_scheduler(listener, config, Arc::new(store), security, cancel.clone())?;
    if let Some(listener) = http_listener {
        let addr = listener.local_addr()?;
        let limits = HttpLimits {
            max_connections: args.http_max_connections as usize,
            header_timeout: Duration::from_millis(args.http_header_timeout_ms),
            ..HttpLimits::default()
        };
        serve_http(
            listener,
            server.handle.clone(),
            &http_security,
            limits,
            cancel.clone(),
        )?;
        tracing::info!(%addr, "HTTP port: dashboard at /, /metrics, /v1/demand, /healthz");
    }
    if let Some(addr) = &args.health_listen {
        crate::health::serve_health_on(addr, server.health.clone(), cancel.clone()).await?;
    }
    if let Some(path) = &args.auth_file {
        let scheduler = server.handle.clone();
        watch_auth_file(
            gate,
            path.clone(),
            Duration::from_secs(1),
            move |valid| {
                scheduler.send_soon(SchedulerCommand::CredentialsChanged { valid });
            },
            cancel,
        );
    }
    // Printed on stdout so scripts and tests can read the bound address.
    println!("resident scheduler listening on {}", server.url);
    server.task.await??;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_binds_need_tls_and_tokens_or_insecure() {
        let loopback: SocketAddr = "127.0.0.1:50051".parse().unwrap();
        let open: SocketAddr = "0.0.0.0:50051".parse().unwrap();
        assert_eq!(exposure_check(loopback, false, false, false), Ok(None));
        assert_eq!(exposure_check(open, true, true, false), Ok(None));
        let refused = exposure_check(open, true, false, false).unwrap_err();
        assert!(refused.contains("tokens (--auth-file"), "{refused}");
        assert!(!refused.contains("TLS (--tls-cert"), "{refused}");
        let refused = exposure_check(open, false, false, false).unwrap_err();
        assert!(
            refused.contains("TLS") && refused.contains("--insecure"),
            "{refused}"
        );
        let warned = exposure_check(open, false, true, true).unwrap().unwrap();
        assert!(warned.contains("--insecure"), "{warned}");
    }
}
