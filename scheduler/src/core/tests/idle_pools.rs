//! Pools that delete themselves: after `idle_ttl_ms` unused, or when their job ends and no
//! other job uses them (`DeletePool` with `if_unused`).

use std::time::Duration;

use super::*;

fn delete_if_unused(h: &mut Harness, pool: &str) -> Option<String> {
    h.delete_pool(pool, true).unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_pool_used_by_a_running_job_is_kept_and_deleted_once_unused() {
    let mut h = Harness::new(CoreConfig::for_test());
    let (job, _rx, task) = h.one_task_running();
    let kept = delete_if_unused(&mut h, "p").expect("kept");
    assert!(kept.contains(&format!("job {job} is running")), "{kept}");
    h.core.handle(SchedulerCommand::CloseJobInput {
        stream: h.stream(&job),
    });
    h.outcome("n1", &task, Ok("done"));
    assert_eq!(delete_if_unused(&mut h, "p"), None);
    assert!(h.core.pools.is_empty());
}

#[tokio::test(start_paused = true)]
async fn an_idle_pool_past_its_ttl_is_deleted_and_one_in_use_is_not() {
    let mut h = Harness::new(CoreConfig::for_test());
    h.add_node("n1", vec![]);
    let mut spec = cpu_pool("ttl", 1, 1);
    spec.idle_ttl_ms = 60_000;
    h.create_pool(spec.clone());
    h.load_actors("n1");
    let (job, _rx) = h.open_job("ttl");
    // A running job keeps it, however long.
    h.tick();
    tokio::time::advance(Duration::from_secs(120)).await;
    h.tick();
    assert!(h.core.pools.contains_key(&PoolName::from("ttl")));
    h.core.handle(SchedulerCommand::CloseJobInput {
        stream: h.stream(&job),
    });
    // Unused from now: kept for the TTL, then deleted with an event saying why.
    h.tick();
    tokio::time::advance(Duration::from_secs(59)).await;
    h.tick();
    assert!(h.core.pools.contains_key(&PoolName::from("ttl")));
    // Creating it again with another TTL is not a conflict: the TTL changes.
    spec.idle_ttl_ms = 30_000;
    h.create_pool(spec);
    tokio::time::advance(Duration::from_secs(2)).await;
    h.tick();
    assert!(h.core.pools.is_empty(), "deleted after 30 s unused");
    let events = h.core.metrics.events.recent(1);
    assert!(events[0].message.contains("unused"), "{events:?}");
}
