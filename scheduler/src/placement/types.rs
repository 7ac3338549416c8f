use std::collections::BTreeMap;
use std::fmt;

use resident_proto::{ActorId, GpuFraction, NodeId, PoolName, VramBytes};

use super::Refusal;

/// CUDA compute capability, ordered (8.6 < 9.0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ComputeCapability {
    pub major: u32,
    pub minor: u32,
}

impl fmt::Display for ComputeCapability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct GpuCapacity {
    pub index: u32,
    pub name: String,
    /// VRAM this GPU can give to actors (what was free when the node registered).
    pub usable_vram: VramBytes,
    pub compute: ComputeCapability,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeCapacity {
    pub labels: BTreeMap<String, String>,
    /// The actor kinds the node's agent can host (`embed`, `minhash@1`).
    pub actor_kinds: std::collections::BTreeSet<String>,
    pub gpus: Vec<GpuCapacity>,
    /// CPU cores in thousandths.
    pub cpu_millicores: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PlacementStrategy {
    /// Fill the fullest GPU that still fits (fewest GPUs touched).
    #[default]
    Pack,
    /// Put the pool's actors on as many nodes as possible.
    Spread,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ResourceRequest {
    /// The actor kind, which the node must offer (empty: any node).
    pub actor_kind: String,
    pub gpus: GpuFraction,
    /// Needed on each GPU the actor uses.
    pub vram_per_gpu: VramBytes,
    pub selector: BTreeMap<String, String>,
    /// Case-insensitive substring of the GPU name.
    pub gpu_model: Option<String>,
    pub min_compute: Option<ComputeCapability>,
    pub strategy: PlacementStrategy,
    pub cpu_millicores: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ActorDemand {
    pub pool: PoolName,
    pub request: ResourceRequest,
    /// Creation order: earlier actors are placed first.
    pub order: u64,
}

/// The whole problem [`super::place`] solves (the specification, in test builds).
#[cfg(test)]
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Problem {
    pub nodes: BTreeMap<NodeId, NodeCapacity>,
    pub actors: BTreeMap<ActorId, ActorDemand>,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Assignment {
    pub node: NodeId,
    /// GPU indices on that node; empty for CPU-only actors.
    pub gpus: Vec<u32>,
    /// Share of each listed GPU.
    pub share_per_gpu: GpuFraction,
}

/// Assignments already in force; kept whenever they are still valid, so nothing moves
/// when nothing changed.
#[cfg(test)]
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Previous {
    pub assignments: BTreeMap<ActorId, Assignment>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    pub assignments: BTreeMap<ActorId, Assignment>,
    pub refusals: BTreeMap<ActorId, Refusal>,
}

impl Plan {
    #[cfg(test)]
    pub fn as_previous(&self) -> Previous {
        Previous {
            assignments: self.assignments.clone(),
        }
    }
}
