//! Models come to the agent. A pool names its model as a local directory, an
//! `s3://bucket/prefix/` (which holds a `resident-model.json` manifest, as
//! `resident model push` writes it) or a Hugging Face id at a revision. The agent fetches a
//! remote model once into its `--model-cache`, checks every file against the manifest's
//! SHA-256 digests, and its actors load from there.
//!
//! One download per node: the actors that start together wait on a lock file per model
//! (`.locks/`, an OS file lock, so two agent processes sharing a cache wait too), a download
//! goes to a temporary directory renamed into place only when every file checked, and a
//! model already in the cache is re-checked once per agent process before its first use.
//! S3 models are kept by their manifest digest (`sha256-<digest>/`), so the same files under
//! two prefixes are one copy, and a pinned model loads from the cache without asking S3.
//!
//! With `max_bytes` set (`--model-cache-max-gib`), each download is followed by eviction of
//! the least recently used models until the cache fits, never one a live actor has loaded
//! ([`eviction`]).

pub mod eviction;
mod hub;
mod sources;

use std::collections::HashSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use resident_models::roots::MAX_DATASET_BYTES;
use resident_storage::model_manifest::{MANIFEST_FILE, ManifestFile, ModelManifest, file_matches};
use resident_storage::model_manifest::{copy_hashing, sha256_of};
use resident_storage::{Location, S3Client, S3Options, key_under};

use crate::error::BackendError;
pub use resident_storage::model_source::ModelSource;

/// Where and how an agent keeps models.
#[derive(Clone, Debug)]
pub struct ModelCacheConfig {
    /// The cache's directory.
    pub dir: PathBuf,
    /// How to reach S3 for `s3://` models (endpoint, credentials).
    pub s3: S3Options,
    /// The most bytes of models kept; `None`: no limit.
    pub max_bytes: Option<u64>,
}

impl Default for ModelCacheConfig {
    fn default() -> Self {
        Self {
            dir: default_model_cache_dir(),
            s3: S3Options::default(),
            max_bytes: None,
        }
    }
}

/// `$XDG_CACHE_HOME/resident/models`, else `~/.cache/resident/models`, else under the
/// system's temporary directory.
pub fn default_model_cache_dir() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("resident/models")
}

/// The agent's model cache, shared by its actor threads.
pub struct ModelCache {
    config: ModelCacheConfig,
    /// The agent's runtime, for S3 calls (none where the cache was made outside one).
    runtime: Option<tokio::runtime::Handle>,
    s3: OnceLock<S3Client>,
    /// Cache entries checked against their manifest by this process.
    verified: Mutex<HashSet<PathBuf>>,
    downloads: AtomicU64,
    /// Entries loaded by live actors: never evicted.
    in_use: eviction::InUse,
}

fn load_error(message: impl Into<String>) -> BackendError {
    BackendError::Load(message.into())
}

impl ModelCache {
    /// Made inside the agent's tokio runtime, S3 calls run on it; made outside one, the
    /// cache serves local and hub models only.
    pub fn new(config: ModelCacheConfig) -> Self {
        Self {
            config,
            runtime: tokio::runtime::Handle::try_current().ok(),
            s3: OnceLock::new(),
            verified: Mutex::new(HashSet::new()),
            downloads: AtomicU64::new(0),
            in_use: eviction::InUse::default(),
        }
    }

    /// Marks the cache entry holding `model_dir` (from [`Self::local_dir`]) as loaded by an
    /// actor until the guard is dropped, and as used now; `None` for a model outside the
    /// cache (a local directory).
    pub fn hold(&self, model_dir: &str) -> Option<eviction::ModelInUse> {
        let entry = eviction::entry_of(&self.config.dir, Path::new(model_dir))?;
        eviction::touch(&entry);
        Some(self.in_use.hold(entry))
    }

