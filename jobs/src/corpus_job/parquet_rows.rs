//! Rows of a Parquet file, a batch at a time: a text column, an optional id column and
//! carried columns; or every column as a JSON object (lists as arrays, structs as objects),
//! so that a Hugging Face dataset's `choices`, `messages` or `chosen` columns read as the
//! same fields of a JSON line do.

use std::fs::File;

use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type, UInt32Type, UInt64Type};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::DataType;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use serde_json::Value;

use super::JobError;
use super::parquet_columns::{Columns, ParquetRow, Row};

pub(super) struct ParquetRows {
    batches: ParquetRecordBatchReader,
    batch: Option<RecordBatch>,
    next_row: usize,
    text_field: String,
    id_field: String,
    keep_fields: Vec<String>,
    objects: bool,
}

fn is_text(data_type: &DataType) -> bool {
    matches!(
        data_type,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
    )
}

fn string_at(array: &dyn Array, row: usize) -> Option<String> {
    if array.is_null(row) {
        return None;
    }
    match array.data_type() {
        DataType::Utf8 => Some(array.as_string::<i32>().value(row).to_owned()),
        DataType::LargeUtf8 => Some(array.as_string::<i64>().value(row).to_owned()),
        DataType::Utf8View => Some(array.as_string_view().value(row).to_owned()),
        _ => None,
    }
}

fn id_at(array: &dyn Array, row: usize) -> Result<Option<Value>, String> {
    if array.is_null(row) {
        return Ok(None);
    }
    Ok(Some(match array.data_type() {
        DataType::Int32 => Value::from(array.as_primitive::<Int32Type>().value(row)),
        DataType::Int64 => Value::from(array.as_primitive::<Int64Type>().value(row)),
        DataType::UInt32 => Value::from(array.as_primitive::<UInt32Type>().value(row)),
        DataType::UInt64 => Value::from(array.as_primitive::<UInt64Type>().value(row)),
        t if is_text(t) => Value::from(string_at(array, row).unwrap_or_default()),
        other => return Err(format!("id column has unsupported type {other}")),
    }))
}

/// A cell as JSON, whatever its nesting: lists as arrays, structs as objects, text, numbers,
/// booleans and null as themselves, and every other type (dates, timestamps, decimals,
/// binary, maps) as the text arrow prints for it.
fn json_at(array: &dyn Array, row: usize) -> Result<Value, String> {
    use arrow_array::types::{
        Float32Type, Float64Type, Int8Type, Int16Type, UInt8Type, UInt16Type,
    };
    if array.is_null(row) {
        return Ok(Value::Null);
    }
    Ok(match array.data_type() {
        DataType::Boolean => Value::from(array.as_boolean().value(row)),
        DataType::Int8 => Value::from(array.as_primitive::<Int8Type>().value(row)),
        DataType::Int16 => Value::from(array.as_primitive::<Int16Type>().value(row)),
        DataType::UInt8 => Value::from(array.as_primitive::<UInt8Type>().value(row)),
        DataType::UInt16 => Value::from(array.as_primitive::<UInt16Type>().value(row)),
        DataType::Int32 | DataType::Int64 | DataType::UInt32 | DataType::UInt64 => {
            id_at(array, row)?.unwrap_or(Value::Null)
        }
        DataType::Float32 => Value::from(array.as_primitive::<Float32Type>().value(row)),
        DataType::Float64 => Value::from(array.as_primitive::<Float64Type>().value(row)),
        t if is_text(t) => Value::from(string_at(array, row).unwrap_or_default()),
        DataType::List(_) => items(&array.as_list::<i32>().value(row))?,
        DataType::LargeList(_) => items(&array.as_list::<i64>().value(row))?,
        DataType::FixedSizeList(..) => items(&array.as_fixed_size_list().value(row))?,
        DataType::Struct(fields) => {
            let columns = array.as_struct().columns();
            let mut object = serde_json::Map::new();
            for (field, column) in fields.iter().zip(columns) {
                object.insert(field.name().clone(), json_at(column.as_ref(), row)?);
            }
            Value::Object(object)
        }
        _ => {
            let options = arrow_cast::display::FormatOptions::default();
            let formatter = arrow_cast::display::ArrayFormatter::try_new(array, &options)
                .map_err(|e| format!("a {} value cannot be read: {e}", array.data_type()))?;
            Value::from(formatter.value(row).to_string())
        }
    })
}

/// A list cell's items as a JSON array.
fn items(values: &ArrayRef) -> Result<Value, String> {
    (0..values.len())
        .map(|index| json_at(values.as_ref(), index))
        .collect::<Result<Vec<_>, _>>()
        .map(Value::Array)
}

