//! `resident generate --reasoning-parser`, with the real binary and the real SmolLM2 GGUF
//! taught to think by its prompt: few-shot examples that think in `<think>...</think>`
//! before each answer, the record's turn opened with `<think>` as DeepSeek-R1's template
//! opens it. The thinking is split from the answer (lines, samples, the report, Parquet,
//! the Batch output), the answer alone is checked, and an output grammar holds the answer
//! while the thinking runs free.

use std::path::Path;

use resident_tests::{
    assert_refused, generate_command, init_logging, read_json, read_jsonl, run_to_success,
    write_jsonl,
};
use serde_json::{Value, json};

use super::generate_job::parquet_lines;

/// Sums, each with its answer: the examples think in digits, so a number extracted from
/// the whole completion would be the thinking's first, not the answer.
const SUMS: [(&str, &str); 6] = [
    ("2+2", "4"),
    ("3+5", "8"),
    ("1+6", "7"),
    ("5+4", "9"),
    ("6+3", "9"),
    ("2+7", "9"),
];

const EXAMPLES: &str = "Q: 1+1?\n<think>1 plus 1 makes 2</think>A: 2\n\
                        Q: 2+3?\n<think>2 plus 3 makes 5</think>A: 5\n\
                        Q: 4+4?\n<think>4 plus 4 makes 8</think>A: 8\n";

/// The few-shot prompt, the record's thinking opened.
fn thinking_prompt() -> String {
    format!("{EXAMPLES}Q: {{text}}?\n<think>")
}

fn sums(dir: &Path) -> std::path::PathBuf {
    let input = dir.join("sums.jsonl");
    let records: Vec<Value> = (SUMS.iter().enumerate())
        .map(|(i, (sum, answer))| json!({"id": i, "text": sum, "answer": answer}))
        .collect();
    write_jsonl(&input, &records);
    input
}

/// Runs `resident generate` raw (`--template none`) over the sums with `prompt` and
/// `flags` into `dir/name`; returns its lines and report.
fn generate(dir: &Path, name: &str, prompt: &str, flags: &[&str]) -> (Vec<Value>, Value) {
    let out = dir.join(name);
    let mut all = vec!["--template", "none"];
    all.extend(flags);
    run_to_success(generate_command(&sums(dir), &out, prompt, &all));
    let lines = match out.join("generations.parquet").exists() {
        true => parquet_lines(&out.join("generations.parquet")),
        false => read_jsonl(&out.join("generations.jsonl")),
    };
    (lines, read_json(&out.join("report.json")))
}

fn first_number(text: &str) -> Option<String> {
    let digits: String = (text.chars())
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(char::is_ascii_digit)
        .collect();
    (!digits.is_empty()).then_some(digits)
}

