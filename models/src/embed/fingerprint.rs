//! The content fingerprint of a loaded model: SHA-256 over the files that decide its
//! vectors (weights in full, the model and tokenizer configs, sentence-transformers'
//! pooling settings). Every embedding carries it, so a job can refuse to mix vectors of two
//! different models that share a name (two revisions of one Hugging Face id, each agent
//! resolving its own copy).

use std::io::Read;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::ModelError;
use crate::roots::FileRoots;

/// Files beside the weights that change what a model computes, when present.
const CONFIG_FILES: [&str; 6] = [
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "sentence_bert_config.json",
    "modules.json",
    "1_Pooling/config.json",
];

/// Hex SHA-256 of `dir`'s config files (each with its name) and of every byte of `weights`,
/// in order. Reading the weights costs one pass over files the load has just read.
pub fn model_content_fingerprint(
    dir: &Path,
    weights: &[std::path::PathBuf],
    roots: &FileRoots,
) -> Result<String, ModelError> {
    let mut hasher = Sha256::new();
    for name in CONFIG_FILES {
        let path = dir.join(name);
        if path.is_file() {
            let real = roots.check_model_path(&path)?;
            let bytes = std::fs::read(&real)
                .map_err(|e| ModelError::Load(format!("{}: {e}", path.display())))?;
            hasher.update(name.as_bytes());
            hasher.update((bytes.len() as u64).to_le_bytes());
            hasher.update(&bytes);
        }
    }
    let mut buffer = vec![0u8; 4 << 20];
    for path in weights {
        let real = roots.check_model_path(path)?;
        let mut file = std::fs::File::open(&real)
            .map_err(|e| ModelError::Load(format!("{}: {e}", path.display())))?;
        hasher.update(b"weights");
        loop {
            let read = file
                .read(&mut buffer)
                .map_err(|e| ModelError::Load(format!("{}: {e}", path.display())))?;
            if read == 0 {
                break;
            }
            hasher.update(&buffer[..read]);
        }
    }
    Ok(hex::encode(hasher.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model_dir(weights: &[u8], config: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("model.safetensors"), weights).unwrap();
        std::fs::write(dir.path().join("config.json"), config).unwrap();
        dir
    }

    fn fingerprint(dir: &Path) -> String {
        let roots = FileRoots::unrestricted();
        model_content_fingerprint(dir, &[dir.join("model.safetensors")], &roots).unwrap()
    }

    #[test]
    fn any_byte_of_the_weights_or_config_changes_it() {
        let mut weights = vec![7u8; 9 << 20];
        let base = model_dir(&weights, "{\"hidden_size\": 8}");
        let same = model_dir(&weights, "{\"hidden_size\": 8}");
        assert_eq!(fingerprint(base.path()), fingerprint(same.path()));
        weights[5 << 20] = 8; // the middle of the weights, size unchanged
        let edited = model_dir(&weights, "{\"hidden_size\": 8}");
        assert_ne!(fingerprint(base.path()), fingerprint(edited.path()));
        let reconfigured = model_dir(&vec![7u8; 9 << 20], "{\"hidden_size\": 9}");
        assert_ne!(fingerprint(base.path()), fingerprint(reconfigured.path()));
    }
}
