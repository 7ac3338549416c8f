//! `resident generate`'s output constraints beyond JSON schemas, with the real binary and
//! the real SmolLM2 GGUF: `--guided-choice` (a classifier whose accuracy the answer checks
//! report), `--guided-regex`, `--guided-grammar`, a record's own constraint in an OpenAI
//! Batch file (vLLM's `guided_*` and `structured_outputs`, Resident's `response_format`
//! types), and the refusals, each before any actor starts.

use std::path::Path;

use resident_tests::{
    assert_refused, generate_command, init_logging, read_json, read_jsonl, write_jsonl,
};
use serde_json::{Value, json};

const REVIEWS: [(&str, &str); 8] = [
    ("I loved this film, the acting was wonderful.", "positive"),
    ("A dull, boring mess. I walked out.", "negative"),
    ("Brilliant soundtrack and a moving story.", "positive"),
    ("The worst meal I have had in years.", "negative"),
    ("Friendly staff, great coffee, will come back.", "positive"),
    (
        "It broke after two days and support never answered.",
        "negative",
    ),
    ("An absolute delight from start to finish.", "positive"),
    ("Terrible plot and awful dialogue.", "negative"),
];

/// Runs `resident generate` over `records` with `flags` into `dir/name` and returns its
/// lines and report.
fn generate(dir: &Path, name: &str, records: &[Value], flags: &[&str]) -> (Vec<Value>, Value) {
    let input = dir.join(format!("{name}.jsonl"));
    write_jsonl(&input, records);
    let out = dir.join(name);
    let prompt = "Review: {text}\nIs this review positive or negative?";
    resident_tests::run_to_success(generate_command(&input, &out, prompt, flags));
    (
        read_jsonl(&out.join("generations.jsonl")),
        read_json(&out.join("report.json")),
    )
}

/// Every completion under `--guided-choice` is one of the labels, and the answer checks
/// score them against each record's label as a classifier's accuracy; under
/// `--guided-regex` each matches the expression whole; under `--guided-grammar` each is a
/// sentence of the grammar.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_are_a_choice_a_regex_s_match_or_a_grammar_s_sentence() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let records: Vec<Value> = (REVIEWS.iter().enumerate())
        .map(|(i, (text, label))| json!({"id": i, "text": text, "label": label}))
        .collect();
    let choices = [
        "--guided-choice",
        "positive",
        "--guided-choice",
        "negative",
        "--reference-field",
        "label",
        "--max-new-tokens",
        "8",
    ];
    let (lines, report) = generate(dir.path(), "labels", &records, &choices);
    assert_eq!(lines.len(), REVIEWS.len());
    let mut right = 0;
    for (line, (_, label)) in lines.iter().zip(REVIEWS) {
        let text = line["text"].as_str().unwrap();
        assert!(["positive", "negative"].contains(&text), "{line}");
        assert_eq!(line["finish_reason"], "stop", "{line}");
        assert_eq!(line["correct"], json!(text == label), "{line}");
        right += usize::from(text == label);
    }
    assert_eq!(report["reference_records"], REVIEWS.len());
    assert_eq!(report["exact_match_records"], right);
    assert_eq!(
        report["exact_match"].as_f64().unwrap(),
        right as f64 / REVIEWS.len() as f64
    );

    let stars = ["--guided-regex", "[1-5] stars?", "--max-new-tokens", "8"];
    let (lines, _) = generate(dir.path(), "stars", &records, &stars);
    for line in &lines {
        let text = line["text"].as_str().unwrap();
        let (count, word) = text.split_once(' ').expect(text);
        assert!(["1", "2", "3", "4", "5"].contains(&count), "{line}");
        assert!(word == "star" || word == "stars", "{line}");
        assert_eq!(line["finish_reason"], "stop", "{line}");
    }

    let grammar = dir.path().join("verdict.lark");
    std::fs::write(
        &grammar,
        "start: verdict \", because \" reason\nverdict: \"good\" | \"bad\"\nreason: /[a-z ]{3,30}/\n",
    )
    .unwrap();
    let verdicts = [
        "--guided-grammar",
        grammar.to_str().unwrap(),
        "--max-new-tokens",
        "24",
    ];
    let (lines, _) = generate(dir.path(), "verdicts", &records, &verdicts);
    for line in &lines {
        let text = line["text"].as_str().unwrap();
        let (verdict, reason) = text.split_once(", because ").expect(text);
        assert!(verdict == "good" || verdict == "bad", "{line}");
        assert!((3..=30).contains(&reason.len()), "{line}");
        assert!(
            reason.chars().all(|c| c.is_ascii_lowercase() || c == ' '),
            "{line}"
        );
    }
}

