//! What a reader asks of a Parquet file's rows, and what it gets back: the same with or
//! without the `parquet` feature (`parquet_rows.rs`, `parquet_off.rs`).

use serde_json::{Map, Value};

use crate::records::Kept;

/// What a reader takes from each row of a Parquet file.
#[cfg_attr(not(feature = "parquet"), allow(dead_code))]
pub(super) struct Columns<'a> {
    /// The text column.
    pub text: &'a str,
    /// The id column (a row without it gets an id from its place).
    pub id: &'a str,
    /// Columns carried to the output.
    pub keep: &'a [String],
    /// Every column, as a JSON object, for records with more than a text (a prompt's
    /// fields, conversations, choices, preference pairs), read as a JSON line would be.
    /// The file then needs its text column only where it has no `messages` or `chosen`
    /// column either.
    pub objects: bool,
}

/// One row: its id (when the file has the id column), text and carried columns, or every
/// column by name ([`Columns::objects`]); or why it is unusable.
pub(super) type Row = Result<ParquetRow, String>;

/// A usable row.
#[cfg_attr(not(feature = "parquet"), allow(dead_code))]
pub(super) enum ParquetRow {
    /// Its id, text and carried columns.
    Text {
        id: Option<Value>,
        text: String,
        kept: Kept,
    },
    /// Every column by name, nested lists and structs as JSON arrays and objects.
    Object(Map<String, Value>),
}
