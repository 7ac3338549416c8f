//! An input that crashes the model: retried once, alone, on an actor kept for it; a
//! second crash fails it for good, and everything else goes on.

use super::*;
use crate::core::quarantine::CRASHES_THE_MODEL;

impl Harness {
    /// The actor ran `task` and panicked: the crashed outcome, then its death.
    fn crash(&mut self, node: &str, task: &pb::RunTask) {
        let outcome = pb::TaskOutcome {
            task_id: task.task_id,
            dispatch: task.dispatch,
            actor_id: task.actor_id.clone(),
            result: Some(pb::task_outcome::Result::Error(
                "actor panicked: bad input".into(),
            )),
            crashed: true,
            ..Default::default()
        };
        self.send(node, pb::agent_message::Body::TaskOutcome(outcome));
        let id = resident_proto::ActorId::new(task.actor_id.clone());
        let dead = pb::ActorReport {
            actor_id: task.actor_id.clone(),
            incarnation: self.core.actors[&id].incarnation,
            state: pb::ActorState::Dead as i32,
            error: "actor panicked: bad input; restarting with a fresh model".into(),
            ..Default::default()
        };
        self.send(node, pb::agent_message::Body::ActorReport(dead));
    }
}

#[tokio::test(start_paused = true)]
async fn a_poison_input_runs_once_alone_then_fails_and_the_rest_succeed() {
    let mut h = Harness::new(CoreConfig::for_test());
    h.add_node("n1", vec![]);
    h.create_pool(cpu_pool("p", 2, 2));
    h.load_actors("n1");
    let (job, mut rx) = h.open_job("p");
    h.submit(&job, 0..4);
    let first = run_tasks(&sent(h.agent("n1")));
    assert_eq!(first.len(), 4, "two actors, credit 2");
    let poison = first
        .iter()
        .find(|t| t.key.as_ref().unwrap().seq == 0)
        .unwrap()
        .clone();
    let crashed_actor = poison.actor_id.clone();
    h.crash("n1", &poison);
    // The crashed actor restarts; its other task goes back to the queue.
    h.load_actors("n1");
    let mut pending: Vec<pb::RunTask> = first
        .into_iter()
        .filter(|t| t.actor_id != crashed_actor)
        .collect();
    pending.extend(run_tasks(&sent(h.agent("n1"))));
    // Until the suspect has run, whatever runs beside it runs on other actors.
    let mut suspect_run = None;
    for _ in 0..10 {
        let Some(task) = pending.pop() else { break };
        if task.key.as_ref().unwrap().seq == 0 {
            suspect_run = Some(task);
            continue;
        }
        h.outcome("n1", &task, Ok("fine"));
        pending.extend(run_tasks(&sent(h.agent("n1"))));
    }
    let suspect_run = suspect_run.expect("the suspect ran again");
    let alone = h.core.actors[&resident_proto::ActorId::new(suspect_run.actor_id.clone())]
        .in_flight
        .len();
    assert_eq!(alone, 1, "the suspect runs alone on its actor");
    let convicted = resident_proto::ActorId::new(suspect_run.actor_id.clone());
    let restarts_before = h.core.actors[&convicted].restarts.used;
    h.crash("n1", &suspect_run);
    h.load_actors("n1");
    let got = results(&mut rx);
    let failed: Vec<_> = got
        .iter()
        .filter_map(|r| match &r.result {
            Some(pb::task_result::Result::Error(e)) => Some((r.seq, e.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(failed.len(), 1, "{got:?}");
    assert_eq!(failed[0].0, 0);
    assert!(
        failed[0].1.starts_with(CRASHES_THE_MODEL),
        "{}",
        failed[0].1
    );
    let ok: std::collections::BTreeSet<u64> = got
        .iter()
        .filter(|r| matches!(r.result, Some(pb::task_result::Result::Output(_))))
        .map(|r| r.seq)
        .collect();
    assert_eq!(ok, [1, 2, 3].into());
    assert_eq!(
        h.core.actors[&convicted].restarts.used,
        restarts_before.saturating_sub(u32::from(convicted.as_str() == crashed_actor)),
        "dying on a proven poison input spends no restart"
    );
    let spent: u32 = h.core.actors.values().map(|a| a.restarts.used).sum();
    assert_eq!(spent, 0, "the first actor it killed gets its restart back");
    // The pool goes on: a new task runs and no actor is kept any more.
    h.submit(&job, 4..5);
    let next = run_tasks(&sent(h.agent("n1")));
    assert_eq!(next.len(), 1);
    assert!(
        h.core.pools[&PoolName::from("p")]
            .kept_for_suspect
            .is_none()
    );
}

#[tokio::test(start_paused = true)]
async fn an_innocent_task_beside_a_crash_succeeds_when_run_alone() {
    let mut h = Harness::new(CoreConfig::for_test());
    let (_job, mut rx, task) = h.one_task_running();
    h.crash("n1", &task);
    h.load_actors("n1");
    let again = run_tasks(&sent(h.agent("n1"))).remove(0);
    assert_eq!(again.key.as_ref().unwrap().seq, 0);
    h.outcome("n1", &again, Ok("fine"));
    let got = results(&mut rx);
    assert_eq!(got.len(), 1);
    assert!(matches!(
        got[0].result,
        Some(pb::task_result::Result::Output(_))
    ));
    assert!(
        h.core.pools[&PoolName::from("p")]
            .kept_for_suspect
            .is_none()
    );
}