/// The same greedy completions with and without `--reasoning-parser deepseek_r1`: each
/// parsed line's thinking, `</think>` and answer make the raw text; the answer checks read
/// the answer alone (a number extracted from the raw text is the thinking's); the report
/// counts the thinking's tokens. A completion cut while thinking is all reasoning under
/// deepseek_r1 and all answer under qwen3; each of `-n`'s samples is split on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thinking_is_split_from_the_answer_and_the_answer_alone_is_checked() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let prompt = thinking_prompt();
    let plain = ["--max-new-tokens", "24", "--stop", "\n"];
    let (raw, _) = generate(dir.path(), "raw", &prompt, &plain);
    let mut checked = plain.to_vec();
    checked.extend(["--reasoning-parser", "deepseek_r1", "--reference-field"]);
    checked.extend(["answer", "--extract", r"(\d+)"]);
    let (lines, report) = generate(dir.path(), "parsed", &prompt, &checked);
    let mut closed = 0;
    let mut thinking_tokens = 0;
    for (raw, line) in raw.iter().zip(&lines) {
        let (raw_text, text) = (
            raw["text"].as_str().unwrap(),
            line["text"].as_str().unwrap(),
        );
        let reasoning = line["reasoning"]
            .as_str()
            .expect("deepseek_r1: always reasoning");
        match raw_text.contains("</think>") {
            true => assert_eq!(raw_text, format!("{reasoning}</think>{text}"), "{line}"),
            false => assert_eq!((reasoning, text), (raw_text, ""), "{line}"),
        }
        closed += usize::from(raw_text.contains("</think>"));
        assert_eq!(line["extracted"].as_str(), first_number(text).as_deref());
        let tokens = line["reasoning_tokens"].as_u64().unwrap();
        assert!(tokens > 0 && tokens <= line["generated_tokens"].as_u64().unwrap());
        thinking_tokens += tokens;
    }
    assert!(closed >= SUMS.len() / 2, "the examples teach it: {raw:?}");
    let answers: Vec<_> = lines.iter().map(|l| l["extracted"].clone()).collect();
    let from_raw: Vec<_> = raw
        .iter()
        .map(|l| json!(first_number(l["text"].as_str().unwrap())))
        .collect();
    assert_ne!(
        answers, from_raw,
        "the thinking's numbers are not the answers"
    );
    assert_eq!(report["reasoning_tokens"], thinking_tokens);
    let right = lines.iter().filter(|l| l["correct"] == true).count();
    assert_eq!(report["exact_match_records"], right);

    let cut = ["--max-new-tokens", "3", "--reasoning-parser"];
    let with = |parser: &'static str| [&cut[..], &[parser]].concat();
    let (r1, _) = generate(dir.path(), "cut-r1", &prompt, &with("deepseek_r1"));
    let (qwen3, report) = generate(dir.path(), "cut-qwen3", &prompt, &with("qwen3"));
    for (r1, qwen3) in r1.iter().zip(&qwen3) {
        assert_eq!(
            (&r1["text"], &r1["reasoning_tokens"]),
            (&json!(""), &json!(3))
        );
        assert_eq!(
            qwen3["text"], r1["reasoning"],
            "qwen3: no </think>, no reasoning"
        );
        assert!(qwen3.get("reasoning").is_none() && qwen3.get("reasoning_tokens").is_none());
    }
    assert!(report.get("reasoning_tokens").is_none(), "{report}");

    let sampled = ["-n", "3", "--temperature", "0.8", "--max-new-tokens", "24"];
    let sampled = [
        &sampled[..],
        &["--stop", "\n", "--reasoning-parser", "deepseek_r1"],
    ]
    .concat();
    let (lines, _) = generate(dir.path(), "sampled", &prompt, &sampled);
    for line in &lines {
        let choices = line["choices"].as_array().unwrap();
        assert_eq!(choices.len(), 3);
        assert_eq!(
            (&choices[0]["text"], &choices[0]["reasoning"]),
            (&line["text"], &line["reasoning"])
        );
        for choice in choices {
            assert!(choice["reasoning"].is_string(), "{choice}");
            assert!(!choice["text"].as_str().unwrap().contains("</think>"));
        }
    }
}

