use std::collections::BTreeMap;

use resident_proto::{ActorId, GpuFraction, NodeId, PoolName, VramBytes};

use super::fit::{Usage, gpu_eligible, node_matches};
use super::refusal::explain;
use super::types::{
    ActorDemand, Assignment, GpuCapacity, NodeCapacity, PlacementStrategy, Plan, ResourceRequest,
};
#[cfg(test)]
use super::types::{Previous, Problem};

#[cfg(test)]
/// Places every actor of `problem`, keeping each still-valid assignment of `previous`.
///
/// Actors are handled in creation order (then id). Previous assignments are re-checked
/// against the current capacities first; new actors are then placed one by one with the
/// request's strategy. Actors that do not fit get a [`super::Refusal`] computed against the
/// final usage, so `place(p, place(p, prev)) == place(p, prev)`.
///
/// Cost: consecutive new actors with the same pool and request (a pool's new replicas)
/// share one ranking of the fleet's nodes. It is built once, scoring every GPU, and after
/// each actor only the node that took it is scored again. So placing *a* actors of one pool
/// on *n* nodes of *g* GPUs costs *n·g + a·(g + log n)*, not *a·n·g*.
pub fn place(problem: &Problem, previous: &Previous) -> Plan {
    place_in_runs(problem, previous, true)
}

#[cfg(test)]
/// [`place`], with `share_rankings: false` ranking the whole fleet again for every actor:
/// the plain definition that the tests hold the shared rankings to.
fn place_in_runs(problem: &Problem, previous: &Previous, share_rankings: bool) -> Plan {
    let order = creation_order(&problem.actors);

    let mut usage = Usage::new(&problem.nodes);
    let mut plan = Plan::default();

    for &(actor, demand) in &order {
        let Some(kept) = previous.assignments.get(actor) else {
            continue;
        };
        if still_valid(problem, demand, kept, &usage) {
            usage.add(demand, kept);
            plan.assignments.insert(actor.clone(), kept.clone());
        }
    }

    let new_actors: Vec<(&ActorId, &ActorDemand)> = order
        .into_iter()
        .filter(|(actor, _)| !plan.assignments.contains_key(*actor))
        .collect();
    let budget = PlacementBudget {
        share_rankings,
        max_assignments: usize::MAX,
    };
    place_new_actors(&problem.nodes, &mut usage, &new_actors, budget, &mut plan);
    debug_assert_eq!(check_plan(problem, &plan), Ok(()));
    plan
}

/// An actor that already holds its place, whatever the capacities say now: what it takes
/// is taken, and it is never moved.
#[derive(Clone, Copy, Debug)]
pub struct Holding<'a> {
    pub pool: &'a PoolName,
    pub request: &'a ResourceRequest,
    pub assignment: &'a Assignment,
}

/// Places only `pending` actors, around the actors `holding` their places: the plan names
/// the pending ones alone. This is [`place`] for a running scheduler, whose placed actors
/// never move: its cost grows with the actors to place and the fleet, not with the actors
/// already placed (those are only added up). Unlike [`place`], a holding actor that no
/// longer fits (its GPU reported less VRAM since) still counts in full, so nothing new is
/// put on top of it.
///
/// At most `max_assignments` actors are placed; the plan names no later actor, and the
/// caller places those in another call (so one call's time stays bounded).
pub fn place_pending<'a>(
    nodes: &BTreeMap<NodeId, NodeCapacity>,
    holding: impl IntoIterator<Item = Holding<'a>>,
    pending: &BTreeMap<ActorId, ActorDemand>,
    max_assignments: usize,
) -> Plan {
    let mut occupancy = Occupancy::new(nodes, holding);
    place_pending_on(
        nodes,
        &mut occupancy,
        &creation_order(pending),
        max_assignments,
    )
}

/// What the actors holding their places take of `nodes`, per node and GPU: built once
/// (a walk of every placed actor) and then carried from one call of [`place_pending_on`] to
/// the next, which adds what it places. A caller that places in slices keeps one while
/// nothing else moves (no actor leaves or takes a place but through the plans, the set of
/// nodes and their GPUs stays), so a slice costs what it places, not a walk of the fleet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Occupancy {
    usage: Usage,
}

