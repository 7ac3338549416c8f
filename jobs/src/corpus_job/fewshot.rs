//! Few-shot examples before every record's prompt (lm-evaluation-harness's `num_fewshot`):
//! the first N answered multiple-choice records of another file (a dataset's dev or train
//! split), each written as the job's prompt writes a record, its right choice after it, the
//! examples joined by a delimiter and put before the prompt as literal text. Every record
//! of a job shares that start, so the engines compute it once (the prefix cache).

use std::path::Path;

use super::JobError;
use super::generate::GenerateJobConfig;
use super::inputs::InputSet;
use super::prompt::PromptTemplate;
use super::reader::{Item, ReaderOptions, Record, RecordReader};

/// lm-evaluation-harness's default between two examples, and between the last and the
/// record's prompt.
pub const DEFAULT_FEWSHOT_DELIMITER: &str = "\n\n";

impl GenerateJobConfig {
    /// Puts `count` examples from `path` before the job's prompt, read as the job reads its
    /// records (`read_fewshot`: a scoring job, whose reader has its choice fields) and
    /// written through its prompt (`with_fewshot`).
    pub fn put_fewshot(
        &mut self,
        path: &Path,
        count: usize,
        delimiter: &str,
    ) -> Result<(), JobError> {
        let shots = read_fewshot(path, self.corpus.reader.clone(), count)?;
        self.generation.prompt =
            with_fewshot(&self.generation.prompt, &shots, delimiter).map_err(JobError::Input)?;
        Ok(())
    }
}

/// `template` with `shots` before it: each shot's prompt (its text and fields through
/// `template`), then its right choice, the shots and the prompt joined by `delimiter`. A
/// shot without choices or an answer, or one that is a conversation, is refused naming it.
pub fn with_fewshot(
    template: &PromptTemplate,
    shots: &[Record],
    delimiter: &str,
) -> Result<PromptTemplate, String> {
    let mut examples = String::new();
    for shot in shots {
        let answer = shot
            .choices
            .as_ref()
            .and_then(|c| c.choices.get(c.answer? as usize))
            .ok_or_else(|| {
                format!(
                    "few-shot example {} has no answered choices: an example needs choices \
                     and an answer (--choices-field, --answer-field)",
                    shot.id
                )
            })?;
        if shot.chat.is_some() {
            return Err(format!(
                "few-shot example {} is a conversation: examples are written through \
                 --prompt, so they need a text",
                shot.id
            ));
        }
        let (before, after) = template.around(&shot.fields);
        examples.push_str(&format!("{before}{}{after}{answer}{delimiter}", shot.text));
    }
    let literal = examples.replace('{', "{{").replace('}', "}}");
    PromptTemplate::parse(&format!("{literal}{}", template.as_str()))
}

/// The first `count` records of the file or directory at `path` that have choices and an
/// answer, read as the job reads its records (`options`); an error when it has fewer.
pub fn read_fewshot(
    path: &Path,
    options: ReaderOptions,
    count: usize,
) -> Result<Vec<Record>, JobError> {
    let inputs = InputSet::local(path).map_err(|e| match e {
        JobError::Input(reason) => JobError::Input(format!("few-shot examples: {reason}")),
        other => other,
    })?;
    let mut reader = RecordReader::new(inputs, options);
    let mut shots = Vec::new();
    while shots.len() < count {
        match reader.next_item()? {
            Some(Item::Record(record))
                if record.chat.is_none()
                    && record.choices.as_ref().is_some_and(|c| c.answer.is_some()) =>
            {
                shots.push(record);
            }
            Some(_) => {}
            None => {
                return Err(JobError::Input(format!(
                    "{} has {} answered multiple-choice records with a text, and --fewshot \
                     asks for {count}",
                    path.display(),
                    shots.len()
                )));
            }
        }
    }
    Ok(shots)
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::corpus_job::choice_input::ChoiceRecord;

    fn shot(
        id: &str,
        text: &str,
        fields: &[&str],
        choices: &[&str],
        answer: Option<u32>,
    ) -> Record {
        Record {
            id: Value::from(id),
            text: text.into(),
            fields: fields.iter().map(|f| f.to_string()).collect(),
            kept: Default::default(),
            chat: None,
            choices: Some(Box::new(ChoiceRecord {
                choices: choices.iter().map(|c| c.to_string()).collect(),
                answer,
            })),
        }
    }

    /// Each example reads as the prompt writes a record, its right choice after it; braces in
    /// an example are literal; the record's prompt follows, its fields and text in place.
    #[test]
    fn examples_are_written_through_the_prompt_with_their_answer() {
        let template = PromptTemplate::parse("{subject}: {text}\nAnswer:").unwrap();
        let shots = [
            shot("a", "2+2=", &["math"], &[" 3", " 4"], Some(1)),
            shot("b", "Set {x}", &["sets"], &[" {x}", " {}"], Some(0)),
        ];
        let fewshot = with_fewshot(&template, &shots, "\n\n").unwrap();
        let (before, after) = fewshot.around(&["physics".into()]);
        assert_eq!(
            before,
            "math: 2+2=\nAnswer: 4\n\nsets: Set {x}\nAnswer: {x}\n\nphysics: "
        );
        assert_eq!(after, "\nAnswer:");
        assert_eq!(fewshot.fields(), template.fields());
        // No examples: the prompt as it was.
        assert_eq!(with_fewshot(&template, &[], "\n\n").unwrap(), template);
    }

    #[test]
    fn an_example_without_an_answer_is_refused_naming_it() {
        let template = PromptTemplate::parse("{text}").unwrap();
        let error =
            with_fewshot(&template, &[shot("q7", "x", &[], &[" a"], None)], "\n").unwrap_err();
        assert!(
            error.contains("few-shot example \"q7\" has no answered choices"),
            "{error}"
        );
    }

    /// The first answered records with a text are the examples; a file with too few is
    /// refused saying how many it has.
    #[test]
    fn the_first_answered_records_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev.jsonl");
        std::fs::write(
            &path,
            concat!(
                r#"{"id": 1, "text": "open", "choices": [" a", " b"]}"#,
                "\n",
                r#"{"id": 2, "text": "first", "choices": [" a", " b"], "answer": 1}"#,
                "\n",
                r#"{"id": 3, "messages": [{"role": "user", "content": "hi"}], "choices": [" a"], "answer": 0}"#,
                "\n",
                r#"{"id": 4, "text": "second", "choices": [" c", " d"], "answer": " c"}"#,
                "\n",
            ),
        )
        .unwrap();
        let options = || ReaderOptions {
            prompts: crate::corpus_job::PromptInput::TextOrMessages,
            choices: Some(Default::default()),
            ..ReaderOptions::default()
        };
        let shots = read_fewshot(&path, options(), 2).unwrap();
        let texts: Vec<&str> = shots.iter().map(|s| s.text.as_str()).collect();
        assert_eq!(texts, ["first", "second"]);
        let error = read_fewshot(&path, options(), 3).unwrap_err().to_string();
        assert!(
            error.contains("has 2 answered multiple-choice records"),
            "{error}"
        );
        let missing = dir.path().join("missing.jsonl");
        let error = read_fewshot(&missing, options(), 1)
            .unwrap_err()
            .to_string();
        assert!(error.contains("few-shot examples: input "), "{error}");
    }
}
