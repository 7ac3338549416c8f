use std::collections::BTreeMap;

use proptest::prelude::*;
use resident_proto::{ActorId, GpuFraction, NodeId, PoolName, VramBytes};

use super::*;

fn gpu(index: u32, name: &str, gib: f64, major: u32, minor: u32) -> GpuCapacity {
    GpuCapacity {
        index,
        name: name.to_owned(),
        usable_vram: VramBytes::from_gib(gib),
        compute: ComputeCapability { major, minor },
    }
}

fn node(labels: &[(&str, &str)], gpus: Vec<GpuCapacity>) -> NodeCapacity {
    NodeCapacity {
        labels: labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        actor_kinds: Default::default(),
        gpus,
        cpu_millicores: 16_000,
    }
}

/// The three-node cluster of the runtime issue: 8x A6000, 4x T4, 1x H100.
fn mixed_cluster() -> BTreeMap<NodeId, NodeCapacity> {
    let mut nodes = BTreeMap::new();
    nodes.insert(
        NodeId::from("node-1"),
        node(
            &[("pool", "onprem-a6000")],
            (0..8)
                .map(|i| gpu(i, "NVIDIA RTX A6000", 48.0, 8, 6))
                .collect(),
        ),
    );
    nodes.insert(
        NodeId::from("node-2"),
        node(
            &[("pool", "eks-t4")],
            (0..4).map(|i| gpu(i, "Tesla T4", 16.0, 7, 5)).collect(),
        ),
    );
    nodes.insert(
        NodeId::from("node-3"),
        node(
            &[("pool", "eks-h100")],
            vec![gpu(0, "NVIDIA H100", 80.0, 9, 0)],
        ),
    );
    nodes
}

fn request(gpus: f64, vram_gib: f64) -> ResourceRequest {
    ResourceRequest {
        gpus: GpuFraction::from_gpus(gpus).unwrap(),
        vram_per_gpu: VramBytes::from_gib(vram_gib),
        ..ResourceRequest::default()
    }
}

fn problem_with(
    nodes: BTreeMap<NodeId, NodeCapacity>,
    pool: &str,
    count: u64,
    request: ResourceRequest,
) -> Problem {
    let actors = (0..count)
        .map(|i| {
            (
                ActorId::new(format!("{pool}-{i:03}")),
                ActorDemand {
                    pool: PoolName::from(pool),
                    request: request.clone(),
                    order: i,
                },
            )
        })
        .collect();
    Problem { nodes, actors }
}

#[test]
fn refuses_80_gib_with_the_largest_free_gpu_named() {
    let mut nodes = mixed_cluster();
    nodes.remove(&NodeId::from("node-3"));
    let plan = place(
        &problem_with(nodes, "big", 1, request(1.0, 80.0)),
        &Previous::default(),
    );
    let refusal = plan.refusals.values().next().expect("refused");
    assert_eq!(
        refusal.to_string(),
        "needs 80.0 GiB on one GPU; largest free is 48.0 GiB (node-1 gpu 0)"
    );
    assert_eq!(refusal.blocking_resource(), "vram");
}

#[test]
fn actors_go_only_to_nodes_whose_agent_offers_their_kind_and_version() {
    let mut nodes = mixed_cluster();
    for (id, kinds) in [
        ("node-1", &["embed", "minhash@1"][..]),
        ("node-2", &["embed", "minhash@2"][..]),
        ("node-3", &["embed"][..]),
    ] {
        let node = nodes.get_mut(&NodeId::from(id)).unwrap();
        node.actor_kinds = kinds.iter().map(|k| (*k).to_owned()).collect();
    }
    let mut req = request(0.0, 0.0);
    req.cpu_millicores = 1000;
    req.actor_kind = "minhash@2".into();
    let plan = place(
        &problem_with(nodes.clone(), "dedup", 3, req.clone()),
        &Previous::default(),
    );
    assert_eq!(plan.assignments.len(), 3);
    assert!(
        plan.assignments
            .values()
            .all(|a| a.node.as_str() == "node-2"),
        "{plan:?}"
    );
    req.actor_kind = "minhash@3".into();
    let plan = place(&problem_with(nodes, "dedup", 1, req), &Previous::default());
    let refusal = plan.refusals.values().next().unwrap();
    assert_eq!(
        refusal.to_string(),
        "no alive node's agent offers actor kind `minhash@3`"
    );
    assert_eq!(refusal.blocking_resource(), "actor kind");
}

