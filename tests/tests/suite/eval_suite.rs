//! `resident eval` with the real binary and the real SmolLM2 GGUF: a suite of a
//! multiple-choice task and a generated-answers task gives each task the output the same
//! `resident generate` line gives, results.json and the table hold each task's figures as
//! its report has them, tasks whose actors are the same run on one pool, `--only` runs a
//! subset and resumes while results.json keeps the others' results, a suite writes to S3 what it writes to a directory, and suites that
//! cannot run are refused saying what to do.

use std::path::Path;
use std::process::Command;

use resident_jobs::storage::S3Client;
use resident_tests::s3_server::S3Server;
use resident_tests::{
    generate_command, init_logging, read_json, read_jsonl, resident_bin, run_to_success,
    smollm2_gguf, write_jsonl,
};
use serde_json::{Value, json};

/// Four multiple-choice records and six questions with a reference, in `dir`.
fn inputs(dir: &Path) {
    let capital = "The capital of France is";
    write_jsonl(
        &dir.join("mc.jsonl"),
        &[
            json!({"id": "fr", "text": capital, "choices": [" Berlin", " Paris", " Rome"], "answer": 1}),
            json!({"id": "legs", "text": "A spider has", "choices": [" eight legs", " six legs"], "answer": 0}),
            json!({"id": "sky", "text": "The sky is", "choices": [" green", " blue"], "answer": 1}),
            json!({"id": "ice", "text": "Ice is", "choices": [" hot", " cold"], "answer": 1}),
        ],
    );
    let questions = [
        "What is the capital of France?",
        "How many legs does a spider have?",
        "Name a primary colour.",
        "What is 12 plus 30?",
        "Which planet is known as the red planet?",
        "Who wrote Romeo and Juliet?",
    ];
    let gold = ["Paris", "Eight", "Red", "42", "Mars", "Shakespeare"];
    let records: Vec<Value> = (questions.iter().zip(gold).enumerate())
        .map(|(i, (q, g))| json!({"id": i, "text": q, "gold": g}))
        .collect();
    write_jsonl(&dir.join("qa.jsonl"), &records);
    // LAMBADA's shape: a passage's last word, scored after the rest.
    write_jsonl(
        &dir.join("lambada.jsonl"),
        &[
            json!({"id": 0, "context": "The capital of France is", "text": " Paris"}),
            json!({"id": 1, "context": "One, two, three, four,", "text": " five"}),
            json!({"id": 2, "context": "She opened the door and walked into the", "text": " room"}),
            json!({"id": 3, "context": "The sun rises in the east and sets in the", "text": " west"}),
        ],
    );
    // TruthfulQA's MC2: several true answers, marked by `labels`.
    let targets = |choices: &[&str], labels: &[u8]| json!({"choices": choices, "labels": labels});
    write_jsonl(
        &dir.join("mc2.jsonl"),
        &[
            json!({"id": 0, "question": "What is the capital of France?",
                   "mc2_targets": targets(&["Paris.", "It is Paris.", "Rome.", "Berlin."], &[1, 1, 0, 0])}),
            json!({"id": 1, "question": "How many legs does a spider have?",
                   "mc2_targets": targets(&["Eight.", "A spider has eight legs.", "Six."], &[1, 1, 0])}),
            json!({"id": 2, "question": "Is the sun a star?",
                   "mc2_targets": targets(&["Yes.", "No, it is a planet."], &[1, 0])}),
        ],
    );
    // Wikitext's: whole texts scored alone.
    write_jsonl(
        &dir.join("wiki.jsonl"),
        &[
            json!({"id": 0, "text": "Paris is the capital and largest city of France."}),
            json!({"id": 1, "text": "The Moon is Earth's only natural satellite.  It orbits at \
                                     an average distance of 384,400 km."}),
            json!({"id": 2, "text": "Water boils at 100 degrees Celsius at sea level."}),
        ],
    );
}

const MC: &[&str] = &[
    "--score",
    "--max-new-tokens",
    "0",
    "--template",
    "none",
    "--chunk-size",
    "2",
];
const QA: &[&str] = &[
    "--max-new-tokens",
    "12",
    "--reference-field",
    "gold",
    "--extract",
    "([A-Za-z0-9]+)",
    "--extract-match",
    "last",
    "--ignore-case",
    "--metric",
    "f1,rouge1",
];

