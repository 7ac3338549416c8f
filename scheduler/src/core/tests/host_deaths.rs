//! Issue 48: a config or input that takes its host down cannot walk the fleet. A node that
//! dies suddenly under a running task counts as that task crashing (run alone once more,
//! then failed as crashing the model); its actors spend a restart; a pool whose every actor
//! died fails what waits for it. A node that was only cut off and comes back as itself
//! gets all of that back.

use super::*;
use crate::core::quarantine::CRASHES_THE_MODEL;

impl Harness {
    /// `node`'s agent process died: its session closed.
    fn host_dies(&mut self, node: &str) {
        let session = self.agent(node).session;
        self.core.handle(SchedulerCommand::AgentGone { session });
        self.core.after_commands();
    }

    fn restarts_used(&self) -> Vec<u32> {
        self.core.actors.values().map(|a| a.restarts.used).collect()
    }
}

#[tokio::test(start_paused = true)]
async fn a_task_that_kills_two_hosts_fails_and_the_others_finish() {
    let mut h = Harness::new(CoreConfig::for_test());
    for node in ["n1", "n2", "n3"] {
        h.add_node(node, vec![]);
    }
    h.create_pool(cpu_pool("p", 3, 1));
    for node in ["n1", "n2", "n3"] {
        h.load_actors(node);
    }
    let (job, mut rx) = h.open_job("p");
    h.submit(&job, 0..3);
    let on = |h: &mut Harness, node: &str| run_tasks(&sent(h.agent(node)));
    let killer = on(&mut h, "n1").remove(0);
    let killer_seq = killer.key.as_ref().unwrap().seq;
    h.host_dies("n1");
    assert_eq!(h.core.tasks.values().filter(|t| t.crashes == 1).count(), 1);
    // The suspect runs alone on an actor kept for it, once that actor's task is done. Both
    // survivors hold one task, so either may be kept (the tie goes by actor id).
    let kept = h.core.pools[&PoolName::from("p")]
        .kept_for_suspect
        .clone()
        .expect("an actor is kept for the suspect at once");
    let kept_node = h.core.actors[&kept]
        .assignment
        .as_ref()
        .expect("placed")
        .node
        .to_string();
    let other_node = if kept_node == "n2" { "n3" } else { "n2" };
    let kept_task = on(&mut h, &kept_node).remove(0);
    h.outcome(&kept_node, &kept_task, Ok("fine"));
    let alone = on(&mut h, &kept_node).remove(0);
    assert_eq!(
        alone.key.as_ref().unwrap().seq,
        killer_seq,
        "the suspect, alone"
    );
    h.host_dies(&kept_node);
    let results = results(&mut rx);
    let failed: Vec<_> = results
        .iter()
        .filter_map(|r| match &r.result {
            Some(pb::task_result::Result::Error(e)) => Some((r.seq, e.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0].0, killer_seq);
    assert!(
        failed[0].1.starts_with(CRASHES_THE_MODEL),
        "{}",
        failed[0].1
    );
    // Proven: neither host death is charged to an actor.
    assert!(
        h.restarts_used().iter().all(|&used| used == 0),
        "{:?}",
        h.restarts_used()
    );
    // The other survivor goes on with the rest.
    let other_task = on(&mut h, other_node).remove(0);
    h.outcome(other_node, &other_task, Ok("fine"));
    assert_eq!(h.core.job_status(&job).unwrap().succeeded, 2);
}

#[tokio::test(start_paused = true)]
async fn a_pool_whose_actors_kill_their_hosts_fails_its_tasks() {
    let mut h = Harness::new(CoreConfig::for_test());
    let mut spec = cpu_pool("p", 1, 1);
    spec.max_restarts = 1;
    h.create_pool(spec);
    let (job, mut rx) = h.open_job("p");
    h.submit(&job, 0..2);
    // Each host dies while the actor loads on it: the first death spends the restart, the
    // second kills the actor, and the pool has no actor left.
    for node in ["n1", "n2"] {
        h.add_node(node, vec![]);
        h.core.after_commands();
        assert!(
            sent(h.agent(node))
                .iter()
                .any(|m| matches!(m, pb::scheduler_message::Body::StartActor(_))),
            "the actor is started on {node}"
        );
        h.host_dies(node);
    }
    let failed = results(&mut rx);
    assert_eq!(failed.len(), 2);
    for result in &failed {
        let Some(pb::task_result::Result::Error(error)) = &result.result else {
            panic!("{result:?}");
        };
        assert!(
            error.contains("every actor of pool `p` failed") && error.contains("node n2 died"),
            "{error}"
        );
    }
    // A third host is left alone, and a task sent now fails at once.
    h.add_node("n3", vec![]);
    h.core.after_commands();
    assert!(
        !sent(h.agent("n3"))
            .iter()
            .any(|m| matches!(m, pb::scheduler_message::Body::StartActor(_)))
    );
    h.submit(&job, 2..3);
    assert_eq!(results(&mut rx).len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_host_back_from_a_cut_as_itself_gets_its_restart_and_task_back() {
    let mut h = Harness::new(CoreConfig::for_test());
    h.add_node("n1", vec![]);
    h.create_pool(cpu_pool("p", 1, 1));
    let start = h.started_actor("n1");
    let ready = pb::ActorReport {
        actor_id: start.actor_id.clone(),
        incarnation: start.incarnation,
        state: pb::ActorState::Ready as i32,
        model_loads: 1,
        ..Default::default()
    };
    h.send("n1", pb::agent_message::Body::ActorReport(ready.clone()));
    let (job, mut rx) = h.open_job("p");
    h.submit(&job, 0..1);
    let running = run_tasks(&sent(h.agent("n1"))).remove(0);
    h.host_dies("n1");
    assert_eq!(h.restarts_used(), [1]);
    // Back as the same process, the actor still loaded, the task still in hand.
    let register = pb::RegisterNode {
        node_id: "n1".into(),
        generation: "n1-gen".into(),
        cpu_cores: 4,
        actor_kinds: vec!["echo".into()],
        inventory: vec![pb::HostedActor {
            start: Some(start.clone()),
            report: Some(ready),
            tasks_in_hand: vec![running.key.clone().unwrap()],
        }],
        ..Default::default()
    };
    h.register(register, Principal::ANONYMOUS).unwrap();
    h.core.after_commands();
    assert_eq!(h.restarts_used(), [0], "the restart is given back");
    assert!(
        h.core.tasks.values().all(|t| t.crashes == 0),
        "the task is no suspect"
    );
    assert!(
        run_tasks(&sent(h.agent("n1"))).is_empty(),
        "the task is not run again"
    );
    // Its answer, as the agent sends it: from the run the scheduler inherited.
    let outcome = pb::TaskOutcome {
        task_id: running.task_id,
        dispatch: running.dispatch,
        actor_id: running.actor_id.clone(),
        result: Some(pb::task_outcome::Result::Output(b"done".to_vec().into())),
        key: running.key.clone(),
        ..Default::default()
    };
    h.send("n1", pb::agent_message::Body::TaskOutcome(outcome));
    let got = results(&mut rx);
    assert_eq!(got.len(), 1);
    assert!(
        matches!(&got[0].result, Some(pb::task_result::Result::Output(o)) if o.as_ref() == b"done")
    );
}

/// Issue 48, item 4: a churning fleet does not grow the scheduler forever. A dead node that
/// hosts nothing is forgotten after `dead_node_ttl`; one still counted as hosting an actor
/// is kept; a dead actor of a deleted pool goes at the next re-check.
#[tokio::test(start_paused = true)]
async fn dead_nodes_and_dead_actors_of_deleted_pools_are_forgotten() {
    let config = CoreConfig {
        dead_node_ttl: Duration::from_secs(60),
        ..CoreConfig::for_test()
    };
    let mut h = Harness::new(config);
    for node in ["n1", "n2"] {
        h.add_node(node, vec![]);
    }
    h.create_pool(cpu_pool("p", 2, 1));
    for node in ["n1", "n2"] {
        h.load_actors(node);
    }
    let (job, _rx) = h.open_job("p");
    h.submit(&job, 0..2);
    // The pool is deleted while both actors run a task: they drain. Then n1 dies.
    h.core.delete_pool(&PoolName::new("p")).unwrap();
    h.host_dies("n1");
    let n1_node = NodeId::new("n1");
    assert!(h.core.nodes.contains_key(&n1_node), "listed while recent");
    tokio::time::advance(Duration::from_secs(61)).await;
    // n2's agent kept talking meanwhile.
    h.core.nodes[&NodeId::new("n2")].last_heard.heard();
    h.tick();
    assert!(
        !h.core.nodes.contains_key(&n1_node),
        "forgotten after the TTL"
    );
    assert!(h.core.nodes.contains_key(&NodeId::new("n2")), "alive");
    assert_eq!(
        h.core.actors.len(),
        1,
        "the dead draining actor is gone; n2's, still draining, stays"
    );
}

/// An agent that answers that the actor is not there (the scheduler's view of it is
/// stale): the task spends no attempt and runs on the actor started again.
#[tokio::test(start_paused = true)]
async fn a_task_that_never_reached_its_actor_spends_no_attempt() {
    let mut config = CoreConfig::for_test();
    config.default_max_task_attempts = 1;
    let mut h = Harness::new(config);
    let (job, mut rx, task) = h.one_task_running();
    let outcome = pb::TaskOutcome {
        task_id: task.task_id,
        dispatch: task.dispatch,
        actor_id: task.actor_id.clone(),
        result: Some(pb::task_outcome::Result::Error(format!(
            "actor {} is not running on this node",
            task.actor_id
        ))),
        not_run: true,
        ..Default::default()
    };
    h.send("n1", pb::agent_message::Body::TaskOutcome(outcome));
    // One attempt allowed, none spent: the actor starts again and the task waits for it.
    let again = h.started_actor("n1");
    assert_eq!(again.actor_id, task.actor_id);
    assert!(again.incarnation > 1, "{again:?}");
    h.send(
        "n1",
        pb::agent_message::Body::ActorReport(pb::ActorReport {
            actor_id: again.actor_id.clone(),
            incarnation: again.incarnation,
            state: pb::ActorState::Ready as i32,
            model_loads: 1,
            ..Default::default()
        }),
    );
    assert_eq!(h.job(&job).failed, 0);
    let rerun = run_tasks(&sent(h.agent("n1"))).remove(0);
    assert_eq!(rerun.key, task.key);
    h.outcome("n1", &rerun, Ok("done"));
    assert_eq!(results(&mut rx).len(), 1);
    assert_eq!(h.job(&job).succeeded, 1);
}

/// A node that dies with a task while the pool's other actor idles: the task goes to that
/// actor at once (it waited for the next answer or submission before, and none came).
#[tokio::test(start_paused = true)]
async fn a_dead_nodes_task_goes_at_once_to_an_idle_actor_elsewhere() {
    let mut h = Harness::new(CoreConfig::for_test());
    for node in ["n1", "n2"] {
        h.add_node(node, vec![]);
    }
    h.create_pool(cpu_pool("p", 2, 1));
    for node in ["n1", "n2"] {
        h.load_actors(node);
    }
    let (job, mut rx) = h.open_job("p");
    h.submit(&job, 0..2);
    let on_n1 = run_tasks(&sent(h.agent("n1"))).remove(0);
    let on_n2 = run_tasks(&sent(h.agent("n2"))).remove(0);
    h.outcome("n2", &on_n2, Ok("fine"));
    assert_eq!(results(&mut rx).len(), 1);
    h.host_dies("n1");
    let again = run_tasks(&sent(h.agent("n2")));
    assert_eq!(again.len(), 1, "sent to n2's idle actor at once");
    assert_eq!(again[0].key, on_n1.key);
}
