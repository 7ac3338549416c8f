//! `/metrics`: the cluster's state as gauges, read from one [`Overview`] at each scrape,
//! plus the counters and histograms the loop keeps ([`crate::metrics::SchedulerMetrics`]).

use std::sync::atomic::AtomicU64;

use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use resident_proto::gpu_gauges::GpuGauges;
use resident_proto::pb;

use super::access::{HttpState, authorize, query_overview};
use crate::budget::BufferBudget;
use crate::core::Overview;
use crate::metrics::SchedulerMetrics;

pub(super) async fn metrics(State(state): State<HttpState>, headers: HeaderMap) -> Response {
    if let Err(refused) = authorize(&state, &headers, "metrics") {
        return refused.into_response();
    }
    match query_overview(&state).await {
        Ok(overview) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            encode_metrics(
                &overview,
                state.scheduler.metrics(),
                state.scheduler.buffer_budget(),
            ),
        )
            .into_response(),
        Err(refused) => refused.into_response(),
    }
}

type Labels = Vec<(String, String)>;
type IntGauges = Family<Labels, Gauge>;
type FloatGauges = Family<Labels, Gauge<f64, AtomicU64>>;
type FloatCounters = Family<Labels, Counter<f64, AtomicU64>>;

fn labels<const N: usize>(pairs: [(&str, &str); N]) -> Labels {
    pairs
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// A gauge family registered under `name`, to be filled.
fn int_gauges(registry: &mut Registry, name: &str, help: &str) -> IntGauges {
    let family = IntGauges::default();
    registry.register(name, help, family.clone());
    family
}

fn float_gauges(registry: &mut Registry, name: &str, help: &str) -> FloatGauges {
    let family = FloatGauges::default();
    registry.register(name, help, family.clone());
    family
}

/// A job state's name in metrics and JSON (`JOB_STATE_RUNNING` -> `running`).
pub(super) fn job_state_name(state: pb::JobState) -> String {
    state
        .as_str_name()
        .trim_start_matches("JOB_STATE_")
        .to_lowercase()
}

/// An actor state's name in metrics and JSON (`ACTOR_STATE_READY` -> `ready`).
pub(super) fn actor_state_name(state: i32) -> String {
    let state = pb::ActorState::try_from(state).unwrap_or_default();
    state
        .as_str_name()
        .trim_start_matches("ACTOR_STATE_")
        .to_lowercase()
}

/// The scrape's text: gauges from `overview` and the byte budget, then the loop's counters
/// and histograms.
pub(super) fn encode_metrics(
    overview: &Overview,
    counters: &SchedulerMetrics,
    budget: &BufferBudget,
) -> String {
    let mut registry = Registry::default();
    encode_nodes(&mut registry, overview);
    encode_pools(&mut registry, overview);
    encode_jobs(&mut registry, overview);
    encode_buffered(
        &mut registry,
        budget.total_bytes(),
        budget.max_total_bytes(),
    );
    counters.register(&mut registry);
    let mut text = String::new();
    encode(&mut text, &registry).expect("writing to a String cannot fail");
    text
}

fn encode_buffered(registry: &mut Registry, bytes: u64, limit: u64) {
    for (name, help, value) in [
        (
            "resident_scheduler_buffered_bytes",
            "Bytes the scheduler holds for clients: task payloads taken and not finished, \
             results not yet read",
            bytes,
        ),
        (
            "resident_scheduler_buffered_bytes_limit",
            "The cap on those bytes (--max-buffered-bytes)",
            limit,
        ),
    ] {
        let gauge = Gauge::<i64>::default();
        gauge.set(i64::try_from(value).unwrap_or(i64::MAX));
        registry.register(name, help, gauge);
    }
}

fn encode_nodes(registry: &mut Registry, overview: &Overview) {
    let nodes = int_gauges(registry, "resident_nodes", "Nodes by state");
    let gpus = GpuGauges::register(registry, "resident_gpu");
    let demand = &overview.demand;
    for (state, count) in [
        ("alive", demand.nodes_alive),
        ("draining", demand.nodes_draining),
        ("dead", demand.nodes_dead),
    ] {
        nodes
            .get_or_create(&labels([("state", state)]))
            .set(count as i64);
    }
    let unavailable = int_gauges(
        registry,
        "resident_gpus_unavailable",
        "GPUs an alive node has that its agent could not open (held by another process in \
         exclusive mode, fallen off the bus): no actor is placed on them",
    );
    for node in overview.nodes.iter().filter(|n| n.alive) {
        for gpu in &node.gpus {
            gpus.observe(&node.node_id, gpu);
        }
        unavailable
            .get_or_create(&labels([("node", node.node_id.as_str())]))
            .set(node.unavailable_gpus.len() as i64);
    }
}

fn encode_pools(registry: &mut Registry, overview: &Overview) {
    let actors = int_gauges(registry, "resident_actors", "Actors by pool and state");
    let queue = int_gauges(
        registry,
        "resident_pool_queue_depth",
        "Tasks waiting for an actor, per pool",
    );
    let running = int_gauges(
        registry,
        "resident_pool_running_tasks",
        "Tasks handed to actors and not answered yet, per pool",
    );
    let unplaced = int_gauges(
        registry,
        "resident_pool_unplaced_actors",
        "Actors no node can host now, per pool",
    );
    let unplaced_gpus = float_gauges(
        registry,
        "resident_pool_unplaced_gpus",
        "GPUs the unplaced actors ask for, per pool",
    );
    let demand_gpus = Gauge::<f64, AtomicU64>::default();
    registry.register(
        "resident_demand_gpus",
        "GPUs held or wanted by pools with work (the autoscaling signal)",
        demand_gpus.clone(),
    );
    for pool in &overview.pools {
        let name = pool.spec.as_ref().map_or("", |s| s.name.as_str());
        for actor in &pool.actors {
            let state = actor_state_name(actor.state);
            actors
                .get_or_create(&labels([("pool", name), ("state", state.as_str())]))
                .inc();
        }
    }
    for pool in &overview.demand.pools {
        let key = labels([("pool", pool.pool.as_str())]);
        queue.get_or_create(&key).set(pool.queued_tasks as i64);
        running.get_or_create(&key).set(pool.running_tasks as i64);
        unplaced
            .get_or_create(&key)
            .set(pool.unplaced_actors as i64);
        unplaced_gpus.get_or_create(&key).set(pool.unplaced_gpus);
    }
    demand_gpus.set(overview.demand.demand_gpus);
    encode_pool_usage(registry, &overview.pools);
}

/// What each pool's actors have held since it was made, as counters: `rate()` is the GPUs
/// (or cores) a pool holds, `increase()` times a price its cost over a window.
fn encode_pool_usage(registry: &mut Registry, pools: &[pb::PoolStatus]) {
    let gpu_seconds = FloatCounters::default();
    registry.register(
        "resident_pool_gpu_seconds",
        "GPU-seconds a pool's actors have held since the pool was made (each actor's GPU \
         fraction times its GPUs), by GPU model and node `pool` label; kept through \
         scheduler restarts",
        gpu_seconds.clone(),
    );
    let core_seconds = FloatCounters::default();
    registry.register(
        "resident_pool_cpu_core_seconds",
        "CPU core-seconds a pool's CPU actors have held since the pool was made, by node \
         `pool` label",
        core_seconds.clone(),
    );
    for pool in pools {
        let name = pool.spec.as_ref().map_or("", |s| s.name.as_str());
        for class in &pool.usage {
            let label = class.node_pool_label.as_str();
            if class.gpu_seconds > 0.0 {
                let key = [
                    ("pool", name),
                    ("gpu", class.gpu_name.as_str()),
                    ("node_pool", label),
                ];
                gpu_seconds
                    .get_or_create(&labels(key))
                    .inc_by(class.gpu_seconds);
            }
            if class.cpu_core_seconds > 0.0 {
                core_seconds
                    .get_or_create(&labels([("pool", name), ("node_pool", label)]))
                    .inc_by(class.cpu_core_seconds);
            }
        }
    }
}

fn encode_jobs(registry: &mut Registry, overview: &Overview) {
    let jobs = int_gauges(
        registry,
        "resident_jobs",
        "Jobs the scheduler holds, by state",
    );
    let job_tasks = int_gauges(
        registry,
        "resident_job_tasks",
        "Per job (running and recent): tasks by state, `expected` being the client's total",
    );
    let job_items = int_gauges(
        registry,
        "resident_job_items_done",
        "Per job: documents of succeeded tasks",
    );
    let job_items_running = int_gauges(
        registry,
        "resident_job_items_running",
        "Per job: documents done so far inside tasks still running (progress within a chunk)",
    );
    let job_cost = float_gauges(
        registry,
        "resident_job_cost_usd",
        "Per job: what the GPUs and cores its pool held cost while it ran",
    );
    for (state, count) in &overview.jobs_by_state {
        jobs.get_or_create(&labels([("state", job_state_name(*state).as_str())]))
            .set(*count as i64);
    }
    for job in &overview.jobs {
        let id = [("job", job.job_id.as_str()), ("pool", job.pool.as_str())];
        for (state, count) in [
            ("submitted", job.submitted),
            ("queued", job.queued),
            ("running", job.running),
            ("succeeded", job.succeeded),
            ("failed", job.failed),
            ("cancelled", job.cancelled),
            ("expected", job.expected_tasks),
        ] {
            job_tasks
                .get_or_create(&labels([id[0], id[1], ("state", state)]))
                .set(count as i64);
        }
        job_items
            .get_or_create(&labels(id))
            .set(job.items_done as i64);
        job_items_running
            .get_or_create(&labels(id))
            .set(job.items_running as i64);
        job_cost.get_or_create(&labels(id)).set(job.cost_usd);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{Demand, PoolDemand};
    use crate::metrics::TaskOutcomeKind;

    #[test]
    fn an_overview_encodes_as_prometheus_metrics() {
        let overview = Overview {
            nodes: vec![pb::NodeInfo {
                node_id: "n1".into(),
                alive: true,
                gpus: vec![pb::GpuInfo {
                    index: 0,
                    name: "NVIDIA A10G".into(),
                    total_vram_bytes: 24 << 30,
                    free_vram_bytes: 20 << 30,
                    utilization_ratio: Some(0.75),
                    ..Default::default()
                }],
                unavailable_gpus: vec![pb::UnavailableGpu {
                    index: 1,
                    reason: "CUDA_ERROR_DEVICE_UNAVAILABLE".into(),
                }],
                ..Default::default()
            }],
            jobs: vec![pb::JobStatus {
                job_id: "j1".into(),
                pool: "embed-x".into(),
                succeeded: 3,
                expected_tasks: 10,
                ..Default::default()
            }],
            pools: vec![pb::PoolStatus {
                spec: Some(pb::PoolSpec {
                    name: "embed-x".into(),
                    ..Default::default()
                }),
                usage: vec![
                    pb::HeldUsage {
                        gpu_name: "NVIDIA A10G".into(),
                        node_pool_label: "eks-a10g".into(),
                        gpu_seconds: 7200.5,
                        cpu_core_seconds: 0.0,
                    },
                    pb::HeldUsage {
                        cpu_core_seconds: 30.0,
                        ..Default::default()
                    },
                ],
                ..Default::default()
            }],
            jobs_by_state: [(pb::JobState::Running, 1)].into(),
            demand: Demand {
                queued_tasks: 7,
                demand_gpus: 2.5,
                nodes_alive: 1,
                pools: vec![PoolDemand {
                    pool: "embed-x".into(),
                    queued_tasks: 7,
                    unplaced_actors: 1,
                    unplaced_gpus: 0.5,
                    ..PoolDemand::default()
                }],
                ..Demand::default()
            },
        };
        let counters = SchedulerMetrics::default();
        counters.task_ended("embed-x", TaskOutcomeKind::Succeeded);
        let budget = BufferBudget::new(1 << 30, 1 << 20);
        let _held = budget.job_buffer().charge(4096);
        let text = encode_metrics(&overview, &counters, &budget);
        for expected in [
            "resident_pool_queue_depth{pool=\"embed-x\"} 7",
            "resident_pool_unplaced_gpus{pool=\"embed-x\"} 0.5",
            "resident_demand_gpus 2.5",
            "resident_nodes{state=\"alive\"} 1",
            "resident_gpu_vram_total_bytes{node=\"n1\",gpu=\"0\",name=\"NVIDIA A10G\"} 25769803776",
            "resident_gpu_utilization_ratio{node=\"n1\",gpu=\"0\",name=\"NVIDIA A10G\"} 0.75",
            "resident_gpus_unavailable{node=\"n1\"} 1",
            "resident_jobs{state=\"running\"} 1",
            "resident_job_tasks{job=\"j1\",pool=\"embed-x\",state=\"expected\"} 10",
            "resident_tasks_total{pool=\"embed-x\",outcome=\"succeeded\"} 1",
            "resident_scheduler_buffered_bytes 4096",
            "resident_pool_gpu_seconds_total{pool=\"embed-x\",gpu=\"NVIDIA A10G\",node_pool=\"eks-a10g\"} 7200.5",
            "resident_pool_cpu_core_seconds_total{pool=\"embed-x\",node_pool=\"\"} 30.0",
            "resident_scheduler_buffered_bytes_limit 1073741824",
        ] {
            assert!(text.contains(expected), "missing {expected} in\n{text}");
        }
        assert!(
            !text.contains("resident_pool_gpu_seconds_total{pool=\"embed-x\",gpu=\"\""),
            "a CPU class has no GPU series: {text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
