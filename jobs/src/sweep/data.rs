//! The sweep's data: read from JSONL (texts with labels, or documents with queries),
//! embedded once by the sweep's actors and cached on disk by model + data hash.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use prost::Message;
use resident_proto::pb;
use resident_sdk::EmbedPool;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::SweepError;
use super::config::{SweepConfig, TrialKind};
use crate::files::{sha256_hex, write_atomically};
use crate::records::{is_blank, json_object, line_text, numbered_lines};

/// A record the sweep could not use.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SkippedRecord {
    /// Its line in the data file, from 1.
    pub line: u64,
    /// Why it was skipped.
    pub reason: String,
}

/// The sweep's examples before embedding.
#[derive(Debug, Default)]
pub struct SweepData {
    /// Each example's text, in file order.
    pub texts: Vec<String>,
    /// Classifier: a class index per text, and the class names (sorted).
    pub labels: Vec<u32>,
    /// Classifier: the class names, sorted.
    pub classes: Vec<String>,
    /// Retrieval: unique queries and the row of each one's document.
    pub queries: Vec<String>,
    /// Retrieval: the row of each query's document.
    pub query_docs: Vec<u32>,
    /// Records the sweep could not use.
    pub skipped: Vec<SkippedRecord>,
    /// Model + data + fields: the cache key of the embedded dataset.
    pub key: String,
}

fn field_of(record: &serde_json::Map<String, Value>, field: &str) -> Option<String> {
    match record.get(field)? {
        Value::String(text) if !text.trim().is_empty() => Some(text.clone()),
        Value::Number(number) => Some(number.to_string()),
        _ => None,
    }
}

/// The field named in the config, else the first of `fallbacks` the first record has.
fn pick_field(
    configured: &Option<String>,
    first: &serde_json::Map<String, Value>,
    fallbacks: [&str; 2],
) -> String {
    configured.clone().unwrap_or_else(|| {
        fallbacks
            .iter()
            .find(|f| first.contains_key(**f))
            .unwrap_or(&fallbacks[0])
            .to_string()
    })
}

/// Reads the data file (blocking). `model_fingerprint` (the pinned model's) keys the cache
/// of embedded documents.
pub fn read_sweep_data(
    config: &SweepConfig,
    model_fingerprint: &str,
) -> Result<SweepData, SweepError> {
    let path = Path::new(&config.data);
    let bytes = std::fs::read(path)
        .map_err(|e| SweepError::Data(format!("cannot read {}: {e}", path.display())))?;
    let mut data = SweepData::default();
    let records = json_records(&bytes, &mut data.skipped);
    let Some((_, first)) = records.first() else {
        return Err(SweepError::Data(format!(
            "{} holds no records",
            path.display()
        )));
    };
    let second_field = match config.trial {
        TrialKind::Classifier => pick_field(&config.label_field, first, ["label", "topic"]),
        TrialKind::Retrieval => pick_field(&config.query_field, first, ["query", "description"]),
    };
    let rows = usable_rows(config, &records, &second_field, &mut data.skipped);
    let filled = match config.trial {
        TrialKind::Classifier => fill_classes(&mut data, rows)
            .map_err(|_| format!("field `{second_field}` has fewer than 2 classes")),
        TrialKind::Retrieval => fill_queries(&mut data, rows).map_err(|found| {
            format!(
                "only {found} documents have a unique `{second_field}` to use as a query; need at least 10"
            )
        }),
    };
    filled.map_err(|problem| SweepError::Data(format!("{}: {problem}", path.display())))?;
    let mut hasher = Sha256::new();
    hasher.update(model_fingerprint);
    hasher.update(format!(
        "{:?}|{}|{second_field}|",
        config.trial, config.text_field
    ));
    hasher.update(Sha256::digest(&bytes));
    data.key = sha256_hex(&hasher.finalize())[..24].to_owned();
    Ok(data)
}

type JsonRecord = serde_json::Map<String, Value>;

/// The file's JSON objects with their line numbers; lines that are not one are skipped
/// (said in `skipped`), blank lines ignored.
fn json_records(bytes: &[u8], skipped: &mut Vec<SkippedRecord>) -> Vec<(u64, JsonRecord)> {
    let mut records = Vec::new();
    for (line_no, line) in numbered_lines(bytes) {
        if is_blank(line) {
            continue;
        }
        match line_text(line).and_then(json_object) {
            Ok(record) => records.push((line_no, record)),
            Err(reason) => skipped.push(SkippedRecord {
                line: line_no,
                reason,
            }),
        }
    }
    records
}

/// Each record's text and its `second_field` (label or query), records without a text
/// (or, for a classifier, without a label) skipped.
fn usable_rows(
    config: &SweepConfig,
    records: &[(u64, JsonRecord)],
    second_field: &str,
    skipped: &mut Vec<SkippedRecord>,
) -> Vec<(String, Option<String>)> {
    let mut rows = Vec::new();
    for (line, record) in records {
        let Some(text) = field_of(record, &config.text_field) else {
            skipped.push(SkippedRecord {
                line: *line,
                reason: format!("missing or empty text field `{}`", config.text_field),
            });
            continue;
        };
        let second = field_of(record, second_field);
        if config.trial == TrialKind::Classifier && second.is_none() {
            skipped.push(SkippedRecord {
                line: *line,
                reason: format!("missing label field `{second_field}`"),
            });
            continue;
        }
        rows.push((text, second));
    }
    rows
}