    /// After a download into `fetched`: removes the least recently used models not in use
    /// until the cache fits its limit (if it has one).
    fn evict_beyond_limit(&self, fetched: &Path) {
        let Some(max_bytes) = self.config.max_bytes else {
            return;
        };
        let keep = eviction::entry_of(&self.config.dir, fetched).unwrap_or_default();
        eviction::touch(&keep);
        let entries = eviction::list_entries(&self.config.dir, &self.in_use);
        let mut total: u64 = entries.iter().map(|e| e.bytes).sum();
        for dir in eviction::entries_to_evict(&entries, max_bytes, &keep) {
            let name = dir.file_name().unwrap_or_default().to_string_lossy();
            // Another agent sharing the cache may be fetching or checking it: leave it.
            let Some(_lock) = self.try_lock(&name) else {
                continue;
            };
            let bytes = entries.iter().find(|e| e.dir == dir).map_or(0, |e| e.bytes);
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => {
                    total = total.saturating_sub(bytes);
                    self.verified
                        .lock()
                        .expect("verified set")
                        .retain(|checked| !checked.starts_with(&dir));
                    tracing::info!(dir = %dir.display(), bytes, "model evicted from the cache (least recently used)");
                }
                Err(error) => {
                    tracing::warn!(%error, dir = %dir.display(), "cannot evict a cached model")
                }
            }
        }
        if total > max_bytes {
            tracing::warn!(
                total_bytes = total,
                max_bytes,
                "the model cache stays over --model-cache-max-gib: the rest is loaded by \
                 actors or was just fetched; raise the limit"
            );
        }
    }

    /// The cache's directory.
    pub fn dir(&self) -> &Path {
        &self.config.dir
    }

    /// Models this process downloaded (not found in the cache).
    pub fn downloads(&self) -> u64 {
        self.downloads.load(Ordering::Relaxed)
    }

    fn runtime(&self) -> Result<&tokio::runtime::Handle, BackendError> {
        self.runtime
            .as_ref()
            .ok_or_else(|| load_error("this model cache was made outside a runtime: no S3"))
    }

    fn s3_client(&self) -> Result<&S3Client, BackendError> {
        let runtime = self.runtime()?;
        Ok(self
            .s3
            .get_or_init(|| runtime.block_on(S3Client::connect(&self.config.s3))))
    }

    /// The cache's lock for `name` if no one holds it now.
    fn try_lock(&self, name: &str) -> Option<File> {
        let path = self.config.dir.join(".locks").join(format!("{name}.lock"));
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .ok()?;
        file.try_lock().ok()?;
        Some(file)
    }

    /// Holds the cache's lock for `name` until dropped (the OS releases it with the file).
    fn lock(&self, name: &str) -> Result<File, BackendError> {
        let locks = self.config.dir.join(".locks");
        std::fs::create_dir_all(&locks)
            .map_err(|e| load_error(format!("model cache {}: {e}", locks.display())))?;
        let path = locks.join(format!("{name}.lock"));
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| load_error(format!("{}: {e}", path.display())))?;
        file.lock()
            .map_err(|e| load_error(format!("cannot lock {}: {e}", path.display())))?;
        Ok(file)
    }

    /// Whether `dir` holds a complete entry whose manifest has `digest`; checks its files
    /// once per process. A damaged entry is removed so the caller fetches it again.
    fn usable_entry(&self, dir: &Path, digest: &str) -> bool {
        let Ok(bytes) = std::fs::read(dir.join(MANIFEST_FILE)) else {
            return false;
        };
        let manifest = match ModelManifest::parse(&bytes) {
            Ok(m) if m.digest() == digest => m,
            _ => {
                tracing::warn!(dir = %dir.display(), "model cache entry has a wrong manifest; fetching again");
                let _ = std::fs::remove_dir_all(dir);
                return false;
            }
        };
        if self.verified.lock().expect("verified set").contains(dir) {
            return true;
        }
        let started = Instant::now();
        match manifest.verify_dir(dir) {
            Ok(()) => {
                tracing::info!(dir = %dir.display(), seconds = started.elapsed().as_secs_f64(), "model cache entry checked");
                self.verified
                    .lock()
                    .expect("verified set")
                    .insert(dir.to_owned());
                true
            }
            Err(error) => {
                tracing::warn!(%error, "model cache entry is damaged; fetching again");
                let _ = std::fs::remove_dir_all(dir);
                false
            }
        }
    }

    /// Fetches an S3 model into `sha256-<digest>/` (or finds it there).
    fn fetch_s3(
        &self,
        bucket: &str,
        prefix: &str,
        pin: Option<&str>,
    ) -> Result<PathBuf, BackendError> {
        let source = format!("s3://{bucket}/{prefix}");
        let pin = pin.filter(|p| !p.is_empty());
        if let Some(pin) = pin
            && (pin.len() != 64 || !pin.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            // It names a directory of the cache: nothing but a digest may.
            return Err(BackendError::InvalidConfig(format!(
                "model_revision `{pin}` of an s3:// model must be its manifest's 64-hex digest"
            )));
        }
        if let Some(pin) = pin {
            let dir = self.entry_dir(pin);
            let _lock = self.lock(&format!("sha256-{pin}"))?;
            if self.usable_entry(&dir, pin) {
                return Ok(dir);
            }
        }
        let manifest_key = key_under(prefix, MANIFEST_FILE);
        let bytes = self
            .runtime()?
            .block_on(self.s3_client()?.get(bucket, &manifest_key))
            .map_err(load_error)?
            .ok_or_else(|| {
                load_error(format!(
                    "{source} has no {MANIFEST_FILE}; upload the model with \
                     `resident model push DIR {source}/`, which writes it after the files"
                ))
            })?;
        let manifest = ModelManifest::parse(&bytes)
            .map_err(|e| load_error(format!("s3://{bucket}/{manifest_key}: {e}")))?;
        let digest = manifest.digest();
        if let Some(pin) = pin.filter(|p| !p.is_empty() && *p != digest) {
            return Err(load_error(format!(
                "the model at {source} changed since the job pinned it (manifest digest \
                 {digest}, the job wants {pin}); restore it or start a new job"
            )));
        }
        let dir = self.entry_dir(&digest);
        let _lock = self.lock(&format!("sha256-{digest}"))?;
        if self.usable_entry(&dir, &digest) {
            return Ok(dir);
        }
        let started = Instant::now();
        tracing::info!(%source, bytes = manifest.total_bytes(), files = manifest.files.len(), "downloading model");
        let client = self.s3_client()?;
        self.install(&dir, &manifest, |file, partial| {
            let key = key_under(prefix, &file.path);
            let mut body = client.open_blocking(bucket, &key)?;
            copy_checked(&mut body, file, partial).map_err(|e| format!("s3://{bucket}/{key}: {e}"))
        })?;
        self.downloads.fetch_add(1, Ordering::Relaxed);
        tracing::info!(%source, dir = %dir.display(), seconds = started.elapsed().as_secs_f64(), "model downloaded and checked");
        self.evict_beyond_limit(&dir);
        Ok(dir)
    }

    /// The local copy of a sweep's `s3://bucket/key` dataset, whose bytes must have
    /// `sha256`: fetched once per node into `datasets/`, a data root of the agent.
    pub fn local_dataset(&self, uri: &str, sha256: &str) -> Result<PathBuf, BackendError> {
        let bad = |why: String| BackendError::BadPayload(why);
        let Ok(Location::S3 {
            bucket,
            prefix: key,
        }) = Location::parse(uri)
        else {
            return Err(bad(format!("{uri} is not an s3://bucket/key")));
        };
        if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad(format!(
                "the trial names {uri} without the SHA-256 of its bytes; upgrade the client"
            )));
        }
        let path = self.datasets_dir().join(format!("{sha256}.dataset"));
        let _lock = self.lock(&format!("dataset-{sha256}"))?;
        if self.verified.lock().expect("verified set").contains(&path) {
            return Ok(path);
        }
        let mismatch = |digest: &str| {
            format!(
                "{uri}: sha256 {digest}, the sweep says {sha256}; the object changed since \
                 the sweep wrote it"
            )
        };
        let cached = path.is_file() && file_sha256(&path).is_ok_and(|(_, d)| d == sha256);
        if !cached {
            let started = Instant::now();
            let partial = path.with_extension(format!("partial-{}", std::process::id()));
            let fetched = (|| {
                std::fs::create_dir_all(self.datasets_dir())
                    .map_err(|e| format!("{}: {e}", self.datasets_dir().display()))?;
                let body = self
                    .s3_client()
                    .map_err(|e| e.to_string())?
                    .open_blocking(&bucket, &key)?;
                let mut out =
                    File::create(&partial).map_err(|e| format!("{}: {e}", partial.display()))?;
                let (_, digest) = copy_hashing(body, &mut out, MAX_DATASET_BYTES)
                    .map_err(|e| format!("{uri}: {e}"))?;
                if digest != sha256 {
                    return Err(mismatch(&digest));
                }
                std::fs::rename(&partial, &path).map_err(|e| format!("{}: {e}", path.display()))
            })();
            if let Err(error) = fetched {
                let _ = std::fs::remove_file(&partial);
                return Err(load_error(error));
            }
            tracing::info!(%uri, seconds = started.elapsed().as_secs_f64(), "sweep dataset downloaded and checked");
        }
        self.verified
            .lock()
            .expect("verified set")
            .insert(path.clone());
        Ok(path)
    }

    /// Where fetched sweep datasets are kept (the agent makes it a data root).
    pub fn datasets_dir(&self) -> PathBuf {
        self.config.dir.join("datasets")
    }

    fn entry_dir(&self, digest: &str) -> PathBuf {
        self.config.dir.join(format!("sha256-{digest}"))
    }

    /// Fills a temporary directory file by file (`fetch` writes one file and checks it),
    /// writes the manifest last and renames the directory to `dir`.
    fn install(
        &self,
        dir: &Path,
        manifest: &ModelManifest,
        fetch: impl Fn(&ManifestFile, &Path) -> Result<(), String>,
    ) -> Result<(), BackendError> {
        let partial = self.config.dir.join(format!(
            ".partial-{}-{}",
            std::process::id(),
            dir.file_name().unwrap_or_default().to_string_lossy()
        ));
        let _ = std::fs::remove_dir_all(&partial);
        let result = (|| {
            for file in &manifest.files {
                let path = partial.join(&file.path);
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent)
                        .map_err(|e| format!("{}: {e}", parent.display()))?;
                }
                fetch(file, &path)?;
            }
            std::fs::write(partial.join(MANIFEST_FILE), manifest.to_json())
                .map_err(|e| format!("{}: {e}", partial.display()))?;
            let _ = std::fs::remove_dir_all(dir);
            std::fs::rename(&partial, dir).map_err(|e| format!("{}: {e}", dir.display()))
        })();
        if let Err(error) = result {
            let _ = std::fs::remove_dir_all(&partial);
            return Err(load_error(error));
        }
        self.verified
            .lock()
            .expect("verified set")
            .insert(dir.to_owned());
        Ok(())
    }
}

/// Copies `reader` into a new file at `path`, hashing as it goes, and checks the result
/// against the manifest's entry before it counts.
fn copy_checked(
    reader: &mut dyn std::io::Read,
    file: &ManifestFile,
    path: &Path,
) -> Result<(), String> {
    let mut out = File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let (size, digest) = copy_hashing(reader, &mut out, file.size).map_err(|e| e.to_string())?;
    out.sync_all()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    file_matches(file, Path::new(&file.path), size, &digest).map_err(|e| e.to_string())
}

/// Size and hex SHA-256 of a file.
fn file_sha256(path: &Path) -> Result<(u64, String), String> {
    let file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    sha256_of(file).map_err(|e| format!("{}: {e}", path.display()))
}

impl std::fmt::Debug for ModelCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelCache")
            .field("dir", &self.config.dir)
            .field("downloads", &self.downloads())
            .finish()
    }
}
