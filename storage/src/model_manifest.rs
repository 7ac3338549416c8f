//! A model's manifest, `resident-model.json`: every file of a model directory with its size
//! and SHA-256.
//!
//! `resident model push` writes it beside the files at an S3 prefix, last, so a manifest
//! that exists describes a complete upload. Agents check every downloaded byte against it
//! and keep a copy in their model cache. Its own digest ([`ModelManifest::digest`]) names the
//! model's content: the same files give the same digest wherever they are stored, so a job
//! pins its model with it and agents on EKS and on-prem provably load the same weights.

use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The manifest's file name, at the root of a model directory or prefix.
pub const MANIFEST_FILE: &str = "resident-model.json";

/// The format this code writes and reads.
pub const MANIFEST_FORMAT: &str = "resident-model/1";

/// The most files a model may have (sharded checkpoints have tens).
const MAX_FILES: usize = 4096;

/// Why a manifest could not be built, read or checked. Every message names the file.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// A file could not be read or written.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the system said.
        error: std::io::Error,
    },
    /// The manifest's JSON is malformed or breaks its rules (what is wrong is said).
    #[error("the model manifest is not valid: {0}")]
    Invalid(String),
    /// A file's size or digest is not the manifest's.
    #[error(
        "{path} does not match the model manifest: {what}; the copy is damaged or the model \
         changed while it was read"
    )]
    Mismatch {
        /// The file that differs.
        path: PathBuf,
        /// What differs: its size or its digest.
        what: String,
    },
}

/// One file of a model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestFile {
    /// Relative to the model's root, with `/` separators.
    pub path: String,
    /// Its size in bytes.
    pub size: u64,
    /// Lower-case hex.
    pub sha256: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
/// `resident-model.json`: every file of a model with its size and SHA-256, so that a copy
/// can be checked file by file and a model named by its content.
pub struct ModelManifest {
    /// The manifest's format, [`MANIFEST_FORMAT`].
    pub format: String,
    /// Sorted by path, each path once.
    pub files: Vec<ManifestFile>,
}

/// Size and hex SHA-256 of a reader's bytes.
pub fn sha256_of(reader: impl Read) -> std::io::Result<(u64, String)> {
    copy_hashing(reader, std::io::sink(), u64::MAX)
}

/// Copies `reader` into `writer` while hashing, in one pass; returns the size read and its
/// hex SHA-256. It stops after `limit + 1` bytes, so a source longer than `limit` shows as
/// too long without being read to its end.
pub fn copy_hashing(
    reader: impl Read,
    mut writer: impl Write,
    limit: u64,
) -> std::io::Result<(u64, String)> {
    let mut reader = reader.take(limit.saturating_add(1));
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let read = reader.read(&mut buffer)?;
        if read == 0 {
            return Ok((size, hex::encode(hasher.finalize())));
        }
        size += read as u64;
        hasher.update(&buffer[..read]);
        writer.write_all(&buffer[..read])?;
    }
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> ManifestError + '_ {
    move |error| ManifestError::Io {
        path: path.to_owned(),
        error,
    }
}

/// Whether a relative path from a manifest is safe to create under a directory: plain
/// names only, no `..`, no root, no backslashes, no hidden top-level cache entries.
fn check_relative_path(path: &str) -> Result<(), ManifestError> {
    let bad = |why: &str| ManifestError::Invalid(format!("file path `{path}` {why}"));
    if path.is_empty() || path.contains('\\') || path.contains('\0') {
        return Err(bad("is empty or holds a backslash or NUL"));
    }
    if path == MANIFEST_FILE {
        return Err(bad("is the manifest itself"));
    }
    for component in Path::new(path).components() {
        match component {
            Component::Normal(name) if !name.to_string_lossy().starts_with('.') => {}
            Component::Normal(_) => return Err(bad("has a hidden component")),
            _ => return Err(bad("is not a plain relative path")),
        }
    }
    Ok(())
}