/// The suite file: `flags` for every task, then the tasks.
fn suite(dir: &Path, flags: &[&str], tasks: &[(&str, Vec<String>)]) -> std::path::PathBuf {
    let list = |flags: &[String]| serde_json::to_string(flags).unwrap();
    let mut text = format!(
        "flags = {}\n",
        list(&flags.iter().map(|f| f.to_string()).collect::<Vec<_>>())
    );
    for (name, flags) in tasks {
        text.push_str(&format!(
            "\n[[task]]\nname = {name:?}\nflags = {}\n",
            list(flags)
        ));
    }
    let path = dir.join("suite.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// A task's flags: its input, the prompt `{text}`, and `flags`.
fn task(input: &Path, flags: &[&str]) -> Vec<String> {
    let mut all = vec!["--input".to_owned(), input.display().to_string()];
    all.extend(["--prompt".to_owned(), "{text}".to_owned()]);
    all.extend(flags.iter().map(|f| f.to_string()));
    all
}

fn eval(suite: &Path, out: &Path, extra: &[&str]) -> Command {
    let mut command = Command::new(resident_bin());
    command
        .args(["eval", "--tasks"])
        .arg(suite)
        .args(["--model", &smollm2_gguf(), "--output"]);
    command.arg(out).args(extra);
    command
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suite_runs_each_task_as_its_generate_line_and_tabulates_their_figures() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    inputs(dir.path());
    let (mc, qa) = (dir.path().join("mc.jsonl"), dir.path().join("qa.jsonl"));
    // Another context: another pool, and prompts too long for it, which the results say.
    let mut cut = QA.to_vec();
    cut.extend(["--max-context", "44"]);
    let mut lambada = vec![
        "--input".to_owned(),
        dir.path().join("lambada.jsonl").display().to_string(),
    ];
    lambada.extend(["--prompt", "{context}{text}"].map(String::from));
    lambada.extend(MC.iter().map(|f| f.to_string()));
    let mut mc2 = vec![
        "--input".to_owned(),
        dir.path().join("mc2.jsonl").display().to_string(),
    ];
    mc2.extend(["--prompt", "Q: {text}\nA:", "--target-delimiter", " "].map(String::from));
    mc2.extend(["--text-field", "question", "--choices-field", "mc2_targets"].map(String::from));
    mc2.extend(MC.iter().map(|f| f.to_string()));
    let tasks = [
        ("mc", task(&mc, MC)),
        ("qa", task(&qa, QA)),
        ("qa-cut", task(&qa, &cut)),
        ("lambada", lambada),
        (
            "wiki",
            task(
                &dir.path().join("wiki.jsonl"),
                &[MC, &["--score-first-token"]].concat(),
            ),
        ),
        ("mc2", mc2),
    ];
    // The suite's --max-new-tokens is every task's unless its own flags say otherwise (all
    // three do here: their lines equal runs with their own value).
    let path = suite(dir.path(), &["--max-new-tokens", "3"], &tasks);
    let out = dir.path().join("suite");
    let (table, stderr) = run_to_success(eval(&path, &out, &[]));
    // Each task as its own resident generate line would run it.
    for (name, input, flags) in [("mc", &mc, MC), ("qa", &qa, QA)] {
        let alone = dir.path().join(format!("alone-{name}"));
        run_to_success(generate_command(input, &alone, "{text}", flags));
        let lines = read_jsonl(&out.join(name).join("generations.jsonl"));
        assert_eq!(
            lines,
            read_jsonl(&alone.join("generations.jsonl")),
            "{name}"
        );
    }
    let results = read_json(&out.join("results.json"));
    assert_eq!(results["model"], json!(smollm2_gguf()));
    let tasks = results["tasks"].as_array().unwrap();
    let names: Vec<&str> = tasks.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["mc", "qa", "qa-cut", "lambada", "wiki", "mc2"]);
    let metric = |task: &Value, name: &str| -> Value {
        let metrics = task["metrics"].as_array().unwrap();
        metrics
            .iter()
            .find(|m| m["metric"] == name)
            .cloned()
            .unwrap_or(Value::Null)
    };
    let mc_report = read_json(&out.join("mc/report.json"));
    let acc = metric(&tasks[0], "acc");
    assert_eq!(
        (&acc["value"], &acc["stderr"], &acc["records"]),
        (
            &mc_report["accuracy"],
            &mc_report["accuracy_stderr"],
            &json!(4)
        )
    );
    assert_eq!(
        metric(&tasks[0], "acc_norm")["value"],
        mc_report["accuracy_normalized"]
    );
    let brier = metric(&tasks[0], "brier_score");
    assert_eq!(
        (&brier["value"], &brier["stderr"], &brier["records"]),
        (
            &mc_report["brier_score"],
            &mc_report["brier_score_stderr"],
            &json!(4)
        )
    );
    let qa_report = read_json(&out.join("qa/report.json"));
    let exact = metric(&tasks[1], "exact_match");
    assert_eq!(
        (&exact["value"], &exact["records"]),
        (&qa_report["exact_match"], &json!(6))
    );
    assert_eq!(tasks[1]["records"], 6);
    // The overlap figures (--metric) after exact match, each the mean of the lines' own
    // (of the extracted answers), with its error.
    let qa_lines = read_jsonl(&out.join("qa/generations.jsonl"));
    let names: Vec<&Value> = (tasks[1]["metrics"].as_array().unwrap().iter())
        .map(|m| &m["metric"])
        .collect();
    assert_eq!(
        names,
        [&json!("exact_match"), &json!("rouge1"), &json!("f1")]
    );
    for name in ["f1", "rouge1"] {
        let row = metric(&tasks[1], name);
        let mean = qa_lines
            .iter()
            .map(|l| l[name].as_f64().unwrap())
            .sum::<f64>()
            / 6.0;
        assert!(
            (row["value"].as_f64().unwrap() - mean).abs() < 1e-12,
            "{row}"
        );
        let stderr = format!("{name}_stderr");
        assert_eq!(
            (&row["stderr"], &row["records"]),
            (&qa_report[&stderr], &json!(6))
        );
    }
    let paris = qa_lines.iter().find(|l| l["id"] == 0).unwrap();
    let said_paris = paris["extracted"]
        .as_str()
        .unwrap()
        .eq_ignore_ascii_case("paris");
    assert_eq!(paris["f1"], if said_paris { 1.0 } else { 0.0 }, "{paris}");
    let row = format!(
        "| qa | exact_match | {:.4} |",
        qa_report["exact_match"].as_f64().unwrap()
    );
    assert!(
        table.starts_with("| task | metric | value | ± stderr | records |"),
        "{table}"
    );
    assert!(table.contains(&row), "{table}");
    check_scored_texts(&out, &tasks[3..5]);
    // TruthfulQA's MC2 shows lm-evaluation-harness's one row: `acc`, the true answers'
    // probability among the choices.
    let mc2_report = read_json(&out.join("mc2/report.json"));
    let mc2_rows = tasks[5]["metrics"].as_array().unwrap();
    assert_eq!(mc2_rows.len(), 1, "{mc2_rows:?}");
    assert_eq!(
        (&mc2_rows[0]["metric"], &mc2_rows[0]["value"]),
        (&json!("acc"), &mc2_report["answer_probability"])
    );
    assert_eq!(
        (&mc2_rows[0]["stderr"], &mc2_rows[0]["records"]),
        (&mc2_report["answer_probability_stderr"], &json!(3))
    );
    assert_eq!(mc2_report["several_answer_records"], 2);
    // mc and qa have the same actors: one pool; another context is another pool.
    assert_eq!(tasks[0]["pool"], tasks[1]["pool"]);
    assert_ne!(tasks[1]["pool"], tasks[2]["pool"]);
    let cut_report = read_json(&out.join("qa-cut/report.json"));
    let cut_prompts = cut_report["truncated_prompts"].as_u64().unwrap();
    assert!(cut_prompts > 0, "{cut_report}");
    assert_eq!(tasks[2]["truncated_prompts"], cut_prompts);
    assert!(tasks[1].get("truncated_prompts").is_none(), "{}", tasks[1]);
    let note = format!("task qa-cut: {cut_prompts} of its 6 prompts were cut to fit the context");
    assert!(stderr.contains(&note), "{stderr}");
    assert!(stderr.contains("task qa (2 of 6):"), "{stderr}");
    // --only runs one task again: it resumes, redoing nothing, and reports the same;
    // results.json keeps the other tasks' earlier results, in the suite's order.
    let (again, stderr) = run_to_success(eval(&path, &out, &["--only", "qa"]));
    let rerun = read_json(&out.join("results.json"));
    let rerun_tasks = rerun["tasks"].as_array().unwrap();
    let names: Vec<&str> = rerun_tasks
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["mc", "qa", "qa-cut", "lambada", "wiki", "mc2"]);
    assert_eq!(
        rerun_tasks[0], tasks[0],
        "mc's earlier results, kept as they were"
    );
    assert_eq!(rerun_tasks[2], tasks[2]);
    assert_eq!(metric(&rerun_tasks[1], "exact_match"), exact);
    assert_eq!(metric(&rerun_tasks[1], "f1"), metric(&tasks[1], "f1"));
    assert_eq!(read_json(&out.join("qa/report.json"))["computed_items"], 0);
    assert!(again.contains(&row), "{again}");
    assert!(
        again.contains("| mc | acc |"),
        "the whole suite's table: {again}"
    );
    assert!(
        stderr
            .contains("results.json keeps the earlier results of mc, qa-cut, lambada, wiki, mc2 (not run this time)"),
        "{stderr}"
    );
}

