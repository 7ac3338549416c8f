//! The best trial's trained head, kept: whenever a trial ends as the sweep's best so far,
//! its weights (the checkpoint without AdamW's moments) are written to the output as
//! `best_head.safetensors`, with what a user needs to apply them in its metadata: the
//! model whose vectors it takes, the trial, its hyperparameters and metric, the class
//! names in the order of the logits (classifier), and how it is applied.
//!
//! Written before the trial's line is appended to `results.jsonl`, so a finished best trial
//! always has its head; the metadata's `trial_id` says whose head the file holds, and the
//! summary names the file only when that is the best trial.

use std::collections::HashMap;
use std::path::Path;

use resident_proto::pb;
use safetensors::tensor::{Dtype, TensorView};

use super::SweepError;
use super::config::{SweepConfig, TrialKind};
use super::results::TrialResult;
use crate::files::write_atomically;

/// The file's name under the sweep's output.
pub const BEST_HEAD_FILE: &str = "best_head.safetensors";

/// What the metadata says of how each trial kind's head is applied.
fn forward_of(kind: TrialKind) -> &'static str {
    match kind {
        TrialKind::Classifier => {
            "logits = x @ w0 + b0 (hidden = 0), or relu(x @ w0 + b0) @ w1 + b1; x: the model's embedding of a text as the sweep embedded it; classes: the logits' order"
        }
        TrialKind::Retrieval => {
            "query = normalize(q @ adapter); rank documents by query . d; q and d: the model's embeddings as the sweep embedded them"
        }
    }
}

/// The metadata written beside a trial's head.
pub fn head_metadata(
    config: &SweepConfig,
    result: &TrialResult,
    classes: &[String],
) -> HashMap<String, String> {
    let mut metadata = HashMap::from([
        ("format".to_owned(), "resident-sweep-head".to_owned()),
        ("sweep".to_owned(), config.name.clone()),
        ("model".to_owned(), config.model.clone()),
        ("trial".to_owned(), json(&config.trial)),
        ("trial_id".to_owned(), result.trial_id.to_string()),
        ("params".to_owned(), json(&result.params)),
        ("metric".to_owned(), config.metric.clone()),
        ("metric_value".to_owned(), json(&result.metric)),
        ("epochs".to_owned(), result.epochs.to_string()),
        ("forward".to_owned(), forward_of(config.trial).to_owned()),
    ]);
    if config.trial == TrialKind::Classifier {
        metadata.insert("classes".to_owned(), json(classes));
    }
    metadata
}

/// JSON text of a value, for the metadata's strings.
fn json<T: serde::Serialize + ?Sized>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

/// The checkpoint's weights (not the optimiser's `.m`/`.v` moments) as safetensors bytes
/// with `metadata`.
pub fn head_bytes(
    checkpoint: &pb::TrialCheckpoint,
    metadata: HashMap<String, String>,
) -> Result<Vec<u8>, SweepError> {
    let bad = |e: String| SweepError::Output(format!("the trained head: {e}"));
    let mut views = Vec::new();
    for tensor in &checkpoint.tensors {
        if tensor.name.ends_with(".m") || tensor.name.ends_with(".v") {
            continue;
        }
        let shape: Vec<usize> = tensor.shape.iter().map(|d| *d as usize).collect();
        let view = TensorView::new(Dtype::F32, shape, &tensor.data)
            .map_err(|e| bad(format!("tensor `{}`: {e}", tensor.name)))?;
        views.push((tensor.name.clone(), view));
    }
    if views.is_empty() {
        return Err(bad("the checkpoint holds no weights".into()));
    }
    safetensors::serialize(views, Some(metadata)).map_err(|e| bad(e.to_string()))
}

/// Writes `result`'s head as the sweep's best (atomically). Blocking.
pub fn write_best_head(
    output: &Path,
    checkpoint: &pb::TrialCheckpoint,
    metadata: HashMap<String, String>,
) -> Result<(), SweepError> {
    let bytes = head_bytes(checkpoint, metadata)?;
    let path = output.join(BEST_HEAD_FILE);
    write_atomically(&path, &bytes).map_err(|e| SweepError::Output(e.to_string()))
}

/// The trial whose head `output`'s file holds, if it holds one.
pub fn best_head_trial(output: &Path) -> Option<usize> {
    let bytes = std::fs::read(output.join(BEST_HEAD_FILE)).ok()?;
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).ok()?;
    header.metadata().as_ref()?.get("trial_id")?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::SafeTensors;

    fn tensor(name: &str, shape: &[u32], values: &[f32]) -> pb::NamedTensor {
        pb::NamedTensor {
            name: name.to_owned(),
            shape: shape.to_vec(),
            data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }

    #[test]
    fn the_head_holds_the_weights_and_what_applies_them() {
        let config = SweepConfig::from_toml(
            "name = \"probe\"\nmodel = \"models/m\"\ntrial = \"classifier\"\ndata = \"d\"\nmetric = \"accuracy\"\nmode = \"max\"\noutput = \"o\"\n[space]\nlr = { choice = [0.1] }\n",
        )
        .unwrap();
        let result: TrialResult = serde_json::from_value(serde_json::json!({
            "trial_id": 3, "params": {"lr": 0.1, "hidden": 0}, "metric": 0.75, "epochs": 4,
            "stopped_early": false, "actor_id": "a", "wall_s": 1.0
        }))
        .unwrap();
        let checkpoint = pb::TrialCheckpoint {
            epoch: 4,
            step: 40,
            tensors: vec![
                tensor("w0", &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
                tensor("w0.m", &[2, 3], &[0.0; 6]),
                tensor("w0.v", &[2, 3], &[0.0; 6]),
                tensor("b0", &[3], &[0.5, -0.5, 0.0]),
            ],
        };
        let classes = ["art".to_owned(), "history".to_owned(), "science".to_owned()];
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(best_head_trial(dir.path()), None);
        let metadata = head_metadata(&config, &result, &classes);
        write_best_head(dir.path(), &checkpoint, metadata).unwrap();
        assert_eq!(best_head_trial(dir.path()), Some(3));
        let bytes = std::fs::read(dir.path().join(BEST_HEAD_FILE)).unwrap();
        let file = SafeTensors::deserialize(&bytes).unwrap();
        let mut names = file.names();
        names.sort();
        assert_eq!(names, vec!["b0", "w0"], "no optimiser moments");
        let w0 = file.tensor("w0").unwrap();
        assert_eq!((w0.shape(), w0.dtype()), (&[2usize, 3][..], Dtype::F32));
        assert_eq!(w0.data(), &checkpoint.tensors[0].data[..]);
        let (_, header) = SafeTensors::read_metadata(&bytes).unwrap();
        let meta = header.metadata().clone().unwrap();
        assert_eq!(meta["classes"], r#"["art","history","science"]"#);
        assert_eq!(meta["params"], r#"{"hidden":0,"lr":0.1}"#);
        assert_eq!(
            (meta["trial"].as_str(), meta["metric_value"].as_str()),
            ("\"classifier\"", "0.75")
        );
        assert!(meta["forward"].starts_with("logits = x @ w0 + b0"));
        let empty = pb::TrialCheckpoint::default();
        assert!(
            head_bytes(&empty, HashMap::new())
                .unwrap_err()
                .to_string()
                .contains("no weights")
        );
    }
}