#[test]
fn label_selector_keeps_actors_on_matching_nodes() {
    let mut req = request(1.0, 20.0);
    req.selector.insert("pool".into(), "onprem-a6000".into());
    let plan = place(
        &problem_with(mixed_cluster(), "emb", 8, req),
        &Previous::default(),
    );
    assert_eq!(plan.assignments.len(), 8);
    assert!(
        plan.assignments
            .values()
            .all(|a| a.node.as_str() == "node-1")
    );
    let mut used: Vec<u32> = plan.assignments.values().map(|a| a.gpus[0]).collect();
    used.sort_unstable();
    assert_eq!(
        used,
        (0..8).collect::<Vec<_>>(),
        "whole GPUs are not shared"
    );
}

#[test]
fn fractional_gpus_share_one_device_when_packing() {
    let mut req = request(0.25, 4.0);
    req.gpu_model = Some("t4".into());
    let plan = place(
        &problem_with(mixed_cluster(), "small", 4, req),
        &Previous::default(),
    );
    let places: Vec<_> = plan.assignments.values().collect();
    assert_eq!(places.len(), 4);
    assert!(
        places
            .iter()
            .all(|a| a.node == places[0].node && a.gpus == places[0].gpus),
        "four quarter-GPU actors pack onto one T4: {places:?}"
    );
    // A fifth quarter does not fit on that GPU and goes to the next one.
    let mut more = request(0.25, 4.0);
    more.gpu_model = Some("t4".into());
    let plan = place(
        &problem_with(mixed_cluster(), "small", 5, more),
        &Previous::default(),
    );
    let distinct: std::collections::BTreeSet<_> =
        plan.assignments.values().map(|a| a.gpus.clone()).collect();
    assert_eq!(distinct.len(), 2);
}

#[test]
fn spread_uses_every_matching_node() {
    let mut req = request(0.0, 0.0);
    req.strategy = PlacementStrategy::Spread;
    let plan = place(
        &problem_with(mixed_cluster(), "cpu", 3, req),
        &Previous::default(),
    );
    let nodes: std::collections::BTreeSet<_> =
        plan.assignments.values().map(|a| a.node.clone()).collect();
    assert_eq!(nodes.len(), 3);
}

#[test]
fn compute_capability_and_model_refusals_name_the_resource() {
    let mut req = request(1.0, 10.0);
    req.min_compute = Some(ComputeCapability {
        major: 10,
        minor: 0,
    });
    let plan = place(
        &problem_with(mixed_cluster(), "x", 1, req),
        &Previous::default(),
    );
    let refusal = plan.refusals.values().next().unwrap();
    assert_eq!(refusal.blocking_resource(), "compute capability");
    assert_eq!(
        refusal.to_string(),
        "needs compute capability 10.0 or higher; the best eligible GPU has 9.0"
    );

    let mut req = request(1.0, 10.0);
    req.gpu_model = Some("B200".into());
    let plan = place(
        &problem_with(mixed_cluster(), "x", 1, req),
        &Previous::default(),
    );
    assert_eq!(
        plan.refusals.values().next().unwrap().blocking_resource(),
        "gpu model"
    );

    let mut req = request(1.0, 10.0);
    req.selector.insert("zone".into(), "mars".into());
    let plan = place(
        &problem_with(mixed_cluster(), "x", 1, req),
        &Previous::default(),
    );
    assert_eq!(
        plan.refusals.values().next().unwrap().to_string(),
        "no alive node has labels zone=mars"
    );

    let plan = place(
        &problem_with(mixed_cluster(), "x", 1, request(2.0, 60.0)),
        &Previous::default(),
    );
    assert_eq!(
        plan.refusals.values().next().unwrap().to_string(),
        "needs 2 whole GPUs with 60.0 GiB each on one node; at most 1 are free (node-3)"
    );
    let plan = place(
        &problem_with(mixed_cluster(), "x", 1, request(9.0, 1.0)),
        &Previous::default(),
    );
    assert_eq!(
        plan.refusals.values().next().unwrap().to_string(),
        "needs 9 GPUs on one node; the largest eligible node has 8"
    );
}

#[test]
fn nothing_moves_when_a_node_joins() {
    let mut nodes = mixed_cluster();
    let big = nodes.remove(&NodeId::from("node-3")).unwrap();
    let problem = problem_with(nodes.clone(), "p", 6, request(0.5, 8.0));
    let first = place(&problem, &Previous::default());
    nodes.insert(NodeId::from("node-3"), big);
    let grown = Problem { nodes, ..problem };
    let second = place(&grown, &first.as_previous());
    assert_eq!(first.assignments, second.assignments);
}

