use std::collections::BTreeMap;

use resident_proto::{ActorId, GpuFraction, NodeId, PoolName, VramBytes};

use super::refusal::explain;
use super::types::{
    ActorDemand, Assignment, GpuCapacity, NodeCapacity, PlacementStrategy, Plan, Previous, Problem,
    ResourceRequest,
};

/// What is already taken on one GPU.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct GpuUse {
    pub vram: VramBytes,
    pub gpu_thousandths: u32,
}

/// What is already taken, per node and GPU, while a plan is being built.
#[derive(Clone, Debug, Default)]
pub(super) struct Usage {
    pub gpus: BTreeMap<(NodeId, u32), GpuUse>,
    pub cpu_millicores: BTreeMap<NodeId, u64>,
    pub pool_actors: BTreeMap<(NodeId, PoolName), u32>,
}

impl Usage {
    pub fn gpu(&self, node: &NodeId, index: u32) -> GpuUse {
        self.gpus
            .get(&(node.clone(), index))
            .copied()
            .unwrap_or_default()
    }

    pub fn free_vram(&self, node: &NodeId, gpu: &GpuCapacity) -> VramBytes {
        gpu.usable_vram
            .saturating_sub(self.gpu(node, gpu.index).vram)
    }

    pub fn free_cpu(&self, node: &NodeId, capacity: &NodeCapacity) -> u64 {
        capacity
            .cpu_millicores
            .saturating_sub(self.cpu_millicores.get(node).copied().unwrap_or(0))
    }

    fn add(&mut self, demand: &ActorDemand, assignment: &Assignment) {
        for &index in &assignment.gpus {
            let entry = self
                .gpus
                .entry((assignment.node.clone(), index))
                .or_default();
            entry.vram = entry.vram.saturating_add(demand.request.vram_per_gpu);
            entry.gpu_thousandths += assignment.share_per_gpu.0;
        }
        *self
            .cpu_millicores
            .entry(assignment.node.clone())
            .or_default() += demand.request.cpu_millicores;
        *self
            .pool_actors
            .entry((assignment.node.clone(), demand.pool.clone()))
            .or_default() += 1;
    }
}

pub(super) fn selector_matches(request: &ResourceRequest, node: &NodeCapacity) -> bool {
    request
        .selector
        .iter()
        .all(|(key, value)| node.labels.get(key) == Some(value))
}

pub(super) fn model_matches(request: &ResourceRequest, gpu: &GpuCapacity) -> bool {
    match &request.gpu_model {
        None => true,
        Some(model) => gpu
            .name
            .to_ascii_lowercase()
            .contains(&model.to_ascii_lowercase()),
    }
}

pub(super) fn compute_matches(request: &ResourceRequest, gpu: &GpuCapacity) -> bool {
    request.min_compute.is_none_or(|min| gpu.compute >= min)
}

/// A GPU this request may use at all, ignoring what is taken.
pub(super) fn gpu_eligible(request: &ResourceRequest, gpu: &GpuCapacity) -> bool {
    model_matches(request, gpu) && compute_matches(request, gpu)
}

/// Places every actor of `problem`, keeping each still-valid assignment of `previous`.
///
/// Actors are handled in creation order (then id). Previous assignments are re-checked
/// against the current capacities first; new actors are then placed one by one with the
/// request's strategy. Actors that do not fit get a [`super::Refusal`] computed against the
/// final usage, so `place(p, place(p, prev)) == place(p, prev)`.
pub fn place(problem: &Problem, previous: &Previous) -> Plan {
    let mut order: Vec<(&ActorId, &ActorDemand)> = problem.actors.iter().collect();
    order.sort_by(|a, b| (a.1.order, a.0).cmp(&(b.1.order, b.0)));

    let mut usage = Usage::default();
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

    let mut unplaced = Vec::new();
    for &(actor, demand) in &order {
        if plan.assignments.contains_key(actor) {
            continue;
        }
        match best_assignment(problem, demand, &usage) {
            Some(assignment) => {
                usage.add(demand, &assignment);
                plan.assignments.insert(actor.clone(), assignment);
            }
            None => unplaced.push((actor, demand)),
        }
    }

    for (actor, demand) in unplaced {
        let refusal = explain(&problem.nodes, &demand.request, &usage);
        plan.refusals.insert(actor.clone(), refusal);
    }

    debug_assert_eq!(check_plan(problem, &plan), Ok(()));
    plan
}

