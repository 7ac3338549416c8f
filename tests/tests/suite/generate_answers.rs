//! `resident generate --reference-field` with the real `resident` binary and the real
//! SmolLM2 GGUF: each generated answer, found by `--extract`, checked against its record's
//! reference as lm-evaluation-harness's `generate_until` tasks score it (GSM8K, TriviaQA).
//! The checks change no generated text; the lines' `extracted` and `correct` are what the
//! texts give (computed here without a regex), the report's counts are the lines', samples
//! give pass@n and the majority; named filters judge one generation as separate jobs would;
//! another check under the same output is refused, and so are flags that cannot go
//! together.

use std::path::Path;

use resident_tests::{
    assert_refused, generate_command, init_logging, read_json, read_jsonl, run_to_success,
    write_jsonl,
};
use serde_json::{Value, json};

const QUESTIONS: [&str; 8] = [
    "What is the capital of France?",
    "How many legs does a spider have?",
    "Name a primary colour.",
    "What is 12 plus 30?",
    "Which planet is known as the red planet?",
    "What is the largest ocean on Earth?",
    "Who wrote Romeo and Juliet?",
    "What gas do plants take in?",
];

/// The first run of ASCII letters and digits in `text`: what `--extract
/// '([A-Za-z0-9]+)'` finds, computed without a regex.
fn first_word(text: &str) -> Option<String> {
    text.split(|c: char| !c.is_ascii_alphanumeric())
        .find(|word| !word.is_empty())
        .map(str::to_owned)
}

/// The job over `records`; its lines in input order, its report and its stderr.
fn generate(
    dir: &Path,
    name: &str,
    records: &[Value],
    flags: &[&str],
) -> (Vec<Value>, Value, String) {
    let input = dir.join(format!("{name}.jsonl"));
    write_jsonl(&input, records);
    let out = dir.join(name);
    let (_, stderr) = run_to_success(generate_command(&input, &out, "{text}", flags));
    let report = read_json(&out.join("report.json"));
    (read_jsonl(&out.join("generations.jsonl")), report, stderr)
}

const GREEDY: &[&str] = &["--max-new-tokens", "12", "--chunk-size", "4"];

/// The questions' greedy generations, unchecked.
fn plain_lines(dir: &Path) -> Vec<Value> {
    let plain: Vec<Value> = (QUESTIONS.iter().enumerate())
        .map(|(i, q)| json!({"id": i, "text": q}))
        .collect();
    generate(dir, "plain", &plain, GREEDY).0
}
const CHECKS: &[&str] = &[
    "--reference-field",
    "gold.answer",
    "--extract",
    "([A-Za-z0-9]+)",
    "--ignore-case",
    "--accuracy-by",
    "task",
];

