//! Reading a corpus as a stream of records: JSONL or plain text, optionally gzip-compressed,
//! one file or a directory of them. Bad lines become [`BadRecord`]s, never a crash.

use std::collections::HashSet;
use std::fs::File;
use std::hash::{Hash, Hasher};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::JobError;
use super::parquet_rows::ParquetRows;

#[derive(Clone, Debug)]
pub struct ReaderOptions {
    pub id_field: String,
    pub text_field: String,
}

impl Default for ReaderOptions {
    fn default() -> Self {
        Self {
            id_field: "id".into(),
            text_field: "text".into(),
        }
    }
}

/// One document.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    pub id: Value,
    pub text: String,
}

/// A line that was skipped, and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BadRecord {
    pub file: String,
    pub line: u64,
    pub reason: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    Jsonl,
    Text,
    Parquet,
}

/// An open input file.
enum Source {
    Lines(Box<dyn BufRead + Send>),
    Parquet(ParquetRows),
}

/// What one step through a file found.
enum Raw {
    /// A line, now in the reader's buffer.
    Line,
    Blank,
    Row(super::parquet_rows::Row),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Compression {
    None,
    Gzip,
    Zstd,
}

fn format_of(path: &Path) -> Option<(Format, Compression)> {
    let name = path.file_name()?.to_str()?.to_ascii_lowercase();
    let (stem, compression) = if let Some(stem) = name.strip_suffix(".gz") {
        (stem.to_owned(), Compression::Gzip)
    } else if let Some(stem) = name.strip_suffix(".zst") {
        (stem.to_owned(), Compression::Zstd)
    } else {
        (name, Compression::None)
    };
    if stem.ends_with(".parquet") && compression == Compression::None {
        Some((Format::Parquet, compression))
    } else if stem.ends_with(".jsonl") || stem.ends_with(".ndjson") || stem.ends_with(".json") {
        Some((Format::Jsonl, compression))
    } else if stem.ends_with(".txt") || stem.ends_with(".text") {
        Some((Format::Text, compression))
    } else {
        None
    }
}

/// The input files, in a stable order. A directory contributes every readable corpus file
/// below it (`.jsonl`, `.ndjson`, `.json`, `.txt`, each optionally `.gz` or `.zst`, and
/// `.parquet` with a text column).
pub fn list_inputs(path: &Path) -> Result<Vec<PathBuf>, JobError> {
    if path.is_file() {
        if format_of(path).is_none() {
            return Err(JobError::Input(format!(
                "{} is not a .jsonl, .ndjson, .json or .txt file (optionally .gz or .zst) or a .parquet file",
                path.display()
            )));
        }
        return Ok(vec![path.to_owned()]);
    }
    if !path.is_dir() {
        return Err(JobError::Input(format!(
            "input {} does not exist",
            path.display()
        )));
    }
    let mut files = Vec::new();
    let mut stack = vec![path.to_owned()];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir)
            .map_err(|e| JobError::Input(format!("cannot list {}: {e}", dir.display())))?;
        for entry in entries {
            let entry = entry
                .map_err(|e| JobError::Input(format!("cannot list {}: {e}", dir.display())))?;
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if format_of(&path).is_some() {
                files.push(path);
            }
        }
    }
    files.sort();
    if files.is_empty() {
        return Err(JobError::Input(format!(
            "no .jsonl or .txt files under {}",
            path.display()
        )));
    }
    Ok(files)
}

fn open(path: &Path, options: &ReaderOptions) -> Result<Source, JobError> {
    let (format, compression) = format_of(path).unwrap_or((Format::Jsonl, Compression::None));
    if format == Format::Parquet {
        return Ok(Source::Parquet(ParquetRows::open(
            path,
            &options.text_field,
            &options.id_field,
        )?));
    }
    let file = File::open(path)
        .map_err(|e| JobError::Input(format!("cannot read {}: {e}", path.display())))?;
    let reader: Box<dyn Read + Send> = match compression {
        Compression::None => Box::new(file),
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(file)),
        Compression::Zstd => Box::new(
            zstd::stream::read::Decoder::new(file)
                .map_err(|e| JobError::Input(format!("cannot read {}: {e}", path.display())))?,
        ),
    };
    Ok(Source::Lines(Box::new(BufReader::with_capacity(
        1 << 20,
        reader,
    ))))
}

