//! Reading a corpus as a stream of records from its files (see `inputs.rs`). Bad lines
//! become [`BadRecord`]s, never a crash.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::JobError;
use super::chat_input::{ChatRecord, PromptInput, parse_batch_line, parse_messages};
use super::choice_input::{
    ChoiceFields, ChoiceRecord, PreferencePrompt, fill_blank, parse_choices, parse_preference,
};
use super::duplicates::{Duplicate, DuplicateFinder};
use super::inputs::{Format, InputSet, Source};
use super::parquet_columns::{Columns, ParquetRow, Row};
use super::prompt::LISTED;
use crate::records::{is_blank, json_object, line_text};

/// How records are read from the input.
#[derive(Clone, Debug)]
pub struct ReaderOptions {
    /// The field holding each record's id.
    pub id_field: String,
    /// The field holding its text.
    pub text_field: String,
    /// Other fields every record must have as text (those a generate prompt names): a
    /// record without one is a bad record.
    pub extra_fields: Vec<String>,
    /// Fields carried to the output as they are (`--keep-columns`): a record without one
    /// carries null.
    pub keep_fields: Vec<String>,
    /// The field whose value picks a record's few-shot examples (MMLU's `subject`): a
    /// record's value follows its [`Self::extra_fields`] in [`Record::fields`], and a
    /// record with text and without it is a bad record.
    pub group_field: Option<String>,
    /// Whether records may be conversations (generate jobs) or OpenAI Batch lines.
    pub prompts: PromptInput,
    /// Where a scoring job reads a record's choices (`None`: records have none): a
    /// multiple-choice record's, or a preference pair's (`prompt`, `chosen`, `rejected`).
    pub choices: Option<ChoiceFields>,
    /// Read no further than the input's first this many records, bad ones included (its
    /// first non-blank lines or rows: `--limit`, lm-evaluation-harness's `--limit`), so
    /// every pass reads the same records. With [`Self::limit_by`], each group's first this
    /// many.
    pub limit: Option<u64>,
    /// The field whose values each get [`Self::limit`] records (`--limit-by`: MMLU's
    /// `subject`, as lm-evaluation-harness limits each of its tasks): a record past its
    /// value's count is passed over as if the input had not held it, bad lines are all
    /// read, and a record without the field is bad.
    pub limit_by: Option<String>,
    /// With [`Self::limit_by`], each value's own count in place of [`Self::limit`] (a share
    /// of each group's records, counted first); a value not listed gets none.
    pub group_limits: Option<Arc<BTreeMap<String, u64>>>,
}

impl ReaderOptions {
    /// What of the reading changes a job's output beyond its input files, for its settings
    /// fingerprint: the labels scored in place of the choices, and the fields choices and
    /// answers are read from where they are not the default ones. `None` when all are as
    /// they were before these settings existed, so such a job keeps its fingerprint.
    pub fn output_settings(&self) -> Option<serde_json::Value> {
        let choices = self.choices.as_ref()?;
        let defaults = ChoiceFields::default();
        let mut settings = serde_json::Map::new();
        if !choices.labels.is_empty() {
            settings.insert("choice_labels".into(), choices.labels.clone().into());
        }
        if choices.choices != defaults.choices {
            settings.insert("choices_field".into(), choices.choices.clone().into());
        }
        if choices.answer != defaults.answer {
            settings.insert("answer_field".into(), choices.answer.clone().into());
        }
        if choices.answer_base != defaults.answer_base {
            settings.insert("answer_base".into(), choices.answer_base.into());
        }
        if let Some(blank) = &choices.blank {
            settings.insert("blank".into(), blank.as_str().into());
        }
        (!settings.is_empty()).then_some(serde_json::Value::Object(settings))
    }

    /// What of the limit makes the job's input other than the whole (`--limit`,
    /// `--limit-by` and each group's count from a share), for its input fingerprint;
    /// `None` without one. A plain limit reads as it always has, so such outputs resume.
    pub fn limit_settings(&self) -> Option<String> {
        let limit = match (&self.group_limits, self.limit) {
            (Some(limits), _) => {
                let counts = serde_json::to_string(limits.as_ref()).expect("counts are JSON");
                format!("limits={counts}")
            }
            (None, Some(limit)) => format!("limit={limit}"),
            (None, None) => return None,
        };
        Some(match &self.limit_by {
            Some(field) => format!("{limit} by={field}"),
            None => limit,
        })
    }

    /// Whether records have more than an id, a text and carried fields: a prompt's fields,
    /// conversations or OpenAI Batch lines, choices. A Parquet file's rows are then read
    /// whole, as a JSON line is.
    pub fn reads_structure(&self) -> bool {
        !self.extra_fields.is_empty()
            || self.group_field.is_some()
            || self.limit_by.is_some()
            || self.prompts != PromptInput::Text
            || self.choices.is_some()
    }
}

impl Default for ReaderOptions {
    fn default() -> Self {
        Self {
            id_field: "id".into(),
            text_field: "text".into(),
            extra_fields: Vec::new(),
            keep_fields: Vec::new(),
            group_field: None,
            prompts: PromptInput::Text,
            choices: None,
            limit: None,
            limit_by: None,
            group_limits: None,
        }
    }
}