impl Occupancy {
    pub fn new<'a>(
        nodes: &BTreeMap<NodeId, NodeCapacity>,
        holding: impl IntoIterator<Item = Holding<'a>>,
    ) -> Self {
        let mut usage = Usage::new(nodes);
        for held in holding {
            usage.take(held.pool, held.request, held.assignment);
        }
        Self { usage }
    }
}

/// [`place_pending`] on an [`Occupancy`] built for the same `nodes` (the same node ids and
/// GPU indices; free VRAM may have moved), with `pending` already in creation order. What
/// it places is added to `occupancy`.
pub fn place_pending_on(
    nodes: &BTreeMap<NodeId, NodeCapacity>,
    occupancy: &mut Occupancy,
    pending: &[(&ActorId, &ActorDemand)],
    max_assignments: usize,
) -> Plan {
    let mut plan = Plan::default();
    let budget = PlacementBudget {
        share_rankings: true,
        max_assignments,
    };
    place_new_actors(nodes, &mut occupancy.usage, pending, budget, &mut plan);
    plan
}

/// Actors in the order they are placed: creation order, then id.
fn creation_order(actors: &BTreeMap<ActorId, ActorDemand>) -> Vec<(&ActorId, &ActorDemand)> {
    let mut order: Vec<(&ActorId, &ActorDemand)> = actors.iter().collect();
    order.sort_by(|a, b| (a.1.order, a.0).cmp(&(b.1.order, b.0)));
    order
}

#[derive(Clone, Copy, Debug)]
struct PlacementBudget {
    /// Consecutive actors of one pool and request share a ranking of the nodes (`false`:
    /// every actor ranks the fleet afresh, the plain definition the tests compare with).
    share_rankings: bool,
    /// Placement stops once it made this many assignments.
    max_assignments: usize,
}

/// Places `new_actors`, in their order, on what `usage` leaves free, into `plan`; those that
/// fit nowhere get their refusal, worked out against the final usage.
fn place_new_actors(
    nodes_by_id: &BTreeMap<NodeId, NodeCapacity>,
    usage: &mut Usage,
    new_actors: &[(&ActorId, &ActorDemand)],
    budget: PlacementBudget,
    plan: &mut Plan,
) {
    let nodes: Vec<(&NodeId, &NodeCapacity)> = nodes_by_id.iter().collect();
    let same_ask = |a: &(&ActorId, &ActorDemand), b: &(&ActorId, &ActorDemand)| {
        budget.share_rankings && a.1.pool == b.1.pool && a.1.request == b.1.request
    };
    let mut unplaced = Vec::new();
    let mut scratch = Vec::new();
    'runs: for run in new_actors.chunk_by(same_ask) {
        let mut ranking = NodeRanking::new(&nodes, run[0].1, usage, &mut scratch);
        for &(actor, demand) in run {
            if plan.assignments.len() >= budget.max_assignments {
                break 'runs;
            }
            match ranking.place_one(&nodes, demand, usage, &mut scratch) {
                Some(assignment) => {
                    plan.assignments.insert(actor.clone(), assignment);
                }
                None => unplaced.push((actor, demand)),
            }
        }
    }

    // Against the final usage, so actors with the same request get the same reason: it is
    // worked out once per distinct request (a pool's unplaced actors share theirs).
    let mut explained: Vec<(&ResourceRequest, super::Refusal)> = Vec::new();
    for (actor, demand) in unplaced {
        let refusal = match explained.iter().find(|(r, _)| **r == demand.request) {
            Some((_, refusal)) => refusal.clone(),
            None => {
                let refusal = explain(nodes_by_id, &demand.request, usage);
                explained.push((&demand.request, refusal.clone()));
                refusal
            }
        };
        plan.refusals.insert(actor.clone(), refusal);
    }
}

/// How good a node is for one actor: the smallest wins.
type Score = (u64, u64);