impl ModelManifest {
    /// Hashes every regular file under `dir` (hidden entries and the manifest itself left
    /// out). Symbolic links are followed, as a Hugging Face snapshot links into its blobs.
    pub fn of_dir(dir: &Path) -> Result<Self, ManifestError> {
        let mut files = Vec::new();
        let mut pending = vec![PathBuf::new()];
        while let Some(relative) = pending.pop() {
            let here = dir.join(&relative);
            for entry in std::fs::read_dir(&here).map_err(io_error(&here))? {
                let entry = entry.map_err(io_error(&here))?;
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with('.')
                    || (relative.as_os_str().is_empty() && name == MANIFEST_FILE)
                {
                    continue;
                }
                let path = entry.path();
                let meta = std::fs::metadata(&path).map_err(io_error(&path))?;
                let child = relative.join(&name);
                if meta.is_dir() {
                    pending.push(child);
                } else if meta.is_file() {
                    let file = std::fs::File::open(&path).map_err(io_error(&path))?;
                    let (size, sha256) = sha256_of(file).map_err(io_error(&path))?;
                    let path = child
                        .components()
                        .map(|c| c.as_os_str().to_string_lossy())
                        .collect::<Vec<_>>()
                        .join("/");
                    files.push(ManifestFile { path, size, sha256 });
                }
            }
        }
        if files.is_empty() {
            return Err(ManifestError::Invalid(format!(
                "{} holds no files",
                dir.display()
            )));
        }
        files.sort_by(|a, b| a.path.cmp(&b.path));
        let manifest = Self {
            format: MANIFEST_FORMAT.into(),
            files,
        };
        manifest.check()?;
        Ok(manifest)
    }

    /// Parses and checks a manifest read from storage.
    pub fn parse(bytes: &[u8]) -> Result<Self, ManifestError> {
        let manifest: Self =
            serde_json::from_slice(bytes).map_err(|e| ManifestError::Invalid(e.to_string()))?;
        manifest.check()?;
        Ok(manifest)
    }

    fn check(&self) -> Result<(), ManifestError> {
        if self.format != MANIFEST_FORMAT {
            return Err(ManifestError::Invalid(format!(
                "format `{}` is not `{MANIFEST_FORMAT}`; upgrade resident",
                self.format
            )));
        }
        if self.files.is_empty() || self.files.len() > MAX_FILES {
            return Err(ManifestError::Invalid(format!(
                "it lists {} files (1 to {MAX_FILES} allowed)",
                self.files.len()
            )));
        }
        for pair in self.files.windows(2) {
            if pair[0].path >= pair[1].path {
                return Err(ManifestError::Invalid(format!(
                    "files are not sorted and unique at `{}`",
                    pair[1].path
                )));
            }
        }
        for file in &self.files {
            check_relative_path(&file.path)?;
            if file.sha256.len() != 64 || !file.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(ManifestError::Invalid(format!(
                    "`{}` has no hex SHA-256",
                    file.path
                )));
            }
        }
        Ok(())
    }

    /// The manifest as stored: pretty JSON, so a person can read it.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).expect("a manifest serializes")
    }

    /// Hex SHA-256 over every file's path, size and digest: the model's content identity.
    pub fn digest(&self) -> String {
        let mut hasher = Sha256::new();
        hasher.update(self.format.as_bytes());
        for file in &self.files {
            hasher.update((file.path.len() as u64).to_le_bytes());
            hasher.update(file.path.as_bytes());
            hasher.update(file.size.to_le_bytes());
            hasher.update(file.sha256.as_bytes());
        }
        hex::encode(hasher.finalize())
    }

    /// The model's size: all its files' bytes.
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }

    /// Checks one file's size and digest.
    pub fn check_file(&self, file: &ManifestFile, path: &Path) -> Result<(), ManifestError> {
        let opened = std::fs::File::open(path).map_err(io_error(path))?;
        let (size, sha256) = sha256_of(opened).map_err(io_error(path))?;
        file_matches(file, path, size, &sha256)
    }

    /// Checks every listed file under `dir` (files the manifest does not list are ignored).
    pub fn verify_dir(&self, dir: &Path) -> Result<(), ManifestError> {
        self.files
            .iter()
            .try_for_each(|file| self.check_file(file, &dir.join(&file.path)))
    }
}