/// Records 0-3 are given their own first word (upper-cased: --ignore-case) as the
/// reference, 4-5 a word the model never wrote, 6 a list holding its word among others,
/// 7 none: five right, two wrong, one not counted; by task, records alternate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_answers_are_extracted_and_checked_against_each_record_s_reference() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let first_lines = plain_lines(dir.path());
    let words: Vec<String> = (first_lines.iter())
        .map(|line| first_word(line["text"].as_str().unwrap()).expect("the model wrote a word"))
        .collect();
    let reference = |i: usize| match i {
        0..=3 => json!(words[i].to_uppercase()),
        4 | 5 => json!("zzzq"),
        6 => json!(["zzzq", words[i].clone(), 7]),
        _ => Value::Null,
    };
    let records: Vec<Value> = (QUESTIONS.iter().enumerate())
        .map(|(i, q)| {
            let task = if i % 2 == 0 { "even" } else { "odd" };
            json!({"id": i, "text": q, "gold": {"answer": reference(i)}, "task": task})
        })
        .collect();
    let flags: Vec<&str> = GREEDY.iter().chain(CHECKS).copied().collect();
    let (lines, report, stderr) = generate(dir.path(), "checked", &records, &flags);
    for (i, (line, first)) in lines.iter().zip(&first_lines).enumerate() {
        assert_eq!(
            line["text"], first["text"],
            "the checks change no generation"
        );
        assert_eq!(line["extracted"], json!(words[i]), "{line}");
        let expected = match i {
            0..=3 | 6 => json!(true),
            4 | 5 => json!(false),
            _ => Value::Null,
        };
        assert_eq!(
            line.get("correct").cloned().unwrap_or(Value::Null),
            expected,
            "{line}"
        );
    }
    let figures = &report;
    let counted = |key: &str| figures[key].as_u64().unwrap_or(0);
    assert_eq!(
        (counted("reference_records"), counted("exact_match_records")),
        (7, 5)
    );
    assert_eq!(counted("unextracted_records"), 0);
    assert_eq!(figures["exact_match"], 5.0 / 7.0);
    let standard_error = (5.0 / 7.0 * (2.0 / 7.0) / 6.0_f64).sqrt();
    assert!(
        (figures["exact_match_stderr"].as_f64().unwrap() - standard_error).abs() < 1e-12,
        "{figures}"
    );
    assert!(figures.get("exact_match_any").is_none(), "one sample each");
    let groups = &figures["accuracy_by_group"]["groups"];
    // even: 0, 2, 4, 6 (three right); odd: 1, 3, 5 (two right), 7 has no reference.
    assert_eq!(
        (
            groups["even"]["accuracy"].as_f64(),
            groups["odd"]["accuracy"].as_f64()
        ),
        (Some(0.75), Some(2.0 / 3.0))
    );
    assert!(
        groups["even"].get("accuracy_normalized").is_none(),
        "{groups}"
    );
    assert!(
        stderr.contains("answers: 7 records with a reference: exact match 0.7143 ± 0.1844;"),
        "{stderr}"
    );
    // A dry run shows each record's references where they will be read.
    let input = dir.path().join("checked.jsonl");
    let mut dry: Vec<&str> = flags.clone();
    dry.extend(["--dry-run", "8"]);
    let (shown, _) = run_to_success(generate_command(
        &input,
        &dir.path().join("dry"),
        "{text}",
        &dry,
    ));
    let list = format!(
        "=== reference (`gold.answer`): [\"zzzq\", {:?}, \"7\"]",
        words[6]
    );
    assert!(shown.contains(&list), "{shown}");
    assert!(
        shown.contains("=== no reference in `gold.answer`: generated, not checked"),
        "{shown}"
    );
    // The same output under another filter is another job.
    let mut other = flags.clone();
    other[GREEDY.len() + 3] = "([A-Za-z]+)";
    let output = generate_command(&input, &dir.path().join("checked"), "{text}", &other)
        .output()
        .unwrap();
    let refused = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{refused}");
    assert!(refused.contains("answer checks"), "{refused}");
}

/// The last run of ASCII letters and digits in `text`.
fn last_word(text: &str) -> Option<String> {
    text.split(|c: char| !c.is_ascii_alphanumeric())
        .rfind(|word| !word.is_empty())
        .map(str::to_owned)
}

