//! `resident sweep` with the real model on real Wikipedia articles: trials train on the
//! resident embed actors (one model load per actor), ASHA and TPE are deterministic, a dead agent's
//! trials rerun elsewhere, and a bad declaration is a clear error.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use resident_jobs::sweep::config::SearchAlgorithm;
use resident_jobs::sweep::{
    SweepConfig, SweepSummary, TrialResult, generate_trials, load_results, run_sweep,
};
use resident_sdk::{Cluster, LocalConfig};
use resident_tests::{
    actor_model_loads, assert_has_fields, free_port, init_logging, minilm_dir, read_json,
    resident_bin, signal_pid, spawn_scheduler, spawn_two_t4_agents, wait_until, wiki_sample_lines,
};
use serde_json::Value;

/// The 300-article fixture (text, 12 topics, Wikidata descriptions) as a JSONL file.
fn wiki_data(dir: &Path) -> PathBuf {
    let path = dir.join("wiki300.jsonl");
    std::fs::write(&path, wiki_sample_lines(300).join("\n") + "\n").unwrap();
    path
}

/// A declaration over `data` writing to `output`; `rest` adds keys and sections.
fn declaration(data: &Path, output: &Path, head: &str, rest: &str) -> String {
    format!(
        "name = \"t\"\nmodel = \"{}\"\nreplicas = 2\ndata = \"{}\"\noutput = \"{}\"\nmode = \"max\"\n{head}\n{rest}",
        minilm_dir(),
        data.display(),
        output.display()
    )
}

