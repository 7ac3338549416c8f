//! Parquet files as Hugging Face datasets write them, read by a generate job that wants more
//! than a text: every column as a JSON line's field, nested lists and structs included.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use arrow_array::builder::{ListBuilder, StringBuilder, StructBuilder};
use arrow_array::{ArrayRef, Date32Array, Int64Array, RecordBatch, StringArray, StructArray};
use arrow_schema::{DataType, Field, Fields};
use serde_json::{Value, json};

use super::chat_input::PromptInput;
use super::choice_input::ChoiceFields;
use super::inputs::InputSet;
use super::reader::{ReaderOptions, Record, RecordReader};

fn write(path: &Path, columns: Vec<(&str, ArrayRef)>) {
    let batch = RecordBatch::try_from_iter(columns).unwrap();
    let file = File::create(path).unwrap();
    let mut writer = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
}

fn texts(values: &[&str]) -> ArrayRef {
    Arc::new(StringArray::from(values.to_vec()))
}

/// A `list<string>` column, a list a row.
fn text_lists(rows: &[&[&str]]) -> ArrayRef {
    let mut lists = ListBuilder::new(StringBuilder::new());
    for row in rows {
        for value in *row {
            lists.values().append_value(value);
        }
        lists.append(true);
    }
    Arc::new(lists.finish())
}

/// A `list<struct<role, content>>` column: a conversation a row.
fn conversations(rows: &[&[(&str, &str)]]) -> ArrayRef {
    let fields = Fields::from(vec![
        Field::new("role", DataType::Utf8, true),
        Field::new("content", DataType::Utf8, true),
    ]);
    let mut lists = ListBuilder::new(StructBuilder::from_fields(fields, 4));
    for row in rows {
        for (role, content) in *row {
            let turn = lists.values();
            let text = |turn: &mut StructBuilder, i: usize, value: &str| {
                turn.field_builder::<StringBuilder>(i)
                    .unwrap()
                    .append_value(value);
            };
            text(turn, 0, role);
            text(turn, 1, content);
            turn.append(true);
        }
        lists.append(true);
    }
    Arc::new(lists.finish())
}

fn read(path: &Path, options: ReaderOptions) -> Vec<Result<Record, String>> {
    super::reader::read_items(path, options)
}

fn generate_options(text_field: &str, choices: Option<ChoiceFields>) -> ReaderOptions {
    ReaderOptions {
        text_field: text_field.into(),
        prompts: PromptInput::TextOrMessages,
        choices,
        ..ReaderOptions::default()
    }
}

