//! Issue 48: a task's result is accepted only from the node it was handed to (or, after a
//! restart, the node whose adopted actor listed it in hand). An agent token cannot answer
//! another node's or another job's tasks.

use super::*;

/// Node `n1` runs seq 0 of a three-task job (credit 1: seq 1 and 2 queued); a second node,
/// `rogue`, registered with its own agent token and an actor of its own.
fn victim_and_rogue() -> (Harness, JobId, ResultsRx, pb::RunTask) {
    let mut h = Harness::new(CoreConfig::for_test());
    h.add_node_as("n1", vec![], "node-a").unwrap();
    h.create_pool(cpu_pool("p", 1, 1));
    h.load_actors("n1");
    let (job, rx) = h.open_job("p");
    h.submit(&job, 0..3);
    let running = run_tasks(&sent(h.agent("n1"))).remove(0);
    h.add_node_as("rogue", vec![], "node-b").unwrap();
    (h, job, rx, running)
}

fn forged(task: &pb::RunTask, job: &JobId, seq: u64) -> pb::agent_message::Body {
    pb::agent_message::Body::TaskOutcome(pb::TaskOutcome {
        task_id: task.task_id,
        dispatch: task.dispatch,
        actor_id: task.actor_id.clone(),
        result: Some(pb::task_outcome::Result::Output(b"forged".to_vec().into())),
        key: Some(pb::TaskKey {
            job_id: job.to_string(),
            seq,
        }),
        ..Default::default()
    })
}

#[tokio::test(start_paused = true)]
async fn a_rogue_agent_cannot_answer_a_task_it_was_never_handed() {
    let (mut h, job, mut rx, running) = victim_and_rogue();
    // The running task, by its exact id and dispatch, and the queued ones by key.
    for seq in 0..3 {
        h.send("rogue", forged(&running, &job, seq));
    }
    assert!(results(&mut rx).is_empty(), "no forged result is delivered");
    let refusals = crate::auth::audit::recent_refusals().recent(crate::metrics::EventLog::CAPACITY);
    assert!(
        refusals
            .iter()
            .any(|e| e.message.contains("task_outcome by node-b refused")),
        "the forgery is audited: {refusals:?}"
    );
    // The real node's answers still count, each once.
    h.outcome("n1", &running, Ok("zero"));
    for _ in 1..3 {
        let next = run_tasks(&sent(h.agent("n1"))).remove(0);
        h.outcome("n1", &next, Ok("real"));
    }
    let got = results(&mut rx);
    assert_eq!(got.len(), 3);
    assert!(
        got.iter()
            .all(|r| !matches!(&r.result, Some(pb::task_result::Result::Output(o)) if o.as_ref() == b"forged"))
    );
    assert_eq!(h.core.job_status(&job).unwrap().succeeded, 3);
}
