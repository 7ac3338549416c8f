//! An actor whose GPU fails under a task: the scheduler hears of the GPU (which takes the
//! task back), then of the actor's death; the GPU is out of service from then on (a start
//! there is refused), and an actor on the node's other GPU goes on. A fault the driver
//! reports (an Xid) stops the actors on its GPU, though their work succeeds.

use std::time::Duration;

use super::*;

fn start(actor: &str, gpu: u32) -> pb::StartActor {
    pb::StartActor {
        actor_id: actor.into(),
        incarnation: 1,
        pool: "p".into(),
        kind: "echo".into(),
        max_in_flight: 1,
        gpu_indices: vec![gpu],
        gpu_fraction: 1.0,
        ..Default::default()
    }
}

fn run(id: u64, actor: &str) -> pb::RunTask {
    pb::RunTask {
        task_id: id,
        dispatch: 1,
        actor_id: actor.into(),
        payload: vec![b'x'].into(),
        ..Default::default()
    }
}

/// What the agent sends next, in order, with a word for each.
async fn next(rx: &mut mpsc::UnboundedReceiver<pb::AgentMessage>) -> (String, pb::AgentMessage) {
    use pb::agent_message::Body;
    let message = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("the agent says something")
        .expect("open");
    let word = match &message.body {
        Some(Body::ActorReport(r)) if r.state == pb::ActorState::Ready as i32 => "ready",
        Some(Body::ActorReport(r)) if r.state == pb::ActorState::Dead as i32 => "dead",
        Some(Body::TaskOutcome(o)) => match o.result {
            Some(pb::task_outcome::Result::Output(_)) => "output",
            _ => "error",
        },
        Some(Body::GpuFailed(_)) => "gpu failed",
        other => panic!("unexpected {other:?}"),
    };
    (format!("{word} {}", actor_of(&message)), message)
}

fn actor_of(message: &pb::AgentMessage) -> String {
    use pb::agent_message::Body;
    match &message.body {
        Some(Body::ActorReport(r)) => r.actor_id.clone(),
        Some(Body::TaskOutcome(o)) => o.actor_id.clone(),
        Some(Body::GpuFailed(f)) => format!("gpu{}", f.gpu.as_ref().unwrap().index),
        _ => String::new(),
    }
}

/// A host whose GPU 1 fails as `fault` says (`RESIDENT_FAULT_FAIL_SIMULATED_GPU`), with an
/// actor ready on each GPU, GPU 1's having answered its first task and been sent its second.
async fn second_task_on_gpu_1(
    fault: &str,
) -> (
    ActorHost,
    tempfile::TempDir,
    mpsc::UnboundedReceiver<pb::AgentMessage>,
) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (mut host, models) =
        super::host_failing_gpu_for_tests(ActorKindRegistry::with_builtin_kinds(), tx, Some(fault));
    host.start(start("on1", 1));
    assert_eq!(next(&mut rx).await.0, "ready on1");
    host.start(start("on0", 0));
    assert_eq!(next(&mut rx).await.0, "ready on0");
    host.run(run(1, "on1"));
    assert_eq!(next(&mut rx).await.0, "output on1");
    host.run(run(2, "on1"));
    (host, models, rx)
}

#[tokio::test]
async fn a_gpu_that_fails_under_a_task_is_reported_first_and_taken_out_of_service() {
    let (mut host, _models, mut rx) = second_task_on_gpu_1("1:2").await;
    let (told, message) = next(&mut rx).await;
    assert_eq!(
        told, "gpu failed gpu1",
        "the GPU is reported before the task's failure"
    );
    let Some(pb::agent_message::Body::GpuFailed(failed)) = message.body else {
        unreachable!()
    };
    assert!(failed.gpu.unwrap().reason.contains("restart the agent"));
    let (died, message) = next(&mut rx).await;
    assert_eq!(died, "dead on1");
    let Some(pb::agent_message::Body::ActorReport(report)) = message.body else {
        unreachable!()
    };
    assert!(
        report.error.starts_with("GPU 1 failed under the actor"),
        "{}",
        report.error
    );

    // GPU 1 takes no actor any more; GPU 0's actor goes on.
    let mut again = start("on1", 1);
    again.incarnation = 2;
    host.start(again);
    let (refused, message) = next(&mut rx).await;
    assert_eq!(refused, "dead on1");
    let Some(pb::agent_message::Body::ActorReport(report)) = message.body else {
        unreachable!()
    };
    assert!(
        report.error.starts_with("GPU 1 of this node failed"),
        "{}",
        report.error
    );
    host.run(run(3, "on0"));
    assert_eq!(next(&mut rx).await.0, "output on0");
    assert!(host.gpu_health.failure(1).is_some() && host.gpu_health.failure(0).is_none());
}

#[tokio::test]
async fn a_reported_xid_stops_the_actors_on_its_gpu_and_spares_the_other() {
    let (mut host, _models, mut rx) = second_task_on_gpu_1("1:2:48").await;
    let (told, failed) = next(&mut rx).await;
    assert_eq!(told, "gpu failed gpu1", "reported during the task");
    assert_eq!(
        next(&mut rx).await.0,
        "output on1",
        "the task itself succeeds"
    );
    // On its way to the scheduler (which counts on1 lost), the report stops on1 here.
    host.forwarded(&failed);
    assert!(
        host.reports().iter().all(|r| r.actor_id != "on1"),
        "{:?}",
        host.reports()
    );
    host.run(run(3, "on1"));
    let (refused, message) = next(&mut rx).await;
    assert_eq!(refused, "error on1");
    let Some(pb::agent_message::Body::TaskOutcome(outcome)) = message.body else {
        unreachable!()
    };
    assert!(outcome.not_run, "{outcome:?}");
    host.run(run(4, "on0"));
    assert_eq!(next(&mut rx).await.0, "output on0");
    assert!(host.gpu_health.failure(1).is_some() && host.gpu_health.failure(0).is_none());
}