/// A task of texts scored after a context (LAMBADA's) shows lm-evaluation-harness's `acc`
/// (the share of texts greedy decoding writes) and `perplexity` (per text); one of texts
/// scored alone (wikitext's) its perplexities per word and byte and its bits per byte;
/// both the perplexity per token; each as its lines give it.
fn check_scored_texts(out: &Path, tasks: &[Value]) {
    let rows = |task: &Value| -> Vec<(String, f64)> {
        (task["metrics"].as_array().unwrap().iter())
            .map(|m| {
                (
                    m["metric"].as_str().unwrap().to_owned(),
                    m["value"].as_f64().unwrap(),
                )
            })
            .collect()
    };
    let scores = |name: &str| -> Vec<Value> {
        let lines = read_jsonl(&out.join(name).join("generations.jsonl"));
        lines
            .into_iter()
            .map(|line| line["score"].clone())
            .collect()
    };
    let sum = |scores: &[Value], key: &str| -> f64 {
        scores.iter().map(|s| s[key].as_f64().unwrap()).sum()
    };
    let close = |got: &[(String, f64)], wanted: &[(&str, f64)]| {
        assert_eq!(got.len(), wanted.len(), "{got:?}");
        for ((name, value), (wanted_name, wanted)) in got.iter().zip(wanted) {
            assert_eq!(name, wanted_name);
            assert!(
                (value - wanted).abs() <= 1e-6 * wanted.abs(),
                "{name}: {value} against {wanted}"
            );
        }
    };
    let lambada = scores("lambada");
    // The perplexity per text's error: the delta method over the texts' log-likelihoods.
    let logprobs: Vec<f64> = lambada
        .iter()
        .map(|s| s["logprob"].as_f64().unwrap())
        .collect();
    let mean = logprobs.iter().sum::<f64>() / 4.0;
    let spread = logprobs.iter().map(|l| (l - mean).powi(2)).sum::<f64>() / 3.0;
    let perplexity_row = (tasks[0]["metrics"].as_array().unwrap().iter())
        .find(|m| m["metric"] == "perplexity")
        .unwrap();
    let stderr = perplexity_row["stderr"].as_f64().unwrap();
    let wanted = (-mean).exp() * (spread / 4.0).sqrt();
    assert!(
        (stderr - wanted).abs() <= 1e-6 * wanted,
        "{stderr} against {wanted}"
    );
    let greedy = lambada.iter().filter(|s| s["greedy"] == true).count();
    assert!(
        greedy > 0,
        "the model writes some last words greedily: {lambada:?}"
    );
    let logprob = sum(&lambada, "logprob");
    close(
        &rows(&tasks[0]),
        &[
            ("acc", greedy as f64 / 4.0),
            ("perplexity", (-logprob / 4.0).exp()),
            (
                "token_perplexity",
                (-logprob / sum(&lambada, "tokens")).exp(),
            ),
        ],
    );
    let wiki = scores("wiki");
    let (logprob, bytes) = (sum(&wiki, "logprob"), sum(&wiki, "bytes"));
    assert_eq!(wiki[1]["words"], 16, "a double space is one gap");
    close(
        &rows(&tasks[1]),
        &[
            ("word_perplexity", (-logprob / sum(&wiki, "words")).exp()),
            ("byte_perplexity", (-logprob / bytes).exp()),
            ("bits_per_byte", -logprob / bytes / std::f64::consts::LN_2),
            ("token_perplexity", (-logprob / sum(&wiki, "tokens")).exp()),
        ],
    );
}

