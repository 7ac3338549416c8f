//! Built without the `parquet` feature: `resident generate --format parquet` is refused with
//! a message that says how to get it. The API matches the real writer so callers need no
//! `cfg`.

use serde_json::{Map, Value};

pub fn encode_generation_lines(
    _lines: &[Map<String, Value>],
    _kept: &[&str],
    _fields: &[&str],
) -> Result<Vec<u8>, String> {
    Err(
        "this build cannot write Parquet: build resident-jobs (or the resident CLI) with the \
         `parquet` feature, or use --format jsonl"
            .into(),
    )
}