#[test]
fn actors_on_a_removed_node_are_placed_again() {
    let problem = problem_with(mixed_cluster(), "p", 3, request(1.0, 60.0));
    let first = place(&problem, &Previous::default());
    assert_eq!(first.assignments.len(), 1, "only the H100 has 60 GiB");
    assert_eq!(first.refusals.len(), 2);
    let mut nodes = mixed_cluster();
    nodes.remove(&NodeId::from("node-3"));
    let shrunk = Problem { nodes, ..problem };
    let second = place(&shrunk, &first.as_previous());
    assert!(second.assignments.is_empty());
    assert_eq!(second.refusals.len(), 3);
}

// ---------------------------------------------------------------------------
// Properties over random clusters and requests
// ---------------------------------------------------------------------------

const GPU_MODELS: [(&str, f64, u32, u32); 4] = [
    ("Tesla T4", 16.0, 7, 5),
    ("NVIDIA A10G", 24.0, 8, 6),
    ("NVIDIA RTX A6000", 48.0, 8, 6),
    ("NVIDIA H100", 80.0, 9, 0),
];

fn arb_node() -> impl Strategy<Value = NodeCapacity> {
    (0usize..4, 0u32..9, 0usize..3, 1u64..17).prop_map(|(model, count, zone, cores)| {
        let (name, gib, major, minor) = GPU_MODELS[model];
        NodeCapacity {
            labels: [("zone".to_owned(), format!("z{zone}"))]
                .into_iter()
                .collect(),
            actor_kinds: Default::default(),
            gpus: (0..count)
                .map(|i| gpu(i, name, gib, major, minor))
                .collect(),
            cpu_millicores: cores * 1000,
        }
    })
}

fn arb_request() -> impl Strategy<Value = ResourceRequest> {
    (
        prop_oneof![
            Just(0.0),
            Just(0.25),
            Just(0.5),
            Just(1.0),
            Just(2.0),
            Just(4.0)
        ],
        0.0f64..90.0,
        proptest::option::of(0usize..3),
        proptest::option::of(0usize..4),
        any::<bool>(),
        0u64..4,
    )
        .prop_map(|(gpus, gib, zone, model, spread, cpus)| {
            let mut request = self::request(gpus, if gpus == 0.0 { 0.0 } else { gib });
            if let Some(zone) = zone {
                request.selector.insert("zone".into(), format!("z{zone}"));
            }
            request.gpu_model =
                model.map(|m| GPU_MODELS[m].0.split(' ').next_back().unwrap().to_owned());
            request.strategy = if spread {
                PlacementStrategy::Spread
            } else {
                PlacementStrategy::Pack
            };
            request.cpu_millicores = cpus * 500;
            request
        })
}

