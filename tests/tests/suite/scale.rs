//! `scale-bench`'s run, scaled down to 50 simulated agents x 8 GPUs against a real scheduler
//! process with TLS and tokens: every actor is placed and ready, every no-op task is
//! answered exactly once, and when 10% of the agents die at once their actors are placed
//! on the others. (Speeds are the benchmark's business, not this test's.)

use std::time::Duration;

use resident_tests::init_logging;
use resident_tests::scale_run::{ScaleConfig, run_scale};
use resident_tests::secure::SecureSetup;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_agents_place_every_actor_answer_every_task_once_and_survive_losing_five() {
    init_logging();
    let setup = SecureSetup::new(&[("ops", "admin"), ("fleet", "agent")]);
    let (scheduler, url) = setup.spawn_scheduler();
    let client = setup.connect_as(&url, "ops").await.unwrap();
    let config = ScaleConfig {
        agents: 50,
        gpus_per_agent: 8,
        actors_per_agent: 8,
        actor_gpus: 0.5,
        pools: 4,
        tasks: 20_000,
        idle_window: Duration::from_secs(1),
        lost_share: 0.1,
        phase_timeout: Duration::from_secs(60),
        metrics_port: None,
    };
    let report = run_scale(
        &url,
        scheduler.pid(),
        &setup.credentials(Some(setup.token("fleet"))),
        &client,
        &config,
    )
    .await
    .unwrap();
    eprintln!("{report:?}");
    assert_eq!(report.actors_placed, 400);
    assert_eq!(report.tasks, 20_000);
    assert_eq!(
        (report.duplicate_results, report.missing_results),
        (0, 0),
        "every task answered exactly once"
    );
    assert_eq!(report.agents_lost, 5);
    assert!(
        (30..=50).contains(&report.actors_lost),
        "spread placement put about 8 actors on each lost agent: {}",
        report.actors_lost
    );
    assert_eq!(
        report.actors_after_loss, 400,
        "the lost agents' actors are ready on the others"
    );
    assert!(report.scheduler_rss_bytes > 0 && report.idle_cpu_ratio >= 0.0);
}
