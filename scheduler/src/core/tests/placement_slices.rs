//! Placement of many actors in slices (a *burst*, `Core::replan`): each slice goes on
//! from where the last stopped, what placed actors hold is kept from one slice to the next
//! (the index assertions after every command check it against a fresh count), and an
//! actor that becomes pending behind the burst's cursor is not left behind.

use super::super::pools::MAX_PLACEMENTS_PER_TURN;
use super::*;

/// Runs placement slices until the burst is done; returns how many ran.
fn place_all(h: &mut Harness) -> usize {
    let mut slices = 0;
    while h.core.more_to_place {
        h.core.replan_needed = true;
        h.core.after_commands();
        slices += 1;
    }
    slices
}

#[test]
fn actors_that_fall_behind_the_cursor_of_a_burst_are_placed_by_the_next_burst() {
    let mut h = Harness::new(CoreConfig::for_test());
    h.add_node("a", Vec::new());
    h.add_node("b", Vec::new());
    let replicas = 2 * MAX_PLACEMENTS_PER_TURN + 10;
    h.create_pool(cpu_pool("p", replicas as u32, 1));
    // The first slice ran with the creation; the burst has more to do.
    assert!(h.core.more_to_place);
    assert_eq!(
        h.core.pending_count(),
        replicas - MAX_PLACEMENTS_PER_TURN,
        "one slice placed"
    );
    let on_b = h.core.hosted_on(&NodeId::new("b")).len();
    assert!(on_b > 0, "spread over both nodes");

    // Node b's agent dies mid-burst: its actors, placed in the first slice, are pending
    // again, behind the cursor, and the kept occupancy is dropped with the node (the next
    // slice counts it afresh; the index assertions compare it with a fresh count).
    let session = h.agent("b").session;
    h.core.handle(SchedulerCommand::AgentGone { session });
    assert!(h.core.occupancy.is_none(), "a node left");
    h.core.after_commands();
    place_all(&mut h);
    assert!(
        h.core.pending_count() == 0,
        "{} actors still pending after the burst",
        h.core.pending_count()
    );
    assert_eq!(h.core.hosted_on(&NodeId::new("a")).len(), replicas);
    assert!(h.core.placement_cursor.is_none(), "the burst is done");
}

#[test]
fn a_burst_keeps_what_placed_actors_hold_between_its_slices() {
    let mut h = Harness::new(CoreConfig::for_test());
    h.add_node("a", (0..8).map(|i| gpu(i, 80)).collect());
    let mut spec = gpu_pool("p", 1);
    spec.replicas = (MAX_PLACEMENTS_PER_TURN + 1) as u32;
    let request = spec.resources.as_mut().expect("set");
    request.gpus = 0.001;
    request.vram_bytes = 1 << 20;
    h.create_pool(spec);
    assert!(h.core.more_to_place);
    let kept = h.core.occupancy.as_ref().map(|(version, _)| *version);
    assert_eq!(
        kept,
        Some(h.core.holdings_version()),
        "the first slice left its occupancy for the next"
    );
    assert_eq!(place_all(&mut h), 1);
    assert!(h.core.pending_count() == 0);
    // 8 GPUs of 1,000 thousandths (and 80 GiB) each hold 8,000 actors of one thousandth
    // (and 1 MiB).
    assert_eq!(
        h.core.hosted_on(&NodeId::new("a")).len(),
        MAX_PLACEMENTS_PER_TURN + 1
    );
}
