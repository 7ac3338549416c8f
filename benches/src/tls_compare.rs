//! `runtime-bench --tls`: the same no-op calls through a plaintext, token-less cluster and a
//! TLS cluster with tokens, in one run. Both are a scheduler and an agent in this process on
//! loopback, set up the same way except for the security, and measured alternately twice.

use std::sync::Arc;
use std::time::{Duration, Instant};

use resident_node_agent::backends::ActorKindRegistry;
use resident_node_agent::gpu::NoGpus;
use resident_node_agent::{AgentConfig, run_agent};
use resident_scheduler::auth::pki::generate_scheduler_pki;
use resident_scheduler::auth::{AuthFile, AuthGate, Role};
use resident_scheduler::core::CoreConfig;
use resident_scheduler::server::{ServerSecurity, TlsIdentity, start_scheduler};
use resident_scheduler::store::MemoryStore;
use resident_sdk::{Bytes, ClientCredentials, Cluster, PoolSpec};
use tokio_util::sync::CancellationToken;

struct BenchCluster {
    cluster: Cluster,
    cancel: CancellationToken,
}

impl Drop for BenchCluster {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

async fn start(secure: bool) -> anyhow::Result<BenchCluster> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let cancel = CancellationToken::new();
    let (security, client, agent) = if secure {
        let pki = generate_scheduler_pki(&["127.0.0.1".into()], 1).map_err(anyhow::Error::msg)?;
        let mut tokens = AuthFile::default();
        let client_token = tokens.create("bench", Role::Admin)?;
        let agent_token = tokens.create("bench-node", Role::Agent)?;
        let ca = Some(pki.ca_cert_pem.clone().into_bytes());
        let security = ServerSecurity {
            tls: Some(TlsIdentity {
                cert_pem: pki.cert_pem.into_bytes(),
                key_pem: pki.key_pem.into_bytes(),
            }),
            agent_ca_pem: None,
            auth: AuthGate::with_tokens(&tokens),
            limits: Default::default(),
        };
        let credentials = |token: String| ClientCredentials {
            ca_pem: ca.clone(),
            token: Some(token),
            ..Default::default()
        };
        (
            security,
            credentials(client_token),
            credentials(agent_token),
        )
    } else {
        (
            ServerSecurity::open(),
            ClientCredentials::default(),
            ClientCredentials::default(),
        )
    };
    let server = start_scheduler(
        listener,
        CoreConfig::default(),
        Arc::new(MemoryStore::default()),
        security,
        cancel.clone(),
    )?;
    let mut config = AgentConfig::new(server.url.clone(), "bench-node");
    config.credentials = agent;
    tokio::spawn(run_agent(
        config,
        ActorKindRegistry::with_builtin_kinds(),
        Arc::new(NoGpus),
        cancel.clone(),
    ));
    let cluster = Cluster::connect_with(&server.url, client).await?;
    cluster.wait_for_nodes(1, Duration::from_secs(10)).await?;
    Ok(BenchCluster { cluster, cancel })
}

/// calls/s one at a time, and pipelined with credit 2, on one echo actor.
async fn measure(secure: bool, sync_calls: u32, pipelined_calls: u32) -> anyhow::Result<[f64; 2]> {
    let bench = start(secure).await?;
    let pool = bench
        .cluster
        .create_pool(PoolSpec::new("one", "echo"))
        .await?;
    pool.wait_ready(Duration::from_secs(10)).await?;
    let mut session = pool.session().await?;
    for _ in 0..200 {
        session.call(Bytes::from_static(b"warm")).await?;
    }
    let started = Instant::now();
    for i in 0..sync_calls {
        session.call(Bytes::from(i.to_le_bytes().to_vec())).await?;
    }
    let sync_rate = f64::from(sync_calls) / started.elapsed().as_secs_f64();
    let pipelined_rate = crate::pipelined(&pool, pipelined_calls).await?;
    Ok([sync_rate, pipelined_rate])
}

pub async fn run(sync_calls: u32, pipelined_calls: u32) -> anyhow::Result<()> {
    let mut plain = Vec::new();
    let mut secure = Vec::new();
    for _ in 0..2 {
        plain.push(measure(false, sync_calls, pipelined_calls).await?);
        secure.push(measure(true, sync_calls, pipelined_calls).await?);
    }
    println!("| measurement | plaintext, no tokens | TLS + token | TLS / plaintext |");
    println!("|---|---:|---:|---:|");
    for (index, name) in [
        "1 actor, one call at a time (calls/s)",
        "1 actor, pipelined, credit 2 (calls/s)",
    ]
    .iter()
    .enumerate()
    {
        let mean =
            |runs: &[[f64; 2]]| runs.iter().map(|r| r[index]).sum::<f64>() / runs.len() as f64;
        let runs = |runs: &[[f64; 2]]| {
            runs.iter()
                .map(|r| format!("{:.0}", r[index]))
                .collect::<Vec<_>>()
                .join(" / ")
        };
        println!(
            "| {name} | {} | {} | {:.2} |",
            runs(&plain),
            runs(&secure),
            mean(&secure) / mean(&plain)
        );
    }
    Ok(())
}