/// A classifier's data: the texts, each label as an index into the sorted classes. Errs
/// with the number of classes when there are fewer than two.
fn fill_classes(data: &mut SweepData, rows: Vec<(String, Option<String>)>) -> Result<(), usize> {
    let classes: BTreeSet<String> = rows.iter().filter_map(|r| r.1.clone()).collect();
    data.classes = classes.into_iter().collect();
    let index: HashMap<&str, u32> = data
        .classes
        .iter()
        .enumerate()
        .map(|(i, c)| (c.as_str(), i as u32))
        .collect();
    for (text, label) in rows {
        data.labels
            .push(index[label.as_deref().expect("usable_rows keeps labelled rows")]);
        data.texts.push(text);
    }
    match data.classes.len() {
        classes @ (0 | 1) => Err(classes),
        _ => Ok(()),
    }
}

/// A retrieval sweep's data: every text, and the queries that name one document alone (a
/// query shared by several documents has no single right answer: left out). Errs with
/// the number found when there are fewer than ten.
fn fill_queries(data: &mut SweepData, rows: Vec<(String, Option<String>)>) -> Result<(), usize> {
    let mut query_count: HashMap<String, u32> = HashMap::new();
    for query in rows.iter().filter_map(|r| r.1.as_ref()) {
        *query_count.entry(query.clone()).or_default() += 1;
    }
    for (row, (text, query)) in rows.into_iter().enumerate() {
        if let Some(query) = query.filter(|q| query_count[q] == 1) {
            data.queries.push(query);
            data.query_docs.push(row as u32);
        }
        data.texts.push(text);
    }
    match data.queries.len() {
        found if found < 10 => Err(found),
        _ => Ok(()),
    }
}

fn f32_bytes(rows: &[Vec<f32>]) -> Vec<u8> {
    rows.iter()
        .flatten()
        .flat_map(|v| v.to_le_bytes())
        .collect()
}

/// Where the embedded dataset is cached.
pub fn cache_path(output: &Path, key: &str) -> PathBuf {
    output.join("cache").join(format!("{key}.dataset"))
}

/// Embeds the data on the sweep's actors unless the cache already holds it; returns the
/// cache file and whether it was a hit.
pub async fn embed_into_cache(
    pool: &EmbedPool,
    data: &SweepData,
    output: &Path,
) -> Result<(PathBuf, bool), SweepError> {
    let path = cache_path(output, &data.key);
    if let Ok(bytes) = std::fs::read(&path)
        && pb::TrialDataset::decode(bytes.as_slice())
            .is_ok_and(|d| d.count as usize == data.texts.len())
    {
        return Ok((path, true));
    }
    let vectors = pool.embed(data.texts.clone()).await?;
    let dim = vectors.first().map_or(0, Vec::len);
    let query_vectors = if data.queries.is_empty() {
        Vec::new()
    } else {
        pool.embed_queries(data.queries.clone()).await?
    };
    let dataset = pb::TrialDataset {
        dim: dim as u32,
        vectors: f32_bytes(&vectors).into(),
        count: vectors.len() as u32,
        labels: data.labels.clone(),
        classes: data.classes.clone(),
        query_vectors: f32_bytes(&query_vectors).into(),
        query_count: query_vectors.len() as u32,
        query_docs: data.query_docs.clone(),
    };
    std::fs::create_dir_all(path.parent().expect("cache dir"))
        .map_err(|e| SweepError::Output(format!("cannot create {}: {e}", path.display())))?;
    write_atomically(&path, &dataset.encode_to_vec())
        .map_err(|e| SweepError::Output(e.to_string()))?;
    Ok((path, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(trial: &str, data: &Path) -> SweepConfig {
        let metric = if trial == "classifier" {
            "accuracy"
        } else {
            "recall@10"
        };
        SweepConfig::from_toml(&format!(
            "name = \"t\"\nmodel = \"m\"\ntrial = \"{trial}\"\ndata = \"{}\"\nmetric = \"{metric}\"\nmode = \"max\"\noutput = \"o\"\n[space]\nlr = {{ choice = [0.1] }}\n",
            data.display()
        ))
        .unwrap()
    }

    #[test]
    fn labels_queries_and_skipped_records() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.jsonl");
        let mut lines = vec![
            r#"{"text": "a", "topic": "x", "description": "qa"}"#.to_owned(),
            "{oops".into(),
            r#"{"text": "", "topic": "x"}"#.into(),
            r#"{"text": "b", "description": "shared"}"#.into(),
            r#"{"text": "c", "topic": "y", "description": "shared"}"#.into(),
        ];
        lines.extend(
            (0..10).map(|i| format!(r#"{{"text": "t{i}", "topic": "y", "description": "q{i}"}}"#)),
        );
        std::fs::write(&path, lines.join("\n")).unwrap();

        let classifier = read_sweep_data(&config("classifier", &path), "model").unwrap();
        assert_eq!(classifier.classes, vec!["x", "y"]);
        assert_eq!(&classifier.labels[..2], &[0, 1]);
        assert_eq!(classifier.texts.len(), 12);
        let reasons: Vec<(u64, &str)> = classifier
            .skipped
            .iter()
            .map(|s| (s.line, s.reason.as_str()))
            .collect();
        assert_eq!(
            reasons[1..],
            [
                (3, "missing or empty text field `text`"),
                (4, "missing label field `topic`")
            ]
        );

        let retrieval = read_sweep_data(&config("retrieval", &path), "model").unwrap();
        assert_eq!(retrieval.texts.len(), 13);
        assert_eq!(retrieval.queries.len(), 11, "the shared query is left out");
        assert_eq!(retrieval.query_docs[..2], [0, 3]);
        assert_ne!(retrieval.key, classifier.key);
    }
}