/// Named filters judge one generation as separate jobs with each as `--extract` would:
/// the first's answers are the line's own and the report's `exact_match`, each one's under
/// `filters` by name; `whole=` takes the whole text; a look-around pattern runs as Python's
/// `re` would. References are records 0-3's first
/// words and 4-7's last words, so each filter is right on its own half.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_filters_judge_one_generation_as_separate_jobs_would() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let texts = plain_lines(dir.path());
    let text = |i: usize| texts[i]["text"].as_str().unwrap();
    let records: Vec<Value> = (QUESTIONS.iter().enumerate())
        .map(|(i, q)| {
            let word = if i < 4 {
                first_word(text(i))
            } else {
                last_word(text(i))
            };
            json!({"id": i, "text": q, "gold": word.expect("the model wrote a word")})
        })
        .collect();
    let word = "([A-Za-z0-9]+)";
    let check = ["--reference-field", "gold", "--ignore-case"];
    let job = |name: &str, flags: &[&str]| {
        let all: Vec<&str> = (GREEDY.iter().chain(&check).chain(flags))
            .copied()
            .collect();
        generate(dir.path(), name, &records, &all)
    };
    let (first, first_report, _) = job("first", &["--extract", word]);
    let (last, last_report, _) = job("last", &["--extract", word, "--extract-match", "last"]);
    let (first_filter, last_filter) = (format!("first={word}"), format!("last:last={word}"));
    let (named, report, stderr) = job(
        "named",
        &[
            "--filter",
            &first_filter,
            "--filter",
            &last_filter,
            "--filter",
            "whole=",
            "--filter",
            // lm-evaluation-harness's patterns look around (BIG-Bench Hard's does): a word
            // with no letter or digit either side, the first found, is the first word.
            "around=(?<![A-Za-z0-9])[A-Za-z0-9]+(?![A-Za-z0-9])",
        ],
    );
    let answer = |line: &Value| json!({"extracted": line["extracted"], "correct": line["correct"]});
    for (i, line) in named.iter().enumerate() {
        assert_eq!(line["text"], texts[i]["text"], "one generation, unchanged");
        assert_eq!(
            answer(line),
            answer(&first[i]),
            "the first filter's is the line's"
        );
        let filters = &line["filters"];
        assert_eq!(answer(&filters["first"]), answer(&first[i]), "{line}");
        assert_eq!(answer(&filters["last"]), answer(&last[i]), "{line}");
        assert_eq!(filters["whole"]["extracted"], json!(text(i).trim()));
        assert_eq!(answer(&filters["around"]), answer(&first[i]), "{line}");
    }
    for key in ["exact_match", "reference_records", "exact_match_records"] {
        assert_eq!(report[key], first_report[key], "{key}");
        assert_eq!(report["filters"]["first"][key], first_report[key], "{key}");
        assert_eq!(report["filters"]["last"][key], last_report[key], "{key}");
    }
    // report.json lists the filters in the order given (lm-evaluation-harness's), not by
    // name ("around" would come first).
    let text = std::fs::read_to_string(dir.path().join("named/report.json")).unwrap();
    let filters = &text[text.find("\"filters\"").unwrap()..];
    let at = |name: &str| filters.find(&format!("\"{name}\": {{")).unwrap();
    assert!(
        at("first") < at("last") && at("whole") < at("around"),
        "{text}"
    );
    let right = |report: &Value| report["exact_match_records"].as_u64().unwrap_or(0);
    assert!(
        right(&first_report) >= 4 && right(&last_report) >= 4,
        "{report}"
    );
    let line = format!(
        "answers by filter last: 8 records with a reference: exact match {:.4}",
        last_report["exact_match"].as_f64().unwrap()
    );
    assert!(stderr.contains(&line), "{stderr}");
    assert!(
        !stderr.contains("\nanswers: "),
        "named filters only: {stderr}"
    );
}

/// A resumed job's report counts every chunk's answers, the reused ones too: a run that
/// finds one of two chunks' shards gone recomputes that chunk alone and reports the first
/// run's exact match, group accuracies and filter figures; a run with nothing left to do
/// reports them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_job_s_report_counts_every_chunk_s_answers() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let texts = plain_lines(dir.path());
    let records: Vec<Value> = (QUESTIONS.iter().enumerate())
        .map(|(i, q)| {
            let word = first_word(texts[i]["text"].as_str().unwrap());
            let gold = if i % 3 == 0 {
                json!("zzzq")
            } else {
                json!(word)
            };
            json!({"id": i, "text": q, "gold": gold, "task": if i < 4 { "a" } else { "b" }})
        })
        .collect();
    let flags: Vec<&str> = GREEDY
        .iter()
        .copied()
        .chain([
            "--reference-field",
            "gold",
            "--accuracy-by",
            "task",
            "--filter",
            "word=([A-Za-z0-9]+)",
            "--filter",
            "whole=",
        ])
        .collect();
    let (_, first, _) = generate(dir.path(), "resumed", &records, &flags);
    let figures = |report: &Value| {
        let keys = [
            "exact_match",
            "reference_records",
            "exact_match_stderr",
            "accuracy_by_group",
            "filters",
        ];
        keys.map(|key| report[key].clone())
    };
    assert_eq!(first["reference_records"], 8, "{first}");
    assert_eq!(first["exact_match"], 5.0 / 8.0, "{first}");
    std::fs::remove_file(dir.path().join("resumed/shards/chunk-000001.jsonl")).unwrap();
    let (_, second, _) = generate(dir.path(), "resumed", &records, &flags);
    assert_eq!(second["computed_items"], 4, "one chunk redone: {second}");
    assert_eq!(figures(&second), figures(&first));
    let (_, third, _) = generate(dir.path(), "resumed", &records, &flags);
    assert_eq!(third["computed_items"], 0, "{third}");
    assert_eq!(figures(&third), figures(&first));
}

