//! What a plan has taken on each node and GPU ([`Usage`]), and whether a request may go on
//! a node or a GPU at all (the predicates). A leaf: the solver (`solve.rs`) and the
//! refusals' explanations (`refusal.rs`) both read it, and it reads neither.

use std::collections::{BTreeMap, HashMap};

use resident_proto::{NodeId, PoolName, VramBytes};

use super::types::{ActorDemand, Assignment, GpuCapacity, NodeCapacity, ResourceRequest};

/// What is already taken on one GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct GpuUse {
    pub vram: VramBytes,
    pub gpu_thousandths: u32,
}

/// A hash map with a fixed, fast hasher: lookups by id on the solver's hot path (every
/// placed actor, every plan) cost a few nanoseconds instead of SipHash's tens, and nothing
/// depends on a random seed.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::FixedState>;

/// What is already taken, per node and GPU, while a plan is being built.
///
/// Nodes are numbered by their place in `Problem::nodes` (a *slot*) and GPUs by their place
/// in `NodeCapacity::gpus` (a *position*), so the solver's inner loop, every actor against
/// every GPU of the fleet, reads plain vectors: no map lookups, no node-id copies.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Usage {
    slots: FastMap<NodeId, usize>,
    /// `[slot][position]`.
    gpus: Vec<Vec<GpuUse>>,
    /// `[slot][position]`: the GPU's index on its node.
    gpu_indices: Vec<Vec<u32>>,
    cpu_millicores: Vec<u64>,
    /// Per pool, its actors on each slot.
    pool_actors: FastMap<PoolName, Vec<u32>>,
}

impl Usage {
    pub fn new(nodes: &BTreeMap<NodeId, NodeCapacity>) -> Self {
        Self {
            slots: nodes
                .keys()
                .enumerate()
                .map(|(slot, id)| (id.clone(), slot))
                .collect(),
            gpus: nodes
                .values()
                .map(|node| vec![GpuUse::default(); node.gpus.len()])
                .collect(),
            gpu_indices: nodes
                .values()
                .map(|node| node.gpus.iter().map(|gpu| gpu.index).collect())
                .collect(),
            cpu_millicores: vec![0; nodes.len()],
            pool_actors: FastMap::default(),
        }
    }

    pub fn slot(&self, node: &NodeId) -> Option<usize> {
        self.slots.get(node).copied()
    }

    pub fn gpu(&self, slot: usize, position: usize) -> GpuUse {
        self.gpus[slot][position]
    }

    pub fn free_vram(&self, slot: usize, position: usize, gpu: &GpuCapacity) -> VramBytes {
        gpu.usable_vram
            .saturating_sub(self.gpus[slot][position].vram)
    }

    /// The CPU millicores taken on the node at `slot`.
    #[cfg(test)]
    pub fn cpu_used(&self, slot: usize) -> u64 {
        self.cpu_millicores[slot]
    }

    pub fn free_cpu(&self, slot: usize, capacity: &NodeCapacity) -> u64 {
        capacity
            .cpu_millicores
            .saturating_sub(self.cpu_millicores[slot])
    }

    /// The pool's actors on the node at `slot`.
    pub(super) fn pool_actors_on(&self, pool: &PoolName, slot: usize) -> u32 {
        self.pool_actors.get(pool).map_or(0, |counts| counts[slot])
    }

    /// Takes what `assignment` uses; GPUs the node does not have are skipped (callers check
    /// them first), and so are nodes not in the problem.
    pub(super) fn add(&mut self, demand: &ActorDemand, assignment: &Assignment) {
        self.take(&demand.pool, &demand.request, assignment);
    }

    pub(super) fn take(
        &mut self,
        pool: &PoolName,
        request: &ResourceRequest,
        assignment: &Assignment,
    ) {
        let Some(slot) = self.slot(&assignment.node) else {
            return;
        };
        for &index in &assignment.gpus {
            if let Some(position) = self.gpu_indices[slot].iter().position(|&i| i == index) {
                let entry = &mut self.gpus[slot][position];
                entry.vram = entry.vram.saturating_add(request.vram_per_gpu);
                entry.gpu_thousandths += assignment.share_per_gpu.0;
            }
        }
        self.cpu_millicores[slot] += request.cpu_millicores;
        let slots = self.gpus.len();
        match self.pool_actors.get_mut(pool) {
            Some(counts) => counts[slot] += 1,
            None => {
                let mut counts = vec![0; slots];
                counts[slot] = 1;
                self.pool_actors.insert(pool.clone(), counts);
            }
        }
    }
}

/// The node offers the actor's kind and has the labels its selector asks for.
pub(super) fn node_matches(request: &ResourceRequest, node: &NodeCapacity) -> bool {
    kind_offered(request, node) && selector_matches(request, node)
}

pub(super) fn kind_offered(request: &ResourceRequest, node: &NodeCapacity) -> bool {
    request.actor_kind.is_empty() || node.actor_kinds.contains(&request.actor_kind)
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
