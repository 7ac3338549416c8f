//! The loop re-checks placed actors: a load that hangs is timed out and started again, and
//! an actor its node stopped listing is started again; nothing stays Starting forever.

use super::*;

fn starts(messages: &[pb::scheduler_message::Body]) -> Vec<pb::StartActor> {
    messages
        .iter()
        .filter_map(|m| match m {
            pb::scheduler_message::Body::StartActor(start) => Some(start.clone()),
            _ => None,
        })
        .collect()
}

impl Harness {
    /// One heartbeat from `node` listing `actors` (id, incarnation, state), stamped as
    /// heard, then a tick.
    fn beat(&mut self, node: &str, actors: &[(String, u64, pb::ActorState)]) {
        let reports = actors
            .iter()
            .map(|(id, incarnation, state)| pb::ActorReport {
                actor_id: id.clone(),
                incarnation: *incarnation,
                state: *state as i32,
                ..Default::default()
            })
            .collect();
        self.agent(node).heard.heard();
        self.send(node, heartbeat(&[], reports));
        self.tick();
    }
}

#[tokio::test(start_paused = true)]
async fn a_load_that_hangs_is_timed_out_and_started_again() {
    let mut h = Harness::new(CoreConfig::for_test());
    h.add_node("n1", vec![]);
    let mut spec = cpu_pool("p", 1, 1);
    spec.load_timeout_ms = 1_000;
    h.create_pool(spec);
    let first = starts(&sent(h.agent("n1"))).remove(0);
    let loading = vec![(
        first.actor_id.clone(),
        first.incarnation,
        pb::ActorState::Starting,
    )];
    for _ in 0..9 {
        tokio::time::advance(Duration::from_millis(100)).await;
        h.beat("n1", &loading);
    }
    assert!(
        starts(&sent(h.agent("n1"))).is_empty(),
        "within its timeout"
    );
    for _ in 0..4 {
        tokio::time::advance(Duration::from_millis(100)).await;
        h.beat("n1", &loading);
    }
    let after = sent(h.agent("n1"));
    let stopped = after.iter().any(
        |m| matches!(m, pb::scheduler_message::Body::StopActor(s) if s.actor_id == first.actor_id),
    );
    assert!(stopped, "{after:?}");
    let again = starts(&after);
    assert_eq!(again.len(), 1, "{after:?}");
    assert_eq!(again[0].actor_id, first.actor_id);
    assert_eq!(again[0].incarnation, first.incarnation + 1);
}

#[tokio::test(start_paused = true)]
async fn an_actor_its_node_stopped_listing_is_started_again() {
    let mut h = Harness::new(CoreConfig::for_test());
    h.add_node("n1", vec![]);
    h.create_pool(cpu_pool("p", 1, 1));
    let first = starts(&sent(h.agent("n1"))).remove(0);
    let ready = vec![(
        first.actor_id.clone(),
        first.incarnation,
        pb::ActorState::Ready,
    )];
    for _ in 0..5 {
        tokio::time::advance(Duration::from_millis(100)).await;
        h.beat("n1", &ready);
    }
    assert!(starts(&sent(h.agent("n1"))).is_empty());
    // The agent lost it (a bug, a restart of its own): its heartbeats go on without it.
    for _ in 0..8 {
        tokio::time::advance(Duration::from_millis(100)).await;
        h.beat("n1", &[]);
    }
    let again = starts(&sent(h.agent("n1")));
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].incarnation, first.incarnation + 1);
}