/// With `-n 3` sampled, every sample has its own `extracted` and `correct`; the line's
/// `correct_majority` is the most common word's (the first found of equals), and the
/// report's pass@n and majority are what the lines count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn samples_give_any_and_majority_as_their_lines_count() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let records: Vec<Value> = (QUESTIONS.iter().enumerate())
        .map(|(i, q)| json!({"id": i, "text": q, "gold": {"answer": ["The", "It", "A"]}}))
        .collect();
    let mut flags: Vec<&str> = GREEDY.to_vec();
    flags.extend(["-n", "3", "--temperature", "1.0", "--seed", "5"]);
    flags.extend(&CHECKS[..5]);
    let (lines, report, _) = generate(dir.path(), "sampled", &records, &flags);
    let (mut any, mut majority) = (0, 0);
    for line in &lines {
        let samples = line["choices"].as_array().unwrap();
        assert_eq!(samples.len(), 3);
        let words: Vec<Option<String>> = (samples.iter())
            .map(|s| first_word(s["text"].as_str().unwrap()).map(|w| w.to_lowercase()))
            .collect();
        let right = |word: &Option<String>| {
            word.as_deref()
                .is_some_and(|w| ["the", "it", "a"].contains(&w))
        };
        for (sample, word) in samples.iter().zip(&words) {
            assert_eq!(sample["correct"], json!(right(word)), "{sample}");
        }
        assert_eq!(line["correct"], samples[0]["correct"]);
        let found: Vec<&Option<String>> = words.iter().filter(|w| w.is_some()).collect();
        let most = found
            .iter()
            .map(|w| found.iter().filter(|o| *o == w).count())
            .max();
        let winner = found
            .iter()
            .find(|w| Some(found.iter().filter(|o| *o == *w).count()) == most);
        let expected_majority = winner.is_some_and(|w| right(w));
        assert_eq!(line["correct_majority"], json!(expected_majority), "{line}");
        any += u64::from(words.iter().any(right));
        majority += u64::from(expected_majority);
    }
    let figures = &report;
    assert_eq!(figures["sampled_reference_records"], 8);
    assert_eq!(figures["any_match_records"].as_u64().unwrap_or(0), any);
    assert_eq!(
        figures["majority_match_records"].as_u64().unwrap_or(0),
        majority
    );
    assert_eq!(figures["exact_match_any"], any as f64 / 8.0);
}

/// GSM8K's flags without few-shot examples: raw, greedy, each answer checked.
const GSM8K: [&str; 12] = [
    "--template",
    "none",
    "--max-new-tokens",
    "16",
    "--stop",
    "Question:",
    "--reference-field",
    "answer",
    "--extract",
    "#### (\\-?[0-9]+)",
    "--ignore-regex",
    "(?s).*#### ",
];

/// Three GSM8K-style dev records in `dir` (the second without an answer, so two are
/// examples) and two questions in its `test.jsonl`: the dev file, the test file, the
/// questions.
fn gsm8k_questions(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf, Vec<Value>) {
    let dev = dir.join("train.jsonl");
    let shots = [
        json!({"id": "d1", "text": "Tom has 2 apples and buys 2. How many?", "answer": "2 + 2 = 4.\n#### 4"}),
        json!({"id": "d2", "text": "No worked answer here."}),
        json!({"id": "d3", "text": "A {box} holds 3 pens; 2 boxes?", "answer": "3 * 2 = 6.\n#### 6"}),
    ];
    write_jsonl(&dev, &shots);
    let records = vec![
        json!({"id": 1, "text": "Ann has 5 cats and gets 1 more. How many?", "answer": "#### 6"}),
        json!({"id": 2, "text": "What is 7 minus 3?", "answer": "#### 4"}),
    ];
    let input = dir.join("test.jsonl");
    write_jsonl(&input, &records);
    (dev, input, records)
}

/// The flags of two examples from `dev`, each answer after a space.
fn two_examples(dev: &Path) -> [&str; 6] {
    let dev = dev.to_str().unwrap();
    [
        "--fewshot-input",
        dev,
        "--fewshot",
        "2",
        "--target-delimiter",
        " ",
    ]
}

