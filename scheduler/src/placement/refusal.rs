use std::collections::BTreeMap;
use std::fmt;

use resident_proto::{GpuFraction, NodeId, VramBytes};

use super::fit::{Usage, gpu_eligible, kind_offered, model_matches, node_matches};
use super::types::{ComputeCapability, NodeCapacity, ResourceRequest};

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

fn describe_selector(selector: &BTreeMap<String, String>) -> String {
    selector
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Explains why `request` fits nowhere, given what `usage` already takes.
pub(super) fn explain(
    nodes: &BTreeMap<NodeId, NodeCapacity>,
    request: &ResourceRequest,
    usage: &Usage,
) -> Refusal {
    if nodes.is_empty() {
        return Refusal::NoNodes;
    }
    if !nodes.values().any(|node| kind_offered(request, node)) {
        return Refusal::KindNotOffered {
            kind: request.actor_kind.clone(),
        };
    }
    // With each node's slot in `usage`.
    let matching: Vec<(usize, &NodeId, &NodeCapacity)> = nodes
        .iter()
        .enumerate()
        .filter(|(_, (_, node))| node_matches(request, node))
        .map(|(slot, (id, node))| (slot, id, node))
        .collect();
    if matching.is_empty() {
        return Refusal::SelectorMatchesNothing {
            selector: describe_selector(&request.selector),
        };
    }
    if let Some(refusal) = explain_gpus(&matching, request, usage) {
        return refusal;
    }
    let (node, most_free_millicores) = matching
        .iter()
        .map(|(slot, id, node)| ((*id).clone(), usage.free_cpu(*slot, node)))
        .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
        .expect("matching is not empty");
    Refusal::NotEnoughCpu {
        needed_millicores: request.cpu_millicores,
        most_free_millicores,
        node,
    }
}

fn explain_gpus(
    matching: &[(usize, &NodeId, &NodeCapacity)],
    request: &ResourceRequest,
    usage: &Usage,
) -> Option<Refusal> {
    if request.gpus.is_cpu_only() {
        return None;
    }
    let all_gpus = || {
        matching.iter().flat_map(|(slot, id, n)| {
            n.gpus
                .iter()
                .enumerate()
                .map(move |(position, g)| (*slot, position, *id, g))
        })
    };
    if all_gpus().next().is_none() {
        return Some(Refusal::NoGpus);
    }
    if !all_gpus().any(|(_, _, _, g)| model_matches(request, g)) {
        return Some(Refusal::NoGpuOfModel {
            model: request.gpu_model.clone().unwrap_or_default(),
        });
    }
    if !all_gpus().any(|(_, _, _, g)| gpu_eligible(request, g)) {
        let best = all_gpus()
            .filter(|(_, _, _, g)| model_matches(request, g))
            .map(|(_, _, _, g)| g.compute)
            .max()
            .unwrap_or_default();
        return Some(Refusal::ComputeTooLow {
            needed: request.min_compute.unwrap_or_default(),
            best,
        });
    }
    let wanted = request.gpus.whole_gpus();
    let most_on_one_node = matching
        .iter()
        .map(|(_, _, n)| n.gpus.iter().filter(|g| gpu_eligible(request, g)).count() as u32)
        .max()
        .unwrap_or(0);
    if most_on_one_node < wanted {
        return Some(Refusal::TooFewGpus {
            needed: wanted,
            most_on_one_node,
        });
    }
    let (largest_free, node, gpu) = all_gpus()
        .filter(|(_, _, _, g)| gpu_eligible(request, g))
        .map(|(slot, position, id, g)| (usage.free_vram(slot, position, g), id.clone(), g.index))
        .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)).then(b.2.cmp(&a.2)))
        .expect("an eligible gpu exists");
    if largest_free < request.vram_per_gpu {
        return Some(Refusal::NotEnoughVram {
            needed: request.vram_per_gpu,
            largest_free,
            node,
            gpu,
        });
    }
    if request.gpus.is_fractional() {
        return Some(Refusal::NoGpuShareFree {
            share: request.gpus,
            vram: request.vram_per_gpu,
        });
    }
    let (most_free, node) = matching
        .iter()
        .map(|(slot, id, n)| {
            let free = n
                .gpus
                .iter()
                .enumerate()
                .filter(|&(position, g)| {
                    gpu_eligible(request, g)
                        && usage.gpu(*slot, position).gpu_thousandths == 0
                        && usage.free_vram(*slot, position, g) >= request.vram_per_gpu
                })
                .count() as u32;
            (free, (*id).clone())
        })
        .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)))
        .expect("matching is not empty");
    if most_free < wanted {
        return Some(Refusal::NotEnoughWholeGpus {
            needed: wanted,
            vram: request.vram_per_gpu,
            most_free,
            node,
        });
    }
    None
}
