//! Why an actor fits nowhere: [`explain`] walks the checks a placement makes, in order, and
//! names the first resource that no node has ([`Refusal`], in `types.rs`).

use std::collections::BTreeMap;

use resident_proto::NodeId;

use super::fit::{Usage, gpu_eligible, kind_offered, model_matches, node_matches};
use super::types::{GpuCapacity, NodeCapacity, Refusal, ResourceRequest};

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

type MatchingNode<'a> = (usize, &'a NodeId, &'a NodeCapacity);

fn explain_gpus(
    matching: &[MatchingNode<'_>],
    request: &ResourceRequest,
    usage: &Usage,
) -> Option<Refusal> {
    if request.gpus.is_cpu_only() {
        return None;
    }
    explain_gpu_kind(matching, request).or_else(|| explain_gpu_room(matching, request, usage))
}

/// Each matching node's GPUs: its slot, the GPU's position on the node, the node, the GPU.
fn all_gpus<'a>(
    matching: &'a [MatchingNode<'a>],
) -> impl Iterator<Item = (usize, usize, &'a NodeId, &'a GpuCapacity)> + 'a {
    matching.iter().flat_map(|(slot, id, n)| {
        n.gpus
            .iter()
            .enumerate()
            .map(move |(position, g)| (*slot, position, *id, g))
    })
}

/// Why no matching GPU could ever take the request, whatever runs on it: none at all, none
/// of the model asked for, none of enough compute, too few on any one node.
fn explain_gpu_kind(matching: &[MatchingNode<'_>], request: &ResourceRequest) -> Option<Refusal> {
    let all_gpus = || all_gpus(matching);
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
    None
}

/// Why the GPUs that could take the request have no room for it now: too little free
/// VRAM, no free share, too few whole GPUs free on one node.
fn explain_gpu_room(
    matching: &[MatchingNode<'_>],
    request: &ResourceRequest,
    usage: &Usage,
) -> Option<Refusal> {
    let wanted = request.gpus.whole_gpus();
    let (largest_free, node, gpu) = all_gpus(matching)
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
