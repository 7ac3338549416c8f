//! A scoring job's records with choices to score after their prompt: a multiple-choice
//! record (`choices` and its `answer`, as MMLU, ARC or HellaSwag rows hold them, or several
//! right answers, as TruthfulQA's MC2 marks them; field names set by `--choices-field` and
//! `--answer-field`), or a preference pair in TRL's format
//! (`prompt`, `chosen`, `rejected`; text or conversations, the prompt explicit or implicit in
//! both conversations). Pure: JSON in, the prompt and its choices or the reason out.

use resident_actor::generate::{ChatMessage, MAX_CHOICES};
use serde_json::{Map, Value};

use super::chat_input::parse_messages;

/// The fields a multiple-choice record's choices and answer are read from.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ChoiceFields {
    /// A list of texts, an object with `text` (and `label`) lists (ARC's), or one with
    /// `choices` and `labels` lists (TruthfulQA's, the labels marking the true ones); or
    /// several fields, comma-separated, a text each (PIQA's `sol1,sol2`, Winogrande's
    /// `option1,option2`).
    pub choices: String,
    /// The right choice: its index, its label or its text; or a list of them.
    pub answer: String,
    /// What is scored in place of each choice's text, in order (`--choice-labels A,B,C,D`:
    /// MMLU's letters, the texts then written into the prompt); empty: the texts.
    pub labels: Vec<String>,
    /// The index a number answer counts choices from (`--answer-base`): 0, or 1 for
    /// Winogrande's and StoryCloze's `"1"`/`"2"`.
    pub answer_base: u32,
    /// Where each choice goes in the record's text (`--blank`, Winogrande's `_`): each
    /// choice becomes the text before it and the choice, and the text after it (trimmed)
    /// the record's text, scored after each (with choices as contexts).
    pub blank: Option<String>,
}

impl Default for ChoiceFields {
    fn default() -> Self {
        Self {
            choices: "choices".into(),
            answer: "answer".into(),
            labels: Vec::new(),
            answer_base: 0,
            blank: None,
        }
    }
}

/// A record's choices, each scored after its prompt, and the right ones when it names
/// them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChoiceRecord {
    /// The continuations, in order.
    pub choices: Vec<String>,
    /// The right ones' indexes, ascending: one for most tasks, several for TruthfulQA's MC2
    /// (empty when the record names none).
    pub answers: Vec<u32>,
    /// The choices are a preference pair's replies (`chosen`, `rejected`), which follow
    /// its prompt: never contexts before a text (`--choices-as-contexts`).
    pub replies: bool,
}

impl ChoiceRecord {
    /// The first right choice (what a few-shot example answers with: TruthfulQA's MC2
    /// lists its true answers first).
    pub fn first_answer(&self) -> Option<&String> {
        let first = *self.answers.first()?;
        self.choices.get(first as usize)
    }
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
    let name = &fields.choices;
    let listed = match name.contains(',') {
        true => match separate_choices(object, name)? {
            Some(texts) => ListedChoices {
                texts,
                labels: None,
                truth: None,
            },
            None => return Ok(None),
        },
        false => match object.get(name) {
            Some(value) => listed_choices(value, name)?,
            None => return Ok(None),
        },
    };
    let choices = (listed.texts.iter().enumerate())
        .map(|(i, text)| match text {
            Value::String(text) if !text.is_empty() => Ok(text.clone()),
            Value::String(_) => Err(format!("`{name}`[{i}] is empty; give each choice its text")),
            _ => Err(format!("`{name}`[{i}] is not a text")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    check_count(choices.len(), name)?;
    let answers = match (object.get(&fields.answer), listed.truth) {
        (None | Some(Value::Null), Some(truth)) => true_choices(truth, choices.len(), name)?,
        (None | Some(Value::Null), None) => Vec::new(),
        (Some(answer), _) => answer_indexes(answer, &choices, listed.labels, fields)?,
    };
    let choices = match fields.labels.is_empty() {
        true => choices,
        false => labelled(choices.len(), &fields.labels, name)?,
    };
    Ok(Some(ChoiceRecord {
        choices,
        answers,
        replies: false,
    }))
}

/// A record's `text` split at `blank` (Winogrande's `_`, the first where there are
/// several): each choice becomes the text before the blank and the choice, and what follows
/// the blank, trimmed, is returned, the text scored after each (lm-evaluation-harness's
/// Winogrande). An error where the text has no blank.
pub fn fill_blank(text: &str, choices: &mut ChoiceRecord, blank: &str) -> Result<String, String> {
    let Some(at) = text.find(blank).filter(|_| !blank.is_empty()) else {
        return Err(format!(
            "the text has no `{blank}` (--blank), where each choice goes"
        ));
    };
    let before = &text[..at];
    for choice in &mut choices.choices {
        *choice = format!("{before}{choice}");
    }
    Ok(text[at + blank.len()..].trim().to_owned())
}

/// A choices field as its dataset writes it.
struct ListedChoices<'a> {
    /// The choices' texts.
    texts: Vec<&'a Value>,
    /// ARC's labels (`A`, `B`, ...), which an answer may name.
    labels: Option<&'a [Value]>,
    /// TruthfulQA's `labels`: 1 for each true choice, 0 for each false one.
    truth: Option<&'a [Value]>,
}

/// The texts (and labels) of a choices field: a list of texts, ARC's `{"text": [...],
/// "label": [...]}` or TruthfulQA's `{"choices": [...], "labels": [1, 0, ...]}`.
fn listed_choices<'a>(value: &'a Value, name: &str) -> Result<ListedChoices<'a>, String> {
    let list = |value: Option<&'a Value>| match value {
        Some(Value::Array(list)) => Some(&list[..]),
        _ => None,
    };
    let listed = |texts: &'a [Value], labels, truth| ListedChoices {
        texts: texts.iter().collect(),
        labels,
        truth,
    };
    match value {
        Value::Array(texts) => Ok(listed(texts, None, None)),
        Value::Object(map) => match (list(map.get("text")), list(map.get("choices"))) {
            (Some(texts), _) => Ok(listed(texts, list(map.get("label")), None)),
            (None, Some(texts)) => Ok(listed(texts, None, list(map.get("labels")))),
            (None, None) => Err(format!(
                "`{name}` is an object without a `text` or `choices` list (ARC's choices are \
                 {{\"text\": [...], \"label\": [...]}}, TruthfulQA's {{\"choices\": [...], \
                 \"labels\": [1, 0, ...]}})"
            )),
        },
        _ => Err(format!("`{name}` must be a list of texts")),
    }
}