#[test]
fn suites_that_cannot_run_are_refused_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    inputs(dir.path());
    let qa = dir.path().join("qa.jsonl");
    let out = dir.path().join("out");
    let cases: [(Vec<String>, &[&str], &str); 4] = [
        (
            task(&qa, &["--model", "x"]),
            &[],
            "task \"qa\" give --model: give it to `resident eval --model`",
        ),
        (
            task(&qa, QA),
            &["--only", "mmlu"],
            "the suite has no task \"mmlu\": it has qa, qa2",
        ),
        (
            task(&qa, &["--no-such-flag"]),
            &[],
            "task \"qa\": error: unexpected argument '--no-such-flag'",
        ),
        (
            task(&qa, &["--cluster", "http://127.0.0.1:1"]),
            &[],
            "the tasks name different --cluster URLs",
        ),
    ];
    for (flags, extra, says) in cases {
        let path = suite(dir.path(), &[], &[("qa", flags), ("qa2", task(&qa, QA))]);
        let output = eval(&path, &out, extra).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(says), "{says}: {stderr}");
        assert!(!out.exists(), "nothing written");
    }
    // A task the job itself would refuse (an engine limit of 0), second in the suite:
    // refused before the first runs.
    let mut zero = task(&qa, QA);
    zero.extend(["--max-context".to_owned(), "0".to_owned()]);
    let path = suite(dir.path(), &[], &[("qa", task(&qa, QA)), ("qa2", zero)]);
    let output = eval(&path, &out, &[]).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    let says = "task \"qa2\": input: max_context (--max-context) must be at least 1";
    assert!(stderr.contains(says), "{stderr}");
    assert!(!out.exists(), "the first task did not run");
}

