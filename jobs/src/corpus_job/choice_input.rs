//! A scoring job's records with choices to score after their prompt: a multiple-choice
//! record (`choices` and its `answer`, as MMLU, ARC or HellaSwag rows hold them, field names
//! set by `--choices-field` and `--answer-field`), or a preference pair in TRL's format
//! (`prompt`, `chosen`, `rejected`; text or conversations, the prompt explicit or implicit in
//! both conversations). Pure: JSON in, the prompt and its choices or the reason out.

use resident_actor::generate::{ChatMessage, MAX_CHOICES};
use serde_json::{Map, Value};

use super::chat_input::parse_messages;

/// The fields a multiple-choice record's choices and answer are read from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChoiceFields {
    /// A list of texts, or an object with `text` (and `label`) lists.
    pub choices: String,
    /// The right choice: its index, its label or its text.
    pub answer: String,
    /// What is scored in place of each choice's text, in order (`--choice-labels A,B,C,D`:
    /// MMLU's letters, the texts then written into the prompt); empty: the texts.
    pub labels: Vec<String>,
}

impl Default for ChoiceFields {
    fn default() -> Self {
        Self {
            choices: "choices".into(),
            answer: "answer".into(),
            labels: Vec::new(),
        }
    }
}

/// A record's choices, each scored after its prompt, and the right one when it names it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChoiceRecord {
    /// The continuations, in order.
    pub choices: Vec<String>,
    /// The right one's index.
    pub answer: Option<u32>,
}

/// What a preference pair's prompt is.
#[derive(Clone, Debug, PartialEq)]
pub enum PreferencePrompt {
    /// A text, each reply scored raw after it.
    Text(String),
    /// A conversation ending with the user's turn, each reply scored as the assistant's.
    Messages(Vec<ChatMessage>),
}

