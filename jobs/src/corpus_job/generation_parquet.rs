//! `resident generate --format parquet`: a shard's lines as one Parquet file, a column per
//! field a line of the job may have (the shards merge as `embed`'s do, in
//! [`super::parquet_out::ParquetMerger`]).

use std::sync::Arc;

use arrow_array::builder::{BooleanBuilder, Float64Builder, StringBuilder, UInt32Builder};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use serde_json::{Map, Value};

use super::parquet_out::{text_cell, write_batch};

/// The fields every line has: their columns hold no null.
const IN_EVERY_LINE: [&str; 4] = ["text", "prompt_tokens", "generated_tokens", "finish_reason"];

/// A line field's column type: counts and choice indexes as `UInt32`, figures as `Float64`,
/// flags as `Boolean` (`truncated` false where the line leaves it out, the others null),
/// text as `Utf8`, and what the line holds as JSON (samples, log-probabilities, scores,
/// each filter's answers) as its JSON text.
fn column_type(name: &str) -> DataType {
    match name {
        "prompt_tokens" | "generated_tokens" | "reasoning_tokens" | "best" | "best_normalized"
        | "answer" => DataType::UInt32,
        "truncated" | "correct" | "correct_normalized" | "correct_majority" => DataType::Boolean,
        "answer_probability" | "brier_score" | "rouge1" | "rouge2" | "rougeL" | "rougeLsum"
        | "f1" | "bleu" | "chrf" => DataType::Float64,
        _ => DataType::Utf8,
    }
}

/// `lines` (each a line of `generations.jsonl`, as JSON) as one Parquet file: `id` as text
/// (as `embed` writes ids), the `kept` columns (`--keep-columns`: text as it is, other
/// values as their JSON, null where missing), then a column for each of `line_fields` (the
/// job's: a completion's fields and what its scores and answer checks add), typed by
/// [`column_type`]. A line with a field no column holds is refused, so nothing a line has
/// is dropped.
pub fn encode_generation_lines(
    lines: &[Map<String, Value>],
    kept: &[&str],
    line_fields: &[&str],
) -> Result<Vec<u8>, String> {
    let known = |name: &str| name == "id" || kept.contains(&name) || line_fields.contains(&name);
    if let Some(name) = lines.iter().flat_map(Map::keys).find(|name| !known(name)) {
        return Err(format!(
            "a line's `{name}` has no Parquet column: write JSON lines (--format jsonl)"
        ));
    }
    let mut fields = vec![Field::new("id", DataType::Utf8, true)];
    let mut columns = vec![texts(lines, "id")];
    for name in kept {
        fields.push(Field::new(*name, DataType::Utf8, true));
        columns.push(texts(lines, name));
    }
    for &name in line_fields {
        let data_type = column_type(name);
        let column = match data_type {
            DataType::UInt32 => numbers(lines, name)?,
            DataType::Float64 => figures(lines, name),
            DataType::Boolean => flags(lines, name),
            _ => texts(lines, name),
        };
        let nullable = !IN_EVERY_LINE.contains(&name);
        if !nullable && column.null_count() > 0 {
            return Err(format!("a line without `{name}`"));
        }
        fields.push(Field::new(name, data_type, nullable));
        columns.push(column);
    }
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
        .map_err(|e| format!("a Parquet shard: {e}"))?;
    write_batch(&batch)
}

/// Each line's `name` as text: a string as it is, other JSON as its text.
fn texts(lines: &[Map<String, Value>], name: &str) -> ArrayRef {
    let mut column = StringBuilder::new();
    for line in lines {
        column.append_option(line.get(name).and_then(text_cell));
    }
    Arc::new(column.finish())
}

fn numbers(lines: &[Map<String, Value>], name: &str) -> Result<ArrayRef, String> {
    let mut column = UInt32Builder::new();
    for line in lines {
        let number = line.get(name).and_then(Value::as_u64);
        let number = number.map(u32::try_from).transpose();
        column.append_option(number.map_err(|_| format!("`{name}` past 2^32"))?);
    }
    Ok(Arc::new(column.finish()))
}

fn figures(lines: &[Map<String, Value>], name: &str) -> ArrayRef {
    let mut column = Float64Builder::new();
    for line in lines {
        column.append_option(line.get(name).and_then(Value::as_f64));
    }
    Arc::new(column.finish())
}

/// Each line's `name`: `truncated` false where it is absent (it is written only when
/// true), another flag null.
fn flags(lines: &[Map<String, Value>], name: &str) -> ArrayRef {
    let mut column = BooleanBuilder::new();
    for line in lines {
        let flag = line.get(name).and_then(Value::as_bool);
        column.append_option(match name {
            "truncated" => Some(flag.unwrap_or(false)),
            _ => flag,
        });
    }
    Arc::new(column.finish())
}

#[cfg(test)]
mod tests {
    use arrow_array::Array;
    use arrow_array::cast::AsArray;
    use arrow_array::types::UInt32Type;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use serde_json::json;

    use super::super::parquet_out::{ParquetMerger, read};
    use super::*;