/// An object of the `results` bucket, as text.
async fn object(client: &S3Client, key: &str) -> String {
    let bytes = client.get("results", key).await.unwrap();
    String::from_utf8(bytes.unwrap_or_else(|| panic!("no {key} on S3"))).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suite_with_an_s3_output_writes_there_what_it_writes_to_a_directory() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    inputs(dir.path());
    let (mc, qa) = (dir.path().join("mc.jsonl"), dir.path().join("qa.jsonl"));
    let tasks = [("mc", task(&mc, MC)), ("qa", task(&qa, QA))];
    let path = suite(dir.path(), &[], &tasks);
    let local = dir.path().join("local");
    let (table, _) = run_to_success(eval(&path, &local, &[]));
    let server = S3Server::start(&["results"]);
    let client = S3Client::connect(&server.options()).await;
    let mut on_s3 = eval(&path, Path::new("s3://results/evals/"), &[]);
    on_s3.envs(server.env());
    let (s3_table, _) = run_to_success(on_s3);
    assert_eq!(s3_table, table);
    for name in ["mc", "qa"] {
        let lines = object(&client, &format!("evals/{name}/generations.jsonl")).await;
        let local_lines = std::fs::read_to_string(local.join(name).join("generations.jsonl"));
        assert_eq!(lines, local_lines.unwrap(), "{name}");
    }
    let results: Value =
        serde_json::from_str(&object(&client, "evals/results.json").await).unwrap();
    let local_results = read_json(&local.join("results.json"));
    let metrics = |results: &Value| {
        results["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["metrics"].clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(metrics(&results), metrics(&local_results));
    assert_eq!(results["tasks"][1]["output"], "s3://results/evals/qa");
    // A task that would reach another S3 endpoint is refused before anything runs.
    let mut elsewhere = task(&qa, QA);
    elsewhere.extend(["--s3-endpoint".to_owned(), "http://127.0.0.1:1".to_owned()]);
    let path = suite(dir.path(), &[], &[("mc", task(&mc, MC)), ("qa", elsewhere)]);
    let mut refused = eval(&path, Path::new("s3://results/other"), &[]);
    let output = refused.envs(server.env()).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("the tasks name different --s3-endpoint URLs"),
        "{stderr}"
    );
    assert!(
        client.list("results", "other").await.unwrap().is_empty(),
        "nothing written"
    );
}
