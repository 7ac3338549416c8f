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

/// Node `n1` with pool `p` (one actor, a load timeout of 1 s) started there: the harness,
/// the start, and the heartbeat line that says it is still loading.
fn one_actor_loading_with_a_timeout_of_1s()
-> (Harness, pb::StartActor, Vec<(String, u64, pb::ActorState)>) {
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
    (h, first, loading)
}

#[tokio::test(start_paused = true)]
async fn a_load_that_hangs_is_timed_out_and_started_again() {
    let (mut h, first, loading) = one_actor_loading_with_a_timeout_of_1s();
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
    let stopped = after.iter().any(|m| {
        matches!(m, pb::scheduler_message::Body::StopActor(s)
            if s.actor_id == first.actor_id && s.incarnation == first.incarnation)
    });
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

/// A report of the incarnation the scheduler stopped that arrives after it started the next
/// one (a heartbeat already on the wire) gets a stop naming the old incarnation, so the agent
/// keeps the new one: a stop by id alone killed it and spent one of its restarts.
#[tokio::test(start_paused = true)]
async fn a_late_report_of_a_stopped_incarnation_stops_only_that_incarnation() {
    let (mut h, first, loading) = one_actor_loading_with_a_timeout_of_1s();
    for _ in 0..13 {
        tokio::time::advance(Duration::from_millis(100)).await;
        h.beat("n1", &loading);
    }
    let second = starts(&sent(h.agent("n1"))).remove(0);
    assert_eq!(second.incarnation, first.incarnation + 1);
    let id = resident_proto::ActorId::new(first.actor_id.clone());
    let restarts = h.core.actors[&id].restarts.used;
    // The first incarnation finally loaded, and said so before the agent stopped it.
    h.beat(
        "n1",
        &[(
            first.actor_id.clone(),
            first.incarnation,
            pb::ActorState::Ready,
        )],
    );
    let after = sent(h.agent("n1"));
    let stops: Vec<(String, u64)> = after
        .iter()
        .filter_map(|m| match m {
            pb::scheduler_message::Body::StopActor(s) => Some((s.actor_id.clone(), s.incarnation)),
            _ => None,
        })
        .collect();
    assert_eq!(stops, [(first.actor_id.clone(), first.incarnation)]);
    assert!(starts(&after).is_empty(), "{after:?}");
    let actor = &h.core.actors[&id];
    assert_eq!(actor.incarnation, second.incarnation);
    assert_eq!(actor.state, crate::state::ActorState::Starting);
    assert_eq!(
        actor.restarts.used, restarts,
        "the stop of the old one spent nothing"
    );
}