    fn completion() -> Vec<&'static str> {
        super::super::generation_lines::completion_fields().collect()
    }

    fn lines(values: &[Value]) -> Vec<Map<String, Value>> {
        values
            .iter()
            .map(|v| v.as_object().unwrap().clone())
            .collect()
    }

    #[test]
    fn a_shard_s_lines_are_columns_and_shards_merge_in_order() {
        let shard = lines(&[
            json!({"id": "a", "title": "A", "text": "One.", "prompt_tokens": 9,
                   "generated_tokens": 2, "finish_reason": "stop"}),
            json!({"id": 7, "title": {"x": 1}, "text": "Two", "reasoning": "One, then",
                   "prompt_tokens": 12, "generated_tokens": 4, "reasoning_tokens": 3,
                   "finish_reason": "length", "truncated": true,
                   "choices": [{"text": "Two"}], "logprobs": [], "error": null}),
            json!({"id": "c", "text": "", "prompt_tokens": 3, "generated_tokens": 0,
                   "finish_reason": "stop", "error": "refused"}),
        ]);
        let bytes = encode_generation_lines(&shard, &["title"], &completion()).unwrap();
        let batch = read(bytes.clone()).remove(0);
        let names: Vec<&str> = batch
            .schema_ref()
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        let expected: Vec<&str> = ["id", "title"].into_iter().chain(completion()).collect();
        assert_eq!(names, expected);
        assert_eq!(names[2..5], ["text", "reasoning", "prompt_tokens"]);
        let text = |name: &str| {
            batch
                .column_by_name(name)
                .unwrap()
                .as_string::<i32>()
                .clone()
        };
        assert_eq!((text("id").value(0), text("id").value(1)), ("a", "7"));
        assert_eq!(text("title").value(1), r#"{"x":1}"#);
        assert!(text("title").is_null(2), "a missing kept field is null");
        assert_eq!(text("choices").value(1), r#"[{"text":"Two"}]"#);
        assert!(text("choices").is_null(0) && text("error").is_null(1));
        assert_eq!(text("error").value(2), "refused");
        let tokens = batch.column_by_name("prompt_tokens").unwrap();
        assert_eq!(tokens.as_primitive::<UInt32Type>().values(), &[9, 12, 3]);
        assert_eq!(text("reasoning").value(1), "One, then");
        assert!(text("reasoning").is_null(0), "no thinking: null");
        let thinking = batch.column_by_name("reasoning_tokens").unwrap();
        let thinking = thinking.as_primitive::<UInt32Type>();
        assert_eq!((thinking.value(1), thinking.is_null(0)), (3, true));
        let truncated = batch
            .column_by_name("truncated")
            .unwrap()
            .as_boolean()
            .clone();
        assert_eq!((truncated.value(0), truncated.value(1)), (false, true));

        let mut merger = ParquetMerger::new();
        let mut merged = merger.add(bytes.clone()).unwrap();
        merged.extend(merger.add(bytes).unwrap());
        merged.extend(merger.finish(Vec::new()).unwrap());
        let rows: usize = read(merged).iter().map(RecordBatch::num_rows).sum();
        assert_eq!(rows, 6);
        // No rows at all: the empty file's schema is the one rows would have had.
        let empty = encode_generation_lines(&[], &["title"], &completion()).unwrap();
        let kept = ParquetMerger::new().finish(empty).unwrap();
        let reader = ParquetRecordBatchReaderBuilder::try_new(resident_sdk::Bytes::from(kept));
        assert_eq!(reader.unwrap().schema().fields().len(), 12);
    }

    #[test]
    fn a_field_without_a_column_is_refused_not_dropped() {
        let scored = lines(&[json!({"id": 1, "text": "", "prompt_tokens": 3,
            "generated_tokens": 0, "finish_reason": "length", "score": {"tokens": 2}})]);
        let refused = encode_generation_lines(&scored, &[], &completion()).unwrap_err();
        assert!(
            refused.contains("`score` has no Parquet column"),
            "{refused}"
        );
    }

    /// A job's scores and checked answers have typed columns: figures as floats, choice
    /// indexes as counts, flags null where a line has none, nested values as JSON text.
    #[test]
    fn scores_and_checked_answers_have_typed_columns() {
        use arrow_array::types::Float64Type;
        let shard = lines(&[
            json!({"id": 1, "text": "A", "prompt_tokens": 3, "generated_tokens": 1,
                   "finish_reason": "stop", "score": {"tokens": 2, "logprob": -1.5},
                   "extracted": "A", "correct": true, "rouge1": 0.5,
                   "choice_scores": [{"tokens": 1}], "best": 2, "answers": [0, 2]}),
            json!({"id": 2, "text": "", "prompt_tokens": 3, "generated_tokens": 0,
                   "finish_reason": "length", "extracted": null}),
        ]);
        let fields = [
            &completion()[..],
            &["score", "choice_scores", "best", "answers"],
            &["extracted", "correct", "rouge1"],
        ]
        .concat();
        let batch = read(encode_generation_lines(&shard, &[], &fields).unwrap()).remove(0);
        let column = |name: &str| batch.column_by_name(name).unwrap().clone();
        let score: Value =
            serde_json::from_str(column("score").as_string::<i32>().value(0)).unwrap();
        assert_eq!(score, json!({"tokens": 2, "logprob": -1.5}));
        assert_eq!(column("best").as_primitive::<UInt32Type>().value(0), 2);
        assert_eq!(column("answers").as_string::<i32>().value(0), "[0,2]");
        let rouge = column("rouge1");
        let rouge = rouge.as_primitive::<Float64Type>();
        assert_eq!((rouge.value(0), rouge.is_null(1)), (0.5, true));
        let correct = column("correct");
        let correct = correct.as_boolean();
        assert_eq!((correct.value(0), correct.is_null(1)), (true, true));
        let extracted = column("extracted");
        assert!(extracted.as_string::<i32>().is_null(1), "not found: null");
        assert!(column("truncated").as_boolean().values().iter().all(|t| !t));
    }
}