async fn sweep(cluster: &Cluster, toml: &str) -> (SweepSummary, Vec<TrialResult>) {
    let config = SweepConfig::from_toml(toml).unwrap();
    let summary = run_sweep(cluster, &config, &mut |_| {}).await.unwrap();
    let results = load_results(Path::new(&config.output));
    (summary, results)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grid_of_four_trials_finds_the_right_best_with_one_load_per_actor() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let data = wiki_data(dir.path());
    let output = dir.path().join("grid");
    let toml = declaration(
        &data,
        &output,
        "trial = \"classifier\"\nmetric = \"accuracy\"",
        "[search]\nalgorithm = \"grid\"\n[scheduler]\nkind = \"fifo\"\nmax_epochs = 6\n\
         [space]\nlr = { grid = [1e-6, 0.03] }\nhidden = { grid = [0, 64] }\n",
    );
    let local = LocalConfig {
        http_listen: Some(([127, 0, 0, 1], 0).into()),
        ..LocalConfig::default()
    };
    let cluster = Cluster::local(local).await.unwrap();
    let (summary, results) = sweep(&cluster, &toml).await;
    assert_eq!(results.len(), 4);
    // The dashboard's data carries the sweep's leaderboard, best first.
    let http = cluster.local_http_url().unwrap();
    let addr: std::net::SocketAddr = http.trim_start_matches("http://").parse().unwrap();
    let overview: Value =
        serde_json::from_str(&resident_tests::plain_http_get(addr, "/v1/overview")).unwrap();
    let swept = overview["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["name"] == "sweep-t")
        .unwrap_or_else(|| panic!("the sweep's job in {overview}"));
    let board = swept["summary"]["leaderboard"].as_array().unwrap();
    assert_eq!(board.len(), 4, "{swept}");
    assert_eq!(
        board[0]["trial"].as_u64(),
        summary.best_trial.map(|t| t as u64)
    );
    assert!(
        swept["summary"]["status"]
            .as_str()
            .unwrap()
            .starts_with("4/4 trials done"),
        "{swept}"
    );
    assert_eq!(
        (summary.trials, summary.failed, summary.stopped_early),
        (4, 0, 0)
    );
    assert!(
        results
            .iter()
            .all(|r| r.epochs == 6 && r.metrics.len() == 6 && !r.actor_id.is_empty())
    );
    // A learning rate of 1e-6 barely moves the weights; 0.03 learns the topics.
    let best = results
        .iter()
        .max_by(|a, b| a.metric.partial_cmp(&b.metric).unwrap())
        .unwrap();
    assert_eq!(summary.best_trial, Some(best.trial_id));
    assert_eq!(summary.best_params.as_ref().unwrap()["lr"], 0.03);
    let slow = results
        .iter()
        .filter(|r| r.params["lr"] == 1e-6)
        .map(|r| r.metric.unwrap());
    assert!(
        slow.fold(0.0, f64::max) + 0.2 < summary.best_metric.unwrap(),
        "{results:?}"
    );
    assert_eq!(
        (summary.model_loads, summary.actors),
        (2, 2),
        "one model load per actor"
    );
    assert!(!summary.embedding_cache_hit && summary.examples == 300);
    // What the two CPU actors held while the sweep ran, as the scheduler counted it: at most
    // two cores each for the whole wall time, priced.
    let most = 2.0 * 2.0 * summary.wall_s / 3600.0;
    assert!(
        summary.cpu_hours > 0.0 && summary.cpu_hours <= most,
        "{} core-hours in {} s",
        summary.cpu_hours,
        summary.wall_s
    );
    assert_eq!(summary.gpu_hours, 0.0);
    assert!(summary.estimated_cost_usd > 0.0);
    let summary_json: Value = read_json(&output.join("summary.json"));
    let summary_fields = [
        "best_trial",
        "best_params",
        "best_metric",
        "model_loads",
        "trials",
        "wall_s",
        "gpu_hours",
        "cpu_hours",
        "estimated_cost_usd",
    ];
    assert_has_fields(&summary_json, &summary_fields, "summary.json");
    let results_text = std::fs::read_to_string(output.join("results.jsonl")).unwrap();
    let line: Value = serde_json::from_str(results_text.lines().next().unwrap()).unwrap();
    let result_fields = [
        "trial_id",
        "params",
        "metric",
        "epochs",
        "stopped_early",
        "actor_id",
        "wall_s",
    ];
    assert_has_fields(&line, &result_fields, "results.jsonl");

    assert_best_head_classifies(&output, &summary);

    // Run again: every trial comes from results.jsonl, the embeddings from the cache.
    let (again, _) = sweep(&cluster, &toml).await;
    assert_eq!((again.resumed_trials, again.embedding_cache_hit), (4, true));
    assert_eq!(again.best_trial, summary.best_trial);
}

/// The best trial's head is kept beside the results; applied as its metadata says, to the
/// vectors the sweep embedded, it classifies the articles about as well as its metric says.
fn assert_best_head_classifies(output: &Path, summary: &SweepSummary) {
    use prost::Message;
    assert_eq!(summary.best_head.as_deref(), Some("best_head.safetensors"));
    let bytes = std::fs::read(output.join("best_head.safetensors")).unwrap();
    let head = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let meta = header.metadata().clone().unwrap();
    assert_eq!(meta["trial_id"], summary.best_trial.unwrap().to_string());
    assert_eq!(meta["model"], minilm_dir());
    let cache = std::fs::read_dir(output.join("cache")).unwrap();
    let file = cache
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "dataset"));
    let dataset =
        resident_proto::pb::TrialDataset::decode(std::fs::read(file.unwrap()).unwrap().as_slice())
            .unwrap();
    let classes: Vec<String> = serde_json::from_str(&meta["classes"]).unwrap();
    assert_eq!(classes, dataset.classes);
    let floats = |name: &str| -> Option<(Vec<f32>, Vec<usize>)> {
        let tensor = head.tensor(name).ok()?;
        let values = tensor
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        Some((values.collect(), tensor.shape().to_vec()))
    };
    // x @ w + b, with w of shape (in, out).
    let layer =
        |x: &[f32], (w, shape): &(Vec<f32>, Vec<usize>), (b, _): &(Vec<f32>, Vec<usize>)| {
            (0..shape[1])
                .map(|o| {
                    b[o] + (0..shape[0])
                        .map(|i| x[i] * w[i * shape[1] + o])
                        .sum::<f32>()
                })
                .collect::<Vec<f32>>()
        };
    let (w0, b0) = (floats("w0").unwrap(), floats("b0").unwrap());
    let second = floats("w1").zip(floats("b1"));
    let dim = dataset.dim as usize;
    let vectors: Vec<f32> = dataset
        .vectors
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let correct = (0..dataset.count as usize)
        .filter(|row| {
            let mut logits = layer(&vectors[row * dim..(row + 1) * dim], &w0, &b0);
            if let Some((w1, b1)) = &second {
                let hidden: Vec<f32> = logits.iter().map(|v| v.max(0.0)).collect();
                logits = layer(&hidden, w1, b1);
            }
            let predicted = (0..logits.len()).max_by(|a, b| logits[*a].total_cmp(&logits[*b]));
            predicted == Some(dataset.labels[*row] as usize)
        })
        .count();
    let accuracy = correct as f64 / f64::from(dataset.count);
    assert!(
        accuracy > summary.best_metric.unwrap() - 0.1,
        "the head gets {accuracy} of the articles (its validation metric {:?})",
        summary.best_metric
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asha_and_tpe_stop_weak_trials_early_and_decide_the_same_under_a_seed() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let data = wiki_data(dir.path());
    let cluster = Cluster::local(LocalConfig::default()).await.unwrap();
    let (mut runs, mut space) = (Vec::new(), None);
    for name in ["first", "second"] {
        let toml = declaration(
            &data,
            &dir.path().join(name),
            "trial = \"classifier\"\nmetric = \"macro_f1\"\ntrials = 10\nseed = 11",
            "[search]\nalgorithm = \"tpe\"\nstartup_trials = 4\n\
             [scheduler]\nkind = \"asha\"\nmax_epochs = 8\ngrace_epochs = 1\nreduction_factor = 2\n\
             [space]\nlr = { loguniform = [1e-5, 1e-1] }\nhidden = { choice = [0, 32] }\ndropout = { uniform = [0.0, 0.3] }\n",
        );
        space = Some(SweepConfig::from_toml(&toml).unwrap().space);
        runs.push(sweep(&cluster, &toml).await);
    }
    // TPE draws trials from the trials before them, as they stood at the first rung:
    // what the two runs draw and decide must not depend on which actor finished first.
    let outcome = |results: &[TrialResult]| {
        let mut outcome: Vec<_> = results
            .iter()
            .map(|r| {
                (
                    r.trial_id,
                    r.params.clone(),
                    r.epochs,
                    r.stopped_early,
                    r.metric,
                )
            })
            .collect();
        outcome.sort_by_key(|o| o.0);
        outcome
    };
    assert_eq!(
        outcome(&runs[0].1),
        outcome(&runs[1].1),
        "same seed, same sweep"
    );
    let random = generate_trials(&space.unwrap(), SearchAlgorithm::Random, 10, 11);
    let by_id = outcome(&runs[0].1);
    assert!(
        by_id[..4].iter().zip(&random).all(|(o, p)| &o.1 == p),
        "startup trials are random's"
    );
    // Trial 4 has nothing to learn from yet (two actors x two segments in flight: trial i
    // learns from trials 0..i-4); from trial 5 on the model draws.
    assert_eq!(by_id[4].1, random[4]);
    assert!(
        by_id[5..].iter().zip(&random[5..]).all(|(o, p)| &o.1 != p),
        "the model draws the rest"
    );
    let (summary, results) = &runs[0];
    assert_eq!(results.len(), 10);
    assert!(summary.stopped_early >= 3, "{results:?}");
    let best = results
        .iter()
        .find(|r| Some(r.trial_id) == summary.best_trial)
        .unwrap();
    assert!(!best.stopped_early && best.epochs == 8);
    for stopped in results.iter().filter(|r| r.stopped_early) {
        assert!(
            [1, 2, 4].contains(&stopped.epochs),
            "stops only at rungs: {stopped:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retrieval_trials_rank_each_articles_description_against_all_articles() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let data = wiki_data(dir.path());
    let toml = declaration(
        &data,
        &dir.path().join("retrieval"),
        "trial = \"retrieval\"\nmetric = \"ndcg@10\"",
        "[search]\nalgorithm = \"grid\"\n[scheduler]\nmax_epochs = 3\n\
         [space]\nadapter = { grid = [false, true] }\nlr = { grid = [1e-3] }\ntemperature = { grid = [0.05] }\n",
    );
    let cluster = Cluster::local(LocalConfig::default()).await.unwrap();
    let (summary, results) = sweep(&cluster, &toml).await;
    assert_eq!(summary.trials, 2);
    let raw = results
        .iter()
        .find(|r| r.params["adapter"] == false)
        .unwrap();
    // Without an adapter the metric is the frozen model's, the same every epoch.
    assert!(raw.metrics.windows(2).all(|w| w[0] == w[1]), "{raw:?}");
    // Short descriptions ("1968 film by Stanley Kubrick") find their article often.
    assert!((0.3..=1.0).contains(&raw.metric.unwrap()), "{raw:?}");
    assert!(
        results
            .iter()
            .all(|r| r.metric.is_some_and(|m| (0.0..=1.0).contains(&m)))
    );
}

fn sweep_command(config: &Path, cluster: Option<&str>) -> Command {
    let mut command = Command::new(resident_bin());
    command.args(["sweep", "--config"]).arg(config);
    if let Some(url) = cluster {
        command.args(["--cluster", url]);
    }
    command
        .env("RESIDENT_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// A 12-trial FIFO sweep whose small batches make each trial take long enough to be
/// caught mid-way; returns its config file and output directory.
fn slow_sweep(dir: &Path, seed: u64, search: &str) -> (PathBuf, PathBuf) {
    let data = wiki_data(dir);
    let output = dir.join("out");
    let toml = declaration(
        &data,
        &output,
        &format!("trial = \"classifier\"\nmetric = \"accuracy\"\ntrials = 12\nseed = {seed}"),
        &format!(
            "[search]\n{search}\n[scheduler]\nkind = \"fifo\"\nmax_epochs = 25\n\
             [space]\nlr = {{ loguniform = [1e-3, 3e-2] }}\nhidden = {{ choice = [128] }}\nbatch_size = {{ choice = [4] }}\n"
        ),
    );
    let config = dir.join("sweep.toml");
    std::fs::write(&config, toml).unwrap();
    (config, output)
}

/// TPE, its model drawing every trial after the fourth from the trials before it.
const TPE_AFTER_4: &str = "algorithm = \"tpe\"\nstartup_trials = 4";

/// Waits until `results.jsonl` in `output` has `count` lines.
async fn wait_for_results(output: &Path, count: usize) {
    let results = output.join("results.jsonl");
    wait_until("finished trials", Duration::from_secs(120), || async {
        let text = std::fs::read_to_string(&results).ok()?;
        (text.lines().count() >= count).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_mid_sweep_costs_time_not_trials() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let (config, output) = slow_sweep(dir.path(), 3, "algorithm = \"random\"");
    let (_scheduler, url) = spawn_scheduler(0, &dir.path().join("state"));
    let [_a, mut b] = spawn_two_t4_agents(&url).await;
    let child = sweep_command(&config, Some(&url)).spawn().unwrap();
    wait_for_results(&output, 1).await;
    let results = output.join("results.jsonl");
    // Frozen while the agent dies, the sweep records no trial, so the count read is the count
    // at the kill, whatever the host's speed.
    signal_pid(child.id(), "STOP");
    b.kill9();
    let done_at_kill = std::fs::read_to_string(&results).unwrap().lines().count();
    signal_pid(child.id(), "CONT");
    assert!(
        done_at_kill < 12,
        "killed mid-sweep ({done_at_kill} trials done)"
    );
    let finished = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&finished.stderr);
    assert!(finished.status.success(), "{stderr}");
    let results = load_results(&output);
    assert_eq!(results.len(), 12, "every trial once");
    assert!(
        results.iter().all(|r| r.error.is_none() && r.epochs == 25),
        "{results:?}"
    );
    let stdout = String::from_utf8_lossy(&finished.stdout);
    assert!(stdout.contains("best: trial"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_space_is_a_clear_error_before_anything_runs() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let data = wiki_data(dir.path());
    let output = dir.path().join("never");
    let cases = [
        (
            "lr = { loguniform = [0.0, 0.1] }",
            "space.lr: loguniform needs low > 0, got 0",
        ),
        ("lr = { normal = [0.0, 0.1] }", "unknown variant `normal`"),
        (
            "temperature = { choice = [0.1] }",
            "space.temperature: `Classifier` trials have no such hyperparameter",
        ),
    ];
    for (space, message) in cases {
        let toml = declaration(
            &data,
            &output,
            "trial = \"classifier\"\nmetric = \"accuracy\"",
            &format!("[space]\n{space}\n"),
        );
        let config = dir.path().join("bad.toml");
        std::fs::write(&config, toml).unwrap();
        let run = sweep_command(&config, None).output().unwrap();
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(
            !run.status.success() && stderr.contains(message),
            "{space}: {stderr}"
        );
    }
    assert!(!output.exists(), "nothing ran");
}

/// The scheduler is killed with -9 mid-sweep and restarted on its state directory within a
/// second: the sweep carries on by itself and exits 0, every trial runs once to the end, and
/// the actors are the same ones, each with its one model load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_scheduler_mid_sweep_reloads_no_model_and_loses_no_trial() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let (config, output) = slow_sweep(dir.path(), 5, "algorithm = \"random\"");
    let state = dir.path().join("state");
    let port = free_port();
    let (mut scheduler, url) = spawn_scheduler(port, &state);
    let _agents = spawn_two_t4_agents(&url).await;
    // Kept, so its actors (and their model loads) can be read after the sweep.
    let child = sweep_command(&config, Some(&url))
        .arg("--keep-pool")
        .spawn()
        .unwrap();
    wait_for_results(&output, 1).await;
    let before = actor_model_loads(&url);
    assert_eq!(before.len(), 2, "{before:?}");
    assert!(before.iter().all(|(_, loads)| *loads == 1), "{before:?}");
    // Frozen while the scheduler dies, the sweep records no trial: the count read is the
    // count at the kill. The scheduler comes back on its port once the old one is gone.
    signal_pid(child.id(), "STOP");
    scheduler.kill9();
    let done_at_kill = load_results(&output).len();
    signal_pid(child.id(), "CONT");
    assert!(
        done_at_kill < 12,
        "killed mid-sweep ({done_at_kill} trials done)"
    );
    let (_scheduler, _) = spawn_scheduler(port, &state);

    let finished = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let stderr = String::from_utf8_lossy(&finished.stderr);
    assert!(finished.status.success(), "{stderr}");
    let results = load_results(&output);
    let trials: std::collections::BTreeSet<_> = results.iter().map(|r| r.trial_id).collect();
    assert_eq!((results.len(), trials.len()), (12, 12), "every trial once");
    assert!(
        results.iter().all(|r| r.error.is_none() && r.epochs == 25),
        "{results:?}"
    );
    assert_eq!(
        actor_model_loads(&url),
        before,
        "the same actors, each with its one model load"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_killed_mid_way_resumes_without_rerunning_finished_trials() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let (config, output) = slow_sweep(dir.path(), 5, TPE_AFTER_4);
    let mut child = sweep_command(&config, None).spawn().unwrap();
    wait_for_results(&output, 2).await;
    let results = output.join("results.jsonl");
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let before = std::fs::read_to_string(&results).unwrap();
    let finished: Vec<&str> = before.lines().filter(|l| l.ends_with('}')).collect();
    assert!(finished.len() < 12, "killed mid-way");

    let rerun = sweep_command(&config, None).output().unwrap();
    assert!(
        rerun.status.success(),
        "{}",
        String::from_utf8_lossy(&rerun.stderr)
    );
    let said = String::from_utf8_lossy(&rerun.stderr);
    assert!(
        said.contains(&format!(
            "12 trials by tpe search (0 stopped early, 0 failed, {} from an earlier run)",
            finished.len()
        )),
        "{said}"
    );
    let summary: Value = read_json(&output.join("summary.json"));
    assert_eq!(
        summary["resumed_trials"],
        finished.len(),
        "finished trials are not re-run"
    );
    assert_eq!(summary["trials"], 12);
    assert!(summary["embedding_cache_hit"].as_bool().unwrap());
    let after = std::fs::read_to_string(&results).unwrap();
    let mut ids: Vec<u64> = after
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["trial_id"]
                .as_u64()
                .unwrap()
        })
        .collect();
    ids.sort();
    assert_eq!(ids, (0..12).collect::<Vec<_>>(), "every trial once");
    let mut earlier: Vec<&str> = finished.clone();
    earlier.sort();
    let mut kept: Vec<&str> = after.lines().take(finished.len()).collect();
    kept.sort();
    assert_eq!(kept, earlier, "earlier results kept as they were");
}

/// A PBT sweep of 8 trials (a grid: lr 1e-6 or 0.03, two weight decays, two dropouts; an
/// MLP of 512 hidden units on batches of 2, slow enough to be caught between rounds), a
/// round every 2 of 8 epochs with no fresh draws; returns its config and output.
fn pbt_sweep(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let data = dir.join("wiki300.jsonl");
    if !data.exists() {
        wiki_data(dir);
    }
    let output = dir.join(name);
    let toml = declaration(
        &data,
        &output,
        "trial = \"classifier\"\nmetric = \"accuracy\"",
        "[search]\nalgorithm = \"grid\"\n\
         [scheduler]\nkind = \"pbt\"\nmax_epochs = 8\nperturbation_interval = 2\nresample_probability = 0.0\n\
         [space]\nlr = { grid = [1e-6, 0.03] }\nweight_decay = { grid = [0.0, 1e-4] }\n\
         dropout = { grid = [0.0, 0.1] }\nhidden = { grid = [512] }\nbatch_size = { grid = [2] }\n",
    );
    let config = dir.join(format!("{name}.toml"));
    std::fs::write(&config, toml).unwrap();
    (config, output)
}

/// What a PBT trial came to: its hyperparameters, metrics and copies.
fn pbt_outcome(results: &[TrialResult]) -> Vec<(usize, Value, Vec<f64>, Value)> {
    results
        .iter()
        .map(|r| {
            (
                r.trial_id,
                serde_json::to_value(&r.params).unwrap(),
                r.metrics.clone(),
                serde_json::to_value(&r.schedule).unwrap(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pbt_copies_better_weights_and_a_killed_sweep_resumes_its_last_round_exactly() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let (config, whole) = pbt_sweep(dir.path(), "whole");
    let local = LocalConfig {
        http_listen: Some(([127, 0, 0, 1], 0).into()),
        ..LocalConfig::default()
    };
    let cluster = Cluster::local(local).await.unwrap();
    let http = cluster.local_http_url().unwrap();
    let addr: std::net::SocketAddr = http.trim_start_matches("http://").parse().unwrap();
    // While it runs, the dashboard shows the population after each round.
    let round_shown = wait_until(
        "a PBT round on the dashboard",
        Duration::from_secs(120),
        || async {
            let overview: Value =
                serde_json::from_str(&resident_tests::plain_http_get(addr, "/v1/overview")).ok()?;
            let job = overview["jobs"]
                .as_array()?
                .iter()
                .find(|j| j["name"] == "sweep-t")?;
            let status = job["summary"]["status"].as_str()?;
            status
                .starts_with("PBT round at epoch")
                .then(|| job["summary"].clone())
        },
    );
    let toml = std::fs::read_to_string(&config).unwrap();
    let (_, shown) = tokio::join!(sweep(&cluster, &toml), round_shown);
    assert!(
        shown["status"]
            .as_str()
            .unwrap()
            .contains("of 8: 8 trials training, best accuracy"),
        "{shown}"
    );
    assert_eq!(shown["leaderboard"].as_array().unwrap().len(), 8, "{shown}");
    let results = load_results(&whole);
    assert_eq!(results.len(), 8);
    assert!(
        results.iter().all(|r| r.epochs == 8 && r.error.is_none()),
        "{results:?}"
    );
    // Each round at 2, 4 and 6, the worst quarter (two trials) copied one of the best two.
    let copies: Vec<(usize, u32, usize, &resident_jobs::sweep::Params)> = results
        .iter()
        .flat_map(|r| {
            r.schedule.iter().filter_map(move |p| {
                p.cloned_from
                    .map(|donor| (r.trial_id, p.epoch, donor, &p.params))
            })
        })
        .collect();
    for epoch in [2, 4, 6] {
        assert_eq!(
            copies.iter().filter(|c| c.1 == epoch).count(),
            2,
            "{copies:?}"
        );
    }
    // A copier takes its donor's weights: one still at chance jumps to the donor's level.
    let mut from_chance = 0;
    for &(trial, epoch, donor, params) in &copies {
        let (copier, donor) = (&results[trial], &results[donor]);
        // The shape is the donor's; a listed value moves to a neighbour or stays at an end.
        assert_eq!(
            (&params["hidden"], &params["batch_size"]),
            (&512.into(), &2.into())
        );
        assert!(
            [1e-6, 0.03].contains(&params["lr"].as_f64().unwrap()),
            "{params:?}"
        );
        let before = copier.metrics[epoch as usize - 1];
        if before < 0.2 {
            from_chance += 1;
            let after = copier.metrics[epoch as usize];
            assert!(
                after > 0.4 && after > donor.metrics[epoch as usize - 1] - 0.15,
                "trial {trial} at {before} copied trial {} at {}, then {after}",
                donor.trial_id,
                donor.metrics[epoch as usize - 1]
            );
        }
    }
    assert!(
        from_chance >= 2,
        "the first round's copiers were at chance: {copies:?}"
    );
    // The best trial's policy runs from epoch 0 to 8 through the trials it copied.
    let summary: Value = read_json(&whole.join("summary.json"));
    let policy = summary["best_policy"].as_array().unwrap();
    assert_eq!(policy[0]["start_epoch"], 0);
    assert_eq!(policy.last().unwrap()["end_epoch"], 8);
    assert_eq!(policy.last().unwrap()["trial"], summary["best_trial"]);
    for pair in policy.windows(2) {
        assert_eq!(pair[0]["end_epoch"], pair[1]["start_epoch"], "{policy:?}");
    }

    // The same sweep killed (-9) after a round: the rerun starts from that round's saved
    // population and comes to exactly what the whole run did.
    let (config, killed) = pbt_sweep(dir.path(), "killed");
    std::fs::create_dir_all(&killed).unwrap();
    let copy = Command::new("cp")
        .arg("-r")
        .arg(whole.join("cache"))
        .arg(&killed)
        .status();
    assert!(copy.unwrap().success(), "the embedded data is reused");
    let mut child = sweep_command(&config, None).spawn().unwrap();
    let population = killed.join("population.json");
    wait_until("a PBT round", Duration::from_secs(120), || async {
        population.exists().then_some(())
    })
    .await;
    signal_pid(child.id(), "STOP");
    let done_at_kill = load_results(&killed).len();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        done_at_kill < 8,
        "killed between rounds ({done_at_kill} trials done)"
    );
    let saved: Value = read_json(&population);
    let epoch = saved["epoch"].as_u64().unwrap();
    let rerun = sweep_command(&config, None).output().unwrap();
    let said = String::from_utf8_lossy(&rerun.stderr);
    assert!(rerun.status.success(), "{said}");
    let stdout = String::from_utf8_lossy(&rerun.stdout);
    assert!(stdout.contains("best policy (PBT"), "{stdout}");
    assert!(
        said.contains(&format!(
            "PBT resumed the population saved after epoch {epoch}"
        )),
        "{said}"
    );
    let summary: Value = read_json(&killed.join("summary.json"));
    assert_eq!(summary["resumed_from_epoch"], epoch);
    assert_eq!(
        pbt_outcome(&load_results(&killed)),
        pbt_outcome(&results),
        "the resumed sweep equals the whole one"
    );
}
