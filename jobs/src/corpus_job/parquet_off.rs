//! Built without the `parquet` feature: a Parquet input is refused with a message that says
//! how to read it. The API matches the real reader so callers need no `cfg`.

use std::fs::File;

use super::JobError;
use super::parquet_columns::{Columns, Row};

pub(super) enum ParquetRows {}

impl ParquetRows {
    pub fn open(_file: File, name: &str, _columns: &Columns<'_>) -> Result<Self, JobError> {
        Err(JobError::Input(format!(
            "{name}: this build cannot read Parquet: build resident-jobs (or the resident CLI) with the `parquet` feature"
        )))
    }

    pub fn next_row(&mut self) -> Result<Option<Row>, JobError> {
        match *self {}
    }
}