/// Each of `records` as the conversation its two examples make as turns (each one's
/// prompt the user's, `answer_start` and its reference the assistant's), its own prompt
/// the last user turn, then `reply_start` as the assistant's where it is not empty.
fn gsm8k_conversations(records: &[Value], answer_start: &str, reply_start: &str) -> Vec<Value> {
    let turn = |role: &str, content: &str| json!({"role": role, "content": content});
    (records.iter())
        .map(|record| {
            let asked = format!("Question: {}\nAnswer:", record["text"].as_str().unwrap());
            let mut messages = vec![
                turn(
                    "user",
                    "Question: Tom has 2 apples and buys 2. How many?\nAnswer:",
                ),
                turn("assistant", &format!("{answer_start}2 + 2 = 4.\n#### 4")),
                turn("user", "Question: A {box} holds 3 pens; 2 boxes?\nAnswer:"),
                turn("assistant", &format!("{answer_start}3 * 2 = 6.\n#### 6")),
                turn("user", &asked),
            ];
            if !reply_start.is_empty() {
                messages.push(turn("assistant", reply_start));
            }
            json!({"id": record["id"], "answer": record["answer"], "messages": messages})
        })
        .collect()
}

/// A generating job's few-shot examples are its dev file's first records with a
/// reference, each written through the prompt with the target delimiter and its
/// reference after it, as lm-evaluation-harness writes GSM8K's: the lines equal those of
/// the same examples written into `--prompt` by hand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generating_job_s_fewshot_examples_are_answered_by_their_reference() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let (dev, input, records) = gsm8k_questions(dir.path());
    let dev_path = dev.to_str().unwrap();
    let common = GSM8K;
    let mut fewshot: Vec<&str> = common.to_vec();
    fewshot.extend([
        "--fewshot-input",
        dev_path,
        "--fewshot",
        "2",
        "--target-delimiter",
        " ",
    ]);
    let prompt = "Question: {text}\nAnswer:";
    let out = dir.path().join("fewshot");
    run_to_success(generate_command(&input, &out, prompt, &fewshot));
    let by_hand = concat!(
        "Question: Tom has 2 apples and buys 2. How many?\nAnswer: 2 + 2 = 4.\n#### 4\n\n",
        "Question: A {{box}} holds 3 pens; 2 boxes?\nAnswer: 3 * 2 = 6.\n#### 6\n\n",
        "Question: {text}\nAnswer:"
    );
    let hand = dir.path().join("hand");
    run_to_success(generate_command(&input, &hand, by_hand, &common));
    let (lines, written) = (
        read_jsonl(&out.join("generations.jsonl")),
        read_jsonl(&hand.join("generations.jsonl")),
    );
    assert_eq!(lines, written);
    assert!(
        lines.iter().all(|line| line.get("correct").is_some()),
        "{lines:?}"
    );
    let report = read_json(&out.join("report.json"));
    assert_eq!(report["reference_records"], 2);

    // Too long for the context: the oldest example written as text goes whole (not the
    // middle of the question), so each line is that of the prompt with the newer example
    // alone written by hand, marked cut; --dry-run shows the prompt the model reads.
    let newer_by_hand = concat!(
        "Question: A {{box}} holds 3 pens; 2 boxes?\nAnswer: 3 * 2 = 6.\n#### 6\n\n",
        "Question: {text}\nAnswer:"
    );
    let newer = dir.path().join("text-newer");
    run_to_success(generate_command(&input, &newer, newer_by_hand, &common));
    let newer_lines = read_jsonl(&newer.join("generations.jsonl"));
    let (whole, read, shown) = cut_to_the_newer_example(
        &dir.path().join("text-cut"),
        (&input, prompt, &fewshot),
        (&lines, &newer_lines),
    );
    assert!(whole.contains("Tom has 2 apples"), "{shown}");
    assert!(
        read.contains("its oldest examples left out first"),
        "{shown}"
    );
    assert!(
        !read.contains("Tom has 2 apples") && read.contains("A {box} holds"),
        "{shown}"
    );
    assert!(
        read.contains("Question: Ann has 5 cats and gets 1 more. How many?\nAnswer:"),
        "{shown}"
    );

    // As chat turns (`--fewshot-as-multiturn`): the lines of the same conversations
    // written as records, each example's reference the assistant's turn.
    let chat: Vec<&str> = (fewshot.iter().copied())
        .map(|flag| if flag == "none" { "chat" } else { flag })
        .chain(["--fewshot-as-multiturn"])
        .collect();
    let turns = dir.path().join("turns");
    run_to_success(generate_command(&input, &turns, prompt, &chat));
    let conversations = gsm8k_conversations(&records, "", "");
    let written_input = dir.path().join("conversations.jsonl");
    write_jsonl(&written_input, &conversations);
    let chat_common: Vec<&str> = chat[..common.len()].to_vec();
    let by_turns = dir.path().join("by-turns");
    run_to_success(generate_command(
        &written_input,
        &by_turns,
        "{text}",
        &chat_common,
    ));
    assert_eq!(
        read_jsonl(&turns.join("generations.jsonl")),
        read_jsonl(&by_turns.join("generations.jsonl"))
    );

    // Too long for the context: the oldest example turns go whole (not the middle of a
    // message), so each line is that of the conversation with the newer example alone,
    // marked cut; --dry-run shows the prompt the model reads.
    let newer_only: Vec<Value> = (conversations.iter())
        .map(|conversation| {
            let mut conversation = conversation.clone();
            conversation["messages"].as_array_mut().unwrap().drain(..2);
            conversation
        })
        .collect();
    let newer_input = dir.path().join("newer.jsonl");
    write_jsonl(&newer_input, &newer_only);
    let newer = dir.path().join("newer");
    run_to_success(generate_command(
        &newer_input,
        &newer,
        "{text}",
        &chat_common,
    ));
    let newer_lines = read_jsonl(&newer.join("generations.jsonl"));
    let (whole, read, shown) = cut_to_the_newer_example(
        &dir.path().join("cut"),
        (&input, prompt, &chat),
        (&read_jsonl(&turns.join("generations.jsonl")), &newer_lines),
    );
    assert!(whole.contains("Tom has 2 apples"), "{shown}");
    assert!(
        !read.contains("Tom has 2 apples") && read.contains("A {box} holds"),
        "{shown}"
    );
    assert!(read.contains("Ann has 5 cats"), "{shown}");

    // Without an answer for the examples, few-shot is refused saying what to do.
    let output = generate_command(
        &input,
        &dir.path().join("refused"),
        prompt,
        &["--fewshot-input", dev_path],
    )
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("or --reference-field (each example's answer)"),
        "{stderr}"
    );
}

