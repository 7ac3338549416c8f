//! `resident embed` end to end on a 300-document Wikipedia sample with the real model:
//! output shape and order, resume after kill -9, a dead agent mid-job, bad records.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use resident_jobs::corpus_job::manifest::Manifest;
use resident_jobs::corpus_job::schedule::NextChunk;
use resident_jobs::corpus_job::{BadRecordPolicy, EmbedJobConfig, EmbedReport, run_embed_job};
use resident_sdk::{Cluster, LocalConfig};
use resident_tests::ids_in_file as ids_of;
use resident_tests::{
    assert_has_fields, embed_command, finished_chunks, init_logging, minilm_dir, parse_npy_f32,
    read_json, sample, spawn_scheduler, spawn_two_t4_agents, wait_for_pause, wait_until,
};
use serde_json::Value;

fn read_npy(path: &Path) -> (Vec<usize>, Vec<f32>) {
    parse_npy_f32(&std::fs::read(path).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeds_300_documents_in_order_with_a_full_report() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let input = sample(dir.path(), 300);
    let out = dir.path().join("out");
    let cluster = Cluster::local(LocalConfig::default()).await.unwrap();
    let mut config = EmbedJobConfig::new(&input, minilm_dir(), &out);
    config.corpus.replicas = Some(2);
    let report = run_embed_job(&cluster, &config, &mut |_| {}).await.unwrap();

    let (shape, data) = read_npy(&out.join("embeddings.npy"));
    assert_eq!(shape, vec![300, 384]);
    for row in data.chunks(384) {
        let norm = row.iter().map(|v| v * v).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4);
    }
    assert_eq!(ids_of(&out.join("ids.jsonl")), ids_of(&input));
    assert_eq!(
        (
            report.items,
            report.figures.dimension,
            report.model_loads,
            report.actors
        ),
        (300, 384, 2, 2)
    );
    assert!(
        report.chunks.total >= 8,
        "several chunks per actor: {:?}",
        report.chunks
    );
    assert!(report.chunks.plan.contains("chunk of"));
    assert!(report.figures.truncated >= 1 && report.figures.tokens > 10_000);
    assert!(
        report.docs_per_second > 0.0 && report.cpu_hours > 0.0 && report.estimated_cost_usd > 0.0
    );
    // The two model loads happened before the pool was ready, the chunks after it.
    assert!(
        report.ready_seconds > 0.0 && report.ready_seconds < report.wall_seconds,
        "ready after {} s of {} s",
        report.ready_seconds,
        report.wall_seconds
    );
    assert_eq!(report.per_node[0].docs, 300);
    let on_disk: Value = read_json(&out.join("report.json"));
    let fields = [
        "items",
        "dimension",
        "norm",
        "truncated",
        "non_finite_vectors",
        "bad_records",
        "wall_seconds",
        "ready_seconds",
        "docs_per_second",
        "per_node",
        "per_gpu",
        "model_loads",
        "gpu_hours",
        "estimated_cost_usd",
    ];
    assert_has_fields(&on_disk, &fields, "report.json");
    let manifest: Value = read_json(&out.join("manifest.json"));
    assert_eq!(
        manifest["chunks"].as_array().unwrap().len() as u64,
        report.chunks.total
    );

    // The same command again recomputes nothing, and its report still describes the whole
    // output (each chunk's norms and cut records are kept in the manifest); only the tokens
    // are this run's.
    let again = run_embed_job(&cluster, &config, &mut |_| {}).await.unwrap();
    assert_eq!(
        (again.computed_items, again.chunks.reused),
        (0, report.chunks.total)
    );
    let figures = |r: &EmbedReport| {
        let norm = &r.figures.norm;
        (norm.min, norm.max, norm.mean, r.figures.truncated)
    };
    assert_eq!(figures(&again), figures(&report));
    assert_eq!(again.figures.tokens, 0);
    // A lost shard is redone alone; the report covers it and the reused chunks alike.
    let entry = &manifest["chunks"][1];
    std::fs::remove_file(out.join(entry["vectors_file"].as_str().unwrap())).unwrap();
    let redone = run_embed_job(&cluster, &config, &mut |_| {}).await.unwrap();
    assert_eq!(redone.computed_items, entry["rows"].as_u64().unwrap());
    assert_eq!(figures(&redone), figures(&report));
    assert!(redone.figures.tokens > 0 && redone.figures.tokens < report.figures.tokens);

    // A changed input under the same output is refused before anything runs.
    let other = sample(dir.path(), 299);
    let changed = EmbedJobConfig::new(&other, minilm_dir(), &out);
    let error = run_embed_job(&cluster, &changed, &mut |_| {})
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(
        error.ends_with(
            "holds embeddings of a different input (or --limit); use another --output or remove it"
        ),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_records_are_listed_or_stop_the_job() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("mixed.jsonl");
    let mut bytes =
        b"{\"id\": 1, \"text\": \"a fine document\"}\n{\"id\": 2, \"text\": \n{\"id\": 3}\n"
            .to_vec();
    bytes.extend(b"{\"id\": 4, \"text\": \"\"}\n{\"id\": 5, \"text\": \"caf\xe9\"}\n{\"id\": 1, \"text\": \"same id\"}\n{\"id\": 6, \"text\": \"another fine one\"}\n");
    std::fs::write(&input, bytes).unwrap();
    let cluster = Cluster::local(LocalConfig::default()).await.unwrap();
    let out = dir.path().join("out");
    let config = EmbedJobConfig::new(&input, minilm_dir(), &out);
    let report = run_embed_job(&cluster, &config, &mut |_| {}).await.unwrap();
    assert_eq!(report.items, 2);
    let listed: Vec<(u64, String)> = report
        .bad_records
        .iter()
        .map(|b| (b.line, b.reason.clone()))
        .collect();
    assert_eq!(
        listed.iter().map(|(l, _)| *l).collect::<Vec<_>>(),
        vec![2, 3, 4, 5, 6]
    );
    assert!(listed[0].1.starts_with("malformed JSON"));
    assert_eq!(listed[1].1, "missing text field `text`");
    assert_eq!(listed[2].1, "empty text");
    assert_eq!(listed[3].1, "invalid UTF-8");
    assert_eq!(listed[4].1, "duplicate id 1");
    assert!(report.bad_records.iter().all(|b| b.file == "mixed.jsonl"));
    assert_eq!(
        ids_of(&out.join("ids.jsonl")),
        vec![Value::from(1), Value::from(6)]
    );

    let strict_error = |input: std::path::PathBuf, out: &str| {
        let mut strict = EmbedJobConfig::new(input, minilm_dir(), dir.path().join(out));
        strict.corpus.on_bad_record = BadRecordPolicy::Fail;
        let cluster = &cluster;
        async move {
            run_embed_job(cluster, &strict, &mut |_| {})
                .await
                .err()
                .unwrap()
                .to_string()
        }
    };
    let error = strict_error(input.clone(), "strict").await;
    assert!(
        error.starts_with("bad record at mixed.jsonl:2: malformed JSON"),
        "{error}"
    );
    assert!(
        !dir.path().join("strict/manifest.json").exists(),
        "no chunk ran"
    );
    // A repeated id is found after the scan (ids are checked out of memory), and still
    // stops a strict job before any chunk, naming both places.
    let repeated = dir.path().join("repeated.jsonl");
    std::fs::write(
        &repeated,
        "{\"id\": 1, \"text\": \"x\"}\n{\"id\": 2, \"text\": \"y\"}\n{\"id\": 1, \"text\": \"z\"}\n",
    )
    .unwrap();
    let error = strict_error(repeated, "strict2").await;
    assert!(
        error.starts_with(
            "bad record at repeated.jsonl:3: duplicate id 1 (first at repeated.jsonl:1)"
        ),
        "{error}"
    );

    let missing = EmbedJobConfig::new(
        dir.path().join("nope.jsonl"),
        minilm_dir(),
        dir.path().join("o2"),
    );
    let error = run_embed_job(&cluster, &missing, &mut |_| {})
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(error.contains("does not exist"), "{error}");
    let bad_model = EmbedJobConfig::new(&input, "/no/model", dir.path().join("o3"));
    let error = run_embed_job(&cluster, &bad_model, &mut |_| {})
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(
        error.starts_with("model did not load") && error.contains("/no/model does not exist"),
        "{error}"
    );
    assert!(finished_chunks(&dir.path().join("o3")).is_empty());
}

fn shard_files(out: &Path) -> BTreeMap<String, (Vec<u8>, std::time::SystemTime)> {
    std::fs::read_dir(out.join("shards"))
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .filter(|e| !e.file_name().to_string_lossy().contains(".tmp"))
                .map(|e| {
                    let meta = e.metadata().unwrap();
                    (
                        e.file_name().to_string_lossy().into_owned(),
                        (std::fs::read(e.path()).unwrap(), meta.modified().unwrap()),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_job_then_rerun_finishes_without_redoing_shards() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let input = sample(dir.path(), 300);
    let out = dir.path().join("out");
    let mut child = embed_command(&input, &out, &["--chunk-size", "10", "--replicas", "1"])
        .spawn()
        .unwrap();
    wait_until("a few shards", Duration::from_secs(60), || async {
        (finished_chunks(&out).len() >= 3).then_some(())
    })
    .await;
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let before = finished_chunks(&out);
    let finished = before.len();
    assert!(finished < 30, "killed before the end ({finished} chunks)");
    let shards_before = shard_files(&out);

    let status = embed_command(&input, &out, &[]).status().unwrap();
    assert!(status.success());
    assert_eq!(
        ids_of(&out.join("ids.jsonl")),
        ids_of(&input),
        "every input id once, in order"
    );
    let report: Value = read_json(&out.join("report.json"));
    assert_eq!(
        report["chunks"]["reused"].as_u64().unwrap() as usize,
        finished
    );
    assert_eq!(
        report["chunks"]["size"], 10,
        "the first run's chunk size is kept"
    );
    let shards_after = shard_files(&out);
    for entry in &before {
        for file in [&entry.vectors_file, &entry.ids_file] {
            let name = file.trim_start_matches("shards/").to_owned();
            assert_eq!(
                shards_before[&name], shards_after[&name],
                "{name} was rewritten"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_agent_mid_job_costs_time_not_documents() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let input = sample(dir.path(), 300);
    let out = dir.path().join("out");
    let (_scheduler, url) = spawn_scheduler(0, &dir.path().join("state"));
    let mut agents = spawn_two_t4_agents(&url).await;
    let mut child = embed_command(
        &input,
        &out,
        &[
            "--cluster",
            &url,
            "--chunk-size",
            "10",
            "--gpus-per-actor",
            "1",
            "--replicas",
            "2",
        ],
    )
    .spawn()
    .unwrap();
    wait_until("first shards", Duration::from_secs(60), || async {
        (finished_chunks(&out).len() >= 2).then_some(())
    })
    .await;
    agents[1].kill9();
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "job failed after losing an agent");
    assert_eq!(ids_of(&out.join("ids.jsonl")), ids_of(&input));
    let report: Value = read_json(&out.join("report.json"));
    assert_eq!(report["items"], 300);
    assert_eq!(report["per_gpu"][0]["gpu_name"], "T4");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_run_on_the_same_output_is_refused() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let input = sample(dir.path(), 300);
    let out = dir.path().join("out");
    let mut first = embed_command(&input, &out, &["--chunk-size", "10"])
        .spawn()
        .unwrap();
    let manifest = out.join("manifest.json");
    wait_until(
        "the first run to start",
        Duration::from_secs(60),
        || async { manifest.exists().then_some(()) },
    )
    .await;
    let second = embed_command(&input, &out, &["--chunk-size", "10"])
        .output()
        .unwrap();
    assert!(
        !second.status.success(),
        "two runs must not share an output"
    );
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(
        stderr.contains("another run is writing") && stderr.contains("pid"),
        "{stderr}"
    );
    let status = tokio::task::spawn_blocking(move || first.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "the first run is undisturbed");
    assert_eq!(ids_of(&out.join("ids.jsonl")), ids_of(&input));
}

/// A chunk size whose result would not fit in one message is refused before any chunk
/// runs, with the largest size that fits; the same output then runs with that size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_size_past_the_message_limit_is_refused_with_the_size_that_fits() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let input = sample(dir.path(), 20);
    let out = dir.path().join("out");
    let refused = embed_command(&input, &out, &["--chunk-size", "400000", "--replicas", "1"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    // all-MiniLM-L6-v2: 384 dimensions, 1,540 bytes a document.
    let most = resident_jobs::corpus_job::planner::max_chunk_for_dimension(384).unwrap();
    assert!(
        stderr.contains("400000 x 384 dimensions")
            && stderr.contains(&format!("use --chunk-size {most} or less")),
        "{stderr}"
    );
    assert!(
        !out.join("shards").exists() || shard_files(&out).is_empty(),
        "nothing ran"
    );
    let accepted = embed_command(
        &input,
        &out,
        &["--chunk-size", &most.to_string(), "--replicas", "1"],
    )
    .output()
    .unwrap();
    assert!(
        accepted.status.success(),
        "{}",
        String::from_utf8_lossy(&accepted.stderr)
    );
    assert_eq!(ids_of(&out.join("ids.jsonl")), ids_of(&input));
}

/// Runs the embed with the job paused at `pause` (see `journal::PauseAt`), kills it with
/// SIGKILL there, lets `at_kill` check what the kill left, reruns, and checks the rerun
/// resumed exactly: the chunks recorded before the kill reused with their shards untouched,
/// the rest computed once, every id once and in order, no journal left.
async fn kill_9_at_then_resume(pause: &str, recorded_at_kill: usize, at_kill: impl Fn(&Path)) {
    let flags = ["--chunk-size", "10", "--replicas", "1"];
    let in_order = |out: &Path| {
        at_kill(out);
        let recorded: Vec<u64> = finished_chunks(out).iter().map(|c| c.index).collect();
        let first: Vec<u64> = (0..recorded_at_kill as u64).collect();
        assert_eq!(recorded, first, "one actor records its chunks in order");
    };
    let report =
        kill_9_with_flags_at_then_resume(&flags, 200, pause, recorded_at_kill, in_order).await;
    assert_eq!(report["chunks"]["total"], 20);
}

/// [`kill_9_at_then_resume`] with the first run's `flags` (besides a compaction every 4
/// chunks) on `docs` documents; returns the rerun's report.
async fn kill_9_with_flags_at_then_resume(
    flags: &[&str],
    docs: usize,
    pause: &str,
    recorded_at_kill: usize,
    at_kill: impl Fn(&Path),
) -> Value {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let input = sample(dir.path(), docs);
    let out = dir.path().join("out");
    let flags = [flags, &["--manifest-compact-min", "4"]].concat();
    let mut child = embed_command(&input, &out, &flags)
        .env(resident_jobs::corpus_job::journal::PauseAt::ENV, pause)
        .spawn()
        .unwrap();
    wait_for_pause(&mut child).await;
    child.kill().unwrap(); // SIGKILL, in the middle of the write
    child.wait().unwrap();
    at_kill(&out);

    let before = finished_chunks(&out);
    assert_eq!(
        before.len(),
        recorded_at_kill,
        "chunks recorded at the kill"
    );
    let shards_before = shard_files(&out);

    let rerun = embed_command(&input, &out, &["--manifest-compact-min", "4"])
        .output()
        .unwrap();
    assert!(
        rerun.status.success(),
        "{}",
        String::from_utf8_lossy(&rerun.stderr)
    );
    assert_eq!(ids_of(&out.join("ids.jsonl")), ids_of(&input));
    let report: Value = read_json(&out.join("report.json"));
    let total = report["chunks"]["total"].as_u64().unwrap();
    assert_eq!(report["chunks"]["reused"], recorded_at_kill as u64);
    assert_eq!(
        report["chunks"]["computed"],
        total - recorded_at_kill as u64
    );
    assert_eq!(report["items"], docs as u64);
    let shards_after = shard_files(&out);
    for entry in &before {
        for file in [&entry.vectors_file, &entry.ids_file] {
            let name = file.trim_start_matches("shards/");
            assert_eq!(
                shards_before[name], shards_after[name],
                "{name} was rewritten"
            );
        }
    }
    let manifest = read_json(&out.join("manifest.json"));
    assert_eq!(manifest["chunks"].as_array().unwrap().len() as u64, total);
    assert_eq!(
        std::fs::read_dir(out.join("journal")).unwrap().count(),
        0,
        "a finished job leaves every chunk in manifest.json and no journal"
    );
    assert_chunks_follow_the_schedule(&manifest, docs as u64);
    report
}

/// The manifest's chunks hold exactly the documents its schedule cuts, chunk by chunk.
fn assert_chunks_follow_the_schedule(manifest: &Value, docs: u64) {
    let manifest: Manifest = serde_json::from_value(manifest.clone()).unwrap();
    let mut cutter = manifest.schedule().cutter(docs);
    let mut expected = Vec::new();
    while let NextChunk::Docs(rows) = cutter.next_chunk() {
        expected.push(rows as u64);
    }
    let rows: Vec<u64> = manifest.chunks.iter().map(|c| c.rows).collect();
    assert_eq!(rows, expected, "chunk sizes against the schedule");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planned_job_killed_in_its_body_resumes_on_the_same_chunks() {
    // One actor, 300 documents: two probe chunks, the plan (recorded in manifest.json),
    // then the body. The kill comes while the first body chunk is journaled.
    let body = std::cell::Cell::new(0);
    let report =
        kill_9_with_flags_at_then_resume(&["--replicas", "1"], 300, "journal-append:3", 2, |out| {
            let manifest = read_json(&out.join("manifest.json"));
            let schedule = &manifest["chunk_schedule"];
            assert_eq!(schedule["probe_chunks"], 2, "{manifest}");
            body.set(schedule["body_size"].as_u64().unwrap());
            assert!(body.get() > 0, "{manifest}");
        })
        .await;
    let plan = report["chunks"]["plan"].as_str().unwrap();
    let body = body.get();
    assert!(
        plan.starts_with("resumed with the earlier run's chunk schedule (2 probe chunks of ")
            && plan.ends_with(&format!(", then chunks of {body})")),
        "{plan}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_killed_before_its_plan_measures_again_and_keeps_its_probes() {
    // Two actors plan from two probe results; the kill comes while the second is journaled,
    // so manifest.json has the probes' schedule and no body yet.
    let report =
        kill_9_with_flags_at_then_resume(&["--replicas", "2"], 300, "journal-append:2", 1, |out| {
            let manifest = read_json(&out.join("manifest.json"));
            let schedule = &manifest["chunk_schedule"];
            assert_eq!(schedule["probe_chunks"], 4, "{manifest}");
            assert!(schedule["body_size"].is_null(), "{manifest}");
        })
        .await;
    let plan = report["chunks"]["plan"].as_str().unwrap();
    assert!(plan.contains("probe chunks of"), "{plan}");
}

fn journal_at(out: &Path, generation: u64) -> resident_jobs::corpus_job::journal::DecodedJournal {
    let bytes = std::fs::read(out.join(format!("journal/{generation:06}.jsonl"))).unwrap();
    resident_jobs::corpus_job::journal::decode_journal(&bytes, "journal").unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_in_the_middle_of_a_journal_append_redoes_only_that_chunk() {
    // The third append is cut in half: two chunks are recorded, the third is not.
    kill_9_at_then_resume("journal-append:3", 2, |out| {
        let journal = journal_at(out, 1);
        assert!(journal.torn_tail, "killed with half a line written");
        assert_eq!(journal.entries.len(), 2);
        assert_eq!(
            read_json(&out.join("manifest.json"))["journal_generation"],
            1
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_in_the_middle_of_a_compaction_loses_and_repeats_nothing() {
    // The run's second compaction (after 4 chunks, with --manifest-compact-min 4) is
    // stopped with the new manifest in place and the old journal not yet removed.
    kill_9_at_then_resume("compaction:2", 4, |out| {
        let manifest = read_json(&out.join("manifest.json"));
        assert_eq!(manifest["journal_generation"], 2);
        assert_eq!(manifest["chunks"].as_array().unwrap().len(), 4);
        let old = journal_at(out, 1);
        assert_eq!(old.entries.len(), 4, "the folded journal is still there");
        assert!(!old.torn_tail);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_merge_limit_the_shards_and_index_json_are_the_output() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let input = sample(dir.path(), 60);
    let out = dir.path().join("out");
    // Merged files from an earlier run do not survive a run that keeps only the shards.
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("embeddings.npy"), b"stale").unwrap();
    let run = embed_command(
        &input,
        &out,
        &[
            "--chunk-size",
            "25",
            "--replicas",
            "1",
            "--merge-max-gib",
            "0",
        ],
    )
    .output()
    .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(!out.join("embeddings.npy").exists() && !out.join("ids.jsonl").exists());
    let report = read_json(&out.join("report.json"));
    assert_eq!(report["output"]["merged"], false);
    assert!(
        report["output"]["merge_skipped"]
            .as_str()
            .unwrap()
            .contains("--merge-max-gib"),
        "{report}"
    );
    // index.json is enough to read the output back in order.
    let index = read_json(&out.join("index.json"));
    assert_eq!(index["rows"], 60);
    assert_eq!(index["merged"], Value::Null);
    let (mut ids, mut rows) = (Vec::new(), 0u64);
    for shard in index["shards"].as_array().unwrap() {
        assert_eq!(shard["first_row"].as_u64().unwrap(), rows);
        let (shape, _) = read_npy(&out.join(shard["vectors_file"].as_str().unwrap()));
        assert_eq!(shape, vec![shard["rows"].as_u64().unwrap() as usize, 384]);
        rows += shard["rows"].as_u64().unwrap();
        ids.extend(ids_of(&out.join(shard["ids_file"].as_str().unwrap())));
    }
    assert_eq!(index["shards"].as_array().unwrap().len(), 3);
    assert_eq!(ids, ids_of(&input));
    let refused = embed_command(&input, &out, &["--merge-max-gib=-1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("--merge-max-gib must be"),
        "{stderr}"
    );
}