/// Row `row` of `batch` as a JSON object of its columns.
fn object_at(batch: &RecordBatch, row: usize) -> Result<serde_json::Map<String, Value>, String> {
    let schema = batch.schema();
    let mut object = serde_json::Map::new();
    for (field, column) in schema.fields().iter().zip(batch.columns()) {
        let value =
            json_at(column.as_ref(), row).map_err(|e| format!("column `{}`: {e}", field.name()))?;
        object.insert(field.name().clone(), value);
    }
    Ok(object)
}

impl ParquetRows {
    /// Reads `file` (called `name` in messages) and checks that it has a text column (or,
    /// read as objects, a conversation's or a preference pair's).
    pub fn open(file: File, name: &str, columns: &Columns<'_>) -> Result<Self, JobError> {
        let fail = |e: &dyn std::fmt::Display| JobError::Input(format!("cannot read {name}: {e}"));
        let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| fail(&e))?;
        let schema = builder.schema();
        let text_field = columns.text;
        let structured = ["messages", "chosen"]
            .iter()
            .any(|column| schema.field_with_name(column).is_ok());
        match schema.field_with_name(text_field) {
            Ok(field) if is_text(field.data_type()) => {}
            Ok(field) => {
                return Err(JobError::Input(format!(
                    "{name}: column `{text_field}` is {}, not text",
                    field.data_type()
                )));
            }
            Err(_) if columns.objects && structured => {}
            Err(_) => {
                let columns: Vec<&str> =
                    schema.fields().iter().map(|f| f.name().as_str()).collect();
                return Err(JobError::Input(format!(
                    "{name} has no column `{text_field}` (use --text-field; its columns: {})",
                    columns.join(", ")
                )));
            }
        }
        let batches = builder
            .with_batch_size(1024)
            .build()
            .map_err(|e| fail(&e))?;
        Ok(Self {
            batches,
            batch: None,
            next_row: 0,
            text_field: text_field.to_owned(),
            id_field: columns.id.to_owned(),
            keep_fields: columns.keep.to_vec(),
            objects: columns.objects,
        })
    }

    /// The next row, or `None` at the end of the file.
    pub fn next_row(&mut self) -> Result<Option<Row>, JobError> {
        loop {
            if let Some(batch) = &self.batch
                && self.next_row < batch.num_rows()
            {
                let row = self.next_row;
                self.next_row += 1;
                if self.objects {
                    return Ok(Some(object_at(batch, row).map(ParquetRow::Object)));
                }
                let text = batch
                    .column_by_name(&self.text_field)
                    .and_then(|c| string_at(c.as_ref(), row));
                let Some(text) = text else {
                    return Ok(Some(Err(format!(
                        "missing text field `{}`",
                        self.text_field
                    ))));
                };
                let id = match batch.column_by_name(&self.id_field) {
                    Some(column) => match id_at(column.as_ref(), row) {
                        Ok(id) => id,
                        Err(reason) => return Ok(Some(Err(reason))),
                    },
                    None => None,
                };
                let mut kept = crate::records::Kept::new();
                for field in &self.keep_fields {
                    match kept_at(batch, row, field) {
                        Ok(value) => kept.insert(field.clone(), value),
                        Err(reason) => return Ok(Some(Err(reason))),
                    };
                }
                return Ok(Some(Ok(ParquetRow::Text { id, text, kept })));
            }
            match self.batches.next() {
                Some(Ok(batch)) => {
                    self.batch = Some(batch);
                    self.next_row = 0;
                }
                Some(Err(e)) => {
                    return Err(JobError::Input(format!("cannot read a Parquet batch: {e}")));
                }
                None => return Ok(None),
            }
        }
    }
}

/// Row `row`'s kept `field`: its column's value as JSON, or else a path into a column's
/// structs and lists (`meta.url`, `tags.0`), as a JSON record's fields are read; null where
/// there is none.
fn kept_at(batch: &RecordBatch, row: usize, field: &str) -> Result<Value, String> {
    if let Some(column) = batch.column_by_name(field) {
        return json_at(column.as_ref(), row);
    }
    let Some((head, path)) = field.split_once('.') else {
        return Ok(Value::Null);
    };
    let Some(column) = batch.column_by_name(head) else {
        return Ok(Value::Null);
    };
    let value = json_at(column.as_ref(), row)?;
    Ok(crate::records::value_at_path(&value, path)
        .cloned()
        .unwrap_or(Value::Null))
}
