//! `resident generate` end to end with the real SmolLM2 GGUF on real Wikipedia records:
//! output order and fields, the report, seeded sampling across chunk sizes, bad records,
//! prompts cut to fit the context, stop strings, `--template none`, input fields kept in
//! the lines, Parquet output, and kill -9 of an agent and of the CLI with a rerun that redoes no finished
//! chunk.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use resident_tests::{
    finished_chunks, generate_command, ids_in_file, init_logging, read_json, read_jsonl,
    run_to_success, sample, spawn_agent, spawn_scheduler, spawn_two_t4_agents, wait_until,
    write_jsonl,
};
use serde_json::{Value, json};

const PROMPT: &str = "Topic: {topic}\n\n{text}\n\nSummarise the text above in one sentence.";

/// Sampling with a seed gives each record the same text whatever the chunking: the two
/// runs cut the corpus differently and agree line for line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_record_in_order_with_its_report_and_seeded_sampling_is_the_same_in_any_chunking() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let input = sample(dir.path(), 6);
    let sampling = [
        "--max-new-tokens",
        "6",
        "--temperature",
        "0.9",
        "--top-k",
        "40",
        "--top-p",
        "0.95",
        "--seed",
        "11",
        "--replicas",
        "2",
    ];
    let mut outputs = Vec::new();
    for chunk_size in ["2", "5"] {
        let out = dir.path().join(format!("out-{chunk_size}"));
        let mut command = generate_command(&input, &out, PROMPT, &sampling);
        command.args(["--chunk-size", chunk_size]);
        run_to_success(command);
        outputs.push(out);
    }
    let first = read_jsonl(&outputs[0].join("generations.jsonl"));
    assert_eq!(first, read_jsonl(&outputs[1].join("generations.jsonl")));
    let ids: Vec<Value> = first.iter().map(|line| line["id"].clone()).collect();
    assert_eq!(
        ids,
        ids_in_file(&input),
        "every record once, in input order"
    );
    for line in &first {
        let mut fields: Vec<&str> = line
            .as_object()
            .unwrap()
            .keys()
            .map(|k| k.as_str())
            .collect();
        fields.sort_unstable();
        assert_eq!(
            fields,
            [
                "finish_reason",
                "generated_tokens",
                "id",
                "prompt_tokens",
                "text"
            ]
        );
        assert!(line["prompt_tokens"].as_u64().unwrap() > 40, "{line}");
        let generated = line["generated_tokens"].as_u64().unwrap();
        assert!((1..=6).contains(&generated), "{line}");
        let reason = line["finish_reason"].as_str().unwrap();
        assert!(
            reason == "length" || (reason == "stop" && generated < 6),
            "{line}"
        );
        assert!(!line["text"].as_str().unwrap().is_empty(), "{line}");
    }
    let report = read_json(&outputs[0].join("report.json"));
    assert_eq!(report["items"], 6);
    assert_eq!(report["chunks"]["total"], 3);
    let prompt_tokens: u64 = first
        .iter()
        .map(|l| l["prompt_tokens"].as_u64().unwrap())
        .sum();
    let generated: u64 = first
        .iter()
        .map(|l| l["generated_tokens"].as_u64().unwrap())
        .sum();
    assert_eq!(report["prompt_tokens"], prompt_tokens);
    assert_eq!(report["generated_tokens"], generated);
    assert!(report["generated_tokens_per_second"].as_f64().unwrap() > 0.0);
    let (ready, wall) = (
        report["ready_seconds"].as_f64(),
        report["wall_seconds"].as_f64(),
    );
    assert!(
        matches!((ready, wall), (Some(r), Some(w)) if r > 0.0 && r < w),
        "actors ready after {ready:?} s of {wall:?} s"
    );
    assert!(report["prompt_tokens_per_second"].as_f64().unwrap() > 0.0);
    assert!(report["cpu_hours"].as_f64().unwrap() > 0.0);
    assert!(report["estimated_cost_usd"].as_f64().unwrap() > 0.0);
    assert_eq!(report["model_loads"], 2, "one load per actor");
    let index = read_json(&outputs[0].join("index.json"));
    assert_eq!(index["format"], "resident-generations");
    assert_eq!(index["merged"]["generations"], "generations.jsonl");
    assert_eq!(index["rows"], 6);
}