/// `--gen-prefix` starts every answer as lm-evaluation-harness's `gen_prefix` does: raw,
/// each example's answer after the target delimiter, the prefix and a space, and the
/// record's prompt ending with the delimiter and the prefix; under the chat template, the
/// assistant's reply the model continues (after the examples as text in the user's turn,
/// or as turns). Each job's lines equal those of the same prompt or conversation written
/// by hand; `--dry-run` shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gen_prefix_starts_every_answer_as_lm_evaluation_harness_writes_it() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let (dev, input, records) = gsm8k_questions(dir.path());
    let prefix = "Let's think step by step.";
    let fewshot = [&two_examples(&dev)[..], &["--gen-prefix", prefix]].concat();
    let prompt = "Question: {text}\nAnswer:";
    let lines_of = |name: &str, input: &Path, prompt: &str, flags: &[&str]| {
        let out = dir.path().join(name);
        run_to_success(generate_command(input, &out, prompt, flags));
        read_jsonl(&out.join("generations.jsonl"))
    };
    let raw = [&GSM8K[..], &fewshot].concat();
    let by_hand = format!(
        "Question: Tom has 2 apples and buys 2. How many?\nAnswer: {prefix} 2 + 2 = 4.\n#### 4\n\n\
         Question: A {{{{box}}}} holds 3 pens; 2 boxes?\nAnswer: {prefix} 3 * 2 = 6.\n#### 6\n\n\
         Question: {{text}}\nAnswer: {prefix}"
    );
    let lines = lines_of("raw", &input, prompt, &raw);
    assert_eq!(lines, lines_of("raw-hand", &input, &by_hand, &GSM8K));
    let mut dry = generate_command(&input, &dir.path().join("dry"), prompt, &raw);
    dry.args(["--dry-run", "1"]);
    let (shown, _) = run_to_success(dry);
    let asked = by_hand.replace("{{", "{").replace("}}", "}");
    let asked = asked.replace("{text}", "Ann has 5 cats and gets 1 more. How many?");
    assert!(shown.contains(&asked), "{asked} in {shown}");

    // Under the chat template: the examples as text in the user's turn, or as turns.
    let chat: Vec<&str> = (raw.iter().copied())
        .map(|flag| if flag == "none" { "chat" } else { flag })
        .collect();
    let chat_common = &chat[..GSM8K.len()];
    let in_user_turn: Vec<Value> = (records.iter())
        .map(|record| {
            let text = by_hand.strip_suffix(&format!(" {prefix}")).unwrap();
            let text = text.replace("{{", "{").replace("}}", "}");
            let text = text.replace("{text}", record["text"].as_str().unwrap());
            json!({"id": record["id"], "answer": record["answer"], "messages": [
                {"role": "user", "content": text},
                {"role": "assistant", "content": prefix},
            ]})
        })
        .collect();
    let written = dir.path().join("in-user-turn.jsonl");
    write_jsonl(&written, &in_user_turn);
    assert_eq!(
        lines_of("chat", &input, prompt, &chat),
        lines_of("chat-hand", &written, "{text}", chat_common)
    );
    let as_turns = [&chat[..], &["--fewshot-as-multiturn"]].concat();
    let written = dir.path().join("as-turns.jsonl");
    write_jsonl(
        &written,
        &gsm8k_conversations(&records, &format!("{prefix} "), prefix),
    );
    assert_eq!(
        lines_of("turns", &input, prompt, &as_turns),
        lines_of("turns-hand", &written, "{text}", chat_common)
    );
}