/// The choices of `names`, comma-separated fields, one each (PIQA's `sol1,sol2`): `None`
/// where the record has none of them, an error naming the first missing where it has some.
fn separate_choices<'a>(
    object: &'a Map<String, Value>,
    names: &str,
) -> Result<Option<Vec<&'a Value>>, String> {
    let found: Vec<(&str, Option<&Value>)> = (names.split(','))
        .map(|name| (name, object.get(name).filter(|value| !value.is_null())))
        .collect();
    if found.iter().all(|(_, value)| value.is_none()) {
        return Ok(None);
    }
    match found.iter().find(|(_, value)| value.is_none()) {
        Some((missing, _)) => Err(format!(
            "`{missing}` is missing, and the choices are the fields `{names}`, a text each"
        )),
        None => Ok(Some(found.into_iter().filter_map(|(_, v)| v).collect())),
    }
}

/// The true choices of TruthfulQA's `labels` (1 true, 0 false, one for each choice).
fn true_choices(truth: &[Value], count: usize, name: &str) -> Result<Vec<u32>, String> {
    if truth.len() != count {
        return Err(format!(
            "`{name}.labels` holds {} labels for {count} choices; give each choice 1 (true) \
             or 0 (false)",
            truth.len()
        ));
    }
    let mut answers = Vec::new();
    for (index, label) in truth.iter().enumerate() {
        match label.as_u64() {
            Some(1) => answers.push(index as u32),
            Some(0) => {}
            _ => {
                return Err(format!(
                    "`{name}.labels`[{index}] is {label}; a label is 1 (a true choice) or 0 \
                     (a false one)"
                ));
            }
        }
    }
    match answers.is_empty() {
        true => Err(format!(
            "`{name}.labels` marks no choice true (1); give at least one"
        )),
        false => Ok(answers),
    }
}