/// One document.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    /// Its id, as the input gives it (a string or a number).
    pub id: Value,
    /// Its text.
    pub text: String,
    /// The values of [`ReaderOptions::extra_fields`], in their order, then its
    /// [`ReaderOptions::group_field`]'s when there is one (a record with text).
    pub fields: Vec<String>,
    /// [`ReaderOptions::keep_fields`] by name (empty when none are kept).
    pub kept: Kept,
    /// A conversation in place of the text (`text` is then empty): a `messages` record
    /// or an OpenAI Batch line.
    pub chat: Option<Box<ChatRecord>>,
    /// Choices to score after the text or conversation ([`ReaderOptions::choices`]).
    pub choices: Option<Box<ChoiceRecord>>,
    /// Its [`ReaderOptions::limit_by`] field's value, when there is one.
    pub limit_group: Option<String>,
    /// Its place, from 0, among the records that passed every check but the id's (the
    /// reader's own count, the same in every pass): the input's order, as
    /// lm-evaluation-harness numbers a task's documents (what its few-shot draws follow;
    /// a repeated id, left out as a bad record, still takes its place, as there).
    pub ordinal: u64,
}

pub use crate::records::Kept;

/// A line that was skipped, and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BadRecord {
    /// The input file.
    pub file: String,
    /// The line, from 1 (the row for Parquet).
    pub line: u64,
    /// Why it was skipped.
    pub reason: String,
}

/// What one step through a file found.
enum Raw {
    /// A line, now in the reader's buffer.
    Line,
    Blank,
    Row(Row),
}

/// Streams records (and bad lines) from every input file in order. Blocking: run it on a
/// reader thread.
pub struct RecordReader {
    inputs: InputSet,
    options: ReaderOptions,
    current: Option<(usize, Source, u64)>,
    next_file: usize,
    ids: IdCheck,
    /// Records read so far that passed every check but the id's: the same in every pass,
    /// so a pass can skip what the scan found.
    ordinal: u64,
    buffer: Vec<u8>,
    /// Where the last item was read: the file's index and line (row for Parquet).
    last_place: (u32, u64),
    /// Items (records and bad lines) returned so far, for [`ReaderOptions::limit`].
    returned: u64,
    /// Records returned so far of each [`ReaderOptions::limit_by`] value.
    returned_by_group: HashMap<String, u64>,
}

/// What a pass does about ids that repeat an earlier record's.
pub enum IdCheck {
    /// Nothing (a calibration sample).
    Off,
    /// Collect every id (the scan); the repeats are known at [`RecordReader::duplicates`].
    Collect(DuplicateFinder),
    /// Skip the records the scan found repeating an id: their ordinals, ascending.
    Skip(Arc<Vec<u64>>),
}

/// What the reader yields: a record, or a line it could not use.
pub enum Item {
    /// A usable record.
    Record(Record),
    /// A line it could not use, and why.
    Bad(BadRecord),
}

impl RecordReader {
    /// A reader of `inputs`, file by file in order, from the first record.
    pub fn new(inputs: InputSet, options: ReaderOptions) -> Self {
        Self {
            inputs,
            options,
            current: None,
            next_file: 0,
            ids: IdCheck::Off,
            ordinal: 0,
            buffer: Vec::new(),
            last_place: (0, 0),
            returned: 0,
            returned_by_group: HashMap::new(),
        }
    }

    /// Checks ids as it reads (duplicates refused, or those already done skipped).
    pub fn with_id_check(mut self, ids: IdCheck) -> Self {
        self.ids = ids;
        self
    }

    /// After a pass with [`IdCheck::Collect`]: every record whose id an earlier one has.
    pub fn duplicates(self) -> Result<Vec<Duplicate>, JobError> {
        match self.ids {
            IdCheck::Collect(finder) => finder.finish().map_err(JobError::Input),
            _ => Ok(Vec::new()),
        }
    }

    /// The file (its index in the input set) and line of the item [`Self::next_item`]
    /// returned last.
    pub fn last_place(&self) -> (u32, u64) {
        self.last_place
    }

    fn display_name(&self, index: usize) -> &str {
        &self.inputs.files[index].name
    }

    /// The next record or bad line; `Ok(None)` at the end of the corpus, or once
    /// [`ReaderOptions::limit`] items have been returned (without
    /// [`ReaderOptions::limit_by`], each value's limit kept as it reads).
    pub fn next_item(&mut self) -> Result<Option<Item>, JobError> {
        let limit = self
            .options
            .limit
            .filter(|_| self.options.limit_by.is_none());
        if limit.is_some_and(|limit| self.returned >= limit) {
            return Ok(None);
        }
        let item = self.read_item()?;
        self.returned += u64::from(item.is_some());
        Ok(item)
    }

    /// The next record or bad line, whatever the limit.
    fn read_item(&mut self) -> Result<Option<Item>, JobError> {
        loop {
            if self.current.is_none() {
                if self.next_file >= self.inputs.files.len() {
                    return Ok(None);
                }
                let columns = Columns {
                    text: &self.options.text_field,
                    id: &self.options.id_field,
                    keep: &self.options.keep_fields,
                    objects: self.options.reads_structure(),
                };
                let source = self.inputs.open(self.next_file, &columns)?;
                self.current = Some((self.next_file, source, 0));
                self.next_file += 1;
            }
            let Some(raw) = self.next_raw()? else {
                self.current = None;
                continue;
            };
            let (index, line) = self
                .current
                .as_ref()
                .map(|c| (c.0, c.2))
                .expect("set above");
            self.last_place = (index as u32, line);
            let parsed = match raw {
                Raw::Blank => continue,
                Raw::Line => self.parse_line(index, line),
                Raw::Row(row) => row.and_then(|row| match row {
                    ParquetRow::Text { id, text, kept } => Ok(Record {
                        id: id.unwrap_or_else(|| self.generated_id(index, line)),
                        text,
                        fields: Vec::new(),
                        kept,
                        chat: None,
                        choices: None,
                        limit_group: None,
                        ordinal: 0,
                    }),
                    ParquetRow::Object(object) => self.parse_object(object, index, line),
                }),
            };
            let checked = parsed.and_then(|record| {
                // A choice may follow nothing (scored alone); a text must be there to read.
                if record.chat.is_none()
                    && record.choices.is_none()
                    && record.text.trim().is_empty()
                {
                    return Err("empty text".to_owned());
                }
                Ok(record)
            });
            let checked = match checked {
                Ok(record) if self.past_group_limit(&record) => continue,
                Ok(record) => self.check_id(record, index, line)?,
                Err(reason) => Err(reason),
            };
            return Ok(Some(match checked {
                Ok(record) => Item::Record(record),
                Err(reason) => Item::Bad(BadRecord {
                    file: self.display_name(index).to_owned(),
                    line,
                    reason,
                }),
            }));
        }
    }

