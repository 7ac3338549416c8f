//! `resident embed` on a corpus with records that crash the model: the embed actors are
//! told to panic on a marked text (`RESIDENT_FAULT_PANIC_ON_TEXT`). Each such record is
//! retried alone, then listed as a bad record; every other record is embedded once, in
//! order, and the pool survives.

use std::path::Path;

use resident_tests::ids_in_file as ids_of;
use std::process::Stdio;

use resident_tests::{
    Proc, agent_command, embed_command, init_logging, parse_npy_f32, read_json, sample,
    spawn_scheduler_with,
};
use serde_json::Value;

const MARK: &str = "CRASH-THE-MODEL-HERE";

/// Writes a sample of `count` records with `MARK` in the texts at `poisoned` (0-based).
fn poisoned_sample(dir: &Path, count: usize, poisoned: &[usize]) -> std::path::PathBuf {
    let clean = sample(dir, count);
    let lines: Vec<String> = std::fs::read_to_string(&clean)
        .unwrap()
        .lines()
        .enumerate()
        .map(|(i, line)| {
            let mut record: Value = serde_json::from_str(line).unwrap();
            if poisoned.contains(&i) {
                let text = format!("{} {MARK}", record["text"].as_str().unwrap());
                record["text"] = Value::from(text);
            }
            record.to_string()
        })
        .collect();
    let path = dir.join("poisoned.jsonl");
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

/// Asserts that `out` holds every record of `input` but the `poisoned` ones (0-based), once
/// each, in order; returns their ids.
fn assert_every_other_record_once(input: &Path, out: &Path, poisoned: &[usize]) -> Vec<Value> {
    let expected: Vec<Value> = ids_of(input)
        .into_iter()
        .enumerate()
        .filter(|(i, _)| !poisoned.contains(i))
        .map(|(_, id)| id)
        .collect();
    assert_eq!(
        ids_of(&out.join("ids.jsonl")),
        expected,
        "every other record once, in order"
    );
    expected
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_that_crash_the_model_are_listed_as_bad_and_the_rest_is_embedded() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let poisoned = [17, 88];
    let input = poisoned_sample(dir.path(), 120, &poisoned);
    let out = dir.path().join("out");
    let run = |out: &Path, extra: &[&str]| {
        embed_command(&input, out, extra)
            .env("RESIDENT_FAULT_PANIC_ON_TEXT", MARK)
            .output()
            .unwrap()
    };
    let first = run(&out, &["--replicas", "2"]);
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let expected = assert_every_other_record_once(&input, &out, &poisoned);
    let (shape, _) = parse_npy_f32(&std::fs::read(out.join("embeddings.npy")).unwrap());
    assert_eq!(shape, vec![118, 384]);
    let report: Value = read_json(&out.join("report.json"));
    assert_eq!(report["items"], 118);
    assert_eq!(report["bad_record_count"], 2);
    let listed: Vec<(u64, &str)> = report["bad_records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| (b["line"].as_u64().unwrap(), b["reason"].as_str().unwrap()))
        .collect();
    assert_eq!(
        listed.iter().map(|(line, _)| *line).collect::<Vec<_>>(),
        vec![18, 89],
        "{listed:?}"
    );
    for (_, reason) in &listed {
        assert!(
            reason.starts_with("this input crashes the model") && reason.contains(MARK),
            "{reason}"
        );
    }

    // A rerun recomputes nothing and still lists them (from the manifest).
    let again = run(&out, &[]);
    assert!(again.status.success());
    let report: Value = read_json(&out.join("report.json"));
    assert_eq!(report["computed_items"], 0);
    assert_eq!(report["bad_record_count"], 2);
    assert_eq!(ids_of(&out.join("ids.jsonl")), expected);

    // Under --on-bad-record fail the job stops, naming the first such record.
    let strict = run(&dir.path().join("strict"), &["--on-bad-record", "fail"]);
    assert!(!strict.status.success());
    let stderr = String::from_utf8_lossy(&strict.stderr);
    assert!(
        stderr.contains("bad record at poisoned.jsonl:18: this input crashes the model"),
        "{stderr}"
    );
}

/// Issue 48, item 11: before, every crashing chunk opened a job of its own, so more poison
/// chunks in flight than the principal's job limit failed the whole run. Now they share one
/// recovery job: with room for just the main job and one more, 100 poison records in 100
/// chunks end as 100 listed bad records and a finished job, every other record embedded
/// once. Real processes: a scheduler, an agent whose actors panic on the mark, the CLI.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_poison_chunks_share_one_recovery_job() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let poisoned: Vec<usize> = (0..100).map(|chunk| chunk * 3 + 1).collect();
    let input = poisoned_sample(dir.path(), 300, &poisoned);
    let out = dir.path().join("out");
    let (_scheduler, url) = spawn_scheduler_with(
        0,
        &dir.path().join("state"),
        &["--max-jobs-per-principal".into(), "2".into()],
    );
    let agent = agent_command(&url, "node-1", "A10G:24GiB", "", &[])
        .env("RESIDENT_FAULT_PANIC_ON_TEXT", MARK)
        .env("RESIDENT_LOG", "error")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let _agent = Proc::new("agent", agent);
    let run = embed_command(
        &input,
        &out,
        &["--cluster", &url, "--replicas", "2", "--chunk-size", "3"],
    )
    .output()
    .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let report: Value = read_json(&out.join("report.json"));
    assert_eq!(report["bad_record_count"], 100);
    assert_eq!(report["items"], 200);
    let lines: Vec<u64> = report["bad_records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["line"].as_u64().unwrap())
        .collect();
    let expected: Vec<u64> = poisoned.iter().map(|i| *i as u64 + 1).collect();
    assert_eq!(lines, expected);
    assert_every_other_record_once(&input, &out, &poisoned);
}
