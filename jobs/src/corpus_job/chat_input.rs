//! A generate job's records as conversations: a JSONL record's `messages` (OpenAI's
//! role/content list), or a line of an OpenAI Batch file (`custom_id`, `method`, `url`,
//! `body` with `messages` and the request's parameters). Pure: JSON in, a [`ChatRecord`] or
//! the reason out.
//!
//! A Batch line that names its `custom_id` is always answered, in its place in the output:
//! when its request is wrong (an unsupported URL, a bad parameter), the record carries the
//! error and the output line says it. A line without a `custom_id` cannot be answered and is
//! a bad record, as a malformed line of any corpus is.

use resident_actor::generate::{ChatMessage, ParamsOverride, ResponseFormat};
use serde_json::{Map, Value};

/// How a generate job reads its records' prompts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PromptInput {
    /// The text field only (embedding jobs).
    #[default]
    Text,
    /// The text field, or a `messages` list in its place.
    TextOrMessages,
    /// OpenAI Batch lines: `custom_id` is the id, `body.messages` the conversation.
    OpenAiBatch,
}

/// A record's conversation and its own decoding parameters.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChatRecord {
    /// The turns, in order.
    pub messages: Vec<ChatMessage>,
    /// The record's own decoding parameters, over the job's.
    pub params: Option<ParamsOverride>,
    /// Why the record's request cannot run: it is answered with this error.
    pub error: Option<String>,
    /// The request's `chat_template_kwargs` (vLLM's), which must be the job's: a job
    /// renders every request with one set.
    pub template_kwargs: Option<Map<String, Value>>,
}

/// The URL of the requests a Batch file may hold.
pub const CHAT_COMPLETIONS_URL: &str = "/v1/chat/completions";

/// The roles a message may have.
const ROLES: &[&str] = &["system", "user", "assistant", "developer"];

/// A `messages` value: a non-empty list of `{role, content}` objects, `content` a string or
/// a list of text parts (`{"type": "text", "text": ...}`, joined by newlines, as OpenAI's
/// chat API reads them). OpenAI's `developer` role is read as `system`.
pub fn parse_messages(value: &Value) -> Result<Vec<ChatMessage>, String> {
    let list = value
        .as_array()
        .filter(|list| !list.is_empty())
        .ok_or("`messages` must be a non-empty list of {\"role\", \"content\"} objects")?;
    list.iter()
        .enumerate()
        .map(|(index, message)| {
            let at = |what: &str| format!("messages[{index}]: {what}");
            let object = message
                .as_object()
                .ok_or_else(|| at("not an object with `role` and `content`"))?;
            let role = object
                .get("role")
                .and_then(Value::as_str)
                .filter(|role| ROLES.contains(role))
                .ok_or_else(|| at("`role` must be one of system, user, assistant"))?;
            let content = match object.get("content") {
                Some(Value::String(text)) => text.clone(),
                Some(Value::Array(parts)) => text_parts(parts).map_err(|e| at(&e))?,
                _ => return Err(at("`content` must be a string or a list of text parts")),
            };
            let role = if role == "developer" { "system" } else { role };
            Ok(ChatMessage::new(role, &content))
        })
        .collect()
}

fn text_parts(parts: &[Value]) -> Result<String, String> {
    let texts = parts
        .iter()
        .map(
            |part| match (part.get("type").and_then(Value::as_str), part.get("text")) {
                (Some("text"), Some(Value::String(text))) => Ok(text.as_str()),
                (Some(other), _) => Err(format!(
                    "a content part of type `{other}`; only text parts can be read"
                )),
                _ => Err("a content part without `type` and `text`".to_owned()),
            },
        )
        .collect::<Result<Vec<_>, _>>()?;
    Ok(texts.join("\n"))
}

/// One Batch line's `custom_id` and record; `Err` when the line has no `custom_id` (it
/// cannot be answered).
pub fn parse_batch_line(object: &Map<String, Value>) -> Result<(Value, ChatRecord), String> {
    let custom_id = match object.get("custom_id") {
        Some(Value::String(id)) if !id.is_empty() => Value::String(id.clone()),
        Some(_) => return Err("`custom_id` must be a non-empty string".into()),
        None => return Err("missing `custom_id` (an OpenAI batch line needs one)".into()),
    };
    let record = match batch_request(object) {
        Ok(record) => record,
        Err(error) => ChatRecord {
            error: Some(error),
            ..ChatRecord::default()
        },
    };
    Ok((custom_id, record))
}