    /// Whether `record`'s [`ReaderOptions::limit_by`] value has had its records already
    /// (it is then passed over, before its id is checked, as if the input had not held
    /// it); counts it otherwise.
    fn past_group_limit(&mut self, record: &Record) -> bool {
        let Some(group) = &record.limit_group else {
            return false;
        };
        let limit = match &self.options.group_limits {
            Some(limits) => limits.get(group).copied().unwrap_or(0),
            None => self.options.limit.unwrap_or(u64::MAX),
        };
        let returned = self.returned_by_group.entry(group.clone()).or_insert(0);
        if *returned >= limit {
            return true;
        }
        *returned += 1;
        false
    }

    fn check_id(
        &mut self,
        mut record: Record,
        file: usize,
        line: u64,
    ) -> Result<Result<Record, String>, JobError> {
        let ordinal = self.ordinal;
        self.ordinal += 1;
        record.ordinal = ordinal;
        match &mut self.ids {
            IdCheck::Off => {}
            IdCheck::Collect(finder) => finder
                .add(&record.id.to_string(), ordinal, file as u32, line)
                .map_err(JobError::Input)?,
            IdCheck::Skip(ordinals) => {
                if ordinals.binary_search(&ordinal).is_ok() {
                    return Ok(Err(format!("duplicate id {}", record.id)));
                }
            }
        }
        Ok(Ok(record))
    }

    /// Advances the current file by one line or row; `None` at its end.
    fn next_raw(&mut self) -> Result<Option<Raw>, JobError> {
        let (index, source, line) = self.current.as_mut().expect("a file is open");
        let raw = match source {
            Source::Parquet(rows) => match rows.next_row()? {
                Some(row) => Raw::Row(row),
                None => return Ok(None),
            },
            Source::Lines(reader) => {
                self.buffer.clear();
                let read = reader.read_until(b'\n', &mut self.buffer).map_err(|e| {
                    JobError::Input(format!("cannot read {}: {e}", self.inputs.describe(*index)))
                })?;
                if read == 0 {
                    return Ok(None);
                }
                while matches!(self.buffer.last(), Some(b'\n' | b'\r')) {
                    self.buffer.pop();
                }
                let jsonl = self.inputs.files[*index].format() == Format::Jsonl;
                if jsonl && is_blank(&self.buffer) {
                    Raw::Blank // blank lines in JSONL are not records, but still count as lines
                } else {
                    Raw::Line
                }
            }
        };
        *line += 1;
        Ok(Some(raw))
    }

    /// The record on the line in `self.buffer`, or why it is bad.
    fn parse_line(&self, index: usize, line: u64) -> Result<Record, String> {
        let text = line_text(&self.buffer)?;
        match self.inputs.files[index].format() {
            Format::Text => {
                self.no_extra_fields("plain-text")?;
                if let Some(field) = self.options.keep_fields.first() {
                    return Err(format!(
                        "--keep-columns names `{field}`, and plain-text records have only a \
                         text; give the corpus as JSON lines or Parquet"
                    ));
                }
                Ok(Record {
                    id: self.generated_id(index, line),
                    text: text.to_owned(),
                    fields: Vec::new(),
                    kept: Kept::new(),
                    chat: None,
                    choices: None,
                    limit_group: None,
                    ordinal: 0,
                })
            }
            _ => self.parse_json(text, index, line),
        }
    }

    /// Fields besides the text are read from JSON lines and Parquet only.
    fn no_extra_fields(&self, format: &str) -> Result<(), String> {
        let prompt_field = self.options.extra_fields.first();
        let group_field = self.options.group_field.as_ref();
        let named = prompt_field.map(|f| (f, "the prompt names"));
        let limit_by = self
            .options
            .limit_by
            .as_ref()
            .map(|f| (f, "--limit-by names"));
        match (named.or(group_field.map(|f| (f, "few-shot groups by")))).or(limit_by) {
            Some((field, by)) => Err(format!(
                "{by} the field `{field}`, and {format} records have only a text; give the \
                 corpus as JSON lines or Parquet"
            )),
            None => Ok(()),
        }
    }

    fn generated_id(&self, index: usize, line: u64) -> Value {
        if self.inputs.files.len() == 1 {
            Value::from(line)
        } else {
            Value::from(format!("{}:{line}", self.display_name(index)))
        }
    }

    fn parse_json(&self, text: &str, index: usize, line: u64) -> Result<Record, String> {
        self.parse_object(json_object(text)?, index, line)
    }