/// Whether bytes read (their size and digest) are the manifest's file.
pub fn file_matches(
    file: &ManifestFile,
    path: &Path,
    size: u64,
    sha256: &str,
) -> Result<(), ManifestError> {
    let mismatch = |what: String| ManifestError::Mismatch {
        path: path.to_owned(),
        what,
    };
    if size != file.size {
        return Err(mismatch(format!(
            "{size} bytes, the manifest says {}",
            file.size
        )));
    }
    if sha256 != file.sha256 {
        return Err(mismatch(format!(
            "sha256 {sha256}, the manifest says {}",
            file.sha256
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model_dir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), b"{}").unwrap();
        std::fs::write(dir.path().join("model.safetensors"), vec![7u8; 3 << 20]).unwrap();
        std::fs::create_dir(dir.path().join("1_Pooling")).unwrap();
        std::fs::write(dir.path().join("1_Pooling/config.json"), b"{\"m\":1}").unwrap();
        std::fs::create_dir(dir.path().join(".cache")).unwrap();
        std::fs::write(dir.path().join(".cache/x"), b"ignored").unwrap();
        dir
    }

    #[test]
    fn lists_every_file_sorted_and_round_trips() {
        let dir = model_dir();
        let manifest = ModelManifest::of_dir(dir.path()).unwrap();
        let paths: Vec<&str> = manifest.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(
            paths,
            ["1_Pooling/config.json", "config.json", "model.safetensors"]
        );
        assert_eq!(manifest.total_bytes(), 2 + 7 + (3 << 20));
        assert_eq!(
            manifest.files[1].sha256,
            "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
        let parsed = ModelManifest::parse(&manifest.to_json()).unwrap();
        assert_eq!(parsed, manifest);
        assert_eq!(parsed.digest(), manifest.digest());
        manifest.verify_dir(dir.path()).unwrap();
    }

    #[test]
    fn the_digest_follows_content_not_location() {
        let one = model_dir();
        let two = model_dir();
        std::fs::write(one.path().join(MANIFEST_FILE), b"not part of the content").unwrap();
        let first = ModelManifest::of_dir(one.path()).unwrap();
        assert_eq!(
            first.digest(),
            ModelManifest::of_dir(two.path()).unwrap().digest()
        );
        std::fs::write(two.path().join("config.json"), b"{ }").unwrap();
        assert_ne!(
            first.digest(),
            ModelManifest::of_dir(two.path()).unwrap().digest()
        );
    }

    #[test]
    fn a_changed_file_fails_verification_with_its_name() {
        let dir = model_dir();
        let manifest = ModelManifest::of_dir(dir.path()).unwrap();
        let mut weights = std::fs::read(dir.path().join("model.safetensors")).unwrap();
        weights[100] ^= 1;
        std::fs::write(dir.path().join("model.safetensors"), &weights).unwrap();
        let error = manifest.verify_dir(dir.path()).unwrap_err().to_string();
        assert!(
            error.contains("model.safetensors does not match"),
            "{error}"
        );
        assert!(error.contains("sha256"), "{error}");
        std::fs::remove_file(dir.path().join("config.json")).unwrap();
        let error = manifest.verify_dir(dir.path()).unwrap_err().to_string();
        assert!(error.contains("config.json"), "{error}");
    }

    #[test]
    fn unsafe_or_malformed_manifests_are_refused() {
        let file = |path: &str| ManifestFile {
            path: path.into(),
            size: 1,
            sha256: "a".repeat(64),
        };
        let manifest = |files: Vec<ManifestFile>| ModelManifest {
            format: MANIFEST_FORMAT.into(),
            files,
        };
        for path in [
            "../etc/passwd",
            "/abs",
            "a/../../b",
            ".git/config",
            "a\\b",
            "",
        ] {
            let json = manifest(vec![file(path)]).to_json();
            let error = ModelManifest::parse(&json).unwrap_err().to_string();
            assert!(error.contains("file path"), "{path}: {error}");
        }
        let unsorted = manifest(vec![file("b"), file("a")]).to_json();
        assert!(ModelManifest::parse(&unsorted).is_err());
        let mut short = manifest(vec![file("a")]);
        short.files[0].sha256 = "abc".into();
        assert!(ModelManifest::parse(&short.to_json()).is_err());
        let mut future = manifest(vec![file("a")]);
        future.format = "resident-model/9".into();
        let error = ModelManifest::parse(&future.to_json())
            .unwrap_err()
            .to_string();
        assert!(error.contains("upgrade resident"), "{error}");
        assert!(ModelManifest::parse(b"{}").is_err());
    }
}