fn batch_request(object: &Map<String, Value>) -> Result<ChatRecord, String> {
    let method = object
        .get("method")
        .and_then(Value::as_str)
        .unwrap_or("POST");
    if !method.eq_ignore_ascii_case("POST") {
        return Err(format!("method `{method}` is not POST"));
    }
    match object.get("url").and_then(Value::as_str) {
        Some(CHAT_COMPLETIONS_URL) => {}
        Some(url) => {
            return Err(format!(
                "url `{url}` is not supported; resident generate answers {CHAT_COMPLETIONS_URL}"
            ));
        }
        None => return Err(format!("missing `url` ({CHAT_COMPLETIONS_URL})")),
    }
    let body = object
        .get("body")
        .and_then(Value::as_object)
        .ok_or("missing `body` (the chat completion request)")?;
    let messages = parse_messages(body.get("messages").unwrap_or(&Value::Null))?;
    let mut body = body.clone();
    let template_kwargs = match body.remove("chat_template_kwargs") {
        None | Some(Value::Null) => None,
        Some(Value::Object(kwargs)) => Some(kwargs),
        Some(_) => return Err("`chat_template_kwargs` must be an object".into()),
    };
    let params = parse_params(&body)?;
    Ok(ChatRecord {
        messages,
        params: Some(params),
        error: None,
        template_kwargs,
    })
}

/// Parameters an OpenAI (or vLLM) chat completion request may carry that change nothing
/// here: read and left alone.
const IGNORED: &[&str] = &[
    "model",
    "messages",
    "user",
    "stream",
    "stream_options",
    "store",
    "metadata",
    "service_tier",
    "parallel_tool_calls",
    "reasoning_effort",
    // vLLM's choice of grammar engine for a `guided_*` constraint: the constraint is the
    // same whichever engine masks it (here always llguidance).
    "guided_decoding_backend",
];

/// A request body's decoding parameters, by OpenAI's names (`max_tokens` or
/// `max_completion_tokens`, `stop` as a string or a list) and vLLM's extra ones. A parameter
/// that would change the answer and is not honoured here is an error, never dropped.
pub fn parse_params(body: &Map<String, Value>) -> Result<ParamsOverride, String> {
    let mut over = ParamsOverride::default();
    for (key, value) in body {
        if value.is_null() || IGNORED.contains(&key.as_str()) {
            continue;
        }
        apply_param(&mut over, key, value)?;
    }
    if over.top_logprobs.is_some_and(|n| n > 0) && over.logprobs != Some(true) {
        return Err("`top_logprobs` needs `logprobs: true`".into());
    }
    Ok(over)
}

/// Sets the parameter `key` of `over` from `value`.
fn apply_param(over: &mut ParamsOverride, key: &str, value: &Value) -> Result<(), String> {
    let number = || number_param(key, value);
    let count = || count_param(key, value);
    let flag = || {
        value
            .as_bool()
            .ok_or_else(|| format!("`{key}` must be true or false"))
    };
    match key {
        "max_tokens" | "max_completion_tokens" => over.max_new_tokens = Some(count()?),
        "temperature" => over.temperature = Some(number()?),
        "top_p" => over.top_p = Some(number()?),
        "top_k" => {
            // vLLM's -1 (or 0) keeps every token.
            let k = value.as_i64().ok_or("`top_k` must be a whole number")?;
            over.top_k = Some(u32::try_from(k.max(0)).map_err(|_| "`top_k` is too large")?);
        }
        "min_p" => over.min_p = Some(number()?),
        "seed" => {
            over.seed = Some(
                value
                    .as_u64()
                    .or_else(|| value.as_i64().map(|v| v as u64))
                    .ok_or("`seed` must be a whole number")?,
            )
        }
        "stop" => over.stop = Some(stop_param(value)?),
        "repetition_penalty" => over.repetition_penalty = Some(number()?),
        "presence_penalty" => over.presence_penalty = Some(number()?),
        "frequency_penalty" => over.frequency_penalty = Some(number()?),
        "min_tokens" => over.min_tokens = Some(count()?),
        "stop_token_ids" => {
            over.stop_token_ids = Some(
                value
                    .as_array()
                    .and_then(|ids| {
                        ids.iter()
                            .map(|id| id.as_u64().and_then(|id| u32::try_from(id).ok()))
                            .collect::<Option<_>>()
                    })
                    .ok_or("`stop_token_ids` must be a list of token ids")?,
            )
        }
        "n" => over.n = Some(count()?),
        "logprobs" => over.logprobs = Some(flag()?),
        "top_logprobs" => over.top_logprobs = Some(count()?),
        "ignore_eos" => over.ignore_eos = Some(flag()?),
        "response_format" | "guided_json" | "guided_regex" | "guided_choice" | "guided_grammar"
        | "structured_outputs" => {
            if over.response_format.is_some() {
                return Err(format!(
                    "`{key}` is a second output constraint; give one of response_format, \
                     guided_json, guided_regex, guided_choice, guided_grammar and \
                     structured_outputs"
                ));
            }
            over.response_format = Some(output_constraint(key, value)?);
        }
        "skip_special_tokens" | "spaces_between_special_tokens" if value == &Value::Bool(true) => {}
        "chat_template_kwargs" => {
            return Err(
                "a prompt's own `chat_template_kwargs` are not supported: the template's \
                 variables are the call's; give them to it (chat_template_kwargs= in Python, \
                 --chat-template-kwargs for a job)"
                    .into(),
            );
        }
        other => return Err(unsupported_param(other)),
    }
    Ok(())
}