/// Bad lines and records without a field the prompt names are listed (or stop the job
/// under `fail`); a record too long for the context is cut from its middle and counted;
/// a stop string ends completions before it; `--template none` feeds the prompt as is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_records_long_texts_stop_strings_and_a_raw_template() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("mixed.jsonl");
    let mut records = resident_tests::wiki_sample_lines(3);
    records.push("{not json".into());
    records.push(r#"{"id": "no-topic", "text": "A record without a topic."}"#.into());
    let long_text = "The river floods every spring and the town rebuilds. ".repeat(60);
    records
        .push(serde_json::json!({"id": "long", "topic": "Floods", "text": long_text}).to_string());
    std::fs::write(&input, records.join("\n") + "\n").unwrap();
    let flags = [
        "--max-new-tokens",
        "12",
        "--max-context",
        "256",
        "--stop",
        ".",
        "--stop",
        "\n",
        "--template",
        "none",
        "--replicas",
        "1",
    ];
    let out = dir.path().join("out");
    run_to_success(generate_command(&input, &out, PROMPT, &flags));
    let generated = read_jsonl(&out.join("generations.jsonl"));
    assert_eq!(generated.len(), 4, "three articles and the long record");
    for line in &generated {
        let text = line["text"].as_str().unwrap();
        assert!(!text.contains('.') && !text.contains('\n'), "{line}");
        assert!(
            line["prompt_tokens"].as_u64().unwrap() <= 256 - 12,
            "{line}"
        );
    }
    let long = generated.iter().find(|l| l["id"] == "long").unwrap();
    assert!(long["prompt_tokens"].as_u64().unwrap() > 200, "{long}");
    let report = read_json(&out.join("report.json"));
    assert_eq!(report["truncated_prompts"], 1);
    assert_eq!(report["bad_record_count"], 2);
    let reasons: Vec<(u64, String)> = report["bad_records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["line"].as_u64().unwrap(),
                b["reason"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(
        reasons[0].0 == 4 && reasons[0].1.starts_with("malformed JSON"),
        "{reasons:?}"
    );
    assert_eq!(
        reasons[1],
        (5, "missing field `topic` (named in the prompt)".to_owned())
    );

    let mut strict = generate_command(&input, &dir.path().join("strict"), PROMPT, &flags);
    strict.args(["--on-bad-record", "fail"]);
    let output = strict.output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("mixed.jsonl:4"), "{stderr}");

    let no_text = generate_command(&input, &dir.path().join("bad-prompt"), "Summarise.", &[])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&no_text.stderr);
    assert_eq!(no_text.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--prompt must hold {text}"), "{stderr}");
}

fn shard_bytes(out: &Path) -> BTreeMap<String, Vec<u8>> {
    finished_chunks(out)
        .iter()
        .flat_map(|entry| [entry.vectors_file.clone(), entry.ids_file.clone()])
        .map(|file| {
            let bytes = std::fs::read(out.join(&file)).unwrap();
            (file, bytes)
        })
        .collect()
}

/// A dead agent costs time, not records; once its node is back, a killed CLI's rerun keeps
/// every finished shard byte for byte and ends with each record once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_an_agent_then_of_the_cli_and_a_rerun_redo_no_finished_chunk() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let input = sample(dir.path(), 16);
    let out = dir.path().join("out");
    let (_scheduler, url) = spawn_scheduler(0, &dir.path().join("state"));
    let mut agents = spawn_two_t4_agents(&url).await;
    let flags = [
        "--cluster",
        url.as_str(),
        "--chunk-size",
        "2",
        "--gpus-per-actor",
        "1",
        "--replicas",
        "2",
        "--max-new-tokens",
        "8",
    ];
    let mut child = generate_command(&input, &out, PROMPT, &flags)
        .spawn()
        .unwrap();
    wait_until("the first shards", Duration::from_secs(120), || async {
        (finished_chunks(&out).len() >= 2).then_some(())
    })
    .await;
    agents[1].kill9();
    wait_until(
        "shards after the agent died",
        Duration::from_secs(120),
        || async { (finished_chunks(&out).len() >= 4).then_some(()) },
    )
    .await;
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let before = shard_bytes(&out);
    let finished = finished_chunks(&out).len();
    assert!(
        finished < 8,
        "killed before the end ({finished} of 8 chunks)"
    );

    // The node comes back (as systemd would restart it), and the command is run again.
    agents[1] = spawn_agent(&url, "node-b", "T4:16GiB", "");
    run_to_success(generate_command(&input, &out, PROMPT, &flags));
    let after = shard_bytes(&out);
    for (file, bytes) in &before {
        assert_eq!(Some(bytes), after.get(file), "{file} was rewritten");
    }
    let generated = read_jsonl(&out.join("generations.jsonl"));
    let ids: Vec<Value> = generated.iter().map(|line| line["id"].clone()).collect();
    assert_eq!(ids, ids_in_file(&input), "every record once, in order");
    let report = read_json(&out.join("report.json"));
    assert_eq!(
        report["chunks"]["reused"].as_u64().unwrap() as usize,
        finished
    );
    assert_eq!(report["per_gpu"][0]["gpu_name"], "T4");
}

