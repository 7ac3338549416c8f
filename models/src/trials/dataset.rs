//! A sweep's embedded data inside an actor: loaded once from the runner's cache file, kept
//! on the actor's device, split into train and validation by the sweep's seed.

use candle_core::{Device, Tensor};
use prost::Message;
use resident_proto::{SeededRng, pb};

use crate::ModelError;
use crate::roots::{FileRoots, MAX_DATASET_BYTES};

pub struct LoadedDataset {
    pub key: String,
    pub split_seed: u64,
    pub dim: usize,
    /// Classifier examples or retrieval documents, `[count, dim]`.
    pub vectors: Tensor,
    pub labels: Vec<u32>,
    pub classes: usize,
    /// Retrieval queries, `[query_count, dim]`, and each one's document row.
    pub queries: Option<Tensor>,
    pub query_docs: Vec<u32>,
    /// Rows (classifier) or queries (retrieval) to train on, and to validate on.
    pub train: Vec<u32>,
    pub validation: Vec<u32>,
}

fn f32_rows(bytes: &[u8], rows: usize, dim: usize, device: &Device) -> Result<Tensor, ModelError> {
    if bytes.len() != rows * dim * 4 {
        return Err(ModelError::BadPayload(format!(
            "dataset holds {} bytes of vectors, expected {rows} x {dim} f32",
            bytes.len()
        )));
    }
    let values: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    Ok(Tensor::from_vec(values, (rows, dim), device)?)
}

/// `count` indices shuffled by `seed`, the first 80% for training.
pub fn split(count: usize, seed: u64) -> (Vec<u32>, Vec<u32>) {
    let mut order: Vec<u32> = (0..count as u32).collect();
    SeededRng::derived(seed, 0x5917).shuffle(&mut order);
    let train = (count * 4)
        .div_ceil(5)
        .min(count.saturating_sub(1))
        .max(1.min(count));
    let validation = order.split_off(train);
    (order, validation)
}

impl LoadedDataset {
    pub fn load(
        uri: &str,
        key: &str,
        split_seed: u64,
        device: &Device,
        roots: &FileRoots,
    ) -> Result<Self, ModelError> {
        let path = uri.strip_prefix("file://").unwrap_or(uri);
        if !std::path::Path::new(path).exists() {
            return Err(ModelError::BadPayload(format!(
                "cannot read the sweep's embedding cache {path}: no such file on this node; \
                 give the sweep a `cache = \"s3://bucket/prefix/\"` (or `resident sweep --cache`) so \
                 agents fetch it, or put its output on a filesystem they share"
            )));
        }
        let bytes = roots.read_data_file(std::path::Path::new(path), MAX_DATASET_BYTES)?;
        let data = pb::TrialDataset::decode(bytes.as_slice())
            .map_err(|e| ModelError::BadPayload(format!("{path} is not a sweep dataset: {e}")))?;
        let dim = data.dim as usize;
        let count = data.count as usize;
        let vectors = f32_rows(&data.vectors, count, dim, device)?;
        let (queries, examples) = if data.query_count > 0 {
            let queries = f32_rows(&data.query_vectors, data.query_count as usize, dim, device)?;
            (Some(queries), data.query_count as usize)
        } else {
            if data.labels.len() != count {
                return Err(ModelError::BadPayload(format!(
                    "{path}: {} labels for {count} rows",
                    data.labels.len()
                )));
            }
            (None, count)
        };
        let (train, validation) = split(examples, split_seed);
        Ok(Self {
            key: key.to_owned(),
            split_seed,
            dim,
            vectors,
            labels: data.labels,
            classes: data.classes.len().max(1),
            queries,
            query_docs: data.query_docs,
            train,
            validation,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_split_is_seeded_disjoint_and_complete() {
        let (train, validation) = split(100, 7);
        assert_eq!((train.len(), validation.len()), (80, 20));
        let mut all: Vec<u32> = train.iter().chain(&validation).copied().collect();
        all.sort();
        assert_eq!(all, (0..100).collect::<Vec<_>>());
        assert_eq!(split(100, 7), (train, validation));
        assert_ne!(split(100, 8).1, split(100, 7).1);
        assert_eq!(split(3, 1).0.len(), 2);
    }
}