/// `--fewshot-answer-field` answers each example with a field of its own, not the field
/// records are checked against (lm-evaluation-harness's few-shot `doc_to_target`;
/// MMLU-Pro's chain of thought): an example without it is passed over, even with a
/// reference; the lines equal those of the same examples written into `--prompt` by hand,
/// and `--dry-run` shows them. The reference field's own examples are another prompt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fewshot_answer_field_writes_the_examples_worked_answers() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let (_, input, _) = gsm8k_questions(dir.path());
    let dev = dir.path().join("worked.jsonl");
    write_jsonl(
        &dev,
        &[
            json!({"id": "d1", "text": "Tom has 2 apples and buys 2. How many?",
                   "solution": "2 + 2 = 4.\n#### 4", "answer": "#### 4"}),
            json!({"id": "d2", "text": "No worked answer here.", "answer": "#### 1"}),
            json!({"id": "d3", "text": "A pen costs 3; 2 pens?",
                   "solution": "3 * 2 = 6.\n#### 6", "answer": "#### 6"}),
        ],
    );
    let prompt = "Question: {text}\nAnswer:";
    let examples = two_examples(&dev);
    let worked = [
        &GSM8K[..],
        &examples,
        &["--fewshot-answer-field", "solution"],
    ]
    .concat();
    let lines_of = |name: &str, prompt: &str, flags: &[&str]| {
        let out = dir.path().join(name);
        run_to_success(generate_command(&input, &out, prompt, flags));
        read_jsonl(&out.join("generations.jsonl"))
    };
    let by_hand = concat!(
        "Question: Tom has 2 apples and buys 2. How many?\nAnswer: 2 + 2 = 4.\n#### 4\n\n",
        "Question: A pen costs 3; 2 pens?\nAnswer: 3 * 2 = 6.\n#### 6\n\n",
        "Question: {text}\nAnswer:"
    );
    let lines = lines_of("worked", prompt, &worked);
    assert_eq!(lines, lines_of("worked-hand", by_hand, &GSM8K));
    assert!(
        lines.iter().all(|line| line.get("solution").is_none()),
        "{lines:?}"
    );
    let mut dry = generate_command(&input, &dir.path().join("dry"), prompt, &worked);
    dry.args(["--dry-run", "1"]);
    let (shown, _) = run_to_success(dry);
    let asked = by_hand.replace("{text}", "Ann has 5 cats and gets 1 more. How many?");
    assert!(shown.contains(&asked), "{asked} in {shown}");
    // Answered by the reference field, the examples are the first two with one.
    let (shown_reference, _) = run_to_success({
        let flags = [&GSM8K[..], &examples, &["--dry-run", "1"]].concat();
        generate_command(&input, &dir.path().join("dry-ref"), prompt, &flags)
    });
    assert!(
        shown_reference.contains("Question: No worked answer here.\nAnswer: #### 1"),
        "{shown_reference}"
    );
}