fn still_valid(problem: &Problem, demand: &ActorDemand, kept: &Assignment, usage: &Usage) -> bool {
    let Some(node) = problem.nodes.get(&kept.node) else {
        return false;
    };
    let request = &demand.request;
    if !selector_matches(request, node) || kept.share_per_gpu != share_per_gpu(request.gpus) {
        return false;
    }
    if kept.gpus.len() as u32 != request.gpus.whole_gpus() {
        return false;
    }
    if usage.free_cpu(&kept.node, node) < request.cpu_millicores && request.cpu_millicores > 0 {
        return false;
    }
    kept.gpus.iter().all(|&index| {
        node.gpus.iter().any(|gpu| {
            gpu.index == index
                && gpu_eligible(request, gpu)
                && fits_on_gpu(request, &kept.node, gpu, usage)
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

fn fits_on_gpu(request: &ResourceRequest, node: &NodeId, gpu: &GpuCapacity, usage: &Usage) -> bool {
    let taken = usage.gpu(node, gpu.index);
    let share = share_per_gpu(request.gpus).0;
    usage.free_vram(node, gpu) >= request.vram_per_gpu && taken.gpu_thousandths + share <= 1000
}

/// Sort key of a candidate; the smallest wins.
type Score = (u64, u64, NodeId, Vec<u32>);

fn best_assignment(problem: &Problem, demand: &ActorDemand, usage: &Usage) -> Option<Assignment> {
    let request = &demand.request;
    let mut best: Option<(Score, Assignment)> = None;
    for (node_id, node) in &problem.nodes {
        if !selector_matches(request, node) {
            continue;
        }
        if request.cpu_millicores > 0 && usage.free_cpu(node_id, node) < request.cpu_millicores {
            continue;
        }
        let Some(gpus) = pick_gpus(request, node_id, node, usage) else {
            continue;
        };
        let pool_here = usage
            .pool_actors
            .get(&(node_id.clone(), demand.pool.clone()))
            .copied()
            .unwrap_or(0);
        let free_after: u64 = if gpus.is_empty() {
            usage
                .free_cpu(node_id, node)
                .saturating_sub(request.cpu_millicores)
        } else {
            gpus.iter()
                .map(|&index| {
                    let gpu = node.gpus.iter().find(|g| g.index == index).expect("picked");
                    usage
                        .free_vram(node_id, gpu)
                        .saturating_sub(request.vram_per_gpu)
                        .0
                })
                .sum()
        };
        let score: Score = match request.strategy {
            PlacementStrategy::Pack => (free_after, 0, node_id.clone(), gpus.clone()),
            PlacementStrategy::Spread => (
                u64::from(pool_here),
                u64::MAX - free_after,
                node_id.clone(),
                gpus.clone(),
            ),
        };
        if best.as_ref().is_none_or(|(current, _)| score < *current) {
            let assignment = Assignment {
                node: node_id.clone(),
                gpus,
                share_per_gpu: share_per_gpu(request.gpus),
            };
            best = Some((score, assignment));
        }
    }
    best.map(|(_, assignment)| assignment)
}

/// The GPUs on one node this request would take (empty for CPU-only), or `None` if it does
/// not fit there. Among fitting GPUs the tightest fit wins, so big GPUs stay free for big asks.
fn pick_gpus(
    request: &ResourceRequest,
    node_id: &NodeId,
    node: &NodeCapacity,
    usage: &Usage,
) -> Option<Vec<u32>> {
    let wanted = request.gpus.whole_gpus() as usize;
    if wanted == 0 {
        return Some(Vec::new());
    }
    let mut fitting: Vec<(VramBytes, u32)> = node
        .gpus
        .iter()
        .filter(|gpu| gpu_eligible(request, gpu) && fits_on_gpu(request, node_id, gpu, usage))
        .map(|gpu| (usage.free_vram(node_id, gpu), gpu.index))
        .collect();
    if fitting.len() < wanted {
        return None;
    }
    fitting.sort();
    let mut chosen: Vec<u32> = fitting.into_iter().take(wanted).map(|(_, i)| i).collect();
    chosen.sort_unstable();
    Some(chosen)
}

/// Post-conditions of a plan: every assignment names a real node and GPUs that satisfy the
/// request, and no GPU or node is over-committed.
pub fn check_plan(problem: &Problem, plan: &Plan) -> Result<(), String> {
    let mut usage = Usage::default();
    for (actor, assignment) in &plan.assignments {
        let demand = problem
            .actors
            .get(actor)
            .ok_or_else(|| format!("{actor} is assigned but not in the problem"))?;
        let node = problem
            .nodes
            .get(&assignment.node)
            .ok_or_else(|| format!("{actor} is on unknown node {}", assignment.node))?;
        if !selector_matches(&demand.request, node) {
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
    for ((node_id, index), used) in &usage.gpus {
        let gpu = problem.nodes[node_id]
            .gpus
            .iter()
            .find(|g| g.index == *index)
            .expect("checked above");
        if used.vram > gpu.usable_vram {
            return Err(format!(
                "{node_id} gpu {index} over-committed: {} of {}",
                used.vram, gpu.usable_vram
            ));
        }
        if used.gpu_thousandths > 1000 {
            return Err(format!("{node_id} gpu {index} shared beyond one whole GPU"));
        }
    }
    for (node_id, used) in &usage.cpu_millicores {
        let node = &problem.nodes[node_id];
        if *used > node.cpu_millicores && *used > 0 {
            return Err(format!("{node_id} cpu over-committed"));
        }
    }
    Ok(())
}
