//! `resident generate --format parquet`: a shard's lines as one Parquet file, a column per
//! field of a completion's line (the shards merge as `embed`'s do, in
//! [`super::parquet_out::ParquetMerger`]).

use std::sync::Arc;

use arrow_array::builder::{BooleanBuilder, StringBuilder, UInt32Builder};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use serde_json::{Map, Value};

use super::parquet_out::{text_cell, write_batch};

/// The columns after `id` and the kept ones, in order, and their types: every field a
/// completion's line may have. Log-probabilities and `-n`'s samples are JSON text.
const COLUMNS: [(&str, DataType, bool); 10] = [
    ("text", DataType::Utf8, false),
    ("reasoning", DataType::Utf8, true),
    ("prompt_tokens", DataType::UInt32, false),
    ("generated_tokens", DataType::UInt32, false),
    ("reasoning_tokens", DataType::UInt32, true),
    ("finish_reason", DataType::Utf8, false),
    ("truncated", DataType::Boolean, false),
    ("choices", DataType::Utf8, true),
    ("logprobs", DataType::Utf8, true),
    ("error", DataType::Utf8, true),
];

/// `lines` (each a line of `generations.jsonl`, as JSON) as one Parquet file: `id` as text
/// (as `embed` writes ids), the `kept` columns (`--keep-columns`: text as it is, other
/// values as their JSON, null where missing), then [`COLUMNS`]. A line with a field no
/// column holds is refused, so nothing a line has is dropped.
pub fn encode_generation_lines(
    lines: &[Map<String, Value>],
    kept: &[&str],
) -> Result<Vec<u8>, String> {
    let known = |name: &str| {
        name == "id" || kept.contains(&name) || COLUMNS.iter().any(|(column, ..)| *column == name)
    };
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
    for (name, data_type, nullable) in COLUMNS {
        let column = match data_type {
            DataType::UInt32 => numbers(lines, name)?,
            DataType::Boolean => flags(lines, name),
            _ => texts(lines, name),
        };
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

/// Each line's `name`, false where it is absent (`truncated` is written only when true).
fn flags(lines: &[Map<String, Value>], name: &str) -> ArrayRef {
    let mut column = BooleanBuilder::new();
    for line in lines {
        column.append_value(line.get(name).and_then(Value::as_bool).unwrap_or(false));
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
        let bytes = encode_generation_lines(&shard, &["title"]).unwrap();
        let batch = read(bytes.clone()).remove(0);
        let names: Vec<&str> = batch
            .schema_ref()
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        assert_eq!(
            names,
            [
                "id",
                "title",
                "text",
                "reasoning",
                "prompt_tokens",
                "generated_tokens",
                "reasoning_tokens",
                "finish_reason",
                "truncated",
                "choices",
                "logprobs",
                "error"
            ]
        );
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
        let empty = encode_generation_lines(&[], &["title"]).unwrap();
        let kept = ParquetMerger::new().finish(empty).unwrap();
        let reader = ParquetRecordBatchReaderBuilder::try_new(resident_sdk::Bytes::from(kept));
        assert_eq!(reader.unwrap().schema().fields().len(), 12);
    }

    #[test]
    fn a_field_without_a_column_is_refused_not_dropped() {
        let scored = lines(&[json!({"id": 1, "text": "", "prompt_tokens": 3,
            "generated_tokens": 0, "finish_reason": "length", "score": {"tokens": 2}})]);
        let refused = encode_generation_lines(&scored, &[]).unwrap_err();
        assert!(
            refused.contains("`score` has no Parquet column"),
            "{refused}"
        );
    }
}
