//! `resident embed --format parquet`: each shard as a Parquet file (`id`, the vector as a
//! fixed-size list, the carried columns), and the merge of the shards into one
//! `embeddings.parquet`, streamed a shard at a time.

use std::sync::Arc;

use arrow_array::builder::StringBuilder;
use arrow_array::{
    ArrayRef, FixedSizeListArray, Float16Array, Float32Array, Int8Array, RecordBatch, UInt8Array,
    UInt32Array,
};
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use serde_json::Value;

use super::shard_rows::{ShardRows, WINDOW_FIELDS};
use super::vectors::OutputDtype;
use resident_sdk::RowWindow;

/// The column that holds the vectors.
pub const VECTOR_COLUMN: &str = "embedding";

/// One of a window's numbers (its index, its first or last character).
type WindowNumber = fn(&RowWindow) -> u32;

/// A value as a text cell: a string as it is, anything else as its JSON (null stays null).
pub(super) fn text_cell(value: &Value) -> Option<String> {
    match value {
        Value::Null => None,
        Value::String(text) => Some(text.clone()),
        other => Some(other.to_string()),
    }
}

fn element_type(dtype: OutputDtype) -> DataType {
    match dtype {
        OutputDtype::F32 => DataType::Float32,
        OutputDtype::F16 => DataType::Float16,
        OutputDtype::Int8 | OutputDtype::Binary => DataType::Int8,
        OutputDtype::Uint8 | OutputDtype::Ubinary => DataType::UInt8,
    }
}

/// The stored elements (`encode_rows`' bytes) as one flat array.
fn elements(bytes: &[u8], dtype: OutputDtype) -> ArrayRef {
    match dtype {
        OutputDtype::F32 => Arc::new(Float32Array::from_iter_values(
            bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        )),
        OutputDtype::F16 => Arc::new(Float16Array::from_iter_values(
            bytes
                .chunks_exact(2)
                .map(|b| half::f16::from_bits(u16::from_le_bytes([b[0], b[1]]))),
        )),
        OutputDtype::Int8 | OutputDtype::Binary => {
            Arc::new(Int8Array::from_iter_values(bytes.iter().map(|&b| b as i8)))
        }
        OutputDtype::Uint8 | OutputDtype::Ubinary => {
            Arc::new(UInt8Array::from_iter_values(bytes.iter().copied()))
        }
    }
}

/// One shard as a Parquet file: `id` (text: string ids as they are, numbers as their
/// digits), `embedding` (a fixed-size list of the stored elements: float32, float16, int8 or
/// uint8; packed bits for binary precisions), then `keep` columns as text (strings as they
/// are, other JSON values as JSON, missing as null), then, for windows, `doc_id` (text),
/// `window`, `char_start` and `char_end` (uint32).
pub fn encode_shard(
    rows: &ShardRows<'_>,
    keep: &[&str],
    stored: &[u8],
    dtype: OutputDtype,
    dim: usize,
) -> Result<Vec<u8>, String> {
    let width = dtype.stored_width(dim) as i32;
    let mut ids = StringBuilder::new();
    for row in 0..rows.len() {
        ids.append_option(text_cell(&rows.row_id(row)));
    }
    let item = Arc::new(Field::new("item", element_type(dtype), false));
    let vectors = FixedSizeListArray::try_new(item.clone(), width, elements(stored, dtype), None)
        .map_err(|e| format!("vectors as a Parquet list: {e}"))?;
    let mut fields = vec![
        Field::new("id", DataType::Utf8, true),
        Field::new(VECTOR_COLUMN, DataType::FixedSizeList(item, width), false),
    ];
    let mut columns: Vec<ArrayRef> = vec![Arc::new(ids.finish()), Arc::new(vectors)];
    for name in keep {
        let mut column = StringBuilder::new();
        for row in 0..rows.len() {
            let value = rows.kept_of(row).and_then(|kept| kept.get(*name));
            column.append_option(value.and_then(text_cell));
        }
        fields.push(Field::new(*name, DataType::Utf8, true));
        columns.push(Arc::new(column.finish()));
    }
    if rows.windowed() {
        let [doc_id, window, char_start, char_end] = WINDOW_FIELDS;
        let mut records = StringBuilder::new();
        for row in 0..rows.len() {
            records.append_option(text_cell(&rows.ids[rows.record_of(row)]));
        }
        fields.push(Field::new(doc_id, DataType::Utf8, true));
        columns.push(Arc::new(records.finish()));
        let numbers: [(&str, WindowNumber); 3] = [
            (window, |w| w.window),
            (char_start, |w| w.char_start),
            (char_end, |w| w.char_end),
        ];
        for (name, value) in numbers {
            fields.push(Field::new(name, DataType::UInt32, false));
            columns.push(Arc::new(UInt32Array::from_iter_values(
                rows.windows.iter().map(value),
            )));
        }
    }
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
        .map_err(|e| format!("a Parquet shard: {e}"))?;
    write_batch(&batch)
}