/// An OpenAI Batch file whose lines carry their own constraints as vLLM spells them
/// (`guided_choice`, `structured_outputs`) and as Resident's `response_format` types: each
/// line's completion is of its own form; a line with two constraints, or one that does
/// not compile, is answered with its error alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_line_s_own_constraint_holds_for_that_line_alone() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let line = |id: &str, extra: Value| {
        let mut body = json!({"messages": [{"role": "user", "content":
            "Is this review positive or negative? I loved this film."}], "max_tokens": 8});
        for (key, value) in extra.as_object().unwrap() {
            body[key] = value.clone();
        }
        json!({"custom_id": id, "method": "POST", "url": "/v1/chat/completions", "body": body})
    };
    let input = dir.path().join("batch.jsonl");
    write_jsonl(
        &input,
        &[
            line("vllm-choice", json!({"guided_choice": ["yes", "no"]})),
            line(
                "structured-regex",
                json!({"structured_outputs": {"regex": "[A-Z]{3}"}}),
            ),
            line(
                "resident-choice",
                json!({"response_format": {"type": "choice", "choice": ["up", "down"]}}),
            ),
            line(
                "two",
                json!({"guided_regex": "a", "guided_choice": ["a", "b"]}),
            ),
            line("bad-regex", json!({"guided_regex": "(?<=a)b"})),
            line("free", json!({})),
        ],
    );
    let out = dir.path().join("out");
    let flags = ["--input-format", "openai-batch"];
    resident_tests::run_to_success(generate_command(&input, &out, "{text}", &flags));
    let lines = read_jsonl(&out.join("generations.jsonl"));
    let by_id = |id: &str| {
        lines
            .iter()
            .find(|line| line["id"] == id)
            .unwrap_or_else(|| panic!("{id}: {lines:?}"))
    };
    let text = |id: &str| by_id(id)["text"].as_str().unwrap_or("").to_owned();
    assert!(["yes", "no"].contains(&text("vllm-choice").as_str()));
    let code = text("structured-regex");
    assert!(
        code.len() == 3 && code.chars().all(|c| c.is_ascii_uppercase()),
        "{code:?}"
    );
    assert!(["up", "down"].contains(&text("resident-choice").as_str()));
    let error = |id: &str| by_id(id)["error"].as_str().unwrap_or("").to_owned();
    assert!(
        error("two").contains("a second output constraint"),
        "{}",
        error("two")
    );
    assert!(
        error("bad-regex").contains("the regular expression cannot be used"),
        "{}",
        error("bad-regex")
    );
    assert!(!text("free").is_empty());
    assert_eq!(by_id("free")["error"], Value::Null);
}

/// Two constraints, an empty one, one that does not compile, a grammar file that is not
/// there, or a constraint with `--score`: refused with exit code 2, naming the flag and
/// what is wrong, and nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_constraint_that_cannot_hold_is_refused_before_any_actor_starts() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    write_jsonl(&input, &[json!({"id": 1, "text": "hello"})]);
    let broken = dir.path().join("broken.lark");
    std::fs::write(&broken, "start: x (\n").unwrap();
    let cases: [(&[&str], &str); 8] = [
        (
            &["--guided-regex", "a", "--guided-choice", "a"],
            "cannot be used with",
        ),
        (
            &["--guided-regex", "a", "--json-schema", "schema.json"],
            "cannot be used with",
        ),
        (
            &["--guided-regex", ""],
            "--guided-regex has an empty regular expression",
        ),
        (
            &["--guided-regex", "(?=a)b"],
            "--guided-regex does not compile: the regular expression cannot be used",
        ),
        (
            &["--guided-choice", "yes", "--guided-choice", ""],
            "--guided-choice has an empty choice",
        ),
        (
            &["--guided-grammar", "/no/such/grammar.lark"],
            "--guided-grammar /no/such/grammar.lark: No such file",
        ),
        (
            &["--guided-choice", "yes", "--score"],
            "--score does not take a response format",
        ),
        (
            &["--guided-grammar", broken.to_str().unwrap()],
            "--guided-grammar does not compile: the grammar cannot be used",
        ),
    ];
    let refusals = assert_refused(&input, &dir.path().join("refused"), &cases);
    for (stderr, (flags, _)) in refusals.iter().zip(&cases) {
        assert!(
            !stderr.contains("actor"),
            "{flags:?} was refused before any actor: {stderr}"
        );
    }
}