/// `resident generate` of `input` into `out`, four new tokens a record, with `flags` after.
fn four_tokens(input: &Path, out: &Path, flags: &[&str]) -> std::process::Command {
    let mut command = generate_command(input, out, PROMPT, &["--max-new-tokens", "4"]);
    command.args(flags);
    command
}

/// `--keep-columns` writes input fields into each line right after its id, as the input
/// has them (a path's value, null where a record lacks it, `FIELD=NAME` under another
/// name: the record's text beside its completion), and changes no completion; the same
/// columns resume with nothing to redo, other columns are another job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_columns_follow_each_line_s_id_as_the_input_has_them() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let mut records = read_jsonl(&sample(dir.path(), 4));
    for (rank, record) in records
        .iter_mut()
        .enumerate()
        .filter(|(rank, _)| *rank != 2)
    {
        let url = format!(
            "https://en.wikipedia.org/wiki/{}",
            record["id"].as_str().unwrap()
        );
        record["meta"] = json!({"url": url, "rank": rank});
    }
    let input = dir.path().join("with-meta.jsonl");
    write_jsonl(&input, &records);
    let run = |out: &str, flags: &[&str]| {
        let mut command = four_tokens(&input, &dir.path().join(out), &["--chunk-size", "2"]);
        command.args(flags);
        command
    };
    run_to_success(run("plain", &[]));
    let plain = read_jsonl(&dir.path().join("plain/generations.jsonl"));
    let columns = ["--keep-columns", "topic,text=article,meta.url=url,meta"];
    run_to_success(run("kept", &columns));
    let written = std::fs::read_to_string(dir.path().join("kept/generations.jsonl")).unwrap();
    assert_eq!(written.lines().count(), records.len());
    for ((line, plain), record) in written.lines().zip(&plain).zip(&records) {
        let meta = &record["meta"];
        let start = format!(
            r#"{{"id":{},"topic":{},"article":{},"url":{},"meta":{},"text":"#,
            record["id"], record["topic"], record["text"], meta["url"], meta
        );
        assert!(line.starts_with(&start), "{line}\n does not start {start}");
        let mut line: Value = serde_json::from_str(line).unwrap();
        for name in ["topic", "article", "url", "meta"] {
            line.as_object_mut().unwrap().remove(name);
        }
        assert_eq!(&line, plain, "the same completion");
    }
    assert!(
        written
            .lines()
            .nth(2)
            .unwrap()
            .contains(r#""url":null,"meta":null"#)
    );
    let again = || std::fs::read_to_string(dir.path().join("kept/generations.jsonl")).unwrap();
    run_to_success(run("kept", &columns));
    let report = read_json(&dir.path().join("kept/report.json"));
    assert_eq!(report["computed_items"], 0, "{report}");
    assert_eq!(again(), written);
    let other = run("kept", &["--keep-columns", "topic"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&other.stderr);
    assert_eq!(other.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("or --keep-columns; use another --output"),
        "{stderr}"
    );
}

/// Every row of a generations Parquet file as the JSON line it stands for: text cells as
/// strings (the nested fields parsed from their JSON), numbers and flags as they are,
/// nulls and a false `truncated` left out, as the JSON line leaves them out (`extracted`,
/// which a line writes as null when nothing was found, as null).
pub(crate) fn parquet_lines(path: &Path) -> Vec<Value> {
    use arrow_array::Array;
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Float64Type, UInt32Type};
    const NESTED: [&str; 7] = [
        "choices",
        "logprobs",
        "score",
        "prompt_logprobs",
        "choice_scores",
        "answers",
        "filters",
    ];
    let file = std::fs::File::open(path).unwrap();
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
        .unwrap()
        .build()
        .unwrap();
    let mut lines = Vec::new();
    for batch in reader {
        let batch = batch.unwrap();
        for row in 0..batch.num_rows() {
            let mut line = serde_json::Map::new();
            for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
                let name = field.name().as_str();
                if column.is_null(row) {
                    if name == "extracted" {
                        line.insert(name.to_owned(), Value::Null);
                    }
                    continue;
                }
                let value = if let Some(numbers) = column.as_primitive_opt::<UInt32Type>() {
                    json!(numbers.value(row))
                } else if let Some(figures) = column.as_primitive_opt::<Float64Type>() {
                    json!(figures.value(row))
                } else if let Some(flags) = column.as_boolean_opt() {
                    match (name, flags.value(row)) {
                        ("truncated", false) => continue,
                        (_, flag) => json!(flag),
                    }
                } else {
                    let text = column.as_string::<i32>().value(row);
                    match NESTED.contains(&name) {
                        true => serde_json::from_str(text).unwrap(),
                        false => json!(text),
                    }
                };
                line.insert(name.to_owned(), value);
            }
            lines.push(Value::Object(line));
        }
    }
    lines
}

