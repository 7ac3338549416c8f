//! The manifest of an output: which chunks are finished ([`ShardEntry`]) and what the
//! output was started with ([`Manifest`]: input and model fingerprints, chunk schedule,
//! vector type). A leaf below the output directory, the journal and the jobs;
//! `manifest_store.rs` reads and writes it.

use serde::{Deserialize, Serialize};

use super::error::JobError;
use super::reader::BadRecord;
use super::schedule::ChunkSchedule;
use super::vectors::{OutputDtype, QuantizationRanges};

/// One finished chunk.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShardEntry {
    /// The chunk's index.
    pub index: u64,
    /// Rows of its data file (vectors or generations).
    pub rows: u64,
    /// Records the rows answer, where they differ (texts cut into windows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub records: Option<u64>,
    /// Its data file (vectors `.npy`, Parquet or generations `.jsonl`).
    pub vectors_file: String,
    /// Hex SHA-256 of the data file.
    pub vectors_sha256: String,
    /// Sizes in bytes (0 in manifests from before they were recorded).
    #[serde(default)]
    pub vectors_bytes: u64,
    /// Its ids file (`.jsonl`).
    pub ids_file: String,
    /// Hex SHA-256 of the ids file.
    pub ids_sha256: String,
    /// Size of the ids file (0 in manifests from before it was recorded).
    #[serde(default)]
    pub ids_bytes: u64,
    /// Records of the chunk left out because they crash the model (`corpus_job/poison.rs`):
    /// `rows` counts the others.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub crashed: Vec<BadRecord>,
    /// What the work counted of the chunk's records that its report gives over the whole
    /// output, reused chunks too (generate: answers against right answers, scored texts;
    /// embed: norms, cut records, windows); absent in manifests from before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counts: Option<serde_json::Value>,
}

/// `manifest.json`: the finished chunks of an output and the settings they were made under,
/// which a rerun checks before it resumes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// The manifest's format version.
    pub version: u32,
    /// The input's fingerprint.
    pub input_fingerprint: String,
    /// The model's (and the work's settings') fingerprint.
    pub model_fingerprint: String,
    /// The body's chunk size (0 until planned); see `chunk_schedule` for every chunk's.
    pub chunk_size: usize,
    /// Where each chunk starts and ends (absent: every chunk is `chunk_size`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk_schedule: Option<ChunkSchedule>,
    /// How vectors are stored.
    pub dtype: OutputDtype,
    /// The stored vectors' dimensions (after `--truncate-dim`).
    pub dim: Option<usize>,
    /// The int8/uint8 ranges, calibrated before the first chunk (see `embed.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantization_ranges: Option<QuantizationRanges>,
    /// SHA-256 of the weights and configs of the model the agents loaded (from the first
    /// chunk's result): every later chunk must match it.
    #[serde(default)]
    pub model_content: Option<String>,
    /// The chunks compacted into this file, in chunk order. While a job runs, chunks finished
    /// since the last compaction are in the journal this generation names (see
    /// `manifest_store`); a finished job has them all here.
    pub chunks: Vec<ShardEntry>,
    /// The journal generation that continues this manifest (0 in manifests from before
    /// the journal).
    #[serde(default)]
    pub journal_generation: u64,
}

impl Manifest {
    /// Refuses an output at `place` whose shards are not `.{format}` files: a job asked
    /// for `format` (`parquet`, or the work's own, `plain`: its name and its `--format`
    /// word, `("npy", "npy")`, `("JSON lines", "jsonl")`) resumes only its own kind.
    pub fn check_shard_format(
        &self,
        place: &str,
        format: &str,
        plain: (&str, &str),
    ) -> Result<(), JobError> {
        let extension = format!(".{format}");
        let Some(other) = (self.chunks.iter()).find(|c| !c.vectors_file.ends_with(&extension))
        else {
            return Ok(());
        };
        let (theirs, flag) = match other.vectors_file.ends_with(".parquet") {
            true => ("Parquet", "parquet"),
            false => plain,
        };
        Err(JobError::Mismatch(format!(
            "{place} holds {theirs} shards; rerun with --format {flag}, or write to another \
             --output"
        )))
    }

    /// The chunk boundaries this output was started with.
    pub fn schedule(&self) -> ChunkSchedule {
        self.chunk_schedule
            .clone()
            .unwrap_or_else(|| ChunkSchedule::uniform(self.chunk_size))
    }

    /// Records the first chunk's model content fingerprint and refuses a chunk embedded by
    /// another model (two agents that resolved one model name to different files). An
    /// empty fingerprint (an agent from before fingerprints) is not checked.
    pub fn check_model_content(
        &mut self,
        fingerprint: &str,
        chunk: u64,
        where_from: &str,
    ) -> Result<(), JobError> {
        if fingerprint.is_empty() {
            return Ok(());
        }
        match &self.model_content {
            None => {
                self.model_content = Some(fingerprint.to_owned());
                Ok(())
            }
            Some(recorded) if recorded == fingerprint => Ok(()),
            Some(recorded) => Err(JobError::Mismatch(format!(
                "chunk {chunk} was embedded by {where_from} with a model whose weights or \
                 configs differ from the model of this output's other chunks (content \
                 fingerprint {} against {}): the agents resolved the model name to different \
                 files. Give every agent the same copy (a local directory, or one pinned \
                 revision) and rerun; the chunks already written are kept",
                &fingerprint[..fingerprint.len().min(12)],
                &recorded[..recorded.len().min(12)],
            ))),
        }
    }
}

impl ShardEntry {
    /// Records the chunk answered (written ones and those left out because they crash the
    /// model).
    pub fn records(&self) -> u64 {
        self.records.unwrap_or(self.rows) + self.crashed.len() as u64
    }

    /// An entry for chunk `index` with made-up sums, for tests of the manifest.
    #[cfg(test)]
    pub(crate) fn for_test(index: u64) -> Self {
        Self {
            index,
            rows: 1000,
            records: None,
            vectors_file: format!("shards/chunk-{index:06}.npy"),
            vectors_sha256: "ab".repeat(32),
            vectors_bytes: 1_536_128,
            ids_file: format!("shards/chunk-{index:06}.ids.jsonl"),
            ids_sha256: "cd".repeat(32),
            ids_bytes: 12_000,
            crashed: Vec::new(),
            counts: None,
        }
    }
}