/// The nodes one actor fits on, best first; ties go to the smallest node id (slot).
///
/// Valid for a run of actors with the same pool and request: a node's score depends only
/// on what is taken on that node (and, for `spread`, on the pool's actors there), and usage
/// only grows while a plan is built, so a node that does not fit never fits later in the run.
struct NodeRanking {
    ranked: std::collections::BTreeSet<(Score, usize)>,
}

impl NodeRanking {
    fn new(
        nodes: &[(&NodeId, &NodeCapacity)],
        demand: &ActorDemand,
        usage: &Usage,
        scratch: &mut Vec<(VramBytes, u32)>,
    ) -> Self {
        let ranked = nodes
            .iter()
            .enumerate()
            .filter_map(|(slot, (_, node))| {
                node_score(demand, slot, node, usage, scratch).map(|score| (score, slot))
            })
            .collect();
        Self { ranked }
    }

    /// Places one actor on the best node: takes what it uses into `usage`, and puts the
    /// node back in the ranking, scored on its new usage, if it still fits.
    fn place_one(
        &mut self,
        nodes: &[(&NodeId, &NodeCapacity)],
        demand: &ActorDemand,
        usage: &mut Usage,
        scratch: &mut Vec<(VramBytes, u32)>,
    ) -> Option<Assignment> {
        let (_, slot) = self.ranked.pop_first()?;
        let (id, node) = nodes[slot];
        node_score(demand, slot, node, usage, scratch).expect("a ranked node fits");
        let mut gpus: Vec<u32> = scratch.iter().map(|&(_, index)| index).collect();
        gpus.sort_unstable();
        let assignment = Assignment {
            node: id.clone(),
            gpus,
            share_per_gpu: share_per_gpu(demand.request.gpus),
        };
        usage.add(demand, &assignment);
        if let Some(score) = node_score(demand, slot, node, usage, scratch) {
            self.ranked.insert((score, slot));
        }
        Some(assignment)
    }
}

/// The node's score for one actor, with the GPUs it would take in `scratch`; `None` if it
/// does not fit there.
fn node_score(
    demand: &ActorDemand,
    slot: usize,
    node: &NodeCapacity,
    usage: &Usage,
    scratch: &mut Vec<(VramBytes, u32)>,
) -> Option<Score> {
    let request = &demand.request;
    if !node_matches(request, node) {
        return None;
    }
    if request.cpu_millicores > 0 && usage.free_cpu(slot, node) < request.cpu_millicores {
        return None;
    }
    if !pick_gpus(request, slot, node, usage, scratch) {
        return None;
    }
    let free_after: u64 = if scratch.is_empty() {
        usage
            .free_cpu(slot, node)
            .saturating_sub(request.cpu_millicores)
    } else {
        scratch
            .iter()
            .map(|(free, _)| free.saturating_sub(request.vram_per_gpu).0)
            .sum()
    };
    Some(match request.strategy {
        PlacementStrategy::Pack => (free_after, 0),
        PlacementStrategy::Spread => (
            u64::from(usage.pool_actors_on(&demand.pool, slot)),
            u64::MAX - free_after,
        ),
    })
}

#[cfg(test)]
fn still_valid(problem: &Problem, demand: &ActorDemand, kept: &Assignment, usage: &Usage) -> bool {
    let (Some(node), Some(slot)) = (problem.nodes.get(&kept.node), usage.slot(&kept.node)) else {
        return false;
    };
    let request = &demand.request;
    if !node_matches(request, node) || kept.share_per_gpu != share_per_gpu(request.gpus) {
        return false;
    }
    if kept.gpus.len() as u32 != request.gpus.whole_gpus() {
        return false;
    }
    if usage.free_cpu(slot, node) < request.cpu_millicores && request.cpu_millicores > 0 {
        return false;
    }
    kept.gpus.iter().all(|&index| {
        node.gpus.iter().enumerate().any(|(position, gpu)| {
            gpu.index == index
                && gpu_eligible(request, gpu)
                && fits_on_gpu(request, slot, position, gpu, usage)
        })
    })
}

