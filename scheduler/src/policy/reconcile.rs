//! Reconciliation of what an agent reports it hosts against what the pools want: which
//! reported actors the scheduler adopts (keeping their loaded models) and which it stops.
//!
//! Pure: no clock, no I/O; the core turns the verdicts into records and messages. Runs when
//! a node registers, before placement, so a restarted scheduler (whose pools were restored
//! with unplaced actors) or one that saw a node's session drop takes back what is already
//! loaded and places only what is missing.

use std::collections::{BTreeMap, BTreeSet};

use resident_proto::{ActorId, GpuFraction, NodeId, PoolName};

/// How an actor is started: a reported actor is adopted only if it was started exactly as
/// the pool would start one now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartShape {
    pub kind: String,
    pub config: Vec<u8>,
    pub vram_per_gpu: u64,
    pub max_in_flight: u32,
    pub gpu_count: u32,
    pub share_per_gpu: GpuFraction,
}

/// Where one of a pool's wanted actors stands.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum WantedPlace {
    /// Not placed: waiting for placement, after a restart or a lost node.
    Unplaced,
    /// Placed on a node, with the incarnation it was started as there.
    On { node: NodeId, incarnation: u64 },
}

/// One pool as the scheduler wants it.
#[derive(Clone, Debug)]
pub struct WantedPool {
    pub shape: StartShape,
    /// Its live actors (not draining or dead), oldest first.
    pub actors: Vec<(ActorId, WantedPlace)>,
}

/// One live actor (loading or ready) an agent reports.
#[derive(Clone, Debug)]
pub struct ReportedActor {
    pub id: ActorId,
    pub pool: PoolName,
    pub shape: StartShape,
    pub incarnation: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Keep the actor and its model. `replacing` is the unplaced actor whose place it
    /// takes (a restored pool's fresh ids); `None` when the record is the actor's own.
    Adopt {
        id: ActorId,
        pool: PoolName,
        replacing: Option<ActorId>,
    },
    /// Nobody wants it: stop it, freeing its memory.
    Stop { id: ActorId, why: String },
}

/// Decides, for every actor `node` reports, adopt or stop. An actor whose id the pool
/// still has is adopted if that record is unplaced (or already on this node as the same
/// incarnation); an unknown id is adopted in place of one of the pool's unplaced actors
/// while the pool has one. Everything else stops: its pool is gone, was changed, is full,
/// or its record was placed elsewhere meanwhile.
pub fn reconcile(
    node: &NodeId,
    wanted: &BTreeMap<PoolName, WantedPool>,
    reported: &[ReportedActor],
) -> Vec<Verdict> {
    let mut verdicts = BTreeMap::new();
    let mut claimed: BTreeSet<ActorId> = BTreeSet::new();
    let mut unknown = Vec::new();
    for actor in reported {
        let Some(pool) = wanted.get(&actor.pool) else {
            verdicts.insert(
                actor.id.clone(),
                stop(actor, format!("pool `{}` no longer exists", actor.pool)),
            );
            continue;
        };
        if pool.shape != actor.shape {
            verdicts.insert(
                actor.id.clone(),
                stop(
                    actor,
                    format!("pool `{}` was changed since it started", actor.pool),
                ),
            );
            continue;
        }
        let Some((_, place)) = pool.actors.iter().find(|(id, _)| id == &actor.id) else {
            unknown.push(actor);
            continue;
        };
        let verdict = match place {
            WantedPlace::Unplaced => adopt(actor, None),
            WantedPlace::On {
                node: on,
                incarnation,
            } if on == node && *incarnation == actor.incarnation => adopt(actor, None),
            WantedPlace::On { node: on, .. } => stop(actor, format!("it was placed on {on}")),
        };
        claimed.insert(actor.id.clone());
        verdicts.insert(actor.id.clone(), verdict);
    }
    for actor in unknown {
        let pool = &wanted[&actor.pool];
        let free = pool
            .actors
            .iter()
            .find(|(id, place)| *place == WantedPlace::Unplaced && !claimed.contains(id));
        let verdict = match free {
            Some((id, _)) => {
                claimed.insert(id.clone());
                adopt(actor, Some(id.clone()))
            }
            None => stop(
                actor,
                format!(
                    "pool `{}` already has its {} replicas",
                    actor.pool,
                    pool.actors.len()
                ),
            ),
        };
        verdicts.insert(actor.id.clone(), verdict);
    }
    verdicts.into_values().collect()
}

fn adopt(actor: &ReportedActor, replacing: Option<ActorId>) -> Verdict {
    Verdict::Adopt {
        id: actor.id.clone(),
        pool: actor.pool.clone(),
        replacing,
    }
}