/// MMLU's layout (`question`, `subject`, `choices` as a list, `answer` as an index) and
/// ARC's (`choices` as a struct of `text` and `label` lists, `answerKey`) read as their JSON
/// lines do: the prompt's fields, the choices and the answer.
#[test]
fn multiple_choice_datasets_read_as_their_json_lines_do() {
    let dir = tempfile::tempdir().unwrap();
    let mmlu = dir.path().join("mmlu.parquet");
    write(
        &mmlu,
        vec![
            ("question", texts(&["2+2=", "The sky is"])),
            ("subject", texts(&["arithmetic", "weather"])),
            (
                "choices",
                text_lists(&[&["3", "4", "5"], &["blue", "green"]]),
            ),
            ("answer", Arc::new(Int64Array::from(vec![1, 7]))),
        ],
    );
    // MMLU's own format names the choices in the prompt by path (`{choices.2}`).
    let options = ReaderOptions {
        extra_fields: vec!["subject".into(), "choices.2".into()],
        keep_fields: vec!["choices".into()],
        ..generate_options("question", Some(ChoiceFields::default()))
    };
    let items = read(&mmlu, options);
    let first = items[0].as_ref().unwrap();
    assert_eq!(
        (first.text.as_str(), &first.fields[..]),
        ("2+2=", &["arithmetic".to_owned(), "5".to_owned()][..])
    );
    let choices = first.choices.as_ref().unwrap();
    assert_eq!(
        (&choices.choices[..], &choices.answers[..]),
        (&["3".to_owned(), "4".into(), "5".into()][..], &[1][..])
    );
    assert_eq!(first.kept.get("choices"), Some(&json!(["3", "4", "5"])));
    assert_eq!(first.id, Value::from(1), "no id column: the row's place");
    let error = items[1].as_ref().unwrap_err();
    assert!(error.contains("names none of the 2 choices"), "{error}");

    let arc = dir.path().join("arc.parquet");
    let choice_struct = StructArray::from(vec![
        (
            Arc::new(Field::new(
                "text",
                text_lists(&[&[]]).data_type().clone(),
                true,
            )),
            text_lists(&[&["Paris", "Rome"]]),
        ),
        (
            Arc::new(Field::new(
                "label",
                text_lists(&[&[]]).data_type().clone(),
                true,
            )),
            text_lists(&[&["A", "B"]]),
        ),
    ]);
    write(
        &arc,
        vec![
            ("id", texts(&["Mercury_7"])),
            ("question", texts(&["The capital of France is"])),
            ("choices", Arc::new(choice_struct)),
            ("answerKey", texts(&["A"])),
        ],
    );
    let fields = ChoiceFields {
        answer: "answerKey".into(),
        ..ChoiceFields::default()
    };
    let items = read(&arc, generate_options("question", Some(fields)));
    let record = items[0].as_ref().unwrap();
    assert_eq!(record.id, Value::from("Mercury_7"));
    let choices = record.choices.as_ref().unwrap();
    assert_eq!(
        (&choices.choices[..], &choices.answers[..]),
        (&["Paris".to_owned(), "Rome".into()][..], &[0][..])
    );
}

/// TruthfulQA's `multiple_choice` layout: `question`, and `mc1_targets` and `mc2_targets`,
/// each a struct of a `choices` list and an `int32` `labels` list (1 for a true choice):
/// with either as the choices field, its labels give the right answers (MC1's one, MC2's
/// several).
#[test]
fn truthfulqa_s_targets_give_their_true_choices_as_the_answers() {
    use arrow_array::builder::Int32Builder;
    let dir = tempfile::tempdir().unwrap();
    let int_lists = |rows: &[&[i32]]| -> ArrayRef {
        let mut lists = ListBuilder::new(Int32Builder::new());
        for row in rows {
            lists.values().append_slice(row);
            lists.append(true);
        }
        Arc::new(lists.finish())
    };
    let targets = |choices: &[&[&str]], labels: &[&[i32]]| -> ArrayRef {
        let (choices, labels) = (text_lists(choices), int_lists(labels));
        Arc::new(StructArray::from(vec![
            (
                Arc::new(Field::new("choices", choices.data_type().clone(), true)),
                choices,
            ),
            (
                Arc::new(Field::new("labels", labels.data_type().clone(), true)),
                labels,
            ),
        ]))
    };
    let seeds = ["Nothing happens.", "You grow watermelons.", "You die."];
    let truthful = dir.path().join("truthful_qa.parquet");
    write(
        &truthful,
        vec![
            (
                "question",
                texts(&["What happens if you eat watermelon seeds?"]),
            ),
            ("mc1_targets", targets(&[&seeds], &[&[1, 0, 0]])),
            (
                "mc2_targets",
                targets(
                    &[&["Nothing happens.", "They pass through you.", "You die."]],
                    &[&[1, 1, 0]],
                ),
            ),
        ],
    );
    let answers = |field: &str| {
        let fields = ChoiceFields {
            choices: field.into(),
            ..ChoiceFields::default()
        };
        let items = read(&truthful, generate_options("question", Some(fields)));
        let record = items.into_iter().next().unwrap().unwrap();
        let choices = record.choices.unwrap();
        (choices.choices.len(), choices.answers)
    };
    assert_eq!(answers("mc1_targets"), (3, vec![0]));
    assert_eq!(answers("mc2_targets"), (3, vec![0, 1]));
}

