//! Keeping the model cache within `--model-cache-max-gib`: after each download, the least
//! recently used models go until the cache fits, never one that a live actor has loaded and
//! never the one just fetched. The choice is the pure [`entries_to_evict`]; the rest lists
//! the cache's entries and removes the chosen ones under their lock.
//!
//! An entry is one model: `sha256-<digest>/` (from S3) or `hf/models--<org>--<name>/` (from
//! the Hugging Face hub). Its last use is the modification time of its `.last-used` marker,
//! touched every time an actor is handed the model.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// The marker whose modification time says when an entry was last handed to an actor.
pub const LAST_USED_MARKER: &str = ".last-used";

/// One model in the cache, as the policy sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct CachedModel {
    /// Its directory in the cache.
    pub dir: PathBuf,
    /// Its size on disk.
    pub bytes: u64,
    /// When an actor was last handed it.
    pub last_used: SystemTime,
    /// Loaded by a live actor of this agent.
    pub in_use: bool,
}

/// The entries to remove, least recently used first, so that the cache holds at most
/// `max_bytes`; never one in use or `keep`. When those alone exceed the limit, every other
/// entry goes and the cache stays over it (the caller says so).
pub fn entries_to_evict(models: &[CachedModel], max_bytes: u64, keep: &Path) -> Vec<PathBuf> {
    let mut total: u64 = models.iter().map(|m| m.bytes).sum();
    let mut candidates: Vec<&CachedModel> = models
        .iter()
        .filter(|m| !m.in_use && m.dir != keep)
        .collect();
    candidates.sort_by(|a, b| (a.last_used, &a.dir).cmp(&(b.last_used, &b.dir)));
    let mut evict = Vec::new();
    for model in candidates {
        if total <= max_bytes {
            break;
        }
        total = total.saturating_sub(model.bytes);
        evict.push(model.dir.clone());
    }
    evict
}

/// The models live actors have loaded, by entry directory, counted: an entry is in use
/// while any [`ModelInUse`] for it lives.
#[derive(Clone, Debug, Default)]
pub struct InUse(Arc<Mutex<HashMap<PathBuf, usize>>>);

impl InUse {
    /// Marks the entry holding `model_dir` in use until the guard is dropped.
    pub fn hold(&self, entry: PathBuf) -> ModelInUse {
        *self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(entry.clone())
            .or_default() += 1;
        ModelInUse {
            in_use: self.clone(),
            entry,
        }
    }

    /// Whether an actor holds `entry` now.
    pub fn contains(&self, entry: &Path) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(entry)
    }
}

/// Held by an actor for as long as it keeps its model loaded: the entry is not evicted.
#[derive(Debug)]
pub struct ModelInUse {
    in_use: InUse,
    entry: PathBuf,
}

impl Drop for ModelInUse {
    fn drop(&mut self) {
        let mut counts = self.in_use.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = counts.get_mut(&self.entry) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.entry);
            }
        }
    }
}

/// The cache entry (`sha256-*` or `hf/models--*`) a model directory lies in, if any.
pub fn entry_of(cache_dir: &Path, model_dir: &Path) -> Option<PathBuf> {
    let relative = model_dir.strip_prefix(cache_dir).ok()?;
    let mut parts = relative.components();
    let first = parts.next()?.as_os_str().to_str()?;
    if first.starts_with("sha256-") {
        return Some(cache_dir.join(first));
    }
    if first == "hf" {
        let second = parts.next()?.as_os_str().to_str()?;
        return second
            .starts_with("models--")
            .then(|| cache_dir.join("hf").join(second));
    }
    None
}

/// Every model entry of the cache, with its size and last use.
pub fn list_entries(cache_dir: &Path, in_use: &InUse) -> Vec<CachedModel> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    let children = |dir: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(dir)
            .map(|entries| entries.flatten().map(|e| e.path()).collect())
            .unwrap_or_default()
    };
    let named = |path: &Path, prefix: &str| {
        path.is_dir()
            && path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix))
    };
    dirs.extend(
        children(cache_dir)
            .into_iter()
            .filter(|p| named(p, "sha256-")),
    );
    dirs.extend(
        children(&cache_dir.join("hf"))
            .into_iter()
            .filter(|p| named(p, "models--")),
    );
    dirs.into_iter()
        .map(|dir| CachedModel {
            bytes: bytes_under(&dir),
            last_used: last_used(&dir),
            in_use: in_use.contains(&dir),
            dir,
        })
        .collect()
}