    /// The record in a JSON line's object, or a Parquet row's read as one.
    fn parse_object(
        &self,
        object: serde_json::Map<String, Value>,
        index: usize,
        line: u64,
    ) -> Result<Record, String> {
        let limit_group = (self.options.limit_by.as_ref())
            .map(|field| field_text(&object, field, "--limit-by's group"))
            .transpose()?;
        let record = self.parse_record(object, index, line)?;
        Ok(Record {
            limit_group,
            ordinal: 0,
            ..record
        })
    }

    /// [`Self::parse_object`]'s record, but for its [`Record::limit_group`].
    fn parse_record(
        &self,
        mut object: serde_json::Map<String, Value>,
        index: usize,
        line: u64,
    ) -> Result<Record, String> {
        if self.options.prompts == PromptInput::OpenAiBatch {
            let (id, chat) = parse_batch_line(&object)?;
            return Ok(Record {
                id,
                text: String::new(),
                fields: Vec::new(),
                kept: self.kept(&object),
                chat: Some(Box::new(chat)),
                choices: None,
                limit_group: None,
                ordinal: 0,
            });
        }
        let has_text = object.contains_key(&self.options.text_field);
        let (preference, choices) = self.choices_of(&mut object, has_text)?;
        let messages = match preference {
            Some(PreferencePrompt::Text(prompt)) => {
                object.insert(self.options.text_field.clone(), Value::String(prompt));
                None
            }
            Some(PreferencePrompt::Messages(messages)) => Some(messages),
            _ if self.options.prompts != PromptInput::TextOrMessages || has_text => None,
            _ => object.get("messages").map(parse_messages).transpose()?,
        };
        if let Some(messages) = messages {
            let id = self.record_id(&mut object, index, line)?;
            return Ok(Record {
                id,
                text: String::new(),
                fields: Vec::new(),
                kept: self.kept(&object),
                chat: Some(Box::new(ChatRecord {
                    messages,
                    ..ChatRecord::default()
                })),
                choices,
                limit_group: None,
                ordinal: 0,
            });
        }
        let labels = (self.options.choices.as_ref()).map_or(&[][..], |c| &c.labels[..]);
        let mut fields = (self.options.extra_fields.iter())
            .map(|field| prompt_field(&object, field, labels))
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(field) = &self.options.group_field {
            fields.push(field_text(&object, field, "the record's few-shot group")?);
        }
        let kept = self.kept(&object);
        let text = match object.remove(&self.options.text_field) {
            Some(Value::String(text)) => text,
            Some(_) => {
                return Err(format!(
                    "text field `{}` is not a string",
                    self.options.text_field
                ));
            }
            None => return Err(format!("missing text field `{}`", self.options.text_field)),
        };
        let id = self.record_id(&mut object, index, line)?;
        Ok(Record {
            id,
            text,
            fields,
            kept,
            chat: None,
            choices,
            limit_group: None,
            ordinal: 0,
        })
    }

    /// A scoring job's record's choices ([`ReaderOptions::choices`]), and the prompt in
    /// place of its text when it is a preference pair (a record without a text field).
    /// With a blank (`--blank`) the choices fill the text's, which becomes what follows it.
    fn choices_of(
        &self,
        object: &mut serde_json::Map<String, Value>,
        has_text: bool,
    ) -> Result<(Option<PreferencePrompt>, Option<Box<ChoiceRecord>>), String> {
        let Some(fields) = &self.options.choices else {
            return Ok((None, None));
        };
        if !has_text && let Some((prompt, pair)) = parse_preference(object)? {
            return Ok((Some(prompt), Some(Box::new(pair))));
        }
        let mut choices = parse_choices(object, fields)?;
        let text_field = &self.options.text_field;
        if let (Some(blank), Some(choices)) = (&fields.blank, &mut choices)
            && let Some(Value::String(text)) = object.get(text_field)
        {
            let rest = fill_blank(text, choices, blank)?;
            object.insert(text_field.clone(), Value::String(rest));
        }
        Ok((None, choices.map(Box::new)))
    }

    /// The record's id field, or one made of its place.
    fn record_id(
        &self,
        object: &mut serde_json::Map<String, Value>,
        index: usize,
        line: u64,
    ) -> Result<Value, String> {
        match object.remove(&self.options.id_field) {
            Some(id @ (Value::String(_) | Value::Number(_))) => Ok(id),
            Some(_) => Err(format!(
                "id field `{}` is not a string or number",
                self.options.id_field
            )),
            None => Ok(self.generated_id(index, line)),
        }
    }

    /// [`ReaderOptions::keep_fields`] of the record (a name, or a path as a prompt's
    /// fields are), null where it has none.
    fn kept(&self, object: &serde_json::Map<String, Value>) -> Kept {
        self.options
            .keep_fields
            .iter()
            .map(|field| {
                let value = field_value(object, field);
                (field.clone(), value.cloned().unwrap_or(Value::Null))
            })
            .collect()
    }
}

/// A record's `field`: its key, or else a path into its lists and objects, each step
/// after a dot a key or an index from 0 (`choices.0`, `choices.text.2`, `meta.source`).
fn field_value<'a>(object: &'a serde_json::Map<String, Value>, field: &str) -> Option<&'a Value> {
    if let Some(value) = object.get(field) {
        return Some(value);
    }
    let (head, path) = field.split_once('.')?;
    crate::records::value_at_path(object.get(head)?, path)
}