fn stop(actor: &ReportedActor, why: String) -> Verdict {
    Verdict::Stop {
        id: actor.id.clone(),
        why,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(kind: &str) -> StartShape {
        StartShape {
            kind: kind.into(),
            config: b"{}".to_vec(),
            vram_per_gpu: 0,
            max_in_flight: 2,
            gpu_count: 0,
            share_per_gpu: GpuFraction(0),
        }
    }

    fn id(text: &str) -> ActorId {
        ActorId::new(text)
    }

    fn pool(actors: &[(&str, WantedPlace)]) -> WantedPool {
        WantedPool {
            shape: shape("echo"),
            actors: actors.iter().map(|(a, p)| (id(a), p.clone())).collect(),
        }
    }

    fn reported(actor: &str, pool: &str) -> ReportedActor {
        ReportedActor {
            id: id(actor),
            pool: PoolName::new(pool),
            shape: shape("echo"),
            incarnation: 1,
        }
    }

    fn adopted(actor: &str, replacing: Option<&str>) -> Verdict {
        Verdict::Adopt {
            id: id(actor),
            pool: PoolName::new("p"),
            replacing: replacing.map(id),
        }
    }

    fn stopped(verdict: &Verdict) -> bool {
        matches!(verdict, Verdict::Stop { .. })
    }

    #[test]
    fn a_restored_pool_adopts_reported_actors_in_place_of_its_fresh_ones() {
        let node = NodeId::new("n1");
        let wanted = BTreeMap::from([(
            PoolName::new("p"),
            pool(&[
                ("fresh-1", WantedPlace::Unplaced),
                ("fresh-2", WantedPlace::Unplaced),
            ]),
        )]);
        let verdicts = reconcile(&node, &wanted, &[reported("old-a", "p")]);
        assert_eq!(verdicts, vec![adopted("old-a", Some("fresh-1"))]);
    }

    #[test]
    fn a_full_pool_stops_the_extra_actor() {
        let node = NodeId::new("n2");
        let wanted = BTreeMap::from([(
            PoolName::new("p"),
            pool(&[("fresh-1", WantedPlace::Unplaced)]),
        )]);
        let verdicts = reconcile(
            &node,
            &wanted,
            &[reported("old-a", "p"), reported("old-b", "p")],
        );
        assert_eq!(verdicts[0], adopted("old-a", Some("fresh-1")));
        let Verdict::Stop {
            id: stopped_id,
            why,
        } = &verdicts[1]
        else {
            panic!("{verdicts:?}")
        };
        assert_eq!(stopped_id, &id("old-b"));
        assert!(why.contains("already has its 1 replicas"), "{why}");
    }

    #[test]
    fn a_known_unplaced_actor_is_adopted_as_itself_before_unknown_ones_claim_places() {
        let node = NodeId::new("n1");
        let wanted = BTreeMap::from([(
            PoolName::new("p"),
            pool(&[("a", WantedPlace::Unplaced), ("b", WantedPlace::Unplaced)]),
        )]);
        // The unknown actor is reported first; `b` still keeps its own record.
        let verdicts = reconcile(&node, &wanted, &[reported("x", "p"), reported("b", "p")]);
        assert_eq!(
            verdicts,
            vec![adopted("b", None), adopted("x", Some("a"))],
            "verdicts come in actor id order"
        );
    }

    #[test]
    fn an_actor_placed_elsewhere_meanwhile_is_stopped() {
        let node = NodeId::new("n1");
        let elsewhere = WantedPlace::On {
            node: NodeId::new("n2"),
            incarnation: 2,
        };
        let wanted = BTreeMap::from([(PoolName::new("p"), pool(&[("a", elsewhere)]))]);
        let verdicts = reconcile(&node, &wanted, &[reported("a", "p")]);
        assert!(stopped(&verdicts[0]), "{verdicts:?}");
    }

    #[test]
    fn the_same_incarnation_on_the_same_node_is_kept() {
        let node = NodeId::new("n1");
        let here = WantedPlace::On {
            node: node.clone(),
            incarnation: 1,
        };
        let wanted = BTreeMap::from([(PoolName::new("p"), pool(&[("a", here)]))]);
        assert_eq!(
            reconcile(&node, &wanted, &[reported("a", "p")]),
            vec![adopted("a", None)]
        );
    }

    #[test]
    fn deleted_or_changed_pools_stop_their_actors() {
        let node = NodeId::new("n1");
        let mut changed = pool(&[("fresh", WantedPlace::Unplaced)]);
        changed.shape.config = b"{\"model\":\"other\"}".to_vec();
        let wanted = BTreeMap::from([(PoolName::new("p"), changed)]);
        let verdicts = reconcile(&node, &wanted, &[reported("a", "p"), reported("b", "gone")]);
        let reasons: Vec<String> = verdicts
            .iter()
            .map(|v| match v {
                Verdict::Stop { why, .. } => why.clone(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert!(reasons[0].contains("was changed"), "{reasons:?}");
        assert!(reasons[1].contains("no longer exists"), "{reasons:?}");
    }

    #[test]
    fn an_empty_report_changes_nothing() {
        let wanted = BTreeMap::from([(PoolName::new("p"), pool(&[("a", WantedPlace::Unplaced)]))]);
        assert!(reconcile(&NodeId::new("n"), &wanted, &[]).is_empty());
    }
}
