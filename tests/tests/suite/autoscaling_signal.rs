//! The scheduler's HTTP port exports the fleet's demand for autoscalers (the EKS overlay's
//! KEDA ScaledObject reads `/v1/demand`), with TLS and tokens on: a pool with work and one
//! actor no node can host shows as demand; a label filter counts one node group's share;
//! once the work is done the demand falls to zero, so the autoscaler scales back down.

use std::time::Duration;

use futures::StreamExt;
use resident_sdk::PoolSpec;
use resident_tests::secure::SecureSetup;
use resident_tests::{free_port, https_get, init_logging, wait_until};
use serde_json::Value;

struct Http {
    base: String,
    ca: std::path::PathBuf,
}

impl Http {
    fn get(&self, path: &str, token: Option<&str>) -> (u16, String) {
        https_get(&format!("{}{path}", self.base), &self.ca, token)
    }

    fn demand(&self, token: &str, query: &str) -> Value {
        let (status, body) = self.get(&format!("/v1/demand{query}"), Some(token));
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demand_counts_work_and_unplaceable_actors_and_falls_to_zero_when_idle() {
    init_logging();
    let setup = SecureSetup::new(&[("ops", "admin"), ("metrics", "read"), ("node", "agent")]);
    let http_port = free_port();
    let (_scheduler, url) = setup.spawn_scheduler_with(&[
        "--http-listen".into(),
        format!("127.0.0.1:{http_port}").into(),
    ]);
    let labels = setup.dir.path().join("labels");
    std::fs::write(&labels, "group=burst\n").unwrap();
    let _agent = setup.spawn_agent(
        &url,
        "gpu-node",
        "T4:16GiB",
        Some("node"),
        &["--labels-file".into(), labels.into()],
        std::process::Stdio::inherit(),
    );
    let http = Http {
        base: format!("https://127.0.0.1:{http_port}"),
        ca: setup.ca(),
    };
    let token = setup.token("metrics");

    // Tokens are on: none is refused with how to send one; /healthz needs none.
    let (status, body) = http.get("/v1/demand", None);
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("Authorization: Bearer"), "{body}");
    assert_eq!(http.get("/healthz", None).0, 200);

    let ops = setup.connect_as(&url, "ops").await.unwrap();
    ops.wait_for_nodes(1, Duration::from_secs(10))
        .await
        .unwrap();
    // Two one-GPU actors on a one-GPU node: one placed, one waiting for a node.
    let pool = ops
        .create_pool(
            PoolSpec::new("slow", "echo")
                .replicas(2)
                .gpus(1.0)
                .vram_gib(1.0)
                .config_json(&serde_json::json!({"delay_ms": 200})),
        )
        .await
        .unwrap();
    wait_until("one actor ready", Duration::from_secs(20), || async {
        let status = pool.status().await.ok()?;
        (status.ready_actors == 1).then_some(())
    })
    .await;
    let idle = http.demand(token, "");
    assert_eq!(idle["unplaced_actors"], 1, "{idle}");
    assert_eq!(idle["unplaced_gpus"], 1.0, "{idle}");
    assert_eq!(
        idle["demand_gpus"], 0.0,
        "a pool with no work asks for nothing: {idle}"
    );

    let inputs: Vec<String> = (0..20).map(|i| format!("task {i}")).collect();
    let mut job = pool
        .submit("work", futures::stream::iter(inputs))
        .await
        .unwrap();
    let busy = wait_until("demand with work", Duration::from_secs(10), || async {
        let demand = http.demand(token, "");
        (demand["queued_tasks"].as_u64()? > 0).then_some(demand)
    })
    .await;
    assert_eq!(
        busy["demand_gpus"], 2.0,
        "one GPU held and one wanted: {busy}"
    );
    let other_group = http.demand(token, "?node_labels=group=steady");
    assert_eq!(
        other_group["demand_gpus"], 1.0,
        "another node group's share is only what no node can host: {other_group}"
    );
    let (status, metrics) = http.get("/metrics", Some(token));
    assert_eq!(status, 200, "{metrics}");
    assert!(
        metrics.contains("resident_pool_queue_depth{pool=\"slow\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("resident_pool_unplaced_actors{pool=\"slow\"} 1"),
        "{metrics}"
    );

    let mut answered = 0;
    while let Some(result) = job.next().await {
        result.unwrap().output.unwrap();
        answered += 1;
    }
    assert_eq!(answered, 20);
    let done = http.demand(token, "");
    assert_eq!(done["demand_gpus"], 0.0, "idle again: {done}");
}
