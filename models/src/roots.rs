//! Where an agent may read from. A pool's config names a model path and a sweep names a
//! dataset path; both come from clients, so an agent reads them only under the roots its
//! operator gave (`--model-root`, `--data-root`), after resolving symlinks, and never reads a
//! file whole without a size limit.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::ModelError;

/// Largest JSON settings file of a model (config, modules, pooling) read.
pub const MAX_MODEL_JSON_BYTES: u64 = 16 << 20;
/// Largest `tokenizer.json` read (multilingual tokenizers are tens of MiB).
pub const MAX_TOKENIZER_BYTES: u64 = 512 << 20;
/// Largest single weights file mapped.
pub const MAX_WEIGHTS_BYTES: u64 = 256 << 30;
/// Largest sweep dataset (embedding cache) read.
pub const MAX_DATASET_BYTES: u64 = 16 << 30;

/// The directories an agent reads models and datasets from; `None` is unrestricted
/// (in-process clusters, where the caller owns the files anyway).
#[derive(Clone, Debug, Default)]
pub struct FileRoots {
    models: Option<Vec<PathBuf>>,
    data: Option<Vec<PathBuf>>,
}

#[derive(Clone, Copy)]
enum RootKind {
    Model,
    Data,
}

impl RootKind {
    fn noun(self) -> &'static str {
        match self {
            RootKind::Model => "model",
            RootKind::Data => "dataset",
        }
    }

    fn flag(self) -> &'static str {
        match self {
            RootKind::Model => "--model-root",
            RootKind::Data => "--data-root",
        }
    }

    /// How to get the file to the agent instead.
    fn remote_hint(self) -> &'static str {
        match self {
            RootKind::Model => ", or name the model by s3:// or a Hugging Face id",
            RootKind::Data => {
                ", or give the sweep `--cache s3://bucket/prefix/` so agents fetch it"
            }
        }
    }

    fn error(self, message: String) -> ModelError {
        match self {
            RootKind::Model => ModelError::Load(message),
            RootKind::Data => ModelError::BadPayload(message),
        }
    }
}

/// A root as compared: with symlinks resolved where it exists.
fn normalize(root: &Path) -> PathBuf {
    root.canonicalize().unwrap_or_else(|_| root.to_owned())
}

impl FileRoots {
    /// Reads anything: for `Cluster::local()` and `resident local`.
    pub fn unrestricted() -> Self {
        Self::default()
    }

    /// Reads models only under `models` and datasets only under `data` (none: no datasets).
    pub fn restricted(models: &[PathBuf], data: &[PathBuf]) -> Self {
        Self {
            models: Some(models.iter().map(|r| normalize(r)).collect()),
            data: Some(data.iter().map(|r| normalize(r)).collect()),
        }
    }

    /// The model roots, for messages (`None`: unrestricted).
    pub fn model_roots(&self) -> Option<&[PathBuf]> {
        self.models.as_deref()
    }

    /// The real path of a model file or directory, if it lies under a model root.
    pub fn check_model_path(&self, path: &Path) -> Result<PathBuf, ModelError> {
        check_within(RootKind::Model, self.models.as_deref(), path)
    }

    /// The real path of a dataset file, if it lies under a data root.
    pub fn check_data_path(&self, path: &Path) -> Result<PathBuf, ModelError> {
        check_within(RootKind::Data, self.data.as_deref(), path)
    }

    /// Reads a model's file whole, within the roots and at most `limit` bytes.
    pub fn read_model_file(&self, path: &Path, limit: u64) -> Result<Vec<u8>, ModelError> {
        let real = self.check_model_path(path)?;
        read_limited(RootKind::Model, &real, limit)
    }

    /// Reads a dataset whole, within the roots and at most `limit` bytes.
    pub fn read_data_file(&self, path: &Path, limit: u64) -> Result<Vec<u8>, ModelError> {
        let real = self.check_data_path(path)?;
        read_limited(RootKind::Data, &real, limit)
    }

    /// Checks that a model file is a regular file within the roots and `limit`, without
    /// reading it (weights are memory-mapped).
    pub fn check_model_file(&self, path: &Path, limit: u64) -> Result<PathBuf, ModelError> {
        let real = self.check_model_path(path)?;
        regular_file_len(RootKind::Model, &real, limit)?;
        Ok(real)
    }
}

