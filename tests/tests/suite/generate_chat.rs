//! `resident generate` as chat and batch users run it, with the real `resident` binary and
//! the real SmolLM2 GGUF: a system message and conversations rendered by the model's own
//! chat template (checked against the same text fed raw) or by one given
//! (`--chat-template`), `--dry-run`, the sampling
//! controls on the command line, and an OpenAI Batch file of 50 lines (vLLM's own example
//! lines among them) answered in the Batch output format, in input order, across a kill -9
//! of the CLI and a rerun.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use resident_tests::{
    assert_refused, finished_chunks, generate_command, init_logging, read_json, read_jsonl,
    run_to_success, wait_until, wiki_sample_lines, write_jsonl,
};
use serde_json::{Value, json};

const SYSTEM: &str = "You are a pirate. Answer every question in pirate speech.";
const QUESTION: &str = "What is the capital of France?";

/// `--system` puts a system turn before each text record's user turn, where the template
/// had its default one; a `messages` record is rendered as it is (its own system message,
/// a last assistant turn continued). The completions equal those of the same prompts
/// rendered by hand in ChatML and fed raw (`--template none`), token for token; the system
/// message changes the answer; `--dry-run` prints those prompts and runs nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_system_message_and_conversations_render_as_the_models_template_says() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("chat.jsonl");
    write_jsonl(
        &input,
        &[
            json!({"id": "text", "text": QUESTION}),
            json!({"id": "conversation", "messages": [
                {"role": "system", "content": "Answer with one word."},
                {"role": "user", "content": "Name a colour."},
            ]}),
            json!({"id": "prefill", "messages": [
                {"role": "user", "content": QUESTION},
                {"role": "assistant", "content": "The capital of France is"},
            ]}),
        ],
    );
    let flags = ["--max-new-tokens", "12", "--system", SYSTEM];

    // The dry run shows each prompt as rendered, with its token count, and runs nothing.
    let out = dir.path().join("dry");
    let mut dry = generate_command(&input, &out, "{text}", &flags);
    dry.args(["--dry-run", "3"]);
    let (shown, _) = run_to_success(dry);
    assert!(!out.exists(), "a dry run writes no output");
    let expected_text = format!(
        "<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n"
    );
    assert!(shown.contains(&expected_text), "{shown}");
    assert!(
        shown.contains("<|im_start|>system\nAnswer with one word.<|im_end|>"),
        "{shown}"
    );
    assert!(
        shown.contains("<|im_start|>assistant\nThe capital of France is\n=== "),
        "the prefill is left open: {shown}"
    );
    assert_eq!(shown.matches(" prompt tokens").count(), 3, "{shown}");

    let with_system = dir.path().join("with");
    run_to_success(generate_command(&input, &with_system, "{text}", &flags));
    let without = dir.path().join("without");
    run_to_success(generate_command(
        &input,
        &without,
        "{text}",
        &["--max-new-tokens", "12"],
    ));
    let with_lines = read_jsonl(&with_system.join("generations.jsonl"));
    let without_lines = read_jsonl(&without.join("generations.jsonl"));
    assert_ne!(
        with_lines[0]["text"], without_lines[0]["text"],
        "the system message changes the answer"
    );
    assert_eq!(
        with_lines[1..],
        without_lines[1..],
        "--system leaves conversations alone"
    );

    // The same prompts rendered by hand, fed as they are.
    let raw_input = dir.path().join("raw.jsonl");
    write_jsonl(
        &raw_input,
        &[
            json!({"id": "text", "text": expected_text}),
            json!({"id": "conversation", "text": "<|im_start|>system\nAnswer with one word.<|im_end|>\n<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\n"}),
            json!({"id": "prefill", "text": format!("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\nThe capital of France is")}),
        ],
    );
    let raw = dir.path().join("raw");
    run_to_success(generate_command(
        &raw_input,
        &raw,
        "{text}",
        &["--max-new-tokens", "12", "--template", "none"],
    ));
    let raw_lines = read_jsonl(&raw.join("generations.jsonl"));
    for (chat, raw) in with_lines.iter().zip(&raw_lines) {
        assert_eq!(chat["text"], raw["text"], "{chat} / {raw}");
        assert_eq!(
            chat["prompt_tokens"], raw["prompt_tokens"],
            "{chat} / {raw}"
        );
    }
}