/// A record's `field` as text (a number or a boolean as JSON writes it); `why` says what
/// asks for it, in the refusal of a record without it.
fn field_text(
    object: &serde_json::Map<String, Value>,
    field: &str,
    why: &str,
) -> Result<String, String> {
    match field_value(object, field) {
        Some(Value::String(value)) => Ok(value.clone()),
        Some(value @ (Value::Number(_) | Value::Bool(_))) => Ok(value.to_string()),
        Some(_) => Err(format!("field `{field}` ({why}) is not text")),
        None => Err(format!("missing field `{field}` ({why})")),
    }
}

/// A record's field as a prompt names it: its text ([`field_text`]), or with `:listed`
/// (`{options:listed}`) the list it holds, an item a line, each after its label and ". ":
/// `labels` (`--choice-labels`) where given, else A, B, C... (MMLU-Pro's options, however
/// many a record has).
fn prompt_field(
    object: &serde_json::Map<String, Value>,
    field: &str,
    labels: &[String],
) -> Result<String, String> {
    let Some(name) = field.strip_suffix(LISTED) else {
        return field_text(object, field, "named in the prompt");
    };
    let items = match field_value(object, name) {
        Some(Value::Array(items)) => items,
        Some(_) => {
            return Err(format!(
                "field `{name}` (listed in the prompt) is not a list"
            ));
        }
        None => return Err(format!("missing field `{name}` (listed in the prompt)")),
    };
    // Without labels, the 26 letters.
    let (count, label) = match labels.is_empty() {
        true => (26, None),
        false => (labels.len(), Some(labels)),
    };
    if items.len() > count {
        return Err(format!(
            "field `{name}` lists {} items, and there are {count} labels for them (give a \
             label for each: --choice-labels)",
            items.len()
        ));
    }
    let mut lines = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        let label = match label {
            Some(labels) => labels[index].clone(),
            None => char::from(b'A' + index as u8).to_string(),
        };
        let text = match item {
            Value::String(text) => text.clone(),
            Value::Number(_) | Value::Bool(_) => item.to_string(),
            _ => {
                return Err(format!(
                    "`{name}`[{index}] (listed in the prompt) is not text"
                ));
            }
        };
        lines.push(format!("{label}. {text}"));
    }
    Ok(lines.join("\n"))
}

