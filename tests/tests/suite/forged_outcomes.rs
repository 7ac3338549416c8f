//! Issue 48: a second agent token cannot answer another node's tasks. A rogue session,
//! registered with its own node id, sends outcomes for every task of a running job (by
//! its key, and by the task ids and actor id it could guess): none reaches the client, the
//! real node's results do, each once, and the refusals are audited.

use std::time::Duration;

use futures::StreamExt;
use resident_proto::pb;
use resident_proto::pb::node_agent_service_client::NodeAgentServiceClient;
use resident_sdk::PoolSpec;
use resident_tests::*;
use tokio_stream::wrappers::UnboundedReceiverStream;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rogue_agent_cannot_deliver_another_nodes_results() {
    init_logging();
    let state = tempfile::tempdir().unwrap();
    let http = format!("127.0.0.1:{}", free_port());
    let extra = ["--http-listen".into(), http.clone().into()];
    let (_scheduler, _agent, cluster, url) = scheduler_with_one_agent(state.path(), &extra).await;
    let pool = cluster
        .create_pool(
            PoolSpec::new("victim", "echo")
                .max_in_flight_per_actor(1)
                .config_json(&serde_json::json!({"delay_ms": 300})),
        )
        .await
        .unwrap();
    let ready = pool.wait_ready(Duration::from_secs(20)).await.unwrap();
    let victim = ready.actors[0].actor_id.to_string();
    let payloads: Vec<Vec<u8>> = (0..6).map(|i| format!("real-{i}").into_bytes()).collect();
    let mut job = pool
        .submit("victim-job", futures::stream::iter(payloads.clone()))
        .await
        .unwrap();
    let job_id = job.job_id.to_string();

    let mut rogue = NodeAgentServiceClient::connect(url.clone()).await.unwrap();
    let (uplink, uplink_rx) = tokio::sync::mpsc::unbounded_channel();
    let send = |body| uplink.send(pb::AgentMessage { body: Some(body) }).unwrap();
    send(pb::agent_message::Body::Register(pb::RegisterNode {
        node_id: "rogue".into(),
        generation: "rogue-1".into(),
        cpu_cores: 1,
        ..Default::default()
    }));
    let mut inbound = rogue
        .session(UnboundedReceiverStream::new(uplink_rx))
        .await
        .unwrap()
        .into_inner();
    let first = inbound.message().await.unwrap().and_then(|m| m.body);
    assert!(
        matches!(first, Some(pb::scheduler_message::Body::Registered(_))),
        "{first:?}"
    );
    for seq in 0..6u64 {
        for dispatch in 0..3 {
            send(pb::agent_message::Body::TaskOutcome(pb::TaskOutcome {
                task_id: seq,
                dispatch,
                actor_id: victim.clone(),
                result: Some(pb::task_outcome::Result::Output(
                    format!("forged-{seq}").into_bytes().into(),
                )),
                key: Some(pb::TaskKey {
                    job_id: job_id.clone(),
                    seq,
                }),
                ..Default::default()
            }));
        }
    }

    let mut outputs = vec![None; payloads.len()];
    while let Some(result) = tokio::time::timeout(Duration::from_secs(30), job.next())
        .await
        .expect("the job finishes")
    {
        let result = result.unwrap();
        assert!(
            outputs[result.seq as usize].is_none(),
            "seq {} twice",
            result.seq
        );
        outputs[result.seq as usize] = Some(result.output.unwrap().to_vec());
    }
    let outputs: Vec<Vec<u8>> = outputs.into_iter().map(Option::unwrap).collect();
    assert_eq!(outputs, payloads, "every result is the real node's");

    let overview = plain_http_get(http.parse().unwrap(), "/v1/overview");
    assert!(
        overview.contains("task_outcome") && overview.contains("was not handed that task"),
        "the forged outcomes are audited: {overview}"
    );
    drop(uplink);
}
