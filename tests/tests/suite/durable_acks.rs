//! What the scheduler acknowledges survives a kill -9 that lands the instant the answer
//! arrives: pools created, scaled and deleted; jobs opened, cancelled and finished. Every
//! round kills the scheduler right after one acknowledged change and restarts it on the
//! same state dir; after each restart every change acknowledged so far is there.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use resident_sdk::{Bytes, Cluster, JobId, JobState, PoolSpec};
use resident_tests::*;

/// What the client was told, and so what every restarted scheduler must show.
#[derive(Default)]
struct Acknowledged {
    /// Pool name to replicas; `None`: deleted.
    pools: BTreeMap<String, Option<u32>>,
    /// Job id to the state it must have; `None`: known, in any state.
    jobs: BTreeMap<JobId, Option<JobState>>,
}

impl Acknowledged {
    async fn check(&self, cluster: &Cluster, round: usize) {
        let pools: BTreeMap<String, u32> = cluster
            .list_pools()
            .await
            .unwrap()
            .into_iter()
            .map(|p| (p.spec.name().to_owned(), p.replicas()))
            .collect();
        for (name, replicas) in &self.pools {
            assert_eq!(
                pools.get(name),
                replicas.as_ref(),
                "round {round}: pool `{name}` is not as acknowledged (all pools: {pools:?})"
            );
        }
        for (job, state) in &self.jobs {
            let status = cluster.job_status(job).await.unwrap_or_else(|error| {
                panic!("round {round}: acknowledged job {job} is lost: {error}")
            });
            if let Some(state) = state {
                assert_eq!(status.state, *state, "round {round}: job {job}");
            }
        }
    }
}

/// A scheduler on `port` and `state`, with the agent back and the `stay` pool ready.
async fn restart(port: u16, state: &std::path::Path) -> (Proc, Cluster) {
    let (scheduler, url) = spawn_scheduler(port, state);
    let cluster = Cluster::connect(&url).await.unwrap();
    cluster
        .wait_for_nodes(1, Duration::from_secs(20))
        .await
        .unwrap();
    (scheduler, cluster)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_change_survives_a_kill_at_the_instant_of_its_answer() {
    init_logging();
    let state = tempfile::tempdir().unwrap();
    let port = free_port();
    let (mut scheduler, url) = spawn_scheduler(port, state.path());
    let _agent = spawn_agent(&url, "node-1", "A10G:24GiB", "");
    let mut cluster = Cluster::connect(&url).await.unwrap();
    cluster
        .wait_for_nodes(1, Duration::from_secs(20))
        .await
        .unwrap();
    cluster
        .create_pool(PoolSpec::new("stay", "echo"))
        .await
        .unwrap();
    let mut acked = Acknowledged::default();
    acked.pools.insert("stay".into(), Some(1));

    const KINDS: usize = 6;
    for round in 0..2 * KINDS {
        match round % KINDS {
            0 => {
                let name = format!("created-{round}");
                cluster
                    .create_pool(PoolSpec::new(&name, "echo"))
                    .await
                    .unwrap();
                scheduler.kill9();
                acked.pools.insert(name, Some(1));
            }
            1 => {
                let name = format!("created-{}", round - 1);
                cluster.pool(&name).scale(2).await.unwrap();
                scheduler.kill9();
                acked.pools.insert(name, Some(2));
            }
            2 => {
                let name = format!("created-{}", round - 2);
                cluster.pool(&name).delete().await.unwrap();
                scheduler.kill9();
                acked.pools.insert(name, None);
            }
            3 => {
                // Opened: the job is accepted while its input is still open.
                let job = cluster
                    .pool("stay")
                    .submit("opened", futures::stream::pending::<Bytes>())
                    .await
                    .unwrap();
                scheduler.kill9();
                acked.jobs.insert(job.job_id.clone(), None);
            }
            4 => {
                let job = cluster
                    .pool("stay")
                    .submit("cancelled", futures::stream::pending::<Bytes>())
                    .await
                    .unwrap();
                cluster.cancel_job(&job.job_id).await.unwrap();
                scheduler.kill9();
                acked
                    .jobs
                    .insert(job.job_id.clone(), Some(JobState::Cancelled));
            }
            _ => {
                let pool = cluster.pool("stay");
                pool.wait_ready(Duration::from_secs(20)).await.unwrap();
                let mut job = pool
                    .submit("finished", futures::stream::iter([Bytes::from("x")]))
                    .await
                    .unwrap();
                // The stream ends when the scheduler says the job finished.
                while job.next().await.is_some() {}
                scheduler.kill9();
                acked
                    .jobs
                    .insert(job.job_id.clone(), Some(JobState::Succeeded));
            }
        }
        (scheduler, cluster) = restart(port, state.path()).await;
        acked.check(&cluster, round).await;
    }
}