/// The indexes an answer names: one answer, or a list of them (several right ones),
/// ascending. A list that names a choice twice is refused: 1/0 labels, one per choice
/// (TruthfulQA's), would read as indexes 1 and 0, so they must come as the choices'
/// `labels`.
fn answer_indexes(
    answer: &Value,
    choices: &[String],
    labels: Option<&[Value]>,
    fields: &ChoiceFields,
) -> Result<Vec<u32>, String> {
    let name = &fields.answer;
    let base = u64::from(fields.answer_base);
    let mut answers = match answer {
        Value::Array(list) if list.is_empty() => {
            return Err(format!(
                "`{name}` is an empty list, which names no right choice (give one or more, or \
                 leave the field out for an unanswered record)"
            ));
        }
        Value::Array(list) => (list.iter())
            .map(|one| answer_index(one, choices, labels, (name, base)))
            .collect::<Result<Vec<_>, _>>()?,
        one => vec![answer_index(one, choices, labels, (name, base))?],
    };
    answers.sort_unstable();
    if let Some(twice) = answers.windows(2).find(|pair| pair[0] == pair[1]) {
        return Err(format!(
            "`{name}` names choice {} twice; a list of right answers names each once (1/0 \
             labels, one per choice, go beside the texts: {{\"choices\": [...], \"labels\": \
             [1, 0, ...]}} as the choices field)",
            twice[0]
        ));
    }
    Ok(answers)
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

/// The index an answer names: a whole number (an index from `base`, 0 unless
/// `--answer-base` says otherwise), a choice's label, a choice's own text (leading and
/// trailing spaces aside: `"eight"` names `" eight"`), or an index written as text
/// (HellaSwag's `"label": "2"`, Winogrande's `"answer": "1"` from 1).
fn answer_index(
    answer: &Value,
    choices: &[String],
    labels: Option<&[Value]>,
    (name, base): (&str, u64),
) -> Result<u32, String> {
    let count = choices.len();
    let index = |i: u64| i.checked_sub(base).filter(|&i| (i as usize) < count);
    let found = match answer {
        Value::Number(n) => n.as_u64().and_then(index),
        Value::String(s) => labels
            .and_then(|labels| labels.iter().position(|l| l.as_str() == Some(s.as_str())))
            .or_else(|| choices.iter().position(|c| c.trim() == s.trim()))
            .map(|i| i as u64)
            .or_else(|| s.trim().parse::<u64>().ok().and_then(index)),
        _ => None,
    };
    found.map(|i| i as u32).ok_or_else(|| {
        format!(
            "`{name}` is {answer}, which names none of the {count} choices (give an index \
             from {base}, a label or a choice's text, or a list of them for several right \
             choices; --answer-base says where indexes start)"
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
            answers: vec![0],
            replies: true,
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
                answers: vec![1],
                replies: false,
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
                answers: vec![1],
                replies: false,
            }))
        );
        let arc = json!({"choices": {"text": ["red", "blue"], "label": ["A", "B"]}, "answer": "B"});
        assert_eq!(choices(arc).unwrap().unwrap().answers, [1]);
        let by_text = choices(json!({"choices": [" red", " blue"], "answer": "red"}));
        assert_eq!(by_text.unwrap().unwrap().answers, [0]);
        let as_text = choices(json!({"choices": ["red", "blue"], "answer": "1"}));
        assert_eq!(as_text.unwrap().unwrap().answers, [1]);
        let unanswered = choices(json!({"choices": ["red", "blue"]}));
        assert_eq!(unanswered.unwrap().unwrap().answers, Vec::<u32>::new());
        assert_eq!(choices(json!({"text": "no choices"})), Ok(None));
        let renamed = ChoiceFields {
            choices: "endings".into(),
            answer: "label".into(),
            ..ChoiceFields::default()
        };
        let hellaswag = object(json!({"endings": ["a", "b", "c"], "label": 2}));
        assert_eq!(
            parse_choices(&hellaswag, &renamed)
                .unwrap()
                .unwrap()
                .answers,
            [2]
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
                "without a `text` or `choices` list",
            ),
            (json!({"choices": vec!["a"; 65]}), "at most 64"),
        ] {
            let error = choices(record).unwrap_err();
            assert!(error.contains(wanted), "{error}");
        }
    }

    /// Choices from several fields, a text each (PIQA's `sol1,sol2`, Winogrande's
    /// `option1,option2`), in the order named: none of them is no choices, some of them is
    /// an error naming the missing one. `--answer-base 1` reads Winogrande's `"1"`/`"2"`
    /// (and numbers) from 1, a choice's text as ever; 0 is then no index.
    #[test]
    fn choices_from_several_fields_and_answers_counted_from_one() {
        let winogrande = ChoiceFields {
            choices: "option1,option2".into(),
            answer_base: 1,
            ..ChoiceFields::default()
        };
        let parse = |record: Value| parse_choices(&object(record), &winogrande);
        let record = parse(json!({"option1": "Ian", "option2": "Dennis", "answer": "2"}));
        let record = record.unwrap().unwrap();
        assert_eq!(
            (record.choices, record.answers),
            (vec!["Ian".into(), "Dennis".into()], vec![1])
        );
        for (answer, index) in [(json!(1), 0), (json!("Ian"), 0), (json!(" 2 "), 1)] {
            let record = parse(json!({"option1": "Ian", "option2": "Dennis", "answer": answer}));
            assert_eq!(record.unwrap().unwrap().answers, [index]);
        }
        assert_eq!(parse(json!({"text": "none"})), Ok(None));
        for (record, wanted) in [
            (
                json!({"option1": "Ian", "answer": "1"}),
                "`option2` is missing",
            ),
            (
                json!({"option1": "Ian", "option2": 3}),
                "`option1,option2`[1] is not a text",
            ),
            (
                json!({"option1": "a", "option2": "b", "answer": 0}),
                "give an index from 1",
            ),
            (
                json!({"option1": "a", "option2": "b", "answer": "3"}),
                "names none of the 2",
            ),
        ] {
            let error = parse(record).unwrap_err();
            assert!(error.contains(wanted), "{error}");
        }
    }

    /// `--blank`: each choice fills the text's first blank (the text before it, then the
    /// choice) and what follows it, trimmed, is the text; a text without one is refused.
    #[test]
    fn a_blank_is_filled_by_each_choice_and_the_rest_is_the_text() {
        let mut record = ChoiceRecord {
            choices: vec!["the trophy".into(), "the suitcase".into()],
            answers: vec![0],
            replies: false,
        };
        let text = "The trophy doesn't fit in the suitcase because _ is too large. _";
        let rest = fill_blank(text, &mut record, "_").unwrap();
        assert_eq!(rest, "is too large. _");
        assert_eq!(
            record.choices,
            [
                "The trophy doesn't fit in the suitcase because the trophy",
                "The trophy doesn't fit in the suitcase because the suitcase"
            ]
        );
        let error = fill_blank("no blank here", &mut record, "_").unwrap_err();
        assert!(error.contains("has no `_` (--blank)"), "{error}");
        assert!(fill_blank("x", &mut record, "").is_err());
    }

    /// Several right answers: a list of indexes, labels or texts in the answer field, or
    /// TruthfulQA's `{"choices", "labels"}` whose 1s mark the true ones (when the record has
    /// no answer field); ascending. An empty list, a list naming a choice twice (1/0 labels
    /// given as the answer), labels that are not 0 and 1, or that do not match the
    /// choices, or that mark none true, are refused.
    #[test]
    fn several_right_answers_are_read_from_a_list_or_truthfulqa_s_labels() {
        let answers = |value: Value| choices(value).map(|c| c.unwrap().answers);
        let texts = json!(["a", "b", "c", "d"]);
        assert_eq!(
            answers(json!({"choices": texts, "answer": [2, 0]})),
            Ok(vec![0, 2])
        );
        let arc = json!({"text": ["a", "b", "c"], "label": ["A", "B", "C"]});
        assert_eq!(
            answers(json!({"choices": arc, "answer": ["C", "B"]})),
            Ok(vec![1, 2])
        );
        assert_eq!(
            answers(json!({"choices": texts, "answer": ["d", 0]})),
            Ok(vec![0, 3])
        );
        let truthful = |labels: Value| json!({"choices": ["Nothing.", "You die.", "You fly."], "labels": labels});
        let mc2 = json!({"question": "What happens if you eat seeds?", "mc2_targets": truthful(json!([1, 0, 0]))});
        let fields = ChoiceFields {
            choices: "mc2_targets".into(),
            ..ChoiceFields::default()
        };
        let record = parse_choices(&object(mc2), &fields).unwrap().unwrap();
        assert_eq!(record.choices, ["Nothing.", "You die.", "You fly."]);
        assert_eq!(record.answers, [0]);
        assert_eq!(record.first_answer().map(String::as_str), Some("Nothing."));
        assert_eq!(
            answers(json!({"choices": truthful(json!([1, 1, 0]))})),
            Ok(vec![0, 1])
        );
        assert_eq!(
            answers(json!({"choices": truthful(json!([1, 1, 0])), "answer": 2})),
            Ok(vec![2]),
            "the answer field, when there, over the labels"
        );
        for (record, wanted) in [
            (json!({"choices": texts, "answer": []}), "an empty list"),
            (
                json!({"choices": texts, "answer": [1, 0, 1, 0]}),
                "names choice 0 twice; a list of right answers names each once (1/0 labels",
            ),
            (
                json!({"choices": texts, "answer": [0, 9]}),
                "is 9, which names none of the 4",
            ),
            (
                json!({"choices": truthful(json!([1, 2, 0]))}),
                "`choices.labels`[1] is 2",
            ),
            (
                json!({"choices": truthful(json!([1, 0]))}),
                "holds 2 labels for 3 choices",
            ),
            (
                json!({"choices": truthful(json!([0, 0, 0]))}),
                "marks no choice true",
            ),
        ] {
            let error = answers(record).unwrap_err();
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
        assert_eq!(record.answers, [0]);
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