fn list(roots: &[PathBuf]) -> String {
    if roots.is_empty() {
        return "none given".to_owned();
    }
    roots
        .iter()
        .map(|r| r.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn check_within(
    kind: RootKind,
    roots: Option<&[PathBuf]>,
    path: &Path,
) -> Result<PathBuf, ModelError> {
    let real = path.canonicalize().map_err(|e| {
        kind.error(format!(
            "{} path {} cannot be read: {e}",
            kind.noun(),
            path.display()
        ))
    })?;
    let Some(roots) = roots else {
        return Ok(real);
    };
    if roots.iter().any(|root| real.starts_with(root)) {
        return Ok(real);
    }
    let through = if real != normalize_lexically(path) {
        format!(" (it resolves to {} through a symlink)", real.display())
    } else {
        String::new()
    };
    Err(kind.error(format!(
        "{noun} path {path}{through} is outside this agent's {noun} roots ({roots}); the agent reads {noun}s only under {flag} DIR (repeatable){remote}",
        noun = kind.noun(),
        path = path.display(),
        roots = list(roots),
        flag = kind.flag(),
        remote = kind.remote_hint(),
    )))
}

/// `path` made absolute without resolving symlinks, to tell whether one was followed.
fn normalize_lexically(path: &Path) -> PathBuf {
    let absolute = if path.is_absolute() {
        path.to_owned()
    } else {
        std::env::current_dir().unwrap_or_default().join(path)
    };
    let mut out = PathBuf::new();
    for part in absolute.components() {
        match part {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

fn regular_file_len(kind: RootKind, path: &Path, limit: u64) -> Result<u64, ModelError> {
    let meta = std::fs::metadata(path)
        .map_err(|e| kind.error(format!("cannot read {}: {e}", path.display())))?;
    if !meta.is_file() {
        return Err(kind.error(format!("{} is not a regular file", path.display())));
    }
    if meta.len() > limit {
        return Err(kind.error(format!(
            "{} holds {} bytes, more than the {limit} a {} file may",
            path.display(),
            meta.len(),
            kind.noun()
        )));
    }
    Ok(meta.len())
}

fn read_limited(kind: RootKind, path: &Path, limit: u64) -> Result<Vec<u8>, ModelError> {
    let len = regular_file_len(kind, path, limit)?;
    let file = std::fs::File::open(path)
        .map_err(|e| kind.error(format!("cannot read {}: {e}", path.display())))?;
    let mut bytes = Vec::with_capacity(len as usize);
    // `take` holds the limit even if the file grows after the check.
    file.take(limit)
        .read_to_end(&mut bytes)
        .map_err(|e| kind.error(format!("cannot read {}: {e}", path.display())))?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_outside_and_symlinks_out_are_refused() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("config.json"), "{}").unwrap();
        std::fs::write(outside.path().join("secret"), "x").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), root.path().join("link"))
            .unwrap();
        let roots = FileRoots::restricted(&[root.path().to_owned()], &[]);

        assert!(
            roots
                .check_model_path(&root.path().join("config.json"))
                .is_ok()
        );
        let refused = roots
            .check_model_path(&outside.path().join("secret"))
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains("outside this agent's model roots"),
            "{refused}"
        );
        assert!(refused.contains("--model-root"), "{refused}");
        let refused = roots
            .check_model_path(&root.path().join("link"))
            .unwrap_err()
            .to_string();
        assert!(refused.contains("through a symlink"), "{refused}");
        let dotdot = root
            .path()
            .join("..")
            .join(outside.path().file_name().unwrap());
        assert!(roots.check_model_path(&dotdot).is_err());
        let refused = roots
            .check_data_path(&root.path().join("config.json"))
            .unwrap_err()
            .to_string();
        assert!(refused.contains("none given"), "{refused}");
        assert!(
            FileRoots::unrestricted()
                .check_model_path(&outside.path().join("secret"))
                .is_ok()
        );
    }

    #[test]
    fn reads_are_bounded_and_only_regular_files() {
        let root = tempfile::tempdir().unwrap();
        let file = root.path().join("big.json");
        std::fs::write(&file, vec![b' '; 100]).unwrap();
        let roots = FileRoots::restricted(&[root.path().to_owned()], &[root.path().to_owned()]);
        assert_eq!(roots.read_model_file(&file, 100).unwrap().len(), 100);
        let refused = roots.read_model_file(&file, 99).unwrap_err().to_string();
        assert!(refused.contains("more than the 99"), "{refused}");
        let refused = roots
            .read_data_file(root.path(), 1 << 20)
            .unwrap_err()
            .to_string();
        assert!(refused.contains("not a regular file"), "{refused}");
        let devices = FileRoots::restricted(&[PathBuf::from("/dev")], &[]);
        let refused = devices
            .read_model_file(Path::new("/dev/zero"), 1 << 20)
            .unwrap_err()
            .to_string();
        assert!(refused.contains("not a regular file"), "{refused}");
    }
}