pub fn share_per_gpu(gpus: GpuFraction) -> GpuFraction {
    if gpus.is_fractional() {
        gpus
    } else if gpus.is_cpu_only() {
        GpuFraction(0)
    } else {
        GpuFraction::WHOLE
    }
}

fn fits_on_gpu(
    request: &ResourceRequest,
    slot: usize,
    position: usize,
    gpu: &GpuCapacity,
    usage: &Usage,
) -> bool {
    let taken = usage.gpu(slot, position);
    let share = share_per_gpu(request.gpus).0;
    usage.free_vram(slot, position, gpu) >= request.vram_per_gpu
        && taken.gpu_thousandths + share <= 1000
}

/// The GPUs on one node this request would take, with their free VRAM, into `chosen`
/// (empty for CPU-only); `false` if it does not fit there. Among fitting GPUs the tightest
/// fit wins, so big GPUs stay free for big asks.
fn pick_gpus(
    request: &ResourceRequest,
    slot: usize,
    node: &NodeCapacity,
    usage: &Usage,
    chosen: &mut Vec<(VramBytes, u32)>,
) -> bool {
    chosen.clear();
    let wanted = request.gpus.whole_gpus() as usize;
    if wanted == 0 {
        return true;
    }
    chosen.extend(
        node.gpus
            .iter()
            .enumerate()
            .filter(|&(position, gpu)| {
                gpu_eligible(request, gpu) && fits_on_gpu(request, slot, position, gpu, usage)
            })
            .map(|(position, gpu)| (usage.free_vram(slot, position, gpu), gpu.index)),
    );
    if chosen.len() < wanted {
        return false;
    }
    chosen.sort_unstable();
    chosen.truncate(wanted);
    true
}

#[cfg(test)]
/// Post-conditions of a plan: every assignment names a real node and GPUs that satisfy the
/// request, and no GPU or node is over-committed.
pub fn check_plan(problem: &Problem, plan: &Plan) -> Result<(), String> {
    let mut usage = Usage::new(&problem.nodes);
    for (actor, assignment) in &plan.assignments {
        let demand = problem
            .actors
            .get(actor)
            .ok_or_else(|| format!("{actor} is assigned but not in the problem"))?;
        let node = problem
            .nodes
            .get(&assignment.node)
            .ok_or_else(|| format!("{actor} is on unknown node {}", assignment.node))?;
        if !node_matches(&demand.request, node) {
            return Err(format!(
                "{actor} is on {} against its selector",
                assignment.node
            ));
        }
        if assignment.gpus.len() as u32 != demand.request.gpus.whole_gpus() {
            return Err(format!("{actor} has the wrong number of GPUs"));
        }
        for index in &assignment.gpus {
            let gpu = node
                .gpus
                .iter()
                .find(|g| g.index == *index)
                .ok_or_else(|| format!("{actor} is on missing gpu {index}"))?;
            if !gpu_eligible(&demand.request, gpu) {
                return Err(format!("{actor} is on ineligible gpu {index}"));
            }
        }
        usage.add(demand, assignment);
        if plan.refusals.contains_key(actor) {
            return Err(format!("{actor} is both assigned and refused"));
        }
    }
    for (slot, (node_id, node)) in problem.nodes.iter().enumerate() {
        for (position, gpu) in node.gpus.iter().enumerate() {
            let used = usage.gpu(slot, position);
            if used.vram > gpu.usable_vram {
                return Err(format!(
                    "{node_id} gpu {} over-committed: {} of {}",
                    gpu.index, used.vram, gpu.usable_vram
                ));
            }
            if used.gpu_thousandths > 1000 {
                return Err(format!(
                    "{node_id} gpu {} shared beyond one whole GPU",
                    gpu.index
                ));
            }
        }
        let used = usage.cpu_used(slot);
        if used > node.cpu_millicores && used > 0 {
            return Err(format!("{node_id} cpu over-committed"));
        }
    }
    Ok(())
}

#[cfg(test)]
pub(super) fn place_ranking_every_actor_afresh(problem: &Problem, previous: &Previous) -> Plan {
    place_in_runs(problem, previous, false)
}
