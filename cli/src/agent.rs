use std::sync::Arc;

use clap::Args;
use resident_node_agent::backends::ActorKindRegistry;
use resident_node_agent::gpu::{self, GpuProbe, SimulatedGpus, parse_simulated_gpus};
use resident_node_agent::{AgentConfig, parse_labels, run_agent};

#[derive(Args)]
pub struct AgentArgs {
    /// Scheduler URL to dial out to (the agent opens no port).
    #[arg(long, env = "RESIDENT_SCHEDULER")]
    scheduler: String,
    /// This node's stable name; a restart with the same id is a new generation.
    #[arg(long, env = "RESIDENT_NODE_ID")]
    node_id: String,
    /// Labels for placement selectors: `pool=onprem-a6000,zone=lab1`.
    #[arg(long, env = "RESIDENT_LABELS", default_value = "")]
    labels: String,
    /// Report simulated GPUs instead of real ones: `A6000:48GiB x8,T4:16GiB x4`.
    #[arg(long, env = "RESIDENT_SIMULATE_GPUS")]
    simulate_gpus: Option<String>,
    /// Longest wait between reconnect attempts, in milliseconds.
    #[arg(long, env = "RESIDENT_RECONNECT_MAX_MS", default_value_t = 10_000)]
    reconnect_max_ms: u64,
}

pub async fn run(args: AgentArgs) -> anyhow::Result<()> {
    let probe: Arc<dyn GpuProbe> = match &args.simulate_gpus {
        Some(spec) => Arc::new(SimulatedGpus::new(parse_simulated_gpus(spec)?)),
        None => Arc::from(gpu::discover()),
    };
    let mut config = AgentConfig::new(args.scheduler, args.node_id);
    config.labels = parse_labels(&args.labels)?;
    config.reconnect_max = std::time::Duration::from_millis(args.reconnect_max_ms.max(50));
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
