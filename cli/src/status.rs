use clap::Args;
use resident_sdk::json::{node_state, status_json};
use resident_sdk::{ActorInfo, NodeInfo};

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
    /// Redraw every INTERVAL (default 2s) until Ctrl-C, with the running jobs' progress;
    /// with --json, one JSON object per line each time.
    #[arg(
        long,
        env = "RESIDENT_WATCH",
        num_args = 0..=1,
        default_missing_value = "2s",
        value_parser = humantime::parse_duration,
        value_name = "INTERVAL"
    )]
    watch: Option<std::time::Duration>,
}

/// A line for each GPU a node has that its agent could not open, under the nodes' table.
fn unavailable_gpu_lines(nodes: &[NodeInfo]) -> Vec<String> {
    nodes
        .iter()
        .flat_map(|n| {
            n.unavailable_gpus.iter().map(move |gpu| {
                format!(
                    "{}: GPU {} is unavailable, so no actor is placed there: {} (check \
                     nvidia-smi on {} for its state and for processes that hold it)",
                    n.node_id.as_str(),
                    gpu.index,
                    gpu.reason,
                    if n.hostname.is_empty() {
                        n.node_id.as_str()
                    } else {
                        n.hostname.as_str()
                    }
                )
            })
        })
        .collect()
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
    for line in unavailable_gpu_lines(nodes) {
        println!("{line}");
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
    let Some(interval) = args.watch else {
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
        return Ok(());
    };
    let cancel = crate::shutdown_token();
    let interval = interval.max(std::time::Duration::from_millis(200));
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stdout());
    loop {
        let nodes = cluster.list_nodes().await?;
        let actors = cluster.list_actors().await?;
        let jobs: Vec<_> = cluster
            .list_jobs()
            .await?
            .into_iter()
            .filter(|j| j.is_running())
            .collect();
        if args.json {
            let mut line = status_json(&nodes, &actors);
            line["jobs"] = jobs.iter().map(resident_sdk::json::job_json).collect();
            println!("{line}");
        } else {
            if terminal {
                // Clear the screen and go home: one screenful, redrawn in place.
                print!("\x1b[2J\x1b[H");
            }
            print_table(&nodes, &actors);
            if !jobs.is_empty() {
                println!();
                crate::ops::print_jobs(&jobs);
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = cancel.cancelled() => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, unavailable: Vec<resident_sdk::UnavailableGpu>) -> NodeInfo {
        NodeInfo {
            node_id: id.into(),
            generation: String::new(),
            hostname: format!("{id}.example"),
            alive: true,
            labels: Default::default(),
            gpus: Vec::new(),
            cpu_cores: 8,
            ram_bytes: 0,
            last_heartbeat_ms_ago: 0,
            credential: String::new(),
            draining: false,
            unavailable_gpus: unavailable,
        }
    }

    #[test]
    fn each_unavailable_gpu_gets_a_line_with_its_reason_and_where_to_look() {
        let held = resident_sdk::UnavailableGpu {
            index: 3,
            reason: "busy or unavailable (CUDA_ERROR_DEVICE_UNAVAILABLE)".into(),
        };
        let lines = unavailable_gpu_lines(&[node("a", vec![]), node("b", vec![held])]);
        assert_eq!(lines.len(), 1);
        assert!(
            lines[0].starts_with("b: GPU 3 is unavailable") && lines[0].contains("b.example"),
            "{}",
            lines[0]
        );
        assert!(lines[0].contains("CUDA_ERROR_DEVICE_UNAVAILABLE"));
    }
}
