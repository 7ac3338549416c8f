//! A draining node (its agent got SIGTERM) gets no new tasks; when it leaves, what it still
//! held goes back to the queue and each task is answered once.

use super::*;

fn drain() -> pb::agent_message::Body {
    pb::agent_message::Body::Drain(pb::Drain {
        deadline_ms: 90_000,
        reason: "test".into(),
    })
}

fn leave(abandoned_tasks: u32) -> pb::agent_message::Body {
    pb::agent_message::Body::Leave(pb::Leave { abandoned_tasks })
}

fn node_info(h: &mut Harness, node: &str) -> pb::NodeInfo {
    h.core
        .node_infos()
        .into_iter()
        .find(|n| n.node_id == node)
        .expect("known node")
}

/// Answers `first` on `node`, then every task it is handed after, until none comes.
fn answer_until_idle(h: &mut Harness, node: &str, first: pb::RunTask) {
    let mut next = Some(first);
    while let Some(task) = next {
        h.outcome(node, &task, Ok("done"));
        next = run_tasks(&sent(h.agent(node))).pop();
    }
}

#[tokio::test(start_paused = true)]
async fn a_draining_node_finishes_its_task_gets_no_more_and_leaves() {
    let (mut h, job, mut rx, on_n1, on_n2) = two_busy_nodes(4);
    h.send("n1", drain());
    assert!(node_info(&mut h, "n1").draining);
    h.outcome("n1", &on_n1, Ok("one"));
    assert!(
        run_tasks(&sent(h.agent("n1"))).is_empty(),
        "a draining node gets no new task"
    );
    h.send("n1", leave(0));
    let n1 = node_info(&mut h, "n1");
    assert!(!n1.alive, "left");
    // n2 runs the rest, one at a time.
    answer_until_idle(&mut h, "n2", on_n2);
    assert_eq!(results(&mut rx).len(), 4, "every task answered once");
    assert_eq!(counts(&h.job(&job)), [4, 0, 0, 4, 0, 0]);
}

#[tokio::test(start_paused = true)]
async fn a_task_abandoned_at_the_drain_deadline_runs_elsewhere_once() {
    let (mut h, job, mut rx, on_n1, on_n2) = two_busy_nodes(4);
    h.send("n1", drain());
    h.send("n1", leave(1));
    h.outcome("n2", &on_n2, Ok("two"));
    let retried = run_tasks(&sent(h.agent("n2"))).remove(0);
    assert_eq!(
        (retried.task_id, retried.dispatch),
        (on_n1.task_id, 2),
        "n1's abandoned task goes back to the front of the queue"
    );
    answer_until_idle(&mut h, "n2", retried);
    assert_eq!(results(&mut rx).len(), 4);
    assert_eq!(counts(&h.job(&job)), [4, 0, 0, 4, 0, 0]);
}

#[tokio::test(start_paused = true)]
async fn no_actor_is_placed_on_a_draining_node() {
    let mut h = Harness::new(CoreConfig::for_test());
    h.add_node("n1", vec![]);
    h.send("n1", drain());
    h.create_pool(cpu_pool("p", 1, 1));
    let starts = |h: &mut Harness, node: &str| {
        sent(h.agent(node))
            .into_iter()
            .filter(|m| matches!(m, pb::scheduler_message::Body::StartActor(_)))
            .count()
    };
    assert_eq!(starts(&mut h, "n1"), 0, "nothing starts on n1");
    h.add_node("n2", vec![]);
    assert_eq!(starts(&mut h, "n2"), 1, "the actor goes to n2");
}
