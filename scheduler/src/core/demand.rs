//! What the fleet is asked for, for autoscalers (KEDA, an HPA) and `/metrics`: per pool, the
//! tasks waiting and running, and the GPUs its actors hold or wait for.

use std::collections::BTreeMap;

use resident_proto::PoolName;
use serde::Serialize;

use super::Core;
use crate::state::ActorState;

/// One pool's demand.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PoolDemand {
    /// The pool's name.
    pub pool: String,
    /// Tasks waiting for an actor.
    pub queued_tasks: u64,
    /// Tasks handed to actors and not answered yet.
    pub running_tasks: u64,
    /// Actors loaded and taking tasks.
    pub ready_actors: u64,
    /// Actors placement could not place (no node has what they ask for).
    pub unplaced_actors: u64,
    /// GPUs those actors ask for.
    pub unplaced_gpus: f64,
    /// GPUs held by this pool's placed actors (on the nodes the query selects).
    pub placed_gpus: f64,
}

/// The cluster's demand. `demand_gpus` is what an autoscaler targets: GPUs held or wanted by
/// pools that have work (tasks queued or running), so it falls to 0 when the fleet is idle,
/// and does not fall when a wanted actor gets placed (no thrash).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Demand {
    /// Tasks waiting for an actor, over every pool.
    pub queued_tasks: u64,
    /// Actors no node can host now.
    pub unplaced_actors: u64,
    /// GPUs those actors ask for.
    pub unplaced_gpus: f64,
    /// GPUs held or wanted by pools with work: the autoscaling target.
    pub demand_gpus: f64,
    /// Nodes alive and taking actors.
    pub nodes_alive: u64,
    /// Nodes alive and draining.
    pub nodes_draining: u64,
    /// Nodes remembered as dead.
    pub nodes_dead: u64,
    /// Each pool's demand, by name.
    pub pools: Vec<PoolDemand>,
}

impl Core {
    /// The demand, counting placed GPUs only on nodes whose labels include `node_labels`
    /// (empty: every node), so a scaled node group sees its own share.
    pub(super) fn demand(&self, node_labels: &BTreeMap<String, String>) -> Demand {
        let mut pools: BTreeMap<&PoolName, PoolDemand> = self
            .pools
            .iter()
            .map(|(name, pool)| {
                let demand = PoolDemand {
                    pool: name.to_string(),
                    queued_tasks: pool.queue.len() as u64,
                    ..PoolDemand::default()
                };
                (name, demand)
            })
            .collect();
        for actor in self.actors.values() {
            let Some(pool) = pools.get_mut(&actor.pool) else {
                continue;
            };
            let gpus = actor.request.gpus.as_gpus();
            pool.running_tasks += actor.in_flight.len() as u64;
            match (&actor.state, &actor.assignment) {
                (ActorState::Pending, _) => {
                    pool.unplaced_actors += 1;
                    pool.unplaced_gpus += gpus;
                }
                (state, Some(assignment)) if state.is_placed() => {
                    if *state == ActorState::Ready {
                        pool.ready_actors += 1;
                    }
                    let selected = self.nodes.get(&assignment.node).is_some_and(|node| {
                        node_labels
                            .iter()
                            .all(|(k, v)| node.labels.get(k) == Some(v))
                    });
                    if selected {
                        pool.placed_gpus += gpus;
                    }
                }
                _ => {}
            }
        }
        let mut demand = Demand::default();
        for node in self.nodes.values() {
            match (node.alive, node.draining) {
                (true, false) => demand.nodes_alive += 1,
                (true, true) => demand.nodes_draining += 1,
                (false, _) => demand.nodes_dead += 1,
            }
        }
        for pool in pools.into_values() {
            demand.queued_tasks += pool.queued_tasks;
            demand.unplaced_actors += pool.unplaced_actors;
            demand.unplaced_gpus += pool.unplaced_gpus;
            if pool.queued_tasks + pool.running_tasks > 0 {
                demand.demand_gpus += pool.placed_gpus + pool.unplaced_gpus;
            }
            demand.pools.push(pool);
        }
        demand
    }
}
