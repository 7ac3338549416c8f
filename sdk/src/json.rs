//! The JSON the CLI's `--json` flags print (`resident status`, `resident jobs`, `resident
//! pools`), one definition for every client that shows the same objects (the Python
//! package's `nodes()`, `jobs()`, `pools()`).

use resident_proto::unix_ms_now;
use serde_json::json;

use crate::{ActorInfo, JobStatus, NodeInfo, PoolStatus};

/// `alive`, `draining` (shutting down, finishing its tasks in hand) or `dead`.
pub fn node_state(node: &NodeInfo) -> &'static str {
    match (node.alive, node.draining) {
        (true, false) => "alive",
        (true, true) => "draining",
        (false, _) => "dead",
    }
}

/// Nodes and actors as `resident status --json` prints them.
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
                "unavailable_gpus": n.unavailable_gpus.iter().map(|g| json!({
                    "index": g.index,
                    "reason": g.reason,
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

/// A job as `resident jobs --json` prints it.
pub fn job_json(job: &JobStatus) -> serde_json::Value {
    let now = unix_ms_now();
    json!({
        "job_id": job.job_id.to_string(),
        "name": job.name,
        "pool": job.pool.to_string(),
        "state": job.state.name(),
        "owner": job.owner,
        "submitted": job.submitted,
        "queued": job.queued,
        "running": job.running,
        "succeeded": job.succeeded,
        "failed": job.failed,
        "cancelled": job.cancelled,
        "expected_tasks": job.expected_tasks,
        "progress": job.progress(),
        "items_done": job.items_done,
        "items_running": job.items_running,
        "items_per_second": job.items_per_second(now),
        "elapsed_seconds": job.elapsed(now).as_secs_f64(),
        "started_unix_ms": job.started_unix_ms,
        "finished_unix_ms": job.finished_unix_ms,
        "gpu_seconds": job.gpu_seconds,
        "cost_usd": job.cost_usd,
        "summary": job.summary_json.as_deref().and_then(|s| serde_json::from_str::<serde_json::Value>(s).ok()),
    })
}

/// A pool as `resident pools --json` prints it.
pub fn pool_json(pool: &PoolStatus) -> serde_json::Value {
    json!({
        "name": pool.spec.name(),
        "kind": pool.spec.kind(),
        "owner": pool.spec.owner(),
        "replicas": pool.replicas(),
        "ready_actors": pool.ready_actors,
        "model_loads": pool.actors.iter().map(|a| a.model_loads).sum::<u64>(),
        "idle_ttl_seconds": pool.spec.idle_ttl_wanted().map(|ttl| ttl.as_secs_f64()),
        "task_timeout_seconds": pool.spec.task_timeout_wanted().map(|t| t.as_secs_f64()),
        "actors": pool.actors.iter().map(|a| json!({
            "actor_id": a.actor_id.to_string(),
            "state": a.state.name(),
            "node_id": a.node_id.as_ref().map(|n| n.to_string()),
            "gpu_indices": a.gpu_indices,
            "model_loads": a.model_loads,
            "tasks_done": a.tasks_done,
        })).collect::<Vec<_>>(),
        "unplaced_reason": pool.unplaced_reason,
        "usage": pool.usage.iter().map(|u| json!({
            "gpu_name": u.gpu_name,
            "node_pool_label": u.node_pool_label,
            "gpu_seconds": u.gpu_seconds,
            "cpu_core_seconds": u.cpu_core_seconds,
        })).collect::<Vec<_>>(),
        "usage_since_unix_ms": pool.usage_since_unix_ms,
    })
}