/// A request's output constraint: OpenAI's `response_format`, vLLM's `guided_*`
/// parameters, or vLLM's newer `structured_outputs` object (`json`, `regex`, `choice`,
/// `grammar`, `json_object`).
fn output_constraint(key: &str, value: &Value) -> Result<ResponseFormat, String> {
    let text = || {
        value
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| format!("`{key}` must be a string"))
    };
    match key {
        "response_format" => serde_json::from_value(value.clone()).map_err(|e| {
            format!(
                "`response_format` must be {{\"type\": \"json_schema\", \
                 \"json_schema\": {{\"name\", \"schema\"}}}}, {{\"type\": \"json_object\"}}, \
                 {{\"type\": \"text\"}}, {{\"type\": \"regex\", \"regex\": ...}}, \
                 {{\"type\": \"choice\", \"choice\": [...]}} or \
                 {{\"type\": \"grammar\", \"grammar\": ...}}: {e}"
            )
        }),
        // vLLM's name for a JSON schema constraint: the schema, or its JSON text.
        "guided_json" => {
            let schema = match value {
                Value::String(text) => serde_json::from_str(text)
                    .map_err(|e| format!("`guided_json` is not JSON: {e}"))?,
                other => other.clone(),
            };
            Ok(ResponseFormat::schema(schema))
        }
        "guided_regex" => Ok(ResponseFormat::Regex { regex: text()? }),
        "guided_grammar" => Ok(ResponseFormat::Grammar { grammar: text()? }),
        "guided_choice" => {
            let choice = value
                .as_array()
                .and_then(|texts| {
                    texts
                        .iter()
                        .map(|t| t.as_str().map(str::to_owned))
                        .collect::<Option<Vec<_>>>()
                })
                .ok_or("`guided_choice` must be a list of strings")?;
            Ok(ResponseFormat::Choice { choice })
        }
        _ => structured_outputs(value),
    }
}

/// vLLM's `structured_outputs` object: exactly one of `json`, `regex`, `choice`,
/// `grammar` and `json_object: true`.
fn structured_outputs(value: &Value) -> Result<ResponseFormat, String> {
    const KEYS: &str = "json, regex, choice, grammar or json_object";
    let object = value
        .as_object()
        .ok_or_else(|| format!("`structured_outputs` must be an object with one of {KEYS}"))?;
    let set: Vec<(&String, &Value)> = object.iter().filter(|(_, v)| !v.is_null()).collect();
    let [(key, inner)] = set[..] else {
        return Err(format!(
            "`structured_outputs` must set exactly one of {KEYS} (it sets {})",
            set.len()
        ));
    };
    match key.as_str() {
        "json" => output_constraint("guided_json", inner),
        "regex" => output_constraint("guided_regex", inner),
        "choice" => output_constraint("guided_choice", inner),
        "grammar" => output_constraint("guided_grammar", inner),
        "json_object" if inner == &Value::Bool(true) => Ok(ResponseFormat::JsonObject),
        other => Err(format!(
            "`structured_outputs.{other}` is not supported; use one of {KEYS}"
        )),
    }
}

fn number_param(key: &str, value: &Value) -> Result<f32, String> {
    value
        .as_f64()
        .map(|v| v as f32)
        .ok_or_else(|| format!("`{key}` must be a number"))
}

fn count_param(key: &str, value: &Value) -> Result<u32, String> {
    value
        .as_u64()
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| format!("`{key}` must be a whole number of 0 or more"))
}

