//! Multiple-choice datasets as the hub writes them, read by `resident generate --score`'s
//! field flags, score exactly as the same rows written as `{text, choices, answer}` by
//! hand: PIQA (`goal`, `sol1`, `sol2`, `label`), COPA (`premise`, `choice1`, `choice2`,
//! `question`, `label`) and StoryCloze (four sentences, `sentence_quiz1`,
//! `sentence_quiz2`, `answer_right_ending` counted from 1), each with lm-evaluation-
//! harness's layout (choices after `--target-delimiter ' '`).

use std::path::Path;

use resident_tests::{generate_command, init_logging, read_jsonl, run_to_success, write_jsonl};
use serde_json::{Value, json};

const SCORE: &[&str] = &[
    "--score",
    "--max-new-tokens",
    "0",
    "--template",
    "none",
    "--target-delimiter",
    " ",
];

/// The lines of a scoring job over `records` with `prompt` and `flags`.
fn scored(dir: &Path, name: &str, records: &[Value], prompt: &str, flags: &[&str]) -> Vec<Value> {
    let input = dir.join(format!("{name}.jsonl"));
    write_jsonl(&input, records);
    let out = dir.join(name);
    let flags = [SCORE, flags].concat();
    run_to_success(generate_command(&input, &out, prompt, &flags));
    read_jsonl(&out.join("generations.jsonl"))
}

/// The flags that read a hub row's text, choices (several fields) and answer by name.
fn hub_fields<'a>(text: &'a str, choices: &'a str, answer: &'a str) -> [&'a str; 6] {
    [
        "--text-field",
        text,
        "--choices-field",
        choices,
        "--answer-field",
        answer,
    ]
}

/// Each line's choices score as `by_hand`'s (the same tokens, at least one, and
/// log-probabilities), with the same answer, best choice and verdict.
fn assert_same_scores(hub: &[Value], by_hand: &[Value]) {
    assert_eq!(hub.len(), by_hand.len());
    for (ours, theirs) in hub.iter().zip(by_hand) {
        let choices = |line: &Value| line["choice_scores"].as_array().cloned();
        let (a, b) = (choices(ours).expect("scores"), choices(theirs).unwrap());
        assert_eq!(a.len(), b.len(), "{ours} against {theirs}");
        for (x, y) in a.iter().zip(&b) {
            assert!(x["tokens"].as_u64() > Some(0), "{ours}");
            assert_eq!(x["tokens"], y["tokens"], "{ours} against {theirs}");
            let gap = x["logprob"].as_f64().unwrap() - y["logprob"].as_f64().unwrap();
            assert!(gap.abs() < 1e-3, "{ours} against {theirs}");
        }
        for key in ["answer", "best", "correct"] {
            assert_eq!(ours[key], theirs[key], "{key}: {ours} against {theirs}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_rows_of_piqa_copa_and_storycloze_score_as_rows_written_by_hand() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();

    // PIQA: "Question: {goal}\nAnswer:", its solutions the choices, `label` an index.
    let piqa = [
        json!({"id": "p1", "goal": "How do you open a jar?", "sol1": "Twist the lid.",
               "sol2": "Paint the lid.", "label": 0}),
        json!({"id": "p2", "goal": "How do you dry a towel?", "sol1": "Bury it.",
               "sol2": "Hang it in the sun.", "label": 1}),
    ];
    let flags = hub_fields("goal", "sol1,sol2", "label");
    let prompt = "Question: {text}\nAnswer:";
    let hub = scored(dir, "piqa", &piqa, prompt, &flags);
    let rows: Vec<Value> = (piqa.iter())
        .map(|r| json!({"id": r["id"], "text": r["goal"], "choices": [r["sol1"], r["sol2"]], "answer": r["label"]}))
        .collect();
    assert_same_scores(&hub, &scored(dir, "piqa-hand", &rows, prompt, &[]));

    // COPA: the premise and its question (cause or effect) in the prompt.
    let copa = [
        json!({"id": "c1", "premise": "The man broke his toe.", "question": "cause",
               "choice1": "He dropped a hammer on his foot.", "choice2": "He got a hole in his sock.",
               "label": 0}),
    ];
    let flags = hub_fields("premise", "choice1,choice2", "label");
    let hub = scored(
        dir,
        "copa",
        &copa,
        "{text} What was the {question}?",
        &flags,
    );
    let rows = [
        json!({"id": "c1", "text": "The man broke his toe. What was the cause?",
                       "choices": [copa[0]["choice1"], copa[0]["choice2"]], "answer": 0}),
    ];
    assert_same_scores(&hub, &scored(dir, "copa-hand", &rows, "{text}", &[]));

    // StoryCloze: four sentences, then the ending; `answer_right_ending` counts from 1.
    let story = [json!({"id": "s1",
        "input_sentence_1": "Anna wanted a dog.", "input_sentence_2": "She saved her money.",
        "input_sentence_3": "She visited the shelter.", "input_sentence_4": "She met a puppy.",
        "sentence_quiz1": "She took the puppy home.", "sentence_quiz2": "She hated animals.",
        "answer_right_ending": 1})];
    let fields = hub_fields(
        "input_sentence_4",
        "sentence_quiz1,sentence_quiz2",
        "answer_right_ending",
    );
    let flags = [&fields[..], &["--answer-base", "1"]].concat();
    let prompt = "{input_sentence_1} {input_sentence_2} {input_sentence_3} {text}";
    let hub = scored(dir, "story", &story, prompt, &flags);
    let rows = [json!({"id": "s1",
        "text": "Anna wanted a dog. She saved her money. She visited the shelter. She met a puppy.",
        "choices": ["She took the puppy home.", "She hated animals."], "answer": 0})];
    assert_same_scores(&hub, &scored(dir, "story-hand", &rows, "{text}", &[]));
    assert_eq!(hub[0]["answer"], 0, "{}", hub[0]);
}