/// `--chat-template` (a file, or the template itself) renders text records and
/// conversations in place of the model's own template: the completions equal those of the
/// same prompts rendered by hand and fed raw, token for token, and `--dry-run` shows them;
/// a template that does not compile, or a value that is neither a file nor a template, is
/// refused before anything runs, saying what to give.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_template_given_renders_in_place_of_the_model_s_own() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("chat.jsonl");
    write_jsonl(
        &input,
        &[
            json!({"id": "text", "text": QUESTION}),
            json!({"id": "conversation", "messages": [
                {"role": "system", "content": "Answer with one word."},
                {"role": "user", "content": "Name a colour."},
            ]}),
        ],
    );
    let template = "{% for m in messages %}### {{ m.role | upper }}:\n{{ m.content }}\n\
                    {% endfor %}{% if add_generation_prompt %}### ASSISTANT:\n{% endif %}";
    let file = dir.path().join("template.jinja");
    std::fs::write(&file, template).unwrap();
    let flags = ["--max-new-tokens", "12", "--system", SYSTEM];
    let expected_text = format!("### SYSTEM:\n{SYSTEM}\n### USER:\n{QUESTION}\n### ASSISTANT:\n");
    let expected_conversation =
        "### SYSTEM:\nAnswer with one word.\n### USER:\nName a colour.\n### ASSISTANT:\n";
    let mut lines = Vec::new();
    for (name, given) in [("file", file.to_str().unwrap()), ("inline", template)] {
        let with = [&flags[..], &["--chat-template", given]].concat();
        let mut dry = generate_command(&input, &dir.path().join("dry"), "{text}", &with);
        dry.args(["--dry-run", "2"]);
        let (shown, _) = run_to_success(dry);
        assert!(shown.contains(&expected_text), "{shown}");
        assert!(shown.contains(expected_conversation), "{shown}");
        let out = dir.path().join(name);
        run_to_success(generate_command(&input, &out, "{text}", &with));
        lines.push(read_jsonl(&out.join("generations.jsonl")));
    }
    assert_eq!(lines[0], lines[1]);
    let raw_input = dir.path().join("raw.jsonl");
    write_jsonl(
        &raw_input,
        &[
            json!({"id": "text", "text": expected_text}),
            json!({"id": "conversation", "text": expected_conversation}),
        ],
    );
    let raw = dir.path().join("raw");
    let raw_flags = ["--max-new-tokens", "12", "--template", "none"];
    run_to_success(generate_command(&raw_input, &raw, "{text}", &raw_flags));
    let raw_lines = read_jsonl(&raw.join("generations.jsonl"));
    for (chat, raw) in lines[0].iter().zip(&raw_lines) {
        assert_eq!(chat["text"], raw["text"], "{chat} / {raw}");
        assert_eq!(
            chat["prompt_tokens"], raw["prompt_tokens"],
            "{chat} / {raw}"
        );
    }

    let cases: [(&[&str], &str); 2] = [
        (
            &["--chat-template", "{% for m in messages %}"],
            "--chat-template does not compile: syntax error",
        ),
        (
            &["--chat-template", "template.jinja"],
            "is neither a file nor a Jinja template",
        ),
    ];
    assert_refused(&input, &dir.path().join("refused"), &cases);
}

