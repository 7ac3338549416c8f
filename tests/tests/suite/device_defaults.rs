//! Where a job's actors run when the user names no device (issue 43): the GPUs when the
//! cluster has any, one actor each, said in the job's first line; `--gpus-per-actor 0` keeps
//! the CPU. The `resident` binary on a local cluster with simulated GPUs (capacity only: the
//! work itself runs on the CPU), and the library call with the same cluster.

use resident_jobs::corpus_job::EmbedJobConfig;
use resident_jobs::corpus_job::{CorpusJobConfig, run_embed_job};
use resident_sdk::{Cluster, LocalConfig};
use resident_tests::{embed_command, ids_in_file, init_logging, minilm_dir, read_json, sample};
use serde_json::Value;

/// Runs `resident embed` on 40 documents with `extra` flags; returns its stderr and report.
fn embed(extra: &[&str]) -> (String, Value) {
    let dir = tempfile::tempdir().unwrap();
    let input = sample(dir.path(), 40);
    let out = dir.path().join("out");
    let output = embed_command(&input, &out, extra).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "resident embed failed:\n{stderr}");
    assert_eq!(ids_in_file(&out.join("ids.jsonl")), ids_in_file(&input));
    (stderr, read_json(&out.join("report.json")))
}

fn first_line(stderr: &str) -> &str {
    stderr
        .lines()
        .find(|l| l.starts_with("resident embed of"))
        .unwrap_or_else(|| panic!("no summary line in:\n{stderr}"))
}

#[test]
fn without_a_device_flag_a_job_takes_one_actor_per_gpu_and_says_so() {
    let (stderr, report) = embed(&["--simulate-gpus", "T4:16GiB x2"]);
    let line = first_line(&stderr);
    assert!(
        line.ends_with(
            " 2 simulated GPUs): one actor per GPU (2 GPUs on 1 node); --gpus-per-actor 0 runs \
             CPU actors instead"
        ),
        "{line}"
    );
    assert_eq!(report["actors"], 2, "{report}");
    assert!(report["gpu_hours"].as_f64().unwrap() > 0.0, "{report}");
    assert_eq!(report["cpu_hours"].as_f64(), Some(0.0), "{report}");
    let per_gpu = report["per_gpu"].as_array().unwrap();
    assert!(
        !per_gpu.is_empty() && per_gpu.iter().all(|g| g["gpu_index"].is_u64()),
        "every document ran on a GPU actor: {report}"
    );
}

#[test]
fn gpus_per_actor_zero_keeps_the_cpu_on_a_gpu_host_and_says_what_idles() {
    let (stderr, report) = embed(&["--simulate-gpus", "T4:16GiB x2", "--gpus-per-actor", "0"]);
    let line = first_line(&stderr);
    assert!(
        line.ends_with(": CPU actors, as asked (--gpus-per-actor 0), leaving 2 GPUs idle"),
        "{line}"
    );
    let per_gpu = report["per_gpu"].as_array().unwrap();
    assert!(
        per_gpu
            .iter()
            .all(|g| g["gpu_index"].is_null() && g["gpu_name"] == "cpu"),
        "every document ran on a CPU actor: {report}"
    );
    assert_eq!(report["gpu_hours"].as_f64(), Some(0.0), "{report}");
    assert!(report["cpu_hours"].as_f64().unwrap() > 0.0, "{report}");
}

#[test]
fn without_gpus_a_job_runs_on_the_cpu_and_says_why() {
    let (stderr, report) = embed(&[]);
    let line = first_line(&stderr);
    assert!(
        line.ends_with(" no GPUs): CPU actors: no GPUs on the nodes this job may use")
            || line.contains(" GPUs): one actor per GPU"),
        "a CPU build sees no GPUs; a CUDA build on a GPU host takes them: {line}"
    );
    assert_eq!(report["items"], 40);
}

/// The library leaves the choice to the job when `gpus_per_actor` is `None`, as the CLI does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_library_job_chooses_the_gpus_when_none_is_given() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let input = sample(dir.path(), 24);
    let cluster = Cluster::local(LocalConfig::default().simulate_gpus("T4:16GiB x3"))
        .await
        .unwrap();
    let mut config = EmbedJobConfig::new(&input, minilm_dir(), dir.path().join("auto"));
    assert_eq!(config.corpus.gpus_per_actor, None);
    let report = run_embed_job(&cluster, &config, &mut |_| {}).await.unwrap();
    let hours = (report.gpu_hours, report.cpu_hours);
    assert_eq!(report.actors, 3);
    assert!(
        hours.0 > 0.0 && hours.1 == 0.0,
        "GPU and CPU hours: {hours:?}"
    );

    config.corpus.output = dir.path().join("cpu").into();
    config.corpus.gpus_per_actor = Some(0.0);
    config.corpus.replicas = Some(2);
    let report = run_embed_job(&cluster, &config, &mut |_| {}).await.unwrap();
    let hours = (report.gpu_hours, report.cpu_hours);
    assert_eq!(report.actors, 2);
    assert!(
        hours.0 == 0.0 && hours.1 > 0.0,
        "GPU and CPU hours: {hours:?}"
    );

    let mut chosen = CorpusJobConfig::new(&input, minilm_dir(), dir.path().join("x"));
    let choice = chosen
        .choose_device(&cluster, "gpus_per_actor=")
        .await
        .unwrap();
    assert_eq!(chosen.gpus_per_actor, Some(1.0));
    assert_eq!(
        choice.why,
        "one actor per GPU (3 GPUs on 1 node); gpus_per_actor= 0 runs CPU actors instead"
    );
}