/// A record's choices from `fields`; `Ok(None)` when it has no choices field.
pub fn parse_choices(
    object: &Map<String, Value>,
    fields: &ChoiceFields,
) -> Result<Option<ChoiceRecord>, String> {
    let Some(value) = object.get(&fields.choices) else {
        return Ok(None);
    };
    let name = &fields.choices;
    let (texts, labels) = match value {
        Value::Array(list) => (list, None),
        Value::Object(map) => match (map.get("text"), map.get("label")) {
            (Some(Value::Array(texts)), Some(Value::Array(labels))) => (texts, Some(labels)),
            (Some(Value::Array(texts)), None) => (texts, None),
            _ => {
                return Err(format!(
                    "`{name}` is an object without a `text` list (ARC's choices are \
                     {{\"text\": [...], \"label\": [...]}})"
                ));
            }
        },
        _ => return Err(format!("`{name}` must be a list of texts")),
    };
    let choices = texts
        .iter()
        .enumerate()
        .map(|(i, text)| match text {
            Value::String(text) if !text.is_empty() => Ok(text.clone()),
            Value::String(_) => Err(format!("`{name}`[{i}] is empty; give each choice its text")),
            _ => Err(format!("`{name}`[{i}] is not a text")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    check_count(choices.len(), name)?;
    let answer = match object.get(&fields.answer) {
        None | Some(Value::Null) => None,
        Some(answer) => Some(answer_index(answer, &choices, labels, &fields.answer)?),
    };
    let choices = match fields.labels.is_empty() {
        true => choices,
        false => labelled(choices.len(), &fields.labels, name)?,
    };
    Ok(Some(ChoiceRecord { choices, answer }))
}

/// The first `count` of `labels`, scored in place of a record's `count` choices; an error
/// when there are fewer labels than choices.
fn labelled(count: usize, labels: &[String], name: &str) -> Result<Vec<String>, String> {
    match labels.get(..count) {
        Some(labels) => Ok(labels.to_vec()),
        None => Err(format!(
            "`{name}` holds {count} choices, and --choice-labels gives {} labels; give a label \
             for each choice",
            labels.len()
        )),
    }
}

fn check_count(count: usize, name: &str) -> Result<(), String> {
    match count {
        0 => Err(format!(
            "`{name}` is empty; a record scores at least one choice"
        )),
        n if n > MAX_CHOICES as usize => Err(format!(
            "`{name}` holds {n} choices; a record may have at most {MAX_CHOICES}"
        )),
        _ => Ok(()),
    }
}

/// The index an answer names: a whole number (an index from 0), a choice's label, a
/// choice's own text (leading and trailing spaces aside: `"eight"` names `" eight"`), or an
/// index written as text (HellaSwag's `"label": "2"`).
fn answer_index(
    answer: &Value,
    choices: &[String],
    labels: Option<&Vec<Value>>,
    name: &str,
) -> Result<u32, String> {
    let count = choices.len();
    let found = match answer {
        Value::Number(n) => n.as_u64().filter(|&i| (i as usize) < count),
        Value::String(s) => labels
            .and_then(|labels| labels.iter().position(|l| l.as_str() == Some(s.as_str())))
            .or_else(|| choices.iter().position(|c| c.trim() == s.trim()))
            .map(|i| i as u64)
            .or_else(|| {
                s.trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|&i| (i as usize) < count)
            }),
        _ => None,
    };
    found.map(|i| i as u32).ok_or_else(|| {
        format!(
            "`{name}` is {answer}, which names none of the {count} choices (give an index \
             from 0, a label or a choice's text)"
        )
    })
}

/// A preference pair (`chosen` and `rejected`, after `prompt`) as a prompt and two choices,
/// the chosen first and the answer; `Ok(None)` when the record has no `chosen`.
pub fn parse_preference(
    object: &Map<String, Value>,
) -> Result<Option<(PreferencePrompt, ChoiceRecord)>, String> {
    let (Some(chosen), rejected) = (object.get("chosen"), object.get("rejected")) else {
        return Ok(None);
    };
    let rejected =
        rejected.ok_or("a preference record has `chosen` and `rejected`; `rejected` is missing")?;
    let (prompt, replies) = match (object.get("prompt"), chosen, rejected) {
        (Some(Value::String(prompt)), Value::String(c), Value::String(r)) => (
            PreferencePrompt::Text(prompt.clone()),
            [c.clone(), r.clone()],
        ),
        (Some(prompt @ Value::Array(_)), Value::Array(_), Value::Array(_)) => {
            let prompt = parse_messages(prompt).map_err(|e| format!("`prompt`: {e}"))?;
            let c = one_reply(chosen, "chosen")?;
            let r = one_reply(rejected, "rejected")?;
            (PreferencePrompt::Messages(prompt), [c, r])
        }
        (None, Value::Array(_), Value::Array(_)) => implicit_prompt(chosen, rejected)?,
        (None, _, _) => {
            return Err(
                "a preference record of texts needs `prompt`: the text before \
                        `chosen` and `rejected` (only conversations may leave it implicit)"
                    .into(),
            );
        }
        _ => {
            return Err(
                "`prompt`, `chosen` and `rejected` must all be texts or all be \
                        conversations (lists of {\"role\", \"content\"})"
                    .into(),
            );
        }
    };
    if replies.iter().any(String::is_empty) {
        return Err("`chosen` or `rejected` is empty; give each reply its text".into());
    }
    Ok(Some((
        prompt,
        ChoiceRecord {
            choices: replies.to_vec(),
            answer: Some(0),
        },
    )))
}

/// The conversations `chosen` and `rejected` share up to their last message (the prompt),
/// and each one's reply.
fn implicit_prompt(
    chosen: &Value,
    rejected: &Value,
) -> Result<(PreferencePrompt, [String; 2]), String> {
    let chosen = parse_messages(chosen).map_err(|e| format!("`chosen`: {e}"))?;
    let rejected = parse_messages(rejected).map_err(|e| format!("`rejected`: {e}"))?;
    let shared = chosen.len() - 1;
    if chosen.len() != rejected.len() || chosen[..shared] != rejected[..shared] || shared == 0 {
        return Err(
            "`chosen` and `rejected` (without `prompt`) must be the same conversation \
                    but for its last message, the assistant's reply; give `prompt` apart \
                    otherwise"
                .into(),
        );
    }
    let prompt = chosen[..shared].to_vec();
    let c = reply_text(&chosen[shared], "chosen")?;
    let r = reply_text(&rejected[shared], "rejected")?;
    Ok((PreferencePrompt::Messages(prompt), [c, r]))
}

/// A conversational reply (`[{"role": "assistant", "content": ...}]`) as its text.
fn one_reply(value: &Value, name: &str) -> Result<String, String> {
    let messages = parse_messages(value).map_err(|e| format!("`{name}`: {e}"))?;
    match &messages[..] {
        [reply] => reply_text(reply, name),
        _ => Err(format!(
            "`{name}` holds {} messages; a reply is one assistant message",
            messages.len()
        )),
    }
}

fn reply_text(message: &ChatMessage, name: &str) -> Result<String, String> {
    match message.role.as_str() {
        "assistant" => Ok(message.content.clone()),
        role => Err(format!(
            "`{name}` ends with a {role} message; a reply is the assistant's"
        )),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn object(value: Value) -> Map<String, Value> {
        value.as_object().unwrap().clone()
    }

    fn choices(value: Value) -> Result<Option<ChoiceRecord>, String> {
        parse_choices(&object(value), &ChoiceFields::default())
    }

    /// With labels, the labels are scored in the choices' place, the answer found among
    /// the texts; a record with more choices than labels is refused saying so.
    #[test]
    fn labels_are_scored_in_place_of_the_choices() {
        let letters = ChoiceFields {
            labels: ["A", "B", "C", "D"].map(String::from).to_vec(),
            ..ChoiceFields::default()
        };
        let record = object(json!({"choices": ["red", "blue", "green"], "answer": "blue"}));
        assert_eq!(
            parse_choices(&record, &letters),
            Ok(Some(ChoiceRecord {
                choices: vec!["A".into(), "B".into(), "C".into()],
                answer: Some(1),
            }))
        );
        let five = object(json!({"choices": ["a", "b", "c", "d", "e"], "answer": 0}));
        let error = parse_choices(&five, &letters).unwrap_err();
        assert!(
            error.contains("`choices` holds 5 choices, and --choice-labels gives 4 labels"),
            "{error}"
        );
    }

    /// MMLU's list and index, ARC's labelled object and letter, an answer by its text, and
    /// a record without choices; each wrong shape refused, saying what is wrong.
    #[test]
    fn choices_and_answers_are_read_as_the_common_datasets_write_them() {
        let mmlu = choices(json!({"text": "2+2=", "choices": ["3", "4"], "answer": 1}));
        assert_eq!(
            mmlu,
            Ok(Some(ChoiceRecord {
                choices: vec!["3".into(), "4".into()],
                answer: Some(1),
            }))
        );
        let arc = json!({"choices": {"text": ["red", "blue"], "label": ["A", "B"]}, "answer": "B"});
        assert_eq!(choices(arc).unwrap().unwrap().answer, Some(1));
        let by_text = choices(json!({"choices": [" red", " blue"], "answer": "red"}));
        assert_eq!(by_text.unwrap().unwrap().answer, Some(0));
        let as_text = choices(json!({"choices": ["red", "blue"], "answer": "1"}));
        assert_eq!(as_text.unwrap().unwrap().answer, Some(1));
        let unanswered = choices(json!({"choices": ["red", "blue"]}));
        assert_eq!(unanswered.unwrap().unwrap().answer, None);
        assert_eq!(choices(json!({"text": "no choices"})), Ok(None));
        let renamed = ChoiceFields {
            choices: "endings".into(),
            answer: "label".into(),
            ..ChoiceFields::default()
        };
        let hellaswag = object(json!({"endings": ["a", "b", "c"], "label": 2}));
        assert_eq!(
            parse_choices(&hellaswag, &renamed).unwrap().unwrap().answer,
            Some(2)
        );
        for (record, wanted) in [
            (
                json!({"choices": ["a"], "answer": 1}),
                "names none of the 1 choices",
            ),
            (json!({"choices": ["a"], "answer": "z"}), "names none"),
            (json!({"choices": ["a", ""]}), "`choices`[1] is empty"),
            (json!({"choices": ["a", 3]}), "`choices`[1] is not a text"),
            (json!({"choices": []}), "at least one choice"),
            (json!({"choices": "a"}), "must be a list of texts"),
            (
                json!({"choices": {"label": ["A"]}}),
                "without a `text` list",
            ),
            (json!({"choices": vec!["a"; 65]}), "at most 64"),
        ] {
            let error = choices(record).unwrap_err();
            assert!(error.contains(wanted), "{error}");
        }
    }

    /// TRL's preference formats: texts after a prompt, conversations after a prompt, and
    /// two whole conversations whose shared turns are the prompt; the chosen reply is
    /// choice 0 and the answer. A pair that cannot be read is refused in words.
    #[test]
    fn preference_pairs_are_read_in_trl_s_formats() {
        let pair = |value: Value| parse_preference(&object(value));
        let (prompt, record) =
            pair(json!({"prompt": "The sky is", "chosen": " blue.", "rejected": " green."}))
                .unwrap()
                .unwrap();
        assert_eq!(prompt, PreferencePrompt::Text("The sky is".into()));
        assert_eq!(record.choices, [" blue.", " green."]);
        assert_eq!(record.answer, Some(0));
        let user = json!([{"role": "user", "content": "What colour is the sky?"}]);
        let reply = |text: &str| json!([{"role": "assistant", "content": text}]);
        let explicit =
            pair(json!({"prompt": user, "chosen": reply("Blue."), "rejected": reply("Green.")}));
        let (prompt, record) = explicit.unwrap().unwrap();
        let question = ChatMessage::new("user", "What colour is the sky?");
        assert_eq!(prompt, PreferencePrompt::Messages(vec![question.clone()]));
        assert_eq!(record.choices, ["Blue.", "Green."]);
        let whole = |text: &str| {
            json!([{"role": "user", "content": "What colour is the sky?"},
                   {"role": "assistant", "content": text}])
        };
        let implicit = pair(json!({"chosen": whole("Blue."), "rejected": whole("Green.")}));
        let (prompt, record) = implicit.unwrap().unwrap();
        assert_eq!(prompt, PreferencePrompt::Messages(vec![question]));
        assert_eq!(record.choices, ["Blue.", "Green."]);
        assert_eq!(pair(json!({"text": "no pair"})), Ok(None));
        let other_question = json!([{"role": "user", "content": "And the grass?"},
                                    {"role": "assistant", "content": "Green."}]);
        for (record, wanted) in [
            (
                json!({"prompt": "a", "chosen": "b"}),
                "`rejected` is missing",
            ),
            (json!({"chosen": "b", "rejected": "c"}), "needs `prompt`"),
            (
                json!({"prompt": "a", "chosen": reply("b"), "rejected": "c"}),
                "all be texts or all be conversations",
            ),
            (
                json!({"chosen": whole("Blue."), "rejected": other_question}),
                "the same conversation",
            ),
            (
                json!({"prompt": user, "chosen": whole("b"), "rejected": reply("c")}),
                "holds 2 messages",
            ),
            (
                json!({"prompt": user, "chosen": user, "rejected": reply("c")}),
                "ends with a user message",
            ),
            (
                json!({"prompt": "a", "chosen": "", "rejected": "c"}),
                "is empty",
            ),
        ] {
            let error = pair(record).unwrap_err();
            assert!(error.contains(wanted), "{error}");
        }
    }
}
