//! The OpenAI Batch output format (`resident generate --output-format openai-batch`): one
//! line per input line, in input order, as OpenAI's Batch API and `vllm run-batch` write
//! them: `{"id", "custom_id", "response": {"status_code", "request_id", "body":
//! <chat.completion>}, "error"}`; a request that could not run has `status_code` 400, no
//! body and an `error` object.
//!
//! Ids are derived from the record's id, not drawn at random, so a resumed job's lines read
//! as the first run would have written them (only `created` tells the runs apart).

use resident_actor::generate::{Choice, Completion, TokenLogprob};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// The Batch output line answering the record `id`.
pub fn output_line(id: &Value, completion: &Completion, model: &str, created: u64) -> Value {
    let custom_id = match id {
        Value::String(id) => id.clone(),
        other => other.to_string(),
    };
    let digest = hex::encode(&Sha256::digest(custom_id.as_bytes())[..12]);
    let request_id = format!("req_{digest}");
    let (response, error) = match &completion.error {
        Some(message) => (
            json!({"status_code": 400, "request_id": request_id, "body": null}),
            json!({"code": "invalid_request", "message": message}),
        ),
        None => (
            json!({
                "status_code": 200,
                "request_id": request_id,
                "body": completion_body(completion, model, created, &digest),
            }),
            Value::Null,
        ),
    };
    json!({
        "id": format!("batch_req_{digest}"),
        "custom_id": custom_id,
        "response": response,
        "error": error,
    })
}

/// A `chat.completion` object.
fn completion_body(completion: &Completion, model: &str, created: u64, digest: &str) -> Value {
    // Each choice cloned once (its text, its thinking and its log-probabilities).
    let all = completion.choices();
    let choices: Vec<Value> = (all.iter().enumerate())
        .map(|(index, choice)| choice_object(index, choice))
        .collect();
    let completion_tokens = completion.all_generated_tokens();
    let prompt_tokens = u64::from(completion.prompt_tokens);
    let mut usage = json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    });
    if all.iter().any(|c| c.reasoning.is_some()) {
        let reasoning_tokens: u64 = all.iter().map(|c| u64::from(c.reasoning_tokens)).sum();
        usage["completion_tokens_details"] = json!({"reasoning_tokens": reasoning_tokens});
    }
    json!({
        "id": format!("chatcmpl-{digest}"),
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage,
    })
}

fn choice_object(index: usize, choice: &Choice) -> Value {
    let logprobs = choice
        .logprobs
        .as_ref()
        .map(|tokens| json!({"content": tokens.iter().map(token_object).collect::<Vec<_>>()}));
    let mut message = json!({"role": "assistant", "content": choice.text});
    if let Some(reasoning) = &choice.reasoning {
        // vLLM writes the thinking under both names: `reasoning` now, `reasoning_content`
        // (DeepSeek's API's name) before.
        message["reasoning"] = reasoning.as_str().into();
        message["reasoning_content"] = reasoning.as_str().into();
    }
    json!({
        "index": index,
        "message": message,
        "logprobs": logprobs,
        "finish_reason": choice.finish_reason.as_str(),
    })
}