fn arb_problem() -> impl Strategy<Value = Problem> {
    (
        proptest::collection::vec(arb_node(), 0..6),
        proptest::collection::vec((arb_request(), 1u64..6), 1..6),
    )
        .prop_map(|(nodes, pools)| {
            let nodes = nodes
                .into_iter()
                .enumerate()
                .map(|(i, n)| (NodeId::new(format!("node-{i}")), n))
                .collect();
            let mut actors = BTreeMap::new();
            let mut order = 0;
            for (p, (request, count)) in pools.into_iter().enumerate() {
                for i in 0..count {
                    actors.insert(
                        ActorId::new(format!("pool{p}-{i}")),
                        ActorDemand {
                            pool: PoolName::new(format!("pool{p}")),
                            request: request.clone(),
                            order,
                        },
                    );
                    order += 1;
                }
            }
            Problem { nodes, actors }
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn never_over_commits_and_places_or_refuses_everyone(problem in arb_problem()) {
        let plan = place(&problem, &Previous::default());
        prop_assert_eq!(check_plan(&problem, &plan), Ok(()));
        prop_assert_eq!(plan.assignments.len() + plan.refusals.len(), problem.actors.len());
    }

    #[test]
    fn shared_rankings_place_as_ranking_every_actor_afresh(problem in arb_problem()) {
        let afresh = super::solve::place_ranking_every_actor_afresh;
        prop_assert_eq!(place(&problem, &Previous::default()), afresh(&problem, &Previous::default()));
        // With kept assignments, after the first node is gone.
        let before = place(&problem, &Previous::default()).as_previous();
        let mut smaller = problem.clone();
        smaller.nodes.pop_first();
        prop_assert_eq!(place(&smaller, &before), afresh(&smaller, &before));
    }

    #[test]
    fn placing_only_the_pending_actors_places_them_as_a_full_plan_would(
        problem in arb_problem(),
        split in 0usize..30,
    ) {
        // The first `split` actors (in creation order) are placed already; the rest wait.
        let mut order: Vec<_> = problem.actors.iter().collect();
        order.sort_by_key(|(id, demand)| (demand.order, (*id).clone()));
        let (earlier, later) = order.split_at(split.min(order.len()));
        let earlier_problem = Problem {
            nodes: problem.nodes.clone(),
            actors: earlier.iter().map(|(id, d)| ((*id).clone(), (*d).clone())).collect(),
        };
        let placed = place(&earlier_problem, &Previous::default());
        let holding = placed.assignments.iter().map(|(id, assignment)| {
            let demand = &problem.actors[id];
            Holding { pool: &demand.pool, request: &demand.request, assignment }
        });
        let pending: BTreeMap<_, _> = later.iter().map(|(id, d)| ((*id).clone(), (*d).clone())).collect();
        let incremental = place_pending(&problem.nodes, holding, &pending, usize::MAX);

        let mut whole = problem.clone();
        whole.actors.retain(|id, _| placed.assignments.contains_key(id) || pending.contains_key(id));
        let full = place(&whole, &placed.as_previous());
        let only_pending = |map: &BTreeMap<ActorId, _>| -> Vec<ActorId> {
            map.keys().filter(|id| pending.contains_key(*id)).cloned().collect()
        };
        prop_assert_eq!(only_pending(&incremental.assignments), only_pending(&full.assignments));
        for id in only_pending(&full.assignments) {
            prop_assert_eq!(&incremental.assignments[&id], &full.assignments[&id]);
        }
        prop_assert_eq!(
            incremental.refusals,
            full.refusals.into_iter().filter(|(id, _)| pending.contains_key(id)).collect::<BTreeMap<_, _>>()
        );
    }

    #[test]
    fn a_bounded_call_places_a_prefix_and_the_next_calls_the_rest(problem in arb_problem(), max in 1usize..8) {
        let pending = problem.actors.clone();
        let whole = place_pending(&problem.nodes, [], &pending, usize::MAX);
        // Call after call, each placing at most `max` around what the earlier ones placed.
        let mut placed: BTreeMap<ActorId, Assignment> = BTreeMap::new();
        let mut refused = BTreeMap::new();
        loop {
            let left: BTreeMap<_, _> = pending
                .iter()
                .filter(|(id, _)| !placed.contains_key(*id) && !refused.contains_key(*id))
                .map(|(id, d)| (id.clone(), d.clone()))
                .collect();
            let holding = placed.iter().map(|(id, assignment)| {
                let demand = &problem.actors[id];
                Holding { pool: &demand.pool, request: &demand.request, assignment }
            });
            let plan = place_pending(&problem.nodes, holding, &left, max);
            prop_assert!(plan.assignments.len() <= max);
            let done = plan.assignments.len() + plan.refusals.len() == left.len();
            placed.extend(plan.assignments);
            if done {
                refused = plan.refusals;
                break;
            }
        }
        prop_assert_eq!(placed, whole.assignments);
        prop_assert_eq!(refused, whole.refusals);
    }

    #[test]
    fn same_input_same_plan(problem in arb_problem()) {
        prop_assert_eq!(place(&problem, &Previous::default()), place(&problem, &Previous::default()));
    }

    #[test]
    fn placing_again_changes_nothing(problem in arb_problem()) {
        let first = place(&problem, &Previous::default());
        let second = place(&problem, &first.as_previous());
        prop_assert_eq!(first, second);
    }

    #[test]
    fn refusals_name_a_blocking_resource_that_really_blocks(problem in arb_problem()) {
        let plan = place(&problem, &Previous::default());
        for (actor, refusal) in &plan.refusals {
            let request = &problem.actors[actor].request;
            let text = refusal.to_string();
            prop_assert!(text.starts_with("needs") || text.starts_with("no "), "{}", text);
            match refusal.blocking_resource() {
                "selector" => prop_assert!(!request.selector.is_empty()),
                "actor kind" => prop_assert!(!request.actor_kind.is_empty()),
                "gpu model" => prop_assert!(request.gpu_model.is_some()),
                "vram" | "gpus" | "gpu share" => prop_assert!(!request.gpus.is_cpu_only()),
                "cpu" => prop_assert!(request.cpu_millicores > 0),
                "nodes" => prop_assert!(problem.nodes.is_empty()),
                other => prop_assert!(other == "compute capability", "{}", other),
            }
        }
    }
}
