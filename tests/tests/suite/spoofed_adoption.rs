//! An agent cannot speak for actors it does not host: a node that registers claiming
//! another node's actor gets it stopped, the refusal is audited, and the actor's record
//! stays where the scheduler placed it.

use std::time::Duration;

use resident_proto::pb;
use resident_proto::pb::node_agent_service_client::NodeAgentServiceClient;
use resident_sdk::PoolSpec;
use resident_tests::*;
use tokio_stream::wrappers::UnboundedReceiverStream;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_claiming_another_nodes_actor_is_refused_and_audited() {
    init_logging();
    let state = tempfile::tempdir().unwrap();
    let http_port = free_port();
    let http = format!("127.0.0.1:{http_port}");
    let extra = ["--http-listen".into(), http.clone().into()];
    let (_scheduler, _agent, cluster, url) = scheduler_with_one_agent(state.path(), &extra).await;
    let pool = cluster
        .create_pool(PoolSpec::new("p", "echo"))
        .await
        .unwrap();
    let ready = pool.wait_ready(Duration::from_secs(20)).await.unwrap();
    let victim = ready.actors[0].clone();
    assert_eq!(victim.node_id.as_ref().map(|n| n.as_str()), Some("node-1"));

    // A session that says it is node-2 and already hosts node-1's actor, started exactly as
    // the pool starts one.
    let claimed = pb::HostedActor {
        start: Some(pb::StartActor {
            actor_id: victim.actor_id.to_string(),
            incarnation: 1,
            pool: "p".into(),
            kind: "echo".into(),
            max_in_flight: 2,
            ..Default::default()
        }),
        report: Some(pb::ActorReport {
            actor_id: victim.actor_id.to_string(),
            incarnation: 1,
            state: pb::ActorState::Ready as i32,
            ..Default::default()
        }),
        tasks_in_hand: Vec::new(),
    };
    let register = pb::RegisterNode {
        node_id: "node-2".into(),
        generation: "node-2-spoof".into(),
        cpu_cores: 4,
        actor_kinds: vec!["echo".into()],
        inventory: vec![claimed],
        ..Default::default()
    };
    let mut client = NodeAgentServiceClient::connect(url.clone()).await.unwrap();
    let (uplink, uplink_rx) = tokio::sync::mpsc::unbounded_channel();
    uplink
        .send(pb::AgentMessage {
            body: Some(pb::agent_message::Body::Register(register)),
        })
        .unwrap();
    let mut inbound = client
        .session(UnboundedReceiverStream::new(uplink_rx))
        .await
        .unwrap()
        .into_inner();
    let stopped = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match inbound.message().await.unwrap().and_then(|m| m.body) {
                Some(pb::scheduler_message::Body::StopActor(stop)) => return stop.actor_id,
                Some(_) => {}
                None => panic!("the session ended without a StopActor"),
            }
        }
    })
    .await
    .expect("the claimed actor is stopped");
    assert_eq!(stopped, victim.actor_id.to_string());

    let actors = cluster.list_actors().await.unwrap();
    assert_eq!(actors.len(), 1);
    assert_eq!(actors[0].actor_id, victim.actor_id);
    assert_eq!(
        actors[0].node_id.as_ref().map(|n| n.as_str()),
        Some("node-1"),
        "the record was not moved"
    );

    let overview = plain_http_get(http.parse().unwrap(), "/v1/overview");
    assert!(
        overview.contains("adopt_actor") && overview.contains("was started on node-1"),
        "the refusal is not among the recent audit events: {overview}"
    );
    drop(uplink);
}