/// A template in the manner of the reasoning models' (Python string methods, a namespace,
/// a reversed list, `continue`: what Qwen3's and DeepSeek-R1's distills' call) renders,
/// and `--chat-template-kwargs '{"enable_thinking": false}'` reaches it: the prompt ends in
/// an empty think block, and the completions equal those of the prompts rendered by hand
/// and fed raw. Other kwargs are another job (refused under the same output); kwargs that
/// are not a JSON object, or name a variable the renderer sets, are refused before
/// anything runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_template_kwargs_reach_a_reasoning_model_s_template() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("chat.jsonl");
    write_jsonl(&input, &[json!({"id": "q", "text": QUESTION})]);
    let template = resident_tests::repo_root().join("tests/fixtures/reasoning_chat_template.jinja");
    let thinking_off = r#"{"enable_thinking": false}"#;
    let flags = [
        "--max-new-tokens",
        "12",
        "--system",
        SYSTEM,
        "--chat-template",
        template.to_str().unwrap(),
    ];
    let asked = format!(
        "<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{QUESTION}<|im_end|>\n\
         <|im_start|>assistant\n"
    );
    let expected = format!("{asked}<think>\n\n</think>\n\n");
    let with_kwargs = [&flags[..], &["--chat-template-kwargs", thinking_off]].concat();
    for (given, prompt) in [(&flags[..], &asked), (&with_kwargs[..], &expected)] {
        let mut dry = generate_command(&input, &dir.path().join("dry"), "{text}", given);
        dry.args(["--dry-run", "1"]);
        let (shown, _) = run_to_success(dry);
        assert!(shown.contains(prompt.as_str()), "{shown}");
    }

    let out = dir.path().join("off");
    run_to_success(generate_command(&input, &out, "{text}", &with_kwargs));
    let chat = read_jsonl(&out.join("generations.jsonl"));
    let raw_input = dir.path().join("raw.jsonl");
    write_jsonl(&raw_input, &[json!({"id": "q", "text": expected})]);
    let raw = dir.path().join("raw");
    let raw_flags = ["--max-new-tokens", "12", "--template", "none"];
    run_to_success(generate_command(&raw_input, &raw, "{text}", &raw_flags));
    let raw_lines = read_jsonl(&raw.join("generations.jsonl"));
    assert_eq!(
        chat[0]["text"], raw_lines[0]["text"],
        "{chat:?} / {raw_lines:?}"
    );
    assert_eq!(chat[0]["prompt_tokens"], raw_lines[0]["prompt_tokens"]);

    let thinking_on = [
        &flags[..],
        &["--chat-template-kwargs", r#"{"enable_thinking": true}"#],
    ]
    .concat();
    let output = generate_command(&input, &out, "{text}", &thinking_on)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "other kwargs resumed another job's output"
    );
    assert!(stderr.contains("from a different"), "{stderr}");

    let with = |kwargs| [&flags[..], &["--chat-template-kwargs", kwargs]].concat();
    let (not_an_object, renderer_s) = (with("[1, 2]"), with(r#"{"messages": []}"#));
    let cases: [(&[&str], &str); 2] = [
        (&not_an_object, "is not a JSON object"),
        (
            &renderer_s,
            "chat_template_kwargs (--chat-template-kwargs) cannot set `messages`",
        ),
    ];
    assert_refused(&input, &dir.path().join("refused"), &cases);
}

/// The sampling flags reach the model: `-n 3` gives three choices (the first the seeded
/// single completion), `--logprobs --top-logprobs 2` a log-probability per token with the
/// chosen token first at temperature 0, `--min-tokens` outlasts the end token, a penalty
/// changes a greedy text, `--json-schema` makes every text parse as the schema's JSON, and
/// bad values are refused naming the flag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sampling_flags_reach_the_model_and_bad_values_are_refused() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("q.jsonl");
    write_jsonl(
        &input,
        &[
            json!({"id": "a", "text": "Write the word 'data' eight times."}),
            json!({"id": "b", "text": "Answer with one word only: what colour is the sky?"}),
        ],
    );
    let run = |name: &str, flags: &[&str]| {
        let out = dir.path().join(name);
        let mut all = vec!["--max-new-tokens", "16"];
        all.extend_from_slice(flags);
        run_to_success(generate_command(&input, &out, "{text}", &all));
        read_jsonl(&out.join("generations.jsonl"))
    };
    let sampled = ["--temperature", "0.9", "--seed", "3"];
    let single = run("single", &sampled);
    let mut three_flags = sampled.to_vec();
    three_flags.extend(["-n", "3"]);
    let three = run("three", &three_flags);
    for (one, many) in single.iter().zip(&three) {
        let choices = many["choices"].as_array().expect("choices with -n 3");
        assert_eq!(choices.len(), 3);
        assert_eq!(choices[0]["text"], one["text"], "{many}");
        assert_eq!(many["text"], one["text"]);
        assert!(
            choices[1]["text"] != choices[0]["text"] || choices[2]["text"] != choices[0]["text"]
        );
    }

    let greedy = run("greedy", &[]);
    let logprobs = run("logprobs", &["--logprobs", "--top-logprobs", "2"]);
    for (plain, with) in greedy.iter().zip(&logprobs) {
        assert_eq!(plain["text"], with["text"]);
        let steps = with["logprobs"].as_array().expect("logprobs");
        assert!(steps.len() >= with["generated_tokens"].as_u64().unwrap() as usize);
        for step in steps {
            let top = step["top_logprobs"].as_array().unwrap();
            assert_eq!(top.len(), 2, "{step}");
            assert_eq!(top[0]["token"], step["token"], "greedy takes the likeliest");
            assert!(step["logprob"].as_f64().unwrap() <= 0.0);
        }
    }
    let sky = &greedy[1];
    // `--min-tokens` below needs an answer that stops by itself within 16 tokens: the
    // question is worded for it (greedy, this model: "The sky is a shade of blue.").
    assert_eq!(sky["finish_reason"], "stop", "{sky}");
    let at_least = sky["generated_tokens"].as_u64().unwrap() + 4;
    let longer = run("min-tokens", &["--min-tokens", &at_least.to_string()]);
    assert!(
        longer[1]["generated_tokens"].as_u64().unwrap() >= at_least,
        "{}",
        longer[1]
    );
    let penalised = run(
        "penalised",
        &["--repetition-penalty", "1.5", "--frequency-penalty", "1"],
    );
    assert_ne!(penalised[0]["text"], greedy[0]["text"]);
    let schema = dir.path().join("schema.json");
    std::fs::write(
        &schema,
        json!({"type": "object", "properties": {"answer": {"type": "string", "maxLength": 40},
               "confident": {"type": "boolean"}}, "required": ["answer", "confident"],
               "additionalProperties": false})
        .to_string(),
    )
    .unwrap();
    let structured_out = dir.path().join("structured");
    run_to_success(generate_command(
        &input,
        &structured_out,
        "{text}",
        &[
            "--json-schema",
            schema.to_str().unwrap(),
            "--max-new-tokens",
            "48",
        ],
    ));
    for line in &read_jsonl(&structured_out.join("generations.jsonl")) {
        let value: Value = serde_json::from_str(line["text"].as_str().unwrap()).expect("JSON");
        assert!(
            value["answer"].is_string() && value["confident"].is_boolean(),
            "{value}"
        );
        assert_eq!(value.as_object().unwrap().len(), 2, "{value}");
    }

    let cases: [(&[&str], &str); 4] = [
        (&["--min-p", "1.5"], "--min-p must be between 0 and 1"),
        (
            &["--presence-penalty", "3"],
            "--presence-penalty must be between -2 and 2",
        ),
        (&["-n", "0"], "--n must be between 1 and 16"),
        (&["--top-logprobs", "3"], "--top-logprobs needs --logprobs"),
    ];
    assert_refused(&input, &dir.path().join("refused"), &cases);
}

