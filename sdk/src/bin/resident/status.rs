use clap::Args;
use resident_sdk::{Cluster, pb};
use serde_json::json;

#[derive(Args)]
pub struct StatusArgs {
    /// Scheduler URL.
    #[arg(long, env = "RESIDENT_CLUSTER")]
    cluster: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

fn state_name(state: i32) -> &'static str {
    resident_proto::actor_state_name(
        pb::ActorState::try_from(state).unwrap_or(pb::ActorState::Unspecified),
    )
}

pub fn status_json(nodes: &[pb::NodeInfo], actors: &[pb::ActorInfo]) -> serde_json::Value {
    let nodes: Vec<_> = nodes
        .iter()
        .map(|n| {
            json!({
                "node_id": n.node_id,
                "state": if n.alive { "alive" } else { "dead" },
                "labels": n.labels,
                "hostname": n.hostname,
                "generation": n.generation,
                "gpus": n.gpus.iter().map(|g| json!({
                    "index": g.index,
                    "name": g.name,
                    "total_vram_bytes": g.total_vram_bytes,
                    "free_vram_bytes": g.free_vram_bytes,
                    "compute_capability": format!("{}.{}", g.compute_major, g.compute_minor),
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
                "node_id": if a.node_id.is_empty() { None } else { Some(&a.node_id) },
                "gpu_index": a.gpu_indices.first(),
                "gpu_indices": a.gpu_indices,
                "state": state_name(a.state),
                "model_loads": a.model_loads,
                "restarts": a.restarts,
                "tasks_done": a.tasks_done,
                "in_flight": a.in_flight,
                "vram_bytes": a.vram_bytes,
                "error": if a.error.is_empty() { None } else { Some(&a.error) },
            })
        })
        .collect();
    json!({ "nodes": nodes, "actors": actors })
}

fn print_table(nodes: &[pb::NodeInfo], actors: &[pb::ActorInfo]) {
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
        let state = if n.alive { "alive" } else { "dead" };
        let gpus = if gpus.is_empty() {
            "-".to_owned()
        } else {
            gpus.join(", ")
        };
        println!(
            "{:<16} {:<6} {:<28} {:>5}  {}",
            n.node_id,
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
        let node = if a.node_id.is_empty() {
            "-"
        } else {
            &a.node_id
        };
        println!(
            "{:<28} {:<14} {:<16} {:<5} {:<9} {:>5} {:>8}  {}",
            a.actor_id,
            a.pool,
            node,
            gpu,
            state_name(a.state),
            a.model_loads,
            a.tasks_done,
            a.error
        );
    }
}

pub async fn run(args: StatusArgs) -> anyhow::Result<()> {
    let cluster = Cluster::connect(&args.cluster).await?;
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