/// The job of `input` with `flags` in `out`, its context one example too short for its
/// whole prompts (`whole_lines`' shortest) and long enough for those with the newer example
/// alone (`newer_lines`' longest, and 16 new tokens): each line is that of the newer
/// example alone, marked truncated, and the report counts them. Returns what `--dry-run 1`
/// prints before its cut prompt, the cut prompt, and the whole output.
fn cut_to_the_newer_example(
    out: &Path,
    (input, prompt, flags): (&Path, &str, &[&str]),
    (whole_lines, newer_lines): (&[Value], &[Value]),
) -> (String, String, String) {
    let tokens = |line: &Value| line["prompt_tokens"].as_u64().unwrap();
    let longest = newer_lines.iter().map(tokens).max().unwrap();
    assert!(
        whole_lines.iter().map(tokens).min() > Some(longest),
        "one example more does not fit"
    );
    let context = (longest + 16).to_string();
    let mut cut_flags = flags.to_vec();
    cut_flags.extend(["--max-context", &context]);
    run_to_success(generate_command(input, out, prompt, &cut_flags));
    let mut cut_lines = read_jsonl(&out.join("generations.jsonl"));
    for line in &mut cut_lines {
        let truncated = line.as_object_mut().unwrap().remove("truncated");
        assert_eq!(truncated, Some(json!(true)), "{line}");
    }
    assert_eq!(cut_lines, newer_lines);
    assert_eq!(read_json(&out.join("report.json"))["truncated_prompts"], 2);
    cut_flags.extend(["--dry-run", "1"]);
    let dry = out.with_extension("dry");
    let (shown, _) = run_to_success(generate_command(input, &dry, prompt, &cut_flags));
    let (whole, read) = shown.split_once("=== too long for the").expect(&shown);
    (whole.to_owned(), read.to_owned(), shown.clone())
}

/// Flags that cannot go together are refused before anything runs, saying what to do.
#[test]
fn answer_flags_that_cannot_go_together_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    write_jsonl(&input, &[json!({"id": 1, "text": "q", "answer": "a"})]);
    let out = dir.path().join("out");
    let dev = dir.path().join("dev.jsonl");
    write_jsonl(
        &dev,
        &[json!({"id": 1, "text": "q", "choices": ["a", "b"], "answer": 0, "cot": "a"})],
    );
    let dev = dev.to_str().unwrap();
    let cases: [(&[&str], &str); 16] = [
        (
            &["--keep-columns", "title,text"],
            "--keep-columns cannot write `text`: each line has its own `text` (the \
             completion); keep the field under another name, e.g. --keep-columns text=article",
        ),
        (
            &["--keep-columns", "title", "--output-format", "openai-batch"],
            "--keep-columns title: OpenAI Batch output lines have OpenAI's fields only",
        ),
        (
            &["--fewshot-answer-field", "cot"],
            "--fewshot-answer-field pick and write each record's examples from \
             --fewshot-input: give that file too",
        ),
        (
            &[
                "--score",
                "--max-new-tokens",
                "0",
                "--template",
                "none",
                "--fewshot-input",
                dev,
                "--fewshot",
                "1",
                "--fewshot-answer-field",
                "cot",
            ],
            "a scoring job's examples answer with their right choice",
        ),
        (&["--ignore-case"], "give --reference-field"),
        (&["--extract-match", "last"], "give --extract"),
        (
            &[
                "--reference-field",
                "answer",
                "--score",
                "--max-new-tokens",
                "0",
                "--template",
                "none",
            ],
            "check generations and score choices in two jobs",
        ),
        (
            &["--extract", "(?<=#### )([0-9]+"],
            "is not a regular expression (Python's `re` syntax",
        ),
        (
            &[
                "--reference-field",
                "answer",
                "--output-format",
                "openai-batch",
            ],
            "not with --output-format openai-batch",
        ),
        (
            &["--extract", "x", "--filter", "a=y"],
            "--extract and --filter both say how answers are found",
        ),
        (
            &["--filter", "a=x", "--filter", "a:last=y"],
            "two of --filter have one name",
        ),
        (&["--filter", "strict-match"], "has no `=`: give NAME=REGEX"),
        (
            &["--metric", "rouge"],
            "--metric scores each generated answer against its record's reference: give \
             --reference-field",
        ),
        (
            &[
                "--reference-field",
                "answer",
                "--metric",
                "f1",
                "--rouge-stemmer",
            ],
            "--rouge-stemmer stems the words ROUGE compares: give --metric rouge",
        ),
        (
            &["--reference-field", "answer", "--metric", "rouge,meteor"],
            "\"meteor\" is not an overlap metric: give rouge (rouge1, rouge2, rougeL and \
             rougeLsum), one of those, f1 (SQuAD's token F1), bleu or chrf",
        ),
        (
            &[
                "--score",
                "--max-new-tokens",
                "0",
                "--template",
                "none",
                "--choices-as-contexts",
                "--gen-prefix",
                "Answer:",
            ],
            "--gen-prefix starts the answer after the prompt",
        ),
    ];
    assert_refused(&input, &out, &cases);
}
