//! The rows of one shard as a job writes them ([`ShardRows`]): ids, carried fields and
//! windows. A leaf: each job's shard writer and the Parquet writer read it.

use resident_sdk::RowWindow;

/// The rows of one shard: their records' ids, the records' carried fields
/// (`--keep-columns`; empty when none are kept, else one per id), and, when texts were cut
/// into windows, each row's window (rows then outnumber records).
#[derive(Clone, Copy, Debug)]
pub struct ShardRows<'a> {
    pub ids: &'a [serde_json::Value],
    pub kept: &'a [crate::records::Kept],
    /// A row per window, or empty: a row per record.
    pub windows: &'a [RowWindow],
}

impl<'a> ShardRows<'a> {
    /// Rows with ids only.
    pub fn ids(ids: &'a [serde_json::Value]) -> Self {
        Self {
            ids,
            kept: &[],
            windows: &[],
        }
    }

    /// Rows in the shard.
    pub fn len(&self) -> usize {
        match self.windows.is_empty() {
            true => self.ids.len(),
            false => self.windows.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether rows are windows of the records' texts.
    pub fn windowed(&self) -> bool {
        !self.windows.is_empty()
    }

    /// The record row `row` comes from (its index in `ids`).
    pub fn record_of(&self, row: usize) -> usize {
        self.windows.get(row).map_or(row, |w| w.text as usize)
    }

    /// Row `row`'s id: its record's, or for a window `<record id>#<window>`, so every row
    /// has its own.
    pub fn row_id(&self, row: usize) -> serde_json::Value {
        let id = &self.ids[self.record_of(row)];
        match self.windows.get(row) {
            None => id.clone(),
            Some(window) => {
                let record = match id {
                    serde_json::Value::String(text) => text.clone(),
                    other => other.to_string(),
                };
                format!("{record}#{}", window.window).into()
            }
        }
    }

    /// The carried fields of row `row`'s record.
    pub fn kept_of(&self, row: usize) -> Option<&'a crate::records::Kept> {
        self.kept.get(self.record_of(row))
    }
}

/// The fields a windowed row adds to its id: its record's id, its window's index, and its
/// characters in the record's text.
pub const WINDOW_FIELDS: [&str; 4] = ["doc_id", "window", "char_start", "char_end"];