/// `batch` as one Parquet file (a shard).
pub(super) fn write_batch(batch: &RecordBatch) -> Result<Vec<u8>, String> {
    let mut writer = ArrowWriter::try_new(Vec::new(), batch.schema(), Some(properties()))
        .map_err(|e| format!("a Parquet shard: {e}"))?;
    writer
        .write(batch)
        .and_then(|_| writer.into_inner())
        .map_err(|e| format!("a Parquet shard: {e}"))
}

fn properties() -> WriterProperties {
    WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .build()
}

/// Writes shards' rows, in the order given, into one Parquet file, handing back the bytes
/// written so far after each shard (so a merge holds at most one shard's row group).
pub struct ParquetMerger {
    writer: Option<ArrowWriter<Vec<u8>>>,
}

impl ParquetMerger {
    pub fn new() -> Self {
        Self { writer: None }
    }

    /// Adds one shard file's rows; returns the merged file's bytes written since the last
    /// call.
    pub fn add(&mut self, shard: Vec<u8>) -> Result<Vec<u8>, String> {
        let fail = |e: &dyn std::fmt::Display| format!("merging a Parquet shard: {e}");
        let reader = ParquetRecordBatchReaderBuilder::try_new(resident_sdk::Bytes::from(shard))
            .map_err(|e| fail(&e))?
            .build()
            .map_err(|e| fail(&e))?;
        for batch in reader {
            let batch = batch.map_err(|e| fail(&e))?;
            let writer = match &mut self.writer {
                Some(writer) => writer,
                None => self.writer.insert(
                    ArrowWriter::try_new(Vec::new(), batch.schema(), Some(properties()))
                        .map_err(|e| fail(&e))?,
                ),
            };
            writer.write(&batch).map_err(|e| fail(&e))?;
        }
        match &mut self.writer {
            Some(writer) => {
                writer.flush().map_err(|e| fail(&e))?;
                // The writer counts the bytes it wrote itself: taking them out is safe.
                Ok(std::mem::take(writer.inner_mut()))
            }
            None => Ok(Vec::new()),
        }
    }

    /// The file's last bytes (its footer). When no shard had rows, `no_rows`: the whole of
    /// a file with the columns and no rows, so readers open it.
    pub fn finish(self, no_rows: Vec<u8>) -> Result<Vec<u8>, String> {
        match self.writer {
            Some(writer) => writer
                .into_inner()
                .map_err(|e| format!("finishing the merged Parquet file: {e}")),
            None => Ok(no_rows),
        }
    }
}