/// `stop` as a string or a list of strings.
fn stop_param(value: &Value) -> Result<Vec<String>, String> {
    let wrong = || "`stop` must be a string or a list of strings".to_owned();
    match value {
        Value::String(stop) => Ok(vec![stop.clone()]),
        Value::Array(list) => list
            .iter()
            .map(|s| s.as_str().map(str::to_owned))
            .collect::<Option<_>>()
            .ok_or_else(wrong),
        _ => Err(wrong()),
    }
}

fn unsupported_param(key: &str) -> String {
    format!(
        "`{key}` is not supported by resident generate; remove it from the \
         request (supported: max_tokens, max_completion_tokens, temperature, \
         top_p, top_k, min_p, seed, stop, repetition_penalty, presence_penalty, \
         frequency_penalty, min_tokens, stop_token_ids, n, logprobs, \
         top_logprobs, ignore_eos, response_format, guided_json, guided_regex, \
         guided_choice, guided_grammar, structured_outputs)"
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn object(value: Value) -> Map<String, Value> {
        value.as_object().unwrap().clone()
    }

    #[test]
    fn messages_take_strings_and_text_parts_and_refuse_the_rest() {
        let messages = parse_messages(&json!([
            {"role": "developer", "content": "Be terse."},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        ]))
        .unwrap();
        assert_eq!(
            messages,
            [
                ChatMessage::new("system", "Be terse."),
                ChatMessage::new("user", "a\nb")
            ]
        );
        for (bad, says) in [
            (json!([]), "non-empty list"),
            (json!("hi"), "non-empty list"),
            (
                json!([{"role": "robot", "content": "x"}]),
                "messages[0]: `role`",
            ),
            (json!([{"role": "user"}]), "messages[0]: `content`"),
            (
                json!([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
                "type `image_url`",
            ),
        ] {
            let error = parse_messages(&bad).unwrap_err();
            assert!(error.contains(says), "{bad}: {error}");
        }
    }

    /// vLLM's own example file's first line.
    #[test]
    fn a_batch_line_gives_its_custom_id_messages_and_parameters() {
        let line = object(json!({
            "custom_id": "request-1", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "meta-llama/Meta-Llama-3-8B-Instruct",
                     "messages": [{"role": "system", "content": "You are a helpful assistant."},
                                  {"role": "user", "content": "Hello world!"}],
                     "max_completion_tokens": 1000, "temperature": 0.5, "stop": "\n\n",
                     "top_k": -1, "seed": 7, "logprobs": true, "top_logprobs": 2}
        }));
        let (id, record) = parse_batch_line(&line).unwrap();
        assert_eq!(id, json!("request-1"));
        assert_eq!(record.error, None);
        assert_eq!(record.messages.len(), 2);
        let params = record.params.unwrap();
        assert_eq!(params.max_new_tokens, Some(1000));
        assert_eq!(params.temperature, Some(0.5));
        assert_eq!(params.stop, Some(vec!["\n\n".to_owned()]));
        assert_eq!((params.top_k, params.seed), (Some(0), Some(7)));
        assert_eq!(
            (params.logprobs, params.top_logprobs),
            (Some(true), Some(2))
        );
    }

    /// A Batch line's `chat_template_kwargs` are kept for the job to compare with its own;
    /// a prompt's (Python's dict prompts) are refused, saying where they go.
    #[test]
    fn a_batch_line_keeps_its_chat_template_kwargs_apart_from_its_parameters() {
        let line = object(json!({"custom_id": "r", "method": "POST",
            "url": "/v1/chat/completions", "body": {
                "messages": [{"role": "user", "content": "x"}], "max_tokens": 5,
                "chat_template_kwargs": {"enable_thinking": false}}}));
        let (_, record) = parse_batch_line(&line).unwrap();
        assert_eq!(record.error, None);
        assert_eq!(
            record.template_kwargs,
            json!({"enable_thinking": false}).as_object().cloned()
        );
        assert_eq!(record.params.unwrap().max_new_tokens, Some(5));
        let prompt = object(json!({"chat_template_kwargs": {"enable_thinking": false}}));
        let error = parse_params(&prompt).unwrap_err();
        assert!(error.contains("chat_template_kwargs= in Python"), "{error}");
    }

    #[test]
    fn a_response_format_or_guided_json_becomes_the_schema() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let openai = object(json!({"response_format": {"type": "json_schema",
            "json_schema": {"name": "x", "schema": schema, "strict": true}}}));
        let vllm = object(json!({"guided_json": schema.to_string()}));
        let format = |body| parse_params(&body).unwrap().response_format.unwrap();
        let ResponseFormat::JsonSchema { json_schema } = format(openai) else {
            panic!("a schema")
        };
        assert_eq!(json_schema.schema, schema);
        assert_eq!(format(vllm), ResponseFormat::schema(schema));
        let any = object(json!({"response_format": {"type": "json_object"}}));
        assert_eq!(format(any), ResponseFormat::JsonObject);
        let bad = object(json!({"response_format": {"type": "yaml"}}));
        assert!(
            parse_params(&bad)
                .unwrap_err()
                .contains("`response_format` must be")
        );
    }

    /// vLLM's `guided_regex`, `guided_choice` and `guided_grammar`, its `structured_outputs`
    /// object and Resident's own `response_format` types all give the same constraint; two
    /// constraints in one request, or a malformed one, are refused in words.
    #[test]
    fn regex_choice_and_grammar_constraints_read_as_vllm_and_resident_spell_them() {
        let format = |body: Value| parse_params(&object(body)).map(|p| p.response_format);
        let regex = ResponseFormat::Regex {
            regex: "[0-9]{4}".into(),
        };
        let choice = ResponseFormat::Choice {
            choice: vec!["yes".into(), "no, never".into()],
        };
        let grammar = ResponseFormat::Grammar {
            grammar: "start: \"a\"+".into(),
        };
        for (body, expected) in [
            (json!({"guided_regex": "[0-9]{4}"}), &regex),
            (
                json!({"guided_regex": "[0-9]{4}", "guided_decoding_backend": "xgrammar"}),
                &regex,
            ),
            (json!({"structured_outputs": {"regex": "[0-9]{4}"}}), &regex),
            (
                json!({"response_format": {"type": "regex", "regex": "[0-9]{4}"}}),
                &regex,
            ),
            (json!({"guided_choice": ["yes", "no, never"]}), &choice),
            (
                json!({"structured_outputs": {"choice": ["yes", "no, never"], "regex": null}}),
                &choice,
            ),
            (
                json!({"response_format": {"type": "choice", "choice": ["yes", "no, never"]}}),
                &choice,
            ),
            (json!({"guided_grammar": "start: \"a\"+"}), &grammar),
            (
                json!({"structured_outputs": {"grammar": "start: \"a\"+"}}),
                &grammar,
            ),
        ] {
            assert_eq!(
                format(body.clone()).unwrap().as_ref(),
                Some(expected),
                "{body}"
            );
        }
        assert_eq!(
            format(json!({"structured_outputs": {"json_object": true}})).unwrap(),
            Some(ResponseFormat::JsonObject)
        );
        for (body, says) in [
            (
                json!({"guided_regex": "a", "guided_choice": ["a"]}),
                "is a second output constraint",
            ),
            (json!({"guided_choice": "yes"}), "must be a list of strings"),
            (
                json!({"guided_regex": 4}),
                "`guided_regex` must be a string",
            ),
            (
                json!({"structured_outputs": {"regex": "a", "choice": ["a"]}}),
                "exactly one of json, regex, choice, grammar or json_object (it sets 2)",
            ),
            (
                json!({"structured_outputs": {"structural_tag": "x"}}),
                "`structured_outputs.structural_tag` is not supported",
            ),
        ] {
            let error = format(body.clone()).unwrap_err();
            assert!(error.contains(says), "{body}: {error}");
        }
    }

    #[test]
    fn a_wrong_request_is_answered_with_its_error_and_a_line_without_custom_id_is_bad() {
        let base = json!({"custom_id": "r", "method": "POST", "url": "/v1/chat/completions",
                          "body": {"messages": [{"role": "user", "content": "x"}]}});
        let with = |path: &str, value: Value| {
            let mut line = base.clone();
            match path {
                "body" => {
                    let (key, value) = value.as_object().unwrap().iter().next().unwrap();
                    line["body"][key] = value.clone();
                }
                key => line[key] = value,
            }
            parse_batch_line(&object(line))
                .unwrap()
                .1
                .error
                .unwrap_or_default()
        };
        assert!(with("url", json!("/v1/embeddings")).contains("not supported"));
        assert!(with("method", json!("GET")).contains("not POST"));
        assert!(
            with("body", json!({"temperature": "hot"})).contains("`temperature` must be a number")
        );
        assert!(with("body", json!({"tools": []})).contains("`tools` is not supported"));
        assert!(with("body", json!({"top_logprobs": 3})).contains("needs `logprobs: true`"));
        assert_eq!(with("body", json!({"stream": true})), "");
        let no_id = object(json!({"method": "POST", "url": "/v1/chat/completions", "body": {}}));
        assert!(parse_batch_line(&no_id).unwrap_err().contains("custom_id"));
    }
}
