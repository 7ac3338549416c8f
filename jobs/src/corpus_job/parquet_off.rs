//! Built without the `parquet` feature: a Parquet input is refused with a message that says
//! how to read it. The API matches the real reader so callers need no `cfg`.

use std::fs::File;

use serde_json::Value;

use super::JobError;

pub(super) enum ParquetRows {}

/// One row: its id and text, or why it is unusable.
pub(super) type Row = Result<(Option<Value>, String, crate::records::Kept), String>;

impl ParquetRows {
    pub fn open(
        _file: File,
        name: &str,
        _text_field: &str,
        _id_field: &str,
        _keep_fields: &[String],
    ) -> Result<Self, JobError> {
        Err(JobError::Input(format!(
            "{name}: this build cannot read Parquet: build resident-jobs (or the resident CLI) with the `parquet` feature"
        )))
    }

    pub fn next_row(&mut self) -> Result<Option<Row>, JobError> {
        match *self {}
    }
}
