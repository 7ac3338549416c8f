use clap::Args;
use resident_sdk::{ActorInfo, NodeInfo};
use serde_json::json;

#[derive(Args)]
pub struct StatusArgs {
    /// Scheduler URL.
    #[arg(long, env = "RESIDENT_CLUSTER")]
    cluster: String,
    #[command(flatten)]
    credentials: crate::credentials::CredentialArgs,
    /// Print JSON instead of a table.
    #[arg(long, env = "RESIDENT_JSON")]
    json: bool,
}

/// `alive`, `draining` (shutting down, finishing its tasks in hand) or `dead`.
fn node_state(node: &NodeInfo) -> &'static str {
    match (node.alive, node.draining) {
        (true, false) => "alive",
        (true, true) => "draining",
        (false, _) => "dead",
    }
}

pub fn status_json(nodes: &[NodeInfo], actors: &[ActorInfo]) -> serde_json::Value {
    let nodes: Vec<_> = nodes
        .iter()
        .map(|n| {
            json!({
                "node_id": n.node_id,
                "state": node_state(n),
                "labels": n.labels,
                "hostname": n.hostname,
                "generation": n.generation,
                "credential": n.credential,
                "gpus": n.gpus.iter().map(|g| json!({
                    "index": g.index,
                    "name": g.name,
                    "total_vram_bytes": g.total_vram_bytes,
                    "free_vram_bytes": g.free_vram_bytes,
                    "compute_capability": format!("{}.{}", g.compute_capability.0, g.compute_capability.1),
                    "simulated": g.simulated,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    let actors: Vec<_> = actors
        .iter()
        .map(|a| {
            json!({
                "actor_id": a.actor_id,
                "pool": a.pool,
                "node_id": a.node_id,
                "gpu_index": a.gpu_indices.first(),
                "gpu_indices": a.gpu_indices,
                "state": a.state.name(),
                "model_loads": a.model_loads,
                "restarts": a.restarts,
                "tasks_done": a.tasks_done,
                "in_flight": a.in_flight,
                "vram_bytes": a.vram_bytes,
                "error": a.error,
            })
        })
        .collect();
    json!({ "nodes": nodes, "actors": actors })
}

fn print_table(nodes: &[NodeInfo], actors: &[ActorInfo]) {
    println!(
        "{:<16} {:<6} {:<28} {:>5}  GPUS (free/total GiB)",
        "NODE", "STATE", "LABELS", "CPUS"
    );
    for n in nodes {
        let mut labels: Vec<String> = n.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        labels.sort();
        let gpus: Vec<String> = n
            .gpus
            .iter()
            .map(|g| {
                let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
                format!(
                    "{}:{} {:.1}/{:.1}",
                    g.index,
                    g.name,
                    gib(g.free_vram_bytes),
                    gib(g.total_vram_bytes)
                )
            })
            .collect();
        let state = node_state(n);
        let gpus = if gpus.is_empty() {
            "-".to_owned()
        } else {
            gpus.join(", ")
        };
        println!(
            "{:<16} {:<6} {:<28} {:>5}  {}",
            n.node_id.as_str(),
            state,
            labels.join(","),
            n.cpu_cores,
            gpus
        );
    }
    println!();
    println!(
        "{:<28} {:<14} {:<16} {:<5} {:<9} {:>5} {:>8}  NOTE",
        "ACTOR", "POOL", "NODE", "GPU", "STATE", "LOADS", "TASKS"
    );
    for a in actors {
        let gpu = a
            .gpu_indices
            .first()
            .map_or("-".to_owned(), ToString::to_string);
        let node = a.node_id.as_ref().map_or("-", |n| n.as_str());
        println!(
            "{:<28} {:<14} {:<16} {:<5} {:<9} {:>5} {:>8}  {}",
            a.actor_id.as_str(),
            a.pool.as_str(),
            node,
            gpu,
            a.state.name(),
            a.model_loads,
            a.tasks_done,
            a.error.as_deref().unwrap_or("")
        );
    }
}

pub async fn run(args: StatusArgs) -> anyhow::Result<()> {
    let cluster = args.credentials.connect(&args.cluster).await?;
    let nodes = cluster.list_nodes().await?;
    let actors = cluster.list_actors().await?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&status_json(&nodes, &actors))?
        );
    } else {
        print_table(&nodes, &actors);
    }
    Ok(())
}
