//! The loop re-checks: every `reconcile_interval` it compares each placed actor with what
//! its node reports, so nothing waits on an event that never comes. An actor still loading
//! past its pool's load timeout, or one its (alive) node has stopped listing in its
//! heartbeats, is stopped there and started again (spending a restart, so a node that
//! keeps losing actors cannot loop forever). The decision is the pure [`overdue`].

use std::time::Duration;

use resident_proto::ActorId;
use tokio::time::Instant;

use super::Core;
use crate::state::{ActorEvent, ActorState};

/// What the check knows of one placed actor.
#[derive(Clone, Copy, Debug)]
pub struct PlacedActor {
    pub state: ActorState,
    pub started_at: Instant,
    /// When its node last listed it (`None`: never since it was started).
    pub last_reported: Option<Instant>,
    /// When its node's last heartbeat (which lists every actor it hosts) arrived.
    pub node_heartbeat: Instant,
    pub load_timeout: Duration,
}

/// Why the actor must be started again, if it must. `missing_after` is how long an alive
/// node may go without listing an actor it hosts (a few heartbeats).
pub fn overdue(actor: PlacedActor, now: Instant, missing_after: Duration) -> Option<String> {
    let since = |t: Instant| now.saturating_duration_since(t);
    if actor.state == ActorState::Starting && since(actor.started_at) > actor.load_timeout {
        return Some(format!(
            "it did not load within {:?}; raise the pool's load_timeout_ms if its model takes \
             longer to fetch and load",
            actor.load_timeout
        ));
    }
    let placed = matches!(actor.state, ActorState::Starting | ActorState::Ready);
    // Only a node that keeps sending heartbeats can be said to have dropped an actor from
    // them; a silent one is left to dead-node detection.
    let node_alive = since(actor.node_heartbeat) < missing_after;
    let last_listed = actor.last_reported.unwrap_or(actor.started_at);
    if placed && node_alive && since(last_listed) > missing_after {
        return Some(format!(
            "its node has not listed it in its heartbeats for {:?}",
            since(last_listed)
        ));
    }
    None
}

/// Whether [`overdue`] needs the actor's node and pool at all: a loaded actor its node listed
/// lately is not overdue, whatever they say. Most actors are that one, so the walk over them
/// looks nothing up for them.
fn worth_a_look(
    state: ActorState,
    started_at: Instant,
    last_reported: Option<Instant>,
    now: Instant,
    missing_after: Duration,
) -> bool {
    let listed = last_reported.unwrap_or(started_at);
    state == ActorState::Starting || now.saturating_duration_since(listed) > missing_after
}