/// The shards' bytes by file.
fn shard_bytes(out: &Path) -> BTreeMap<String, Vec<u8>> {
    finished_chunks(out)
        .iter()
        .map(|entry| {
            let file = entry.vectors_file.clone();
            let bytes = std::fs::read(out.join(&file)).unwrap();
            (file, bytes)
        })
        .collect()
}

/// 50 OpenAI Batch lines: vLLM's two example lines as they are, 43 summaries of real
/// articles, lines with their own `n`, `logprobs`, `seed`, `temperature` and JSON schema
/// `response_format`, and two invalid requests. The CLI is killed with SIGKILL mid-job;
/// the rerun keeps every finished shard and writes one Batch output line per input line,
/// custom_ids in input order, the invalid requests as errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openai_batch_file_round_trips_in_order_across_a_kill_9() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("batch.jsonl");
    let mut requests = vec![
        json!({"custom_id": "request-1", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "meta-llama/Meta-Llama-3-8B-Instruct", "messages": [{"role": "system", "content": "You are a helpful assistant."},{"role": "user", "content": "Hello world!"}],"max_completion_tokens": 8}}),
        json!({"custom_id": "request-2", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "meta-llama/Meta-Llama-3-8B-Instruct", "messages": [{"role": "system", "content": "You are an unhelpful assistant."},{"role": "user", "content": "Hello world!"}],"max_completion_tokens": 8}}),
    ];
    for (i, line) in wiki_sample_lines(43).iter().enumerate() {
        let record: Value = serde_json::from_str(line).unwrap();
        let text: String = record["text"].as_str().unwrap().chars().take(600).collect();
        requests.push(json!({
            "custom_id": format!("doc-{i:02}"), "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "smollm2", "max_tokens": 6, "messages": [
                {"role": "system", "content": "Summarise the user's text in one sentence."},
                {"role": "user", "content": text},
            ]},
        }));
    }
    let chat = |id: &str, extra: Value| {
        let mut body =
            json!({"messages": [{"role": "user", "content": "Name a fruit."}], "max_tokens": 6});
        for (key, value) in extra.as_object().unwrap() {
            body[key] = value.clone();
        }
        json!({"custom_id": id, "method": "POST", "url": "/v1/chat/completions", "body": body})
    };
    requests.push(chat(
        "two-choices",
        json!({"n": 2, "temperature": 1.0, "seed": 4}),
    ));
    requests.push(chat(
        "logprobs",
        json!({"logprobs": true, "top_logprobs": 3}),
    ));
    requests.push(chat(
        "schema",
        json!({"max_tokens": 40, "response_format": {"type": "json_schema", "json_schema": {
            "name": "fruit", "schema": {"type": "object", "properties": {
                "fruit": {"type": "string", "maxLength": 12},
                "colour": {"enum": ["red", "green", "yellow", "orange"]}},
                "required": ["fruit", "colour"], "additionalProperties": false}}}}),
    ));
    requests.push(json!({"custom_id": "wrong-url", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}}));
    requests.push(chat("tools", json!({"tools": [{"type": "function"}]})));
    assert_eq!(requests.len(), 50);
    write_jsonl(&input, &requests);

    let out = dir.path().join("out");
    let flags = [
        "--input-format",
        "openai-batch",
        "--output-format",
        "openai-batch",
        "--chunk-size",
        "5",
    ];
    let mut child = generate_command(&input, &out, "{text}", &flags)
        .spawn()
        .unwrap();
    wait_until("the first shards", Duration::from_secs(180), || async {
        (finished_chunks(&out).len() >= 2).then_some(())
    })
    .await;
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let before = shard_bytes(&out);
    assert!(
        before.len() < 10,
        "killed before the end ({} of 10 chunks)",
        before.len()
    );

    run_to_success(generate_command(&input, &out, "{text}", &flags));
    let after = shard_bytes(&out);
    for (file, bytes) in &before {
        assert_eq!(Some(bytes), after.get(file), "{file} was rewritten");
    }
    let answers = read_jsonl(&out.join("generations.jsonl"));
    let ids: Vec<&Value> = answers.iter().map(|a| &a["custom_id"]).collect();
    let expected: Vec<&Value> = requests.iter().map(|r| &r["custom_id"]).collect();
    assert_eq!(ids, expected, "one answer per line, in input order");
    for answer in &answers {
        let id = answer["custom_id"].as_str().unwrap();
        assert!(answer["id"].as_str().unwrap().starts_with("batch_req_"));
        if id == "wrong-url" || id == "tools" {
            assert_eq!(answer["response"]["status_code"], 400, "{answer}");
            let message = answer["error"]["message"].as_str().unwrap();
            assert!(message.contains("not supported"), "{answer}");
            continue;
        }
        assert_eq!(answer["error"], Value::Null, "{answer}");
        assert_eq!(answer["response"]["status_code"], 200);
        let body = &answer["response"]["body"];
        assert_eq!(body["object"], "chat.completion");
        let choices = body["choices"].as_array().unwrap();
        let usage = &body["usage"];
        assert!(usage["prompt_tokens"].as_u64().unwrap() > 5, "{answer}");
        assert_eq!(
            usage["total_tokens"].as_u64().unwrap(),
            usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap()
        );
        let content = choices[0]["message"]["content"].as_str().unwrap();
        assert!(!content.is_empty(), "{answer}");
        let reason = choices[0]["finish_reason"].as_str().unwrap();
        assert!(reason == "stop" || reason == "length", "{answer}");
        match id {
            "two-choices" => assert_eq!(choices.len(), 2, "{answer}"),
            "logprobs" => {
                let steps = choices[0]["logprobs"]["content"].as_array().unwrap();
                assert!(!steps.is_empty());
                assert_eq!(steps[0]["top_logprobs"].as_array().unwrap().len(), 3);
            }
            "schema" => {
                let value: Value = serde_json::from_str(content).expect("JSON");
                assert!(value["fruit"].is_string(), "{value}");
                let colour = value["colour"].as_str().unwrap();
                assert!(
                    ["red", "green", "yellow", "orange"].contains(&colour),
                    "{value}"
                );
            }
            _ => {
                assert_eq!(choices.len(), 1);
                assert_eq!(choices[0]["logprobs"], Value::Null);
                assert!(
                    usage["completion_tokens"].as_u64().unwrap() <= 8,
                    "{answer}"
                );
            }
        }
    }
    let report = read_json(&out.join("report.json"));
    assert_eq!(report["items"], 50);
}