/// `--format parquet` holds scores and checked answers as JSON lines do: a scoring job's
/// and an evaluating job's (samples, named filters, overlap figures) Parquet rows are its
/// JSON lines, with typed columns (figures as floats, flags as booleans).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parquet_output_holds_scores_and_checked_answers_as_json_lines_do() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let input = sample(dir.path(), 4);
    let scoring = ["--score", "--max-new-tokens", "0", "--prompt-logprobs", "1"];
    let checking = [
        "--max-new-tokens",
        "6",
        "-n",
        "2",
        "--temperature",
        "0.7",
        "--reference-field",
        "description",
        "--filter",
        r"first=^\W*(\w+)",
        "--filter",
        r"last:last=(\w+)",
        "--metric",
        "rouge1,f1",
    ];
    for (name, flags) in [("scored", &scoring[..]), ("checked", &checking[..])] {
        let run = |format: &str| {
            let out = dir.path().join(format!("{name}-{format}"));
            let all = [flags, &["--chunk-size", "2", "--format", format]].concat();
            run_to_success(generate_command(&input, &out, "{text}", &all));
            out
        };
        let jsonl = read_jsonl(&run("jsonl").join("generations.jsonl"));
        let parquet_file = run("parquet").join("generations.parquet");
        assert_eq!(parquet_lines(&parquet_file), jsonl, "{name}");
        let file = std::fs::File::open(&parquet_file).unwrap();
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file);
        let schema = reader.unwrap().schema().clone();
        let type_of =
            |field: &str| format!("{}", schema.field_with_name(field).unwrap().data_type());
        match name {
            "scored" => assert!(jsonl.iter().all(|line| line["score"]["tokens"].is_u64())),
            _ => {
                assert_eq!(type_of("f1"), "Float64");
                assert_eq!(type_of("correct"), "Boolean");
                assert!(
                    schema.field_with_name("rouge2").is_err(),
                    "only what was asked"
                );
                assert!(jsonl.iter().all(|line| line["filters"]["last"].is_object()));
            }
        }
    }
}

/// `--format parquet` holds the very lines JSON lines would (samples and log-probabilities
/// as JSON text, kept columns as text), in input order with typed columns; the same format
/// resumes with nothing to redo, the other is refused saying which to give.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parquet_output_holds_the_lines_json_lines_would() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let input = sample(dir.path(), 5);
    let flags = |format: &'static str| {
        [
            "--chunk-size",
            "2",
            "-n",
            "2",
            "--temperature",
            "0.8",
            "--logprobs",
            "--keep-columns",
            "topic,text=article",
            "--format",
            format,
        ]
    };
    let run = |out: &str, flags: &[&str]| four_tokens(&input, &dir.path().join(out), flags);
    run_to_success(run("jsonl", &flags("jsonl")));
    run_to_success(run("parquet", &flags("parquet")));
    let jsonl = read_jsonl(&dir.path().join("jsonl/generations.jsonl"));
    let parquet_file = dir.path().join("parquet/generations.parquet");
    assert_eq!(parquet_lines(&parquet_file), jsonl);
    assert!(
        jsonl
            .iter()
            .all(|line| line["choices"].as_array().unwrap().len() == 2)
    );
    assert!(!dir.path().join("parquet/generations.jsonl").exists());
    let index = read_json(&dir.path().join("parquet/index.json"));
    assert_eq!(index["merged"]["generations"], "generations.parquet");
    let merged = std::fs::read(&parquet_file).unwrap();
    run_to_success(run("parquet", &flags("parquet")));
    let report = read_json(&dir.path().join("parquet/report.json"));
    assert_eq!(report["computed_items"], 0, "{report}");
    assert_eq!(std::fs::read(&parquet_file).unwrap(), merged);
    let other = run("parquet", &flags("jsonl")).output().unwrap();
    let stderr = String::from_utf8_lossy(&other.stderr);
    assert_eq!(other.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("holds Parquet shards; rerun with --format parquet"),
        "{stderr}"
    );
}

