//! What one message costs the loop, counted in records read (`core/table.rs`), on a small
//! and a large fleet: a heartbeat, an actor report, a task outcome and a drain read the
//! records of what they are about (one node, its actors, one task), and so do a task's
//! submission and a node joining a fleet with nothing to place: the same number
//! whether the cluster holds 10 nodes or 100. A walk over every actor or node on one of
//! these paths (as the heartbeat's capacity refresh once did) fails here, on any machine.
//!
//! Placement of many actors goes in slices: each slice reads the pending actors it takes,
//! not every placed actor (what they hold is kept from one slice to the next).
//!
//! Work that does grow with the fleet runs on timers or on demand and is listed in
//! SCALE.md ("What is still O(fleet)").

use super::*;

const GPUS_PER_NODE: u32 = 8;

/// Records read by one step, actors and nodes apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Visits {
    actors: u64,
    nodes: u64,
}

fn visits(h: &Harness) -> Visits {
    Visits {
        actors: h.core.actors.visits(),
        nodes: h.core.nodes.visits(),
    }
}

/// Runs `step` and returns what it read.
fn cost(h: &mut Harness, step: impl FnOnce(&mut Harness)) -> Visits {
    let before = visits(h);
    step(h);
    let after = visits(h);
    Visits {
        actors: after.actors - before.actors,
        nodes: after.nodes - before.nodes,
    }
}

/// A running fleet and the one task it runs.
struct Fleet {
    h: Harness,
    job: JobId,
    _results: ResultsRx,
    /// The node running `task`.
    node: String,
    task: pb::RunTask,
}

/// `nodes` nodes of 8 GPUs, one pool of 8 actors a node (half a GPU each, spread), all
/// loaded, and one job whose single task runs on one of them.
fn fleet(nodes: usize) -> Fleet {
    let mut h = Harness::new(CoreConfig::for_test());
    for n in 0..nodes {
        h.add_node(
            &format!("n{n}"),
            (0..GPUS_PER_NODE).map(|i| gpu(i, 16)).collect(),
        );
    }
    let mut spec = gpu_pool("p", 2);
    spec.replicas = GPUS_PER_NODE * nodes as u32;
    spec.resources.as_mut().expect("set").strategy = pb::PlacementStrategy::Spread as i32;
    h.create_pool(spec);
    // Placement goes in slices, a slice a turn of the loop.
    while h.core.more_to_place {
        h.core.replan_needed = true;
        h.core.after_commands();
    }
    for n in 0..nodes {
        h.load_actors(&format!("n{n}"));
    }
    assert_eq!(h.core.pending_count(), 0, "every actor placed");
    let (job, results) = h.open_job("p");
    h.submit(&job, 0..1);
    let mut running = None;
    for n in 0..nodes {
        let name = format!("n{n}");
        if let Some(task) = run_tasks(&sent(h.agent(&name))).pop() {
            running = Some((name, task));
        }
    }
    let (node, task) = running.expect("the task was dispatched");
    Fleet {
        h,
        job,
        _results: results,
        node,
        task,
    }
}

/// The node's actors as its heartbeat lists them.
fn reports(h: &Harness, node: &str) -> Vec<pb::ActorReport> {
    h.core
        .hosted_here(&NodeId::new(node))
        .map(|id| {
            let actor = &h.core.actors.uncounted()[id];
            pb::ActorReport {
                actor_id: id.to_string(),
                incarnation: actor.incarnation,
                state: pb::ActorState::Ready as i32,
                model_loads: 1,
                vram_bytes: 2 << 30,
                ..Default::default()
            }
        })
        .collect()
}

/// What each message costs on a fleet of `nodes`.
fn message_costs(nodes: usize) -> BTreeMap<&'static str, Visits> {
    let Fleet {
        mut h,
        job,
        _results,
        node,
        task,
    } = fleet(nodes);
    let mut costs = BTreeMap::new();

    // A heartbeat whose free VRAM moved (its actors hold memory now): the node's actors
    // are reported and its capacity is recounted.
    let listed = reports(&h, &node);
    let free: Vec<(u32, u64, u64)> = (0..GPUS_PER_NODE).map(|i| (i, 16, 12)).collect();
    let beat = heartbeat(&free, listed.clone());
    costs.insert("heartbeat", cost(&mut h, |h| h.send(&node, beat)));

    let report = pb::agent_message::Body::ActorReport(listed[1].clone());
    costs.insert("actor report", cost(&mut h, |h| h.send(&node, report)));

    costs.insert(
        "task outcome",
        cost(&mut h, |h| h.outcome(&node, &task, Ok("done"))),
    );

    costs.insert("task submitted", cost(&mut h, |h| h.submit(&job, 1..2)));

    // A node joining a settled fleet: nothing to place, so nothing to read.
    let gpus: Vec<pb::GpuInfo> = (0..GPUS_PER_NODE).map(|i| gpu(i, 16)).collect();
    costs.insert("node joins", cost(&mut h, |h| h.add_node("late", gpus)));

    let drain = pb::agent_message::Body::Drain(pb::Drain {
        deadline_ms: 60_000,
        reason: "test".into(),
    });
    costs.insert("drain", cost(&mut h, |h| h.send(&node, drain)));
    costs
}

#[test]
fn a_message_reads_the_same_records_on_a_fleet_of_10_or_100_nodes() {
    let small = message_costs(10);
    let large = message_costs(100);
    assert_eq!(
        small, large,
        "a message read more records on a 10x larger fleet (small, then large)"
    );
    eprintln!("records read per message: {large:?}");
    for (message, visits) in &large {
        // About the node's 8 actors, a few times each (report, refresh, dispatch), and its
        // node once for each.
        assert!(
            visits.actors <= 8 * 8 && visits.nodes <= 2 * 8,
            "{message} read {visits:?}"
        );
    }
}

/// What each placement slice after the first reads while 4,104 actors that each ask for a
/// whole GPU are worked through: the first slice takes the GPUs still free, and the later
/// ones find that the rest fit nowhere (every GPU is taken or half taken).
fn slice_costs(nodes: usize) -> Vec<Visits> {
    let Fleet { mut h, .. } = fleet(nodes);
    let mut spec = cpu_pool("whole", 1, 1);
    spec.resources = Some(pb::ResourceRequest {
        gpus: 1.0,
        vram_bytes: 1 << 30,
        ..Default::default()
    });
    spec.replicas = 2 * super::super::pools::MAX_PLACEMENTS_PER_TURN as u32 + 8;
    h.create_pool(spec);
    let unplaced = h.core.pending_count();
    let mut costs = Vec::new();
    while h.core.more_to_place {
        costs.push(cost(&mut h, |h| {
            h.core.replan_needed = true;
            h.core.after_commands();
        }));
    }
    assert_eq!(
        h.core.pending_count(),
        unplaced,
        "the later slices place none"
    );
    costs
}

#[test]
fn a_placement_slice_reads_what_it_places_on_a_fleet_of_10_or_100_nodes() {
    let small = slice_costs(10);
    let large = slice_costs(100);
    assert_eq!(small.len(), 2, "the burst went on in two more slices");
    assert_eq!(
        small, large,
        "a placement slice read more records on a 10x larger fleet (small, then large)"
    );
    eprintln!("records read per placement slice: {large:?}");
}