fn token_object(token: &TokenLogprob) -> Value {
    json!({
        "token": token.token,
        "logprob": token.logprob,
        "bytes": token.bytes,
        "top_logprobs": token.top_logprobs.iter().map(|top| json!({
            "token": top.token,
            "logprob": top.logprob,
            "bytes": top.bytes,
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use resident_actor::generate::{FinishReason, TopLogprob};

    use super::*;

    fn completion() -> Completion {
        Completion {
            id: "r1".into(),
            text: "Hi there".into(),
            prompt_tokens: 12,
            generated_tokens: 3,
            finish_reason: FinishReason::Stop,
            truncated: false,
            logprobs: None,
            more: vec![Choice {
                text: "Hello".into(),
                generated_tokens: 2,
                finish_reason: FinishReason::Length,
                logprobs: None,
                reasoning: None,
                reasoning_tokens: 0,
            }],
            error: None,
            score: None,
            choice_scores: None,
            reasoning: None,
            reasoning_tokens: 0,
        }
    }

    #[test]
    fn an_answer_has_choices_in_order_and_usage_over_them_all() {
        let line = output_line(&json!("r1"), &completion(), "smollm2", 7);
        assert_eq!(line["custom_id"], "r1");
        assert_eq!(line["error"], Value::Null);
        assert_eq!(line["response"]["status_code"], 200);
        let body = &line["response"]["body"];
        assert_eq!(body["object"], "chat.completion");
        assert_eq!(body["model"], "smollm2");
        assert_eq!(body["choices"][0]["message"]["content"], "Hi there");
        assert_eq!(body["choices"][0]["finish_reason"], "stop");
        assert_eq!(body["choices"][1]["index"], 1);
        assert_eq!(body["choices"][1]["finish_reason"], "length");
        assert_eq!(
            body["usage"],
            json!({"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17})
        );
        // The same record gets the same ids in any run.
        assert_eq!(
            line["id"],
            output_line(&json!("r1"), &completion(), "m", 9)["id"]
        );
        assert_ne!(
            line["id"],
            output_line(&json!("r2"), &completion(), "m", 9)["id"]
        );
    }

    /// A completion with thinking (`--reasoning-parser`): the message's content is the
    /// answer, the thinking is under vLLM's names, and usage counts its tokens as OpenAI's
    /// `reasoning_tokens`; without thinking neither appears.
    #[test]
    fn thinking_is_the_message_s_reasoning_and_its_tokens_are_in_usage() {
        let mut thought = completion();
        thought.reasoning = Some("Greet back.".into());
        thought.reasoning_tokens = 2;
        let line = output_line(&json!("r1"), &thought, "m", 0);
        let body = &line["response"]["body"];
        let message = &body["choices"][0]["message"];
        assert_eq!(message["content"], "Hi there");
        assert_eq!(
            (&message["reasoning"], &message["reasoning_content"]),
            (&json!("Greet back."), &json!("Greet back."))
        );
        assert!(body["choices"][1]["message"].get("reasoning").is_none());
        assert_eq!(
            body["usage"]["completion_tokens_details"],
            json!({"reasoning_tokens": 2})
        );
        let plain = output_line(&json!("r1"), &completion(), "m", 0);
        let body = &plain["response"]["body"];
        assert!(body["usage"].get("completion_tokens_details").is_none());
        assert!(
            body["choices"][0]["message"]
                .get("reasoning_content")
                .is_none()
        );
    }

    #[test]
    fn logprobs_and_errors_are_spelled_as_openai_spells_them() {
        let mut with_logprobs = completion();
        with_logprobs.logprobs = Some(vec![TokenLogprob {
            token: "Hi".into(),
            logprob: -0.5,
            bytes: b"Hi".to_vec(),
            top_logprobs: vec![TopLogprob {
                token: "Hi".into(),
                logprob: -0.5,
                bytes: b"Hi".to_vec(),
            }],
        }]);
        let line = output_line(&json!("r1"), &with_logprobs, "m", 0);
        let content = &line["response"]["body"]["choices"][0]["logprobs"]["content"];
        assert_eq!(content[0]["token"], "Hi");
        assert_eq!(content[0]["bytes"], json!([72, 105]));
        assert_eq!(content[0]["top_logprobs"][0]["logprob"], -0.5);
        assert_eq!(
            line["response"]["body"]["choices"][1]["logprobs"],
            Value::Null
        );

        let mut failed = completion();
        failed.error = Some("`tools` is not supported".into());
        let line = output_line(&json!(5), &failed, "m", 0);
        assert_eq!(line["custom_id"], "5");
        assert_eq!(line["response"]["status_code"], 400);
        assert_eq!(line["response"]["body"], Value::Null);
        assert_eq!(line["error"]["message"], "`tools` is not supported");
    }
}