/// Every record of the corpus at `path`, or its bad record's reason (tests).
#[cfg(test)]
pub(super) fn read_items(
    path: &std::path::Path,
    options: ReaderOptions,
) -> Vec<Result<Record, String>> {
    let mut reader = RecordReader::new(InputSet::local(path).unwrap(), options);
    let mut items = Vec::new();
    while let Some(item) = reader.next_item().unwrap() {
        items.push(match item {
            Item::Record(record) => Ok(record),
            Item::Bad(bad) => Err(bad.reason),
        });
    }
    items
}

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::path::Path;

    use super::*;

    /// Two passes, as a job reads: the scan collects ids, the second skips repeats.
    fn collect(path: &Path) -> (Vec<Record>, Vec<BadRecord>) {
        let inputs = InputSet::local(path).unwrap();
        let mut scan = RecordReader::new(inputs.clone(), ReaderOptions::default())
            .with_id_check(IdCheck::Collect(DuplicateFinder::default()));
        while scan.next_item().unwrap().is_some() {}
        let ordinals = scan
            .duplicates()
            .unwrap()
            .iter()
            .map(|d| d.ordinal)
            .collect();
        let mut reader = RecordReader::new(inputs, ReaderOptions::default())
            .with_id_check(IdCheck::Skip(Arc::new(ordinals)));
        let (mut good, mut bad) = (Vec::new(), Vec::new());
        while let Some(item) = reader.next_item().unwrap() {
            match item {
                Item::Record(r) => good.push(r),
                Item::Bad(b) => bad.push(b),
            }
        }
        (good, bad)
    }

    #[test]
    fn bad_lines_are_listed_with_their_line_and_reason() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("docs.jsonl");
        let mut bytes = b"{\"id\": \"a\", \"text\": \"alpha\"}\n{not json\n{\"id\": \"b\"}\n{\"id\": \"c\", \"text\": \"  \"}\n".to_vec();
        bytes.extend(b"{\"id\": \"d\", \"text\": \"\xff\xfe\"}\n{\"id\": \"a\", \"text\": \"again\"}\n\n{\"text\": \"no id\"}\n");
        std::fs::write(&path, bytes).unwrap();
        let (good, bad) = collect(&path);
        assert_eq!(
            good.iter().map(|r| r.id.clone()).collect::<Vec<_>>(),
            vec![Value::from("a"), Value::from(8)]
        );
        let reasons: Vec<(u64, &str)> = bad.iter().map(|b| (b.line, b.reason.as_str())).collect();
        assert_eq!(reasons[1], (3, "missing text field `text`"));
        assert_eq!(reasons[2], (4, "empty text"));
        assert_eq!(reasons[3], (5, "invalid UTF-8"));
        assert_eq!(reasons[4], (6, "duplicate id \"a\""));
        assert!(reasons[0].1.starts_with("malformed JSON"), "{reasons:?}");
        assert!(bad.iter().all(|b| b.file == "docs.jsonl"));
    }

    /// `--limit`: the first N items, bad lines counted and blank lines not, in every
    /// pass; the few-shot reader is not limited (`fewshot.rs`).
    #[test]
    fn a_limit_reads_the_input_s_first_records_bad_ones_included() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("docs.jsonl");
        let lines = "{\"id\": 1, \"text\": \"a\"}\n\n{bad\n{\"id\": 2, \"text\": \"b\"}\n\
                     {\"id\": 3, \"text\": \"c\"}\n";
        std::fs::write(&path, lines).unwrap();
        let limited = |limit| {
            let options = ReaderOptions {
                limit,
                ..ReaderOptions::default()
            };
            let items = read_items(&path, options);
            let ids: Vec<String> = (items.iter())
                .map(|item| match item {
                    Ok(record) => record.id.to_string(),
                    Err(_) => "bad".to_owned(),
                })
                .collect();
            ids
        };
        assert_eq!(limited(Some(1)), ["1"]);
        assert_eq!(
            limited(Some(3)),
            ["1", "bad", "2"],
            "the blank line is not one"
        );
        assert_eq!(limited(Some(9)), limited(None));
        assert_eq!(limited(None), ["1", "bad", "2", "3"]);
    }

    /// `--limit N --limit-by FIELD`: each value's first N records, the rest passed over
    /// before their ids are checked (a repeated id among them is no duplicate); bad lines
    /// all read, a record without the field bad; a share's counts by value in place of N.
    #[test]
    fn a_limit_by_a_field_reads_each_value_s_first_records() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mmlu.jsonl");
        let record = |id: u32, subject: &str| {
            format!("{{\"id\": {id}, \"text\": \"q{id}\", \"subject\": \"{subject}\"}}\n")
        };
        let lines = [
            record(1, "math"),
            record(2, "law"),
            record(3, "math"),
            "{bad\n".to_owned(),
            record(4, "math"),
            "{\"id\": 5, \"text\": \"no subject\"}\n".to_owned(),
            record(2, "law"),
            record(6, "art"),
            record(7, "law"),
        ];
        std::fs::write(&path, lines.concat()).unwrap();
        let read = |limit, group_limits: Option<BTreeMap<String, u64>>| {
            let options = ReaderOptions {
                limit,
                limit_by: Some("subject".into()),
                group_limits: group_limits.map(Arc::new),
                ..ReaderOptions::default()
            };
            let mut reader = RecordReader::new(InputSet::local(&path).unwrap(), options)
                .with_id_check(IdCheck::Collect(DuplicateFinder::default()));
            let mut ids = Vec::new();
            while let Some(item) = reader.next_item().unwrap() {
                ids.push(match item {
                    Item::Record(record) => {
                        format!("{}{}", record.limit_group.unwrap(), record.id)
                    }
                    Item::Bad(bad) => bad.reason,
                });
            }
            (ids, reader.duplicates().unwrap().len())
        };
        let (ids, duplicates) = read(Some(1), None);
        assert_eq!(
            ids,
            [
                "math1",
                "law2",
                "malformed JSON: key must be a string at line 1 column 2",
                "missing field `subject` (--limit-by's group)",
                "art6"
            ]
        );
        assert_eq!(
            duplicates, 0,
            "law's second id 2 is past the limit: not read"
        );
        let (ids, duplicates) = read(Some(2), None);
        assert_eq!(ids.iter().filter(|id| id.starts_with("math")).count(), 2);
        assert_eq!(duplicates, 1, "id 2 again, within law's two");
        let counts = [("math".to_owned(), 3), ("art".to_owned(), 1)];
        let (ids, _) = read(None, Some(counts.into_iter().collect()));
        let records: Vec<&String> = ids.iter().filter(|id| !id.contains(' ')).collect();
        assert_eq!(records, ["math1", "math3", "math4", "art6"], "law has none");
        let options = |limit_by: Option<&str>, limit| ReaderOptions {
            limit,
            limit_by: limit_by.map(str::to_owned),
            ..ReaderOptions::default()
        };
        assert_eq!(options(None, None).limit_settings(), None);
        assert_eq!(
            options(None, Some(3)).limit_settings().as_deref(),
            Some("limit=3"),
            "a plain limit reads as before"
        );
        assert_eq!(
            options(Some("subject"), Some(3))
                .limit_settings()
                .as_deref(),
            Some("limit=3 by=subject")
        );
    }

    /// Only choice labels, renamed choice fields, an answer base and a blank join the
    /// settings, so a job with none keeps its fingerprint.
    #[test]
    fn choice_labels_and_renamed_choice_fields_are_the_reading_s_output_settings() {
        let mut options = ReaderOptions::default();
        assert_eq!(options.output_settings(), None);
        options.choices = Some(ChoiceFields::default());
        assert_eq!(options.output_settings(), None);
        options.choices = Some(ChoiceFields {
            labels: vec!["A".into(), "B".into()],
            ..ChoiceFields::default()
        });
        let settings = options.output_settings().unwrap();
        assert_eq!(settings, serde_json::json!({"choice_labels": ["A", "B"]}));
        options.choices = Some(ChoiceFields {
            choices: "endings".into(),
            answer: "label".into(),
            ..ChoiceFields::default()
        });
        let settings = options.output_settings().unwrap();
        let renamed = serde_json::json!({"choices_field": "endings", "answer_field": "label"});
        assert_eq!(settings, renamed);
        options.choices = Some(ChoiceFields {
            answer_base: 1,
            blank: Some("_".into()),
            ..ChoiceFields::default()
        });
        let settings = options.output_settings().unwrap();
        assert_eq!(
            settings,
            serde_json::json!({"answer_base": 1, "blank": "_"})
        );
    }

    /// A field past a dot is a path into the record's lists and objects (MMLU's
    /// `{choices.0}`, ARC's `{choices.text.1}`); a key that holds the dot itself comes
    /// first; a path that leads nowhere is a missing field.
    #[test]
    fn fields_reach_into_lists_and_objects() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("docs.jsonl");
        let lines = [
            r#"{"text": "q", "choices": ["red", "blue"], "arc": {"text": ["x", "y"]}, "a.b": "dotted", "meta": {"year": 1999}}"#,
            r#"{"text": "q", "choices": ["red"], "arc": {"text": []}, "a.b": "d", "meta": {}}"#,
        ];
        std::fs::write(&path, lines.join("\n")).unwrap();
        let fields = ["choices.1", "arc.text.0", "a.b", "meta.year"];
        let options = ReaderOptions {
            extra_fields: fields.map(String::from).to_vec(),
            ..ReaderOptions::default()
        };
        let items = read_items(&path, options);
        assert_eq!(
            items[0].as_ref().unwrap().fields,
            ["blue", "x", "dotted", "1999"]
        );
        assert_eq!(
            items[1].as_ref().unwrap_err(),
            "missing field `choices.1` (named in the prompt)"
        );
    }

    /// `{options:listed}`: the list, an item a line after its label and ". " (A, B, C...,
    /// or the choice labels), however many items a record has (MMLU-Pro's 3 to 10 options);
    /// a field that is no list, an item that is no text, or more items than labels, is a
    /// bad record saying so.
    #[test]
    fn a_listed_field_writes_each_item_after_its_label() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("docs.jsonl");
        let lines = [
            r#"{"text": "q", "options": ["red", "blue", 3]}"#,
            r#"{"text": "q", "options": ["red"], "arc": {"text": ["x", "y"]}}"#,
            r#"{"text": "q", "options": "red"}"#,
            r#"{"text": "q", "options": [["red"]]}"#,
        ];
        std::fs::write(&path, lines.join("\n")).unwrap();
        let listed = |fields: &[&str], labels: &[&str]| {
            let options = ReaderOptions {
                extra_fields: fields.iter().map(|f| f.to_string()).collect(),
                choices: Some(ChoiceFields {
                    choices: "none".into(),
                    labels: labels.iter().map(|l| l.to_string()).collect(),
                    ..ChoiceFields::default()
                }),
                ..ReaderOptions::default()
            };
            let items = read_items(&path, options);
            (items.into_iter())
                .map(|item| item.map(|record| record.fields.join("|")))
                .collect::<Vec<_>>()
        };
        let read = listed(&["options:listed"], &[]);
        assert_eq!(
            read[..2],
            [Ok("A. red\nB. blue\nC. 3".into()), Ok("A. red".into())]
        );
        let error = |item: &Result<String, String>| item.clone().unwrap_err();
        assert!(error(&read[2]).contains("`options` (listed in the prompt) is not a list"));
        assert!(error(&read[3]).contains("`options`[0] (listed in the prompt) is not text"));
        let read = listed(&["options:listed"], &["1", "2"]);
        assert_eq!(read[1], Ok("1. red".into()));
        assert!(error(&read[0]).contains("lists 3 items, and there are 2 labels"));
        let read = listed(&["arc.text:listed"], &[]);
        assert_eq!(read[1], Ok("A. x\nB. y".into()));
    }

    #[test]
    fn fields_a_prompt_names_are_read_and_a_record_without_one_is_bad() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("docs.jsonl");
        std::fs::write(
            &path,
            "{\"id\": 1, \"text\": \"a\", \"title\": \"T\", \"year\": 2024}\n\
             {\"id\": 2, \"text\": \"b\", \"year\": 2025}\n\
             {\"id\": 3, \"text\": \"c\", \"title\": [1], \"year\": 1}\n",
        )
        .unwrap();
        let options = ReaderOptions {
            extra_fields: vec!["title".into(), "year".into()],
            ..ReaderOptions::default()
        };
        let mut reader = RecordReader::new(InputSet::local(&path).unwrap(), options.clone());
        let mut items = Vec::new();
        while let Some(item) = reader.next_item().unwrap() {
            items.push(item);
        }
        let Item::Record(first) = &items[0] else {
            panic!("the first record is good");
        };
        assert_eq!(first.fields, vec!["T".to_owned(), "2024".to_owned()]);
        let reasons: Vec<String> = items[1..]
            .iter()
            .map(|item| match item {
                Item::Bad(bad) => bad.reason.clone(),
                Item::Record(record) => panic!("{record:?}"),
            })
            .collect();
        assert_eq!(
            reasons,
            [
                "missing field `title` (named in the prompt)",
                "field `title` (named in the prompt) is not text"
            ]
        );
        let text = dir.path().join("plain.txt");
        std::fs::write(&text, "just text\n").unwrap();
        let mut reader = RecordReader::new(InputSet::local(&text).unwrap(), options);
        let Some(Item::Bad(bad)) = reader.next_item().unwrap() else {
            panic!("a text line cannot have a title");
        };
        assert!(
            bad.reason.contains("give the corpus as JSON lines"),
            "{bad:?}"
        );
    }

    /// A scoring job reads a multiple-choice record (text or conversation), a preference
    /// pair (its prompt in the text's place, or as the conversation), and a plain record;
    /// a bad answer is a bad record. A job that does not score reads `choices` as any
    /// other field, and a pair as a record without text.
    #[test]
    fn a_scoring_job_reads_choices_and_preference_pairs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("eval.jsonl");
        std::fs::write(
            &path,
            concat!(
                r#"{"id": "mc", "text": "2+2=", "choices": ["3", "4"], "answer": 1}"#,
                "\n",
                r#"{"id": "chat", "messages": [{"role": "user", "content": "2+2?"}], "choices": ["4"]}"#,
                "\n",
                r#"{"id": "pair", "prompt": "Sky:", "chosen": " blue", "rejected": " red"}"#,
                "\n",
                r#"{"id": "plain", "text": "Just text."}"#,
                "\n",
                r#"{"id": "bad", "text": "2+2=", "choices": ["4"], "answer": 3}"#,
                "\n",
            ),
        )
        .unwrap();
        let read = |choices: Option<ChoiceFields>| {
            let options = ReaderOptions {
                prompts: PromptInput::TextOrMessages,
                choices,
                ..ReaderOptions::default()
            };
            read_items(&path, options)
        };
        let items = read(Some(ChoiceFields::default()));
        let record = |i: usize| items[i].as_ref().unwrap();
        let answer = |i: usize| {
            record(i)
                .choices
                .as_ref()
                .map(|c| (c.choices.len(), c.answers.clone()))
        };
        assert_eq!(
            (record(0).text.as_str(), answer(0)),
            ("2+2=", Some((2, vec![1])))
        );
        assert_eq!(record(1).chat.as_ref().unwrap().messages.len(), 1);
        assert_eq!(answer(1), Some((1, vec![])));
        assert_eq!(record(2).text, "Sky:");
        assert_eq!(
            record(2).choices.as_ref().unwrap().choices,
            [" blue", " red"]
        );
        assert_eq!(answer(2), Some((2, vec![0])));
        assert_eq!(answer(3), None);
        let error = items[4].as_ref().unwrap_err();
        assert!(error.contains("names none of the 1 choices"), "{error}");
        let items = read(None);
        assert!(items.iter().all(|item| {
            item.as_ref().is_ok_and(|r| r.choices.is_none())
                || item
                    .as_ref()
                    .is_err_and(|e| e.contains("missing text field"))
        }));
        assert!(items[2].is_err(), "a pair without --score has no text");
    }

    #[test]
    fn every_record_knows_its_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("a.jsonl"),
            "{\"id\": 1, \"text\": \"one\"}\n\n{\"id\": 2, \"text\": \"two\"}\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("b.txt"), "bad\nthree\n").unwrap();
        let inputs = InputSet::local(dir.path()).unwrap();
        let mut reader = RecordReader::new(inputs, ReaderOptions::default());
        let mut places = Vec::new();
        while let Some(item) = reader.next_item().unwrap() {
            if let Item::Record(record) = item {
                places.push((record.text, reader.last_place()));
            }
        }
        let expected = [
            ("one", (0, 1)),
            ("two", (0, 3)),
            ("bad", (1, 1)),
            ("three", (1, 2)),
        ];
        let expected: Vec<(String, (u32, u64))> =
            expected.iter().map(|(t, p)| (t.to_string(), *p)).collect();
        assert_eq!(places, expected);
    }

    #[test]
    fn directories_text_gzip_and_zstd() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), "first line\nsecond line\n").unwrap();
        let mut gz = flate2::write::GzEncoder::new(
            File::create(dir.path().join("b.jsonl.gz")).unwrap(),
            flate2::Compression::fast(),
        );
        gz.write_all(b"{\"id\": 7, \"text\": \"zipped\"}\n")
            .unwrap();
        gz.finish().unwrap();
        let zst =
            zstd::stream::encode_all(&b"{\"id\": 8, \"text\": \"squeezed\"}\n"[..], 3).unwrap();
        std::fs::write(dir.path().join("c.ndjson.zst"), zst).unwrap();
        std::fs::write(dir.path().join("notes.md"), "ignored").unwrap();
        let (good, bad) = collect(dir.path());
        assert!(bad.is_empty());
        let ids: Vec<Value> = good.iter().map(|r| r.id.clone()).collect();
        assert_eq!(
            ids,
            vec![
                Value::from("a.txt:1"),
                Value::from("a.txt:2"),
                Value::from(7),
                Value::from(8)
            ]
        );
        assert_eq!(
            (good[2].text.as_str(), good[3].text.as_str()),
            ("zipped", "squeezed")
        );
        assert!(InputSet::local(&dir.path().join("missing")).is_err());
    }

    #[cfg(feature = "parquet")]
    #[test]
    fn parquet_text_and_id_columns() {
        use std::sync::Arc;

        use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("corpus.parquet");
        let ids: ArrayRef = Arc::new(Int64Array::from(vec![10, 11, 12, 13]));
        let texts: ArrayRef = Arc::new(StringArray::from(vec![
            Some("first"),
            None,
            Some(""),
            Some("fourth"),
        ]));
        let batch = RecordBatch::try_from_iter([("id", ids), ("text", texts)]).unwrap();
        let mut writer = parquet::arrow::ArrowWriter::try_new(
            File::create(&path).unwrap(),
            batch.schema(),
            None,
        )
        .unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
        let (good, bad) = collect(&path);
        assert_eq!(
            good.iter()
                .map(|r| (r.id.clone(), r.text.as_str()))
                .collect::<Vec<_>>(),
            vec![(Value::from(10), "first"), (Value::from(13), "fourth")]
        );
        let reasons: Vec<(u64, &str)> = bad.iter().map(|b| (b.line, b.reason.as_str())).collect();
        assert_eq!(
            reasons,
            vec![(2, "missing text field `text`"), (3, "empty text")]
        );

        let options = ReaderOptions {
            id_field: "id".into(),
            text_field: "body".into(),
            ..ReaderOptions::default()
        };
        let error = RecordReader::new(InputSet::local(&path).unwrap(), options)
            .next_item()
            .err()
            .unwrap()
            .to_string();
        assert!(
            error.contains("has no column `body` (use --text-field; its columns: id, text)"),
            "{error}"
        );
    }
}