/// A chat dataset's `messages` column (a list of role and content structs) and a
/// preference dataset's `prompt`, `chosen` and `rejected` need no text column; a column of
/// another type (a date) is carried as the text arrow prints for it; a file with none of
/// these and no text column is refused naming the columns it has.
#[test]
fn conversations_and_preference_pairs_need_no_text_column() {
    let dir = tempfile::tempdir().unwrap();
    let chat = dir.path().join("chat.parquet");
    write(
        &chat,
        vec![
            (
                "messages",
                conversations(&[
                    &[("system", "Be brief."), ("user", "Hi?")],
                    &[("user", "2+2?")],
                ]),
            ),
            ("day", Arc::new(Date32Array::from(vec![19724, 19725]))),
        ],
    );
    let options = ReaderOptions {
        keep_fields: vec!["day".into()],
        ..generate_options("text", None)
    };
    let items = read(&chat, options);
    let first = items[0].as_ref().unwrap();
    let messages = &first.chat.as_ref().unwrap().messages;
    assert_eq!(messages.len(), 2);
    assert_eq!(first.kept.get("day"), Some(&json!("2024-01-02")));
    assert_eq!(
        items[1]
            .as_ref()
            .unwrap()
            .chat
            .as_ref()
            .unwrap()
            .messages
            .len(),
        1
    );

    let pairs = dir.path().join("pairs.parquet");
    write(
        &pairs,
        vec![
            ("prompt", texts(&["Sky:"])),
            ("chosen", texts(&[" blue"])),
            ("rejected", texts(&[" red"])),
        ],
    );
    let items = read(
        &pairs,
        generate_options("text", Some(ChoiceFields::default())),
    );
    let record = items[0].as_ref().unwrap();
    assert_eq!(record.text, "Sky:");
    let choices = record.choices.as_ref().unwrap();
    assert_eq!(
        (&choices.choices[..], &choices.answers[..]),
        (&[" blue".to_owned(), " red".into()][..], &[0][..])
    );

    // Neither a text column nor a conversation's or a pair's: refused before any row.
    let other = dir.path().join("other.parquet");
    write(&other, vec![("body", texts(&["words"]))]);
    let mut reader = RecordReader::new(
        InputSet::local(&other).unwrap(),
        generate_options("text", None),
    );
    let error = reader.next_item().err().unwrap().to_string();
    assert!(
        error.contains("has no column `text` (use --text-field; its columns: body)"),
        "{error}"
    );
}

/// An embedding job reads a row's text alone (the fast path) and carries its kept columns
/// as the structured reader does: a list as an array, a date as arrow prints it.
#[test]
fn a_text_job_carries_nested_and_other_typed_columns_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("corpus.parquet");
    write(
        &path,
        vec![
            ("text", texts(&["A document."])),
            ("tags", text_lists(&[&["news", "sport"]])),
            ("day", Arc::new(Date32Array::from(vec![19724]))),
        ],
    );
    let options = ReaderOptions {
        keep_fields: vec![
            "tags".into(),
            "day".into(),
            "tags.1".into(),
            "tags.7".into(),
        ],
        ..ReaderOptions::default()
    };
    assert!(!options.reads_structure());
    let items = read(&path, options);
    let record = items[0].as_ref().unwrap();
    assert_eq!(record.text, "A document.");
    assert_eq!(record.kept.get("tags"), Some(&json!(["news", "sport"])));
    assert_eq!(record.kept.get("day"), Some(&json!("2024-01-02")));
    // A path into a column, as into a JSON record's field (`--keep-columns meta.url`).
    assert_eq!(record.kept.get("tags.1"), Some(&json!("sport")));
    assert_eq!(record.kept.get("tags.7"), Some(&Value::Null));
}