/// When the entry was last handed to an actor (its marker), else when it was written.
fn last_used(entry: &Path) -> SystemTime {
    std::fs::metadata(entry.join(LAST_USED_MARKER))
        .or_else(|_| std::fs::metadata(entry))
        .and_then(|m| m.modified())
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

/// Records that the entry was just handed to an actor.
pub fn touch(entry: &Path) {
    let marker = entry.join(LAST_USED_MARKER);
    let touched = std::fs::File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&marker)
        .and_then(|file| file.set_modified(SystemTime::now()));
    if let Err(error) = touched {
        tracing::debug!(%error, marker = %marker.display(), "cannot mark a model's last use");
    }
}

/// Bytes of the files under `dir` (symlinks not followed: a hub entry's snapshot links point
/// into its own `blobs/`, counted once there).
fn bytes_under(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_owned()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                stack.push(entry.path());
            } else if kind.is_file() {
                total += entry.metadata().map_or(0, |m| m.len());
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn model(name: &str, gib: u64, age_s: u64, in_use: bool) -> CachedModel {
        CachedModel {
            dir: PathBuf::from(name),
            bytes: gib << 30,
            last_used: SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 - age_s),
            in_use,
        }
    }

    #[test]
    fn the_least_recently_used_go_first_until_the_cache_fits() {
        let models = [
            model("new", 4, 10, false),
            model("old", 4, 1000, false),
            model("middle", 4, 100, false),
        ];
        assert_eq!(
            entries_to_evict(&models, 8 << 30, Path::new("x")),
            [PathBuf::from("old")]
        );
        assert_eq!(
            entries_to_evict(&models, 4 << 30, Path::new("x")),
            [PathBuf::from("old"), PathBuf::from("middle")]
        );
        assert!(entries_to_evict(&models, 12 << 30, Path::new("x")).is_empty());
    }

    #[test]
    fn a_loaded_model_and_the_one_just_fetched_are_never_evicted() {
        let models = [
            model("loaded", 8, 5000, true),
            model("fetched", 8, 0, false),
            model("idle", 1, 10, false),
        ];
        // Over the limit whatever goes: only the idle one can.
        assert_eq!(
            entries_to_evict(&models, 4 << 30, Path::new("fetched")),
            [PathBuf::from("idle")]
        );
    }

    #[test]
    fn guards_mark_an_entry_in_use_until_the_last_is_dropped() {
        let in_use = InUse::default();
        let entry = PathBuf::from("/cache/sha256-ab");
        let first = in_use.hold(entry.clone());
        let second = in_use.hold(entry.clone());
        drop(first);
        assert!(in_use.contains(&entry));
        drop(second);
        assert!(!in_use.contains(&entry));
    }

    #[test]
    fn entries_are_found_by_their_kind_and_sized_on_disk() {
        let cache = tempfile::tempdir().unwrap();
        let s3 = cache.path().join("sha256-aa");
        let hub = cache.path().join("hf/models--org--name/snapshots/rev");
        std::fs::create_dir_all(&s3).unwrap();
        std::fs::create_dir_all(&hub).unwrap();
        std::fs::create_dir_all(cache.path().join(".locks")).unwrap();
        std::fs::write(s3.join("model.safetensors"), vec![0u8; 1000]).unwrap();
        std::fs::write(hub.join("config.json"), vec![0u8; 10]).unwrap();
        assert_eq!(entry_of(cache.path(), &s3), Some(s3.clone()));
        assert_eq!(
            entry_of(cache.path(), &hub),
            Some(cache.path().join("hf/models--org--name"))
        );
        assert_eq!(entry_of(cache.path(), Path::new("/elsewhere/model")), None);
        let in_use = InUse::default();
        let _held = in_use.hold(s3.clone());
        let mut listed = list_entries(cache.path(), &in_use);
        listed.sort_by(|a, b| a.dir.cmp(&b.dir));
        let summary: Vec<(PathBuf, u64, bool)> = listed
            .iter()
            .map(|m| (m.dir.clone(), m.bytes, m.in_use))
            .collect();
        assert_eq!(
            summary,
            [
                (cache.path().join("hf/models--org--name"), 10, false),
                (s3.clone(), 1000, true),
            ]
        );
        // A use moves the entry's last use forward.
        let before = last_used(&s3);
        std::thread::sleep(Duration::from_millis(20));
        touch(&s3);
        assert!(last_used(&s3) > before);
    }
}
