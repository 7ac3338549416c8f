use std::path::PathBuf;

use clap::Args;
use resident_sdk::{Cluster, LocalConfig};

#[derive(Args)]
pub struct LocalArgs {
    /// Address to serve on, so `resident status` and SDK clients can connect.
    #[arg(long, env = "RESIDENT_LISTEN", default_value = "127.0.0.1:50051")]
    listen: std::net::SocketAddr,
    /// Report simulated GPUs instead of real ones.
    #[arg(long, env = "RESIDENT_SIMULATE_GPUS")]
    simulate_gpus: Option<String>,
    /// Labels of the in-process node, for placement selectors: `pool=dev,zone=lab1`.
    #[arg(long, env = "RESIDENT_LABELS", default_value = "")]
    labels: String,
    /// Persist pools and jobs here (memory only when absent).
    #[arg(long, env = "RESIDENT_STATE_DIR")]
    state_dir: Option<PathBuf>,
    /// Serve the dashboard, `/metrics` and `/healthz` on this address too.
    #[arg(long, env = "RESIDENT_HTTP_LISTEN")]
    http_listen: Option<std::net::SocketAddr>,
    /// Serve beyond loopback with no TLS and no tokens (a local cluster has neither).
    #[arg(long, env = "RESIDENT_INSECURE")]
    insecure: bool,
}

pub async fn run(args: LocalArgs) -> anyhow::Result<()> {
    // A local cluster is plaintext with no tokens: beyond loopback only when asked.
    match crate::scheduler::exposure_check(args.listen, false, false, args.insecure) {
        Ok(None) => {}
        Ok(Some(warning)) => tracing::warn!("{warning}"),
        Err(refusal) => anyhow::bail!(
            "{refusal} (a local cluster has neither; run `resident scheduler` with TLS and tokens and `resident agent` instead)"
        ),
    }
    if let Some(http) = args.http_listen {
        match crate::scheduler::exposure_check(http, false, false, args.insecure) {
            Ok(None) => {}
            Ok(Some(warning)) => tracing::warn!("--http-listen: {warning}"),
            Err(refusal) => anyhow::bail!("--http-listen: {refusal}"),
        }
    }
    let config = LocalConfig {
        listen: args.listen,
        simulate_gpus: args.simulate_gpus,
        labels: args.labels,
        state_dir: args.state_dir,
        http_listen: args.http_listen,
        ..LocalConfig::default()
    };
    let cluster = Cluster::local(config).await?;
    println!("resident local cluster listening on {}", cluster.url());
    if let Some(http) = cluster.local_http_url() {
        println!("dashboard: {http}/ (metrics: {http}/metrics)");
    }
    let cancel = crate::shutdown_token();
    cancel.cancelled().await;
    Ok(())
}