/// Under a reasoning parser an output grammar holds the answer from `</think>` on and
/// leaves the thinking free: every answer matches the expression, the thinking does not,
/// and thinking first changes the answers (without the parser the grammar holds from the
/// first token, and the model answers at once). A prompt whose thinking is closed
/// already (Qwen3's `enable_thinking` false) is held from its first token. Parquet holds
/// the thinking in its own column.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_parser_the_grammar_holds_the_answer_and_leaves_the_thinking_free() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let prompt = thinking_prompt();
    let regex = r"The answer is [0-9]{1,2}\.";
    let answer = |text: &str| {
        let number = text.strip_prefix("The answer is ")?.strip_suffix('.')?;
        (number.len() <= 2 && number.chars().all(|c| c.is_ascii_digit())).then_some(())
    };
    let held = ["--guided-regex", regex, "--max-new-tokens", "40"];
    let parsed = [&held[..], &["--reasoning-parser", "deepseek_r1"]].concat();
    let (thought, _) = generate(
        dir.path(),
        "thought",
        &prompt,
        &[&parsed[..], &["--format", "parquet"]].concat(),
    );
    let (direct, _) = generate(dir.path(), "direct", &prompt, &held);
    for (thought, direct) in thought.iter().zip(&direct) {
        let text = thought["text"].as_str().unwrap();
        assert!(answer(text).is_some(), "{thought}");
        assert_eq!(thought["finish_reason"], "stop");
        let reasoning = thought["reasoning"].as_str().unwrap();
        assert!(
            answer(reasoning).is_none() && !reasoning.is_empty(),
            "{thought}"
        );
        assert!(
            answer(direct["text"].as_str().unwrap()).is_some(),
            "{direct}"
        );
        assert!(direct.get("reasoning").is_none());
    }
    let texts = |lines: &[Value]| lines.iter().map(|l| l["text"].clone()).collect::<Vec<_>>();
    assert_ne!(
        texts(&thought),
        texts(&direct),
        "thinking first answers otherwise"
    );

    let closed = format!("{EXAMPLES}Q: {{text}}?\n<think></think>");
    let qwen3 = [&held[..], &["--reasoning-parser", "qwen3"]].concat();
    let (lines, _) = generate(dir.path(), "closed", &closed, &qwen3);
    for line in &lines {
        assert!(answer(line["text"].as_str().unwrap()).is_some(), "{line}");
        assert!(line.get("reasoning").is_none(), "{line}");
    }
}

/// An OpenAI Batch file through a chat template that opens the assistant's thinking (as
/// DeepSeek-R1's does): each message's `content` is the answer, `reasoning` and
/// `reasoning_content` the thinking, `usage.completion_tokens_details.reasoning_tokens`
/// its tokens; a parser by a name vLLM does not give is refused before any actor starts,
/// with the names there are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_output_carries_the_thinking_as_vllm_writes_it() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let template = format!(
        "{EXAMPLES}{{% for m in messages %}}{{% if m.role == 'user' %}}Q: {{{{ m.content }}}}?\n\
         {{% endif %}}{{% endfor %}}<think>"
    );
    let input = dir.path().join("batch.jsonl");
    let requests: Vec<Value> = (SUMS.iter().enumerate())
        .map(|(i, (sum, _))| {
            json!({"custom_id": format!("sum-{i}"), "method": "POST",
                "url": "/v1/chat/completions", "body": {"model": "smollm2",
                "messages": [{"role": "user", "content": sum}],
                "max_tokens": 24, "stop": ["\n"]}})
        })
        .collect();
    write_jsonl(&input, &requests);
    let out = dir.path().join("out");
    let flags = [
        "--input-format",
        "openai-batch",
        "--output-format",
        "openai-batch",
        "--chat-template",
        &template,
        "--reasoning-parser",
        "deepseek_r1",
    ];
    run_to_success(generate_command(&input, &out, "{text}", &flags));
    let lines = read_jsonl(&out.join("generations.jsonl"));
    assert_eq!(lines.len(), SUMS.len());
    for line in &lines {
        let body = &line["response"]["body"];
        let message = &body["choices"][0]["message"];
        let content = message["content"].as_str().unwrap();
        assert!(!content.contains("</think>"), "{line}");
        assert!(message["reasoning"].is_string(), "{line}");
        assert_eq!(message["reasoning_content"], message["reasoning"]);
        let details = &body["usage"]["completion_tokens_details"];
        let tokens = details["reasoning_tokens"].as_u64().unwrap();
        assert!(tokens > 0 && tokens <= body["usage"]["completion_tokens"].as_u64().unwrap());
    }
    let answered = lines
        .iter()
        .filter(|l| {
            l["response"]["body"]["choices"][0]["message"]["content"]
                .as_str()
                .is_some_and(|c| c.starts_with("A: "))
        })
        .count();
    assert!(answered >= SUMS.len() / 2, "{lines:?}");

    let refused = dir.path().join("refused");
    assert_refused(
        &input,
        &refused,
        &[(
            &["--reasoning-parser", "granite"],
            "[possible values: qwen3, deepseek_r1]",
        )],
    );
}