impl Core {
    /// Starts again every placed actor that [`overdue`] finds stuck or missing.
    pub(super) fn reconcile_actors(&mut self, now: Instant) {
        if now.saturating_duration_since(self.last_reconcile) < self.config.reconcile_interval {
            return;
        }
        self.last_reconcile = now;
        // Dead actors of deleted pools (lost with their node while draining): nothing
        // refers to them any more.
        let pools = &self.pools;
        self.actors
            .retain(|_, a| a.state != ActorState::Dead || pools.contains_key(&a.pool));
        let missing_after = self.config.heartbeat_interval * 4;
        let mut stuck: Vec<(ActorId, String)> = Vec::new();
        for (id, actor) in &self.actors {
            let (Some(started_at), Some(assignment)) = (actor.started_at, &actor.assignment) else {
                continue;
            };
            if !worth_a_look(
                actor.state,
                started_at,
                actor.last_reported,
                now,
                missing_after,
            ) {
                continue;
            }
            let (Some(node), Some(pool)) = (
                self.nodes.get(&assignment.node),
                self.pools.get(&actor.pool),
            ) else {
                continue;
            };
            let facts = PlacedActor {
                state: actor.state,
                started_at,
                last_reported: actor.last_reported,
                node_heartbeat: node.last_heartbeat,
                load_timeout: pool.load_timeout,
            };
            if let Some(why) = overdue(facts, now, missing_after) {
                stuck.push((id.clone(), why));
            }
        }
        for (id, why) in stuck {
            let actor = &self.actors[&id];
            let node = actor.assignment.as_ref().map(|a| a.node.clone());
            tracing::warn!(actor_id = %id, reason = %why, "starting a stuck actor again");
            if let Some(node) = node.as_ref().and_then(|n| self.nodes.get(n)) {
                node.send(resident_proto::pb::scheduler_message::Body::StopActor(
                    resident_proto::pb::StopActor {
                        actor_id: id.to_string(),
                        incarnation: actor.incarnation,
                    },
                ));
            }
            self.lose_actor(&id, ActorEvent::Failed, &why);
            self.replan_needed = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MISSING_AFTER: Duration = Duration::from_secs(8);

    fn actor(
        state: ActorState,
        started_ago: u64,
        reported_ago: Option<u64>,
    ) -> (PlacedActor, Instant) {
        let now = Instant::now() + Duration::from_secs(3600);
        let ago = |s: u64| now - Duration::from_secs(s);
        let facts = PlacedActor {
            state,
            started_at: ago(started_ago),
            last_reported: reported_ago.map(ago),
            node_heartbeat: ago(1),
            load_timeout: Duration::from_secs(60),
        };
        (facts, now)
    }

    #[test]
    fn a_load_past_its_timeout_is_overdue_and_one_within_it_is_not() {
        let (facts, now) = actor(ActorState::Starting, 61, Some(1));
        let why = overdue(facts, now, MISSING_AFTER).unwrap();
        assert!(why.contains("did not load within 60s"), "{why}");
        let (facts, now) = actor(ActorState::Starting, 59, Some(1));
        assert_eq!(overdue(facts, now, MISSING_AFTER), None);
        // A ready actor has no load timeout.
        let (facts, now) = actor(ActorState::Ready, 600, Some(1));
        assert_eq!(overdue(facts, now, MISSING_AFTER), None);
    }

    #[test]
    fn an_actor_an_alive_node_stopped_listing_is_overdue() {
        let (facts, now) = actor(ActorState::Ready, 600, Some(9));
        let why = overdue(facts, now, MISSING_AFTER).unwrap();
        assert!(why.contains("has not listed it"), "{why}");
        // Never listed since it was started, long ago.
        let (facts, now) = actor(ActorState::Starting, 20, None);
        assert!(overdue(facts, now, MISSING_AFTER).is_some());
        // Just started: its node has not had the chance yet.
        let (facts, now) = actor(ActorState::Starting, 2, None);
        assert_eq!(overdue(facts, now, MISSING_AFTER), None);
    }

    #[test]
    fn only_an_actor_not_listed_lately_or_still_loading_is_worth_a_look() {
        for (state, started_ago, reported_ago) in [
            (ActorState::Ready, 600, Some(9)),
            (ActorState::Ready, 20, None),
            (ActorState::Starting, 2, Some(1)),
            (ActorState::Starting, 61, Some(1)),
            (ActorState::Draining, 600, Some(30)),
            (ActorState::Ready, 600, Some(1)),
            (ActorState::Draining, 600, Some(1)),
            (ActorState::Ready, 2, None),
        ] {
            let (facts, now) = actor(state, started_ago, reported_ago);
            let looked = worth_a_look(
                facts.state,
                facts.started_at,
                facts.last_reported,
                now,
                MISSING_AFTER,
            );
            // Skipping is safe: what is not looked at is never overdue.
            if !looked {
                assert_eq!(overdue(facts, now, MISSING_AFTER), None, "{state:?}");
            }
            let expected = state == ActorState::Starting
                || reported_ago.unwrap_or(started_ago) > MISSING_AFTER.as_secs();
            assert_eq!(looked, expected, "{state:?} {started_ago} {reported_ago:?}");
        }
    }

    #[test]
    fn a_silent_node_is_left_to_dead_node_detection() {
        let (mut facts, now) = actor(ActorState::Ready, 600, Some(30));
        facts.node_heartbeat = now - Duration::from_secs(30);
        assert_eq!(overdue(facts, now, MISSING_AFTER), None);
    }
}