/// `--limit N --limit-by FIELD` reads each value's first N records (lm-evaluation-harness's
/// limit per task: MMLU's per subject), a share each value's share rounded up; the report
/// says so, the same limit resumes, and the same N over the whole input is another input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_by_a_field_runs_each_value_s_first_records() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    // Topics: Uncategorized, Mathematics, Everyday life, People, then six of History.
    let input = sample(dir.path(), 10);
    let run = |out: &str, flags: &[&str]| four_tokens(&input, &dir.path().join(out), flags);
    run_to_success(run("whole", &[]));
    let whole = read_jsonl(&dir.path().join("whole/generations.jsonl"));
    run_to_success(run("by", &["--limit", "2", "--limit-by", "topic"]));
    let by = read_jsonl(&dir.path().join("by/generations.jsonl"));
    assert_eq!(by, whole[..6], "one of each single topic, two of History");
    let report = read_json(&dir.path().join("by/report.json"));
    assert_eq!(
        (&report["limit"], &report["limit_by"], &report["items"]),
        (&2.into(), &"topic".into(), &6.into()),
        "{report}"
    );
    run_to_success(run("share", &["--limit", "0.5", "--limit-by", "topic"]));
    let share = read_jsonl(&dir.path().join("share/generations.jsonl"));
    assert_eq!(
        share,
        whole[..7],
        "ceil(0.5 x 1) of each single topic, 3 of History's 6"
    );
    run_to_success(run("share", &["--limit", "0.5", "--limit-by", "topic"]));
    let again = read_json(&dir.path().join("share/report.json"));
    assert_eq!(
        (
            &again["computed_items"],
            &again["limit_share"],
            &again["limit_by"]
        ),
        (&0.into(), &0.5.into(), &"topic".into()),
        "the same limit resumes: {again}"
    );
    let output = run("by", &["--limit", "2"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("of a different input (or --limit)"),
        "{stderr}"
    );
    let output = run("alone", &["--limit-by", "topic"]).output().unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(!dir.path().join("alone").exists());
}

/// `--limit N` reads the input's first N records: their lines are a whole run's first N;
/// the report says so; the same limit resumes with nothing to redo, another is another
/// input, a share of the records is the count it rounds up to, and 0 or a share past 1 is
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_runs_the_input_s_first_records_and_another_limit_is_another_input() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let input = sample(dir.path(), 6);
    let run = |out: &str, flags: &[&str]| four_tokens(&input, &dir.path().join(out), flags);
    run_to_success(run("whole", &[]));
    run_to_success(run("first", &["--limit", "3"]));
    let whole = read_jsonl(&dir.path().join("whole/generations.jsonl"));
    let first = read_jsonl(&dir.path().join("first/generations.jsonl"));
    assert_eq!(first, whole[..3], "a whole run's first three lines");
    let report = read_json(&dir.path().join("first/report.json"));
    assert_eq!(
        (&report["limit"], &report["items"]),
        (&3.into(), &3.into()),
        "{report}"
    );
    assert!(
        read_json(&dir.path().join("whole/report.json"))
            .get("limit")
            .is_none()
    );
    run_to_success(run("first", &["--limit", "3"]));
    let again = read_json(&dir.path().join("first/report.json"));
    assert_eq!(
        again["computed_items"], 0,
        "the same limit resumes: {again}"
    );
    let output = run("first", &["--limit", "4"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("of a different input (or --limit)"),
        "{stderr}"
    );
    // A share, rounded up as lm-evaluation-harness does: 0.4 of 6 records is the first 3,
    // the same records, so it resumes `--limit 3`'s output with nothing to redo.
    run_to_success(run("first", &["--limit", "0.4"]));
    let share = read_json(&dir.path().join("first/report.json"));
    assert_eq!(
        (
            &share["limit"],
            &share["limit_share"],
            &share["computed_items"]
        ),
        (&3.into(), &0.4.into(), &0.into()),
        "{share}"
    );
    for refused in ["0", "1.5", "-0.1"] {
        let flag = format!("--limit={refused}");
        let output = run("zero", &[&flag]).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains("give a count of records from 1 (100) or a share of them"),
            "{stderr}"
        );
    }
    assert!(!dir.path().join("zero").exists());
}
