use std::collections::BTreeMap;
use std::fmt;

use resident_proto::{ActorId, GpuFraction, NodeId, PoolName, VramBytes};

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

/// Why an actor could not be placed, naming the resource that blocks it.
#[derive(Clone, Debug, PartialEq)]
pub enum Refusal {
    NoNodes,
    /// No alive node's agent has the actor's kind (or this version of it).
    KindNotOffered {
        kind: String,
    },
    SelectorMatchesNothing {
        selector: String,
    },
    NoGpus,
    NoGpuOfModel {
        model: String,
    },
    ComputeTooLow {
        needed: ComputeCapability,
        best: ComputeCapability,
    },
    TooFewGpus {
        needed: u32,
        most_on_one_node: u32,
    },
    NotEnoughVram {
        needed: VramBytes,
        largest_free: VramBytes,
        node: NodeId,
        gpu: u32,
    },
    NoGpuShareFree {
        share: GpuFraction,
        vram: VramBytes,
    },
    NotEnoughWholeGpus {
        needed: u32,
        vram: VramBytes,
        most_free: u32,
        node: NodeId,
    },
    NotEnoughCpu {
        needed_millicores: u64,
        most_free_millicores: u64,
        node: NodeId,
    },
}

impl Refusal {
    /// The resource that blocks placement, as a short word.
    pub fn blocking_resource(&self) -> &'static str {
        match self {
            Refusal::NoNodes => "nodes",
            Refusal::KindNotOffered { .. } => "actor kind",
            Refusal::SelectorMatchesNothing { .. } => "selector",
            Refusal::NoGpus | Refusal::TooFewGpus { .. } | Refusal::NotEnoughWholeGpus { .. } => {
                "gpus"
            }
            Refusal::NoGpuShareFree { .. } => "gpu share",
            Refusal::NoGpuOfModel { .. } => "gpu model",
            Refusal::ComputeTooLow { .. } => "compute capability",
            Refusal::NotEnoughVram { .. } => "vram",
            Refusal::NotEnoughCpu { .. } => "cpu",
        }
    }
}

fn cpus(millicores: u64) -> String {
    format!("{:.1}", millicores as f64 / 1000.0)
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::NoNodes => write!(f, "no nodes are alive"),
            Refusal::KindNotOffered { kind } => {
                write!(f, "no alive node's agent offers actor kind `{kind}`")
            }
            Refusal::SelectorMatchesNothing { selector } => {
                write!(f, "no alive node has labels {selector}")
            }
            Refusal::NoGpus => write!(f, "needs a GPU; no eligible node has one"),
            Refusal::NoGpuOfModel { model } => {
                write!(
                    f,
                    "needs a GPU of model {model:?}; no eligible node has one"
                )
            }
            Refusal::ComputeTooLow { needed, best } => write!(
                f,
                "needs compute capability {needed} or higher; the best eligible GPU has {best}"
            ),
            Refusal::TooFewGpus {
                needed,
                most_on_one_node,
            } => write!(
                f,
                "needs {needed} GPUs on one node; the largest eligible node has {most_on_one_node}"
            ),
            Refusal::NotEnoughVram {
                needed,
                largest_free,
                node,
                gpu,
            } => write!(
                f,
                "needs {needed} on one GPU; largest free is {largest_free} ({node} gpu {gpu})"
            ),
            Refusal::NoGpuShareFree { share, vram } => write!(
                f,
                "needs {} of a GPU with {vram}; every eligible GPU with that much VRAM free is fully shared",
                share.as_gpus()
            ),
            Refusal::NotEnoughWholeGpus {
                needed,
                vram,
                most_free,
                node,
            } => write!(
                f,
                "needs {needed} whole GPUs with {vram} each on one node; at most {most_free} are free ({node})"
            ),
            Refusal::NotEnoughCpu {
                needed_millicores,
                most_free_millicores,
                node,
            } => write!(
                f,
                "needs {} CPUs; most free is {} ({node})",
                cpus(*needed_millicores),
                cpus(*most_free_millicores)
            ),
        }
    }
}
