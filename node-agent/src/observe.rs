//! The agent's own metrics (`resident agent --http-listen`): its actors' work and its GPUs,
//! as of the last heartbeat, in the Prometheus text format. The same figures reach the
//! scheduler in every heartbeat, whose `/metrics` (with TLS and tokens) covers the whole
//! fleet, agents behind NAT included; this port is for collectors on the node itself.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use resident_proto::gpu_gauges::GpuGauges;
use resident_proto::pb;
use tokio_util::sync::CancellationToken;

/// One actor as the last heartbeat saw it.
#[derive(Clone, Debug)]
pub struct ObservedActor {
    /// The actor's pool.
    pub pool: String,
    /// Its last report.
    pub report: pb::ActorReport,
}

#[derive(Clone, Debug, Default)]
struct AgentSnapshot {
    node_id: String,
    actors: Vec<ObservedActor>,
    gpus: Vec<pb::GpuInfo>,
}

/// Where the session publishes what it reports, for the agent's HTTP port. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct AgentObserver(Arc<Mutex<AgentSnapshot>>);

impl AgentObserver {
    /// Replaces the snapshot with what a heartbeat reported.
    pub fn publish(&self, node_id: &str, actors: Vec<ObservedActor>, gpus: Vec<pb::GpuInfo>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = AgentSnapshot {
            node_id: node_id.to_owned(),
            actors,
            gpus,
        };
    }

    /// The snapshot as Prometheus text.
    pub fn encode(&self) -> String {
        let snapshot = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        encode_snapshot(&snapshot)
    }
}

type Labels = Vec<(&'static str, String)>;

type Gauges = Family<Labels, Gauge<f64, AtomicU64>>;

/// A gauge family registered in `registry`.
fn gauges(registry: &mut Registry, name: &str, help: &str) -> Gauges {
    let family = Gauges::default();
    registry.register(name, help, family.clone());
    family
}

fn encode_snapshot(snapshot: &AgentSnapshot) -> String {
    let mut registry = Registry::default();
    encode_actors(&mut registry, &snapshot.actors);
    encode_gpus(&mut registry, &snapshot.node_id, &snapshot.gpus);
    let mut text = String::new();
    encode(&mut text, &registry).expect("writing to a String cannot fail");
    text
}

/// Each actor's work since it loaded, its VRAM and whether it is ready, by pool and actor.
fn encode_actors(registry: &mut Registry, actors: &[ObservedActor]) {
    let mut family = |name: &str, help: &str| gauges(registry, name, help);
    // Counters restart with each actor incarnation (a new actor id label set is not made),
    // so they are exported as gauges: rate() over them still works between restarts.
    let busy = family(
        "resident_agent_actor_busy_seconds",
        "Time each actor spent running tasks since it loaded; its rate is the busy ratio",
    );
    let items = family(
        "resident_agent_actor_items",
        "Items (documents) each actor processed since it loaded",
    );
    let tokens = family(
        "resident_agent_actor_tokens",
        "Tokens each actor's model ran over since it loaded",
    );
    let tasks = family(
        "resident_agent_actor_tasks",
        "Tasks each actor ran since it loaded",
    );
    let batch = family(
        "resident_agent_actor_mean_batch_items",
        "Mean items (documents) per task of each actor",
    );
    let vram = family("resident_agent_actor_vram_bytes", "VRAM each actor holds");
    let ready = family(
        "resident_agent_actor_ready",
        "1 when the actor is loaded and serving",
    );
    for actor in actors {
        let report = &actor.report;
        let labels: Labels = vec![
            ("pool", actor.pool.clone()),
            ("actor", report.actor_id.clone()),
        ];
        busy.get_or_create(&labels)
            .set(report.busy_micros as f64 / 1e6);
        items.get_or_create(&labels).set(report.items_done as f64);
        tokens.get_or_create(&labels).set(report.tokens_done as f64);
        tasks.get_or_create(&labels).set(report.tasks_done as f64);
        if report.tasks_done > 0 {
            batch
                .get_or_create(&labels)
                .set(report.items_done as f64 / report.tasks_done as f64);
        }
        vram.get_or_create(&labels).set(report.vram_bytes as f64);
        let is_ready = report.state == pb::ActorState::Ready as i32;
        ready
            .get_or_create(&labels)
            .set(if is_ready { 1.0 } else { 0.0 });
    }
}

/// Each GPU's memory, free memory and busy fraction, by node, index and name.
fn encode_gpus(registry: &mut Registry, node_id: &str, gpus: &[pb::GpuInfo]) {
    let gauges = GpuGauges::register(registry, "resident_agent_gpu");
    for gpu in gpus {
        gauges.observe(node_id, gpu);
    }
}

/// Serves `/metrics` and `/healthz` on `listener` until `cancel` fires.
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    observer: AgentObserver,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    let router = axum::Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/metrics",
            get(move || {
                let observer = observer.clone();
                async move {
                    (
                        [(
                            header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        observer.encode(),
                    )
                        .into_response()
                }
            }),
        );
    axum::serve(listener, router)
        .with_graceful_shutdown(async move { cancel.cancelled().await })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_encodes_actor_work_and_gpus() {
        let observer = AgentObserver::default();
        observer.publish(
            "n1",
            vec![ObservedActor {
                pool: "emb".into(),
                report: pb::ActorReport {
                    actor_id: "a1".into(),
                    state: pb::ActorState::Ready as i32,
                    busy_micros: 2_500_000,
                    items_done: 640,
                    tokens_done: 90_000,
                    tasks_done: 10,
                    ..Default::default()
                },
            }],
            vec![pb::GpuInfo {
                index: 0,
                name: "A10G".into(),
                total_vram_bytes: 100,
                free_vram_bytes: 40,
                utilization_ratio: Some(0.5),
                ..Default::default()
            }],
        );
        let text = observer.encode();
        for expected in [
            "resident_agent_actor_busy_seconds{pool=\"emb\",actor=\"a1\"} 2.5",
            "resident_agent_actor_tokens{pool=\"emb\",actor=\"a1\"} 90000.0",
            "resident_agent_actor_mean_batch_items{pool=\"emb\",actor=\"a1\"} 64.0",
            "resident_agent_actor_ready{pool=\"emb\",actor=\"a1\"} 1.0",
            "resident_agent_gpu_utilization_ratio{node=\"n1\",gpu=\"0\",name=\"A10G\"} 0.5",
        ] {
            assert!(text.contains(expected), "missing {expected} in\n{text}");
        }
    }
}
