//! Built without the `parquet` feature: `--format parquet` is refused with a message that
//! says how to get it. The API matches the real writer so callers need no `cfg`.

use super::shard_rows::ShardRows;
use super::vectors::OutputDtype;

/// The column that holds the vectors.
pub const VECTOR_COLUMN: &str = "embedding";

const REFUSAL: &str = "this build cannot write Parquet: build resident-jobs (or the resident \
                       CLI) with the `parquet` feature, or use --format npy";

pub fn encode_shard(
    _rows: &ShardRows<'_>,
    _keep: &[&str],
    _stored: &[u8],
    _dtype: OutputDtype,
    _dim: usize,
) -> Result<Vec<u8>, String> {
    Err(REFUSAL.into())
}

pub struct ParquetMerger;

impl ParquetMerger {
    pub fn new() -> Self {
        Self
    }

    pub fn add(&mut self, _shard: Vec<u8>) -> Result<Vec<u8>, String> {
        Err(REFUSAL.into())
    }

    pub fn finish(self, _no_rows: Vec<u8>) -> Result<Vec<u8>, String> {
        Err(REFUSAL.into())
    }
}