/// A Parquet file's batches (a row group each), for tests.
#[cfg(test)]
pub(super) fn read(bytes: Vec<u8>) -> Vec<RecordBatch> {
    ParquetRecordBatchReaderBuilder::try_new(resident_sdk::Bytes::from(bytes))
        .unwrap()
        .build()
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::Array;
    use arrow_array::cast::AsArray;
    use arrow_array::types::Float32Type;

    #[test]
    fn a_shard_holds_ids_vectors_and_the_carried_columns_and_shards_merge_in_order() {
        let mut kept = crate::records::Kept::new();
        kept.insert("title".into(), Value::from("A"));
        kept.insert("year".into(), Value::from(1999));
        let ids = [Value::from("a"), Value::from(7)];
        let second_kept = crate::records::Kept::new();
        let carried = [kept, second_kept];
        let rows = ShardRows {
            ids: &ids,
            kept: &carried,
            windows: &[],
        };
        let stored: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let keep = ["title", "year"];
        let shard = encode_shard(&rows, &keep, &stored, OutputDtype::F32, 2).unwrap();
        let batches = read(shard.clone());
        let batch = &batches[0];
        assert_eq!(batch.num_rows(), 2);
        let id = batch.column_by_name("id").unwrap().as_string::<i32>();
        assert_eq!((id.value(0), id.value(1)), ("a", "7"));
        let title = batch.column_by_name("title").unwrap().as_string::<i32>();
        assert_eq!(title.value(0), "A");
        assert!(title.is_null(1), "a missing field is null");
        let year = batch.column_by_name("year").unwrap().as_string::<i32>();
        assert_eq!(year.value(0), "1999");
        let vectors = batch
            .column_by_name(VECTOR_COLUMN)
            .unwrap()
            .as_fixed_size_list();
        let second = vectors.value(1);
        assert_eq!(second.as_primitive::<Float32Type>().values(), &[3.0, 4.0]);

        let mut merger = ParquetMerger::new();
        let mut merged = merger.add(shard.clone()).unwrap();
        merged.extend(merger.add(shard).unwrap());
        merged.extend(merger.finish(Vec::new()).unwrap());
        let rows: usize = read(merged).iter().map(RecordBatch::num_rows).sum();
        assert_eq!(rows, 4);

        // A merge of no rows (an empty corpus) is still a file readers open.
        let no_rows = encode_shard(&ShardRows::ids(&[]), &[], &[], OutputDtype::F32, 2).unwrap();
        let empty = ParquetMerger::new().finish(no_rows).unwrap();
        let reader =
            ParquetRecordBatchReaderBuilder::try_new(resident_sdk::Bytes::from(empty)).unwrap();
        let names: Vec<String> = reader
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        assert_eq!(names, ["id", VECTOR_COLUMN]);
    }

    #[test]
    fn windows_are_rows_of_their_own_after_the_carried_columns() {
        let mut kept = crate::records::Kept::new();
        kept.insert("title".into(), Value::from("Long"));
        let ids = [Value::from(7), Value::from("b")];
        let carried = [kept, crate::records::Kept::new()];
        let window = |text, window, char_start, char_end| RowWindow {
            text,
            window,
            char_start,
            char_end,
        };
        let windows = [
            window(0, 0, 0, 40),
            window(0, 1, 30, 70),
            window(1, 0, 0, 5),
        ];
        let rows = ShardRows {
            ids: &ids,
            kept: &carried,
            windows: &windows,
        };
        let stored: Vec<u8> = (0..6).flat_map(|v| (v as f32).to_le_bytes()).collect();
        let shard = encode_shard(&rows, &["title"], &stored, OutputDtype::F32, 2).unwrap();
        let batch = &read(shard)[0];
        let names: Vec<String> = batch
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        assert_eq!(
            names,
            [
                "id",
                "embedding",
                "title",
                "doc_id",
                "window",
                "char_start",
                "char_end"
            ]
        );
        let text = |name: &str, row: usize| {
            batch
                .column_by_name(name)
                .unwrap()
                .as_string::<i32>()
                .value(row)
                .to_owned()
        };
        assert_eq!(
            [text("id", 0), text("id", 1), text("id", 2)],
            ["7#0", "7#1", "b#0"]
        );
        assert_eq!([text("doc_id", 1), text("title", 1)], ["7", "Long"]);
        assert!(batch.column_by_name("title").unwrap().is_null(2));
        let number = |name: &str| {
            batch
                .column_by_name(name)
                .unwrap()
                .as_primitive::<arrow_array::types::UInt32Type>()
                .values()
                .to_vec()
        };
        assert_eq!(number("window"), [0, 1, 0]);
        assert_eq!(number("char_start"), [0, 30, 0]);
        assert_eq!(number("char_end"), [40, 70, 5]);
    }

    #[test]
    fn packed_bits_are_a_list_of_bytes() {
        let ids = [Value::from("a")];
        let rows = ShardRows::ids(&ids);
        let shard = encode_shard(&rows, &[], &[129, 192], OutputDtype::Ubinary, 10).unwrap();
        let batch = &read(shard)[0];
        let vectors = batch
            .column_by_name(VECTOR_COLUMN)
            .unwrap()
            .as_fixed_size_list();
        assert_eq!(vectors.value_length(), 2);
        assert_eq!(
            vectors
                .value(0)
                .as_primitive::<arrow_array::types::UInt8Type>()
                .values(),
            &[129, 192]
        );
    }
}
