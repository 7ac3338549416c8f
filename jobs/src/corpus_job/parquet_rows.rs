//! Rows of a Parquet file: a text column and an optional id column, a batch at a time.

use std::fs::File;

use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type, UInt32Type, UInt64Type};
use arrow_array::{Array, RecordBatch};
use arrow_schema::DataType;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use serde_json::Value;

use super::JobError;

pub(super) struct ParquetRows {
    batches: ParquetRecordBatchReader,
    batch: Option<RecordBatch>,
    next_row: usize,
    text_field: String,
    id_field: String,
    keep_fields: Vec<String>,
}

/// One row: its id (when the file has the id column), text and carried columns, or why it is
/// unusable.
pub(super) type Row = Result<(Option<Value>, String, crate::records::Kept), String>;

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

/// A carried column's value as JSON: text, numbers and booleans (null when null).
fn value_at(array: &dyn Array, row: usize) -> Result<Value, String> {
    use arrow_array::types::{Float32Type, Float64Type};
    if array.is_null(row) {
        return Ok(Value::Null);
    }
    Ok(match array.data_type() {
        DataType::Boolean => Value::from(array.as_boolean().value(row)),
        DataType::Float32 => Value::from(array.as_primitive::<Float32Type>().value(row)),
        DataType::Float64 => Value::from(array.as_primitive::<Float64Type>().value(row)),
        t if is_text(t) => Value::from(string_at(array, row).unwrap_or_default()),
        _ => match id_at(array, row) {
            Ok(Some(value)) => value,
            _ => {
                return Err(format!(
                    "a --keep-columns column has type {}; text, numbers and booleans are carried",
                    array.data_type()
                ));
            }
        },
    })
}

impl ParquetRows {
    /// Reads `file` (called `name` in messages) and checks that it has a text column.
    pub fn open(
        file: File,
        name: &str,
        text_field: &str,
        id_field: &str,
        keep_fields: &[String],
    ) -> Result<Self, JobError> {
        let fail = |e: &dyn std::fmt::Display| JobError::Input(format!("cannot read {name}: {e}"));
        let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| fail(&e))?;
        match builder.schema().field_with_name(text_field) {
            Ok(field) if is_text(field.data_type()) => {}
            Ok(field) => {
                return Err(JobError::Input(format!(
                    "{name}: column `{text_field}` is {}, not text",
                    field.data_type()
                )));
            }
            Err(_) => {
                return Err(JobError::Input(format!(
                    "{name} has no column `{text_field}` (use --text-field)"
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
            id_field: id_field.to_owned(),
            keep_fields: keep_fields.to_vec(),
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
                    let value = match batch.column_by_name(field) {
                        Some(column) => match value_at(column.as_ref(), row) {
                            Ok(value) => value,
                            Err(reason) => return Ok(Some(Err(reason))),
                        },
                        None => Value::Null,
                    };
                    kept.insert(field.clone(), value);
                }
                return Ok(Some(Ok((id, text, kept))));
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