/// Streams records (and bad lines) from every input file in order.
pub struct RecordReader {
    files: Vec<PathBuf>,
    root: PathBuf,
    options: ReaderOptions,
    current: Option<(usize, Source, u64)>,
    next_file: usize,
    seen_ids: HashSet<u64>,
    buffer: Vec<u8>,
}

pub enum Item {
    Record(Record),
    Bad(BadRecord),
}

impl RecordReader {
    pub fn new(input: &Path, options: ReaderOptions) -> Result<Self, JobError> {
        let files = list_inputs(input)?;
        let root = if input.is_dir() {
            input.to_owned()
        } else {
            input.parent().map(Path::to_owned).unwrap_or_default()
        };
        Ok(Self {
            files,
            root,
            options,
            current: None,
            next_file: 0,
            seen_ids: HashSet::new(),
            buffer: Vec::new(),
        })
    }

    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    fn display_name(&self, index: usize) -> String {
        let path = &self.files[index];
        path.strip_prefix(&self.root)
            .unwrap_or(path)
            .display()
            .to_string()
    }

    /// The next record or bad line; `Ok(None)` at the end of the corpus.
    pub fn next_item(&mut self) -> Result<Option<Item>, JobError> {
        loop {
            if self.current.is_none() {
                if self.next_file >= self.files.len() {
                    return Ok(None);
                }
                let source = open(&self.files[self.next_file], &self.options)?;
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
            let parsed = match raw {
                Raw::Blank => continue,
                Raw::Line => self.parse_line(index, line),
                Raw::Row(row) => row.map(|(id, text)| Record {
                    id: id.unwrap_or_else(|| self.generated_id(index, line)),
                    text,
                }),
            };
            let checked = parsed.and_then(|record| {
                if record.text.trim().is_empty() {
                    return Err("empty text".to_owned());
                }
                let mut hasher = std::collections::hash_map::DefaultHasher::new();
                record.id.to_string().hash(&mut hasher);
                if !self.seen_ids.insert(hasher.finish()) {
                    return Err(format!("duplicate id {}", record.id));
                }
                Ok(record)
            });
            return Ok(Some(match checked {
                Ok(record) => Item::Record(record),
                Err(reason) => Item::Bad(BadRecord {
                    file: self.display_name(index),
                    line,
                    reason,
                }),
            }));
        }
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
                    JobError::Input(format!("cannot read {}: {e}", self.files[*index].display()))
                })?;
                if read == 0 {
                    return Ok(None);
                }
                while matches!(self.buffer.last(), Some(b'\n' | b'\r')) {
                    self.buffer.pop();
                }
                let jsonl = format_of(&self.files[*index]).is_some_and(|f| f.0 == Format::Jsonl);
                if jsonl && self.buffer.iter().all(u8::is_ascii_whitespace) {
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
        let text = std::str::from_utf8(&self.buffer).map_err(|_| "invalid UTF-8".to_owned())?;
        match format_of(&self.files[index]).map_or(Format::Jsonl, |f| f.0) {
            Format::Text => Ok(Record {
                id: self.generated_id(index, line),
                text: text.to_owned(),
            }),
            _ => self.parse_json(text, index, line),
        }
    }

    fn generated_id(&self, index: usize, line: u64) -> Value {
        if self.files.len() == 1 {
            Value::from(line)
        } else {
            Value::from(format!("{}:{line}", self.display_name(index)))
        }
    }

    fn parse_json(&self, text: &str, index: usize, line: u64) -> Result<Record, String> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| format!("malformed JSON: {e}"))?;
        let Value::Object(mut object) = value else {
            return Err("not a JSON object".into());
        };
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
        let id = match object.remove(&self.options.id_field) {
            Some(id @ (Value::String(_) | Value::Number(_))) => id,
            Some(_) => {
                return Err(format!(
                    "id field `{}` is not a string or number",
                    self.options.id_field
                ));
            }
            None => self.generated_id(index, line),
        };
        Ok(Record { id, text })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(path: &Path) -> (Vec<Record>, Vec<BadRecord>) {
        let mut reader = RecordReader::new(path, ReaderOptions::default()).unwrap();
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
        assert!(list_inputs(&dir.path().join("missing")).is_err());
    }

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
        };
        let error = RecordReader::new(&path, options)
            .unwrap()
            .next_item()
            .err()
            .unwrap()
            .to_string();
        assert!(
            error.ends_with("has no column `body` (use --text-field)"),
            "{error}"
        );
    }
}
