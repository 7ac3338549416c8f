//! Hugging Face models: found in a hub cache on the node (`HF_HUB_CACHE`, `HF_HOME` or
//! `~/.cache/huggingface`, then the model cache's own `hf/`), else downloaded through the
//! `hf-hub` crate into `hf/` at one commit. A branch or tag is resolved to its commit once
//! and every file comes from that commit; a job pins the commit so every agent loads the
//! same bytes. Only the files a sentence-transformers encoder needs are fetched (configs,
//! tokenizer, safetensors weights), not ONNX, OpenVINO or PyTorch copies.

use std::path::{Path, PathBuf};

use resident_storage::model_manifest::{MANIFEST_FILE, ModelManifest};

use resident_storage::model_source::{cached_hub_commit, hf_hub_cache_dir};

use super::{ModelCache, load_error};
use crate::error::BackendError;

/// The hub caches to look in, the node's own first.
fn hub_caches(cache: &ModelCache) -> Vec<PathBuf> {
    hf_hub_cache_dir()
        .into_iter()
        .chain([cache.dir().join("hf")])
        .collect()
}

/// The snapshot of `repo` at `revision` in a hub cache, if it is there.
fn cached_snapshot(hub: &Path, repo: &str, revision: &str) -> Option<PathBuf> {
    let commit = cached_hub_commit(hub, repo, revision)?;
    let snapshot = hub
        .join(format!("models--{}", repo.replace('/', "--")))
        .join("snapshots")
        .join(commit);
    snapshot.join("config.json").is_file().then_some(snapshot)
}

/// Whether a file of the repository is one an encoder loads.
#[cfg(any(feature = "hf-hub", test))]
pub(super) fn wanted(path: &str) -> bool {
    let loadable = [".json", ".safetensors", ".txt", ".model"]
        .iter()
        .any(|ext| path.ends_with(ext));
    match path.split_once('/') {
        None => loadable,
        // sentence-transformers' module folders: 1_Pooling/config.json, 2_Normalize/...
        Some((folder, rest)) => {
            folder
                .split_once('_')
                .is_some_and(|(n, _)| n.parse::<u32>().is_ok())
                && !rest.contains('/')
                && path.ends_with(".json")
        }
    }
}

pub(super) fn fetch(
    cache: &ModelCache,
    repo: &str,
    revision: &str,
) -> Result<PathBuf, BackendError> {
    let ours = cache.dir().join("hf");
    for hub in hub_caches(cache) {
        if let Some(snapshot) = cached_snapshot(&hub, repo, revision) {
            if hub != ours {
                return Ok(snapshot);
            }
            let _lock = cache.lock(&lock_name(repo, revision))?;
            if checked(cache, &snapshot) {
                return Ok(snapshot);
            }
        }
    }
    let _lock = cache.lock(&lock_name(repo, revision))?;
    if let Some(snapshot) = cached_snapshot(&ours, repo, revision)
        && checked(cache, &snapshot)
    {
        return Ok(snapshot);
    }
    let snapshot = download(cache, repo, revision)?;
    cache.evict_beyond_limit(&snapshot);
    Ok(snapshot)
}

fn lock_name(repo: &str, revision: &str) -> String {
    format!(
        "hf-{}-{}",
        repo.replace('/', "--"),
        revision.replace('/', "--")
    )
}

/// Whether a snapshot we downloaded still matches the manifest written beside it.
fn checked(cache: &ModelCache, snapshot: &Path) -> bool {
    let digest = std::fs::read(snapshot.join(MANIFEST_FILE))
        .ok()
        .and_then(|bytes| ModelManifest::parse(&bytes).ok())
        .map(|m| m.digest());
    digest.is_some_and(|digest: String| cache.usable_entry(snapshot, &digest))
}

#[cfg(feature = "hf-hub")]
fn download(cache: &ModelCache, repo: &str, revision: &str) -> Result<PathBuf, BackendError> {
    use hf_hub::api::sync::ApiBuilder;
    use hf_hub::{Repo, RepoType};
    use resident_storage::model_source::is_commit;

    let started = std::time::Instant::now();
    let failed = |e: &dyn std::fmt::Display| {
        load_error(format!(
            "cannot fetch {repo}@{revision} from the Hugging Face hub: {e}; on a node without \
             access to the hub, push the model to S3 (`resident model push`) and name it by \
             its s3:// prefix"
        ))
    };
    let api = ApiBuilder::from_env()
        .with_cache_dir(cache.dir().join("hf"))
        .with_progress(false)
        .build()
        .map_err(|e| failed(&e))?;
    let info = api
        .repo(Repo::with_revision(
            repo.to_owned(),
            RepoType::Model,
            revision.to_owned(),
        ))
        .info()
        .map_err(|e| failed(&e))?;
    if is_commit(revision) && !info.sha.eq_ignore_ascii_case(revision) {
        return Err(load_error(format!(
            "the hub answered commit {} for {repo}@{revision}",
            info.sha
        )));
    }
    tracing::info!(%repo, %revision, commit = %info.sha, "downloading model from the hub");
    let at_commit = api.repo(Repo::with_revision(
        repo.to_owned(),
        RepoType::Model,
        info.sha.clone(),
    ));
    let mut snapshot = None;
    for file in info.siblings.iter().filter(|s| wanted(&s.rfilename)) {
        let path = at_commit.get(&file.rfilename).map_err(|e| failed(&e))?;
        if file.rfilename == "config.json" {
            snapshot = path.parent().map(Path::to_owned);
        }
    }
    let snapshot =
        snapshot.ok_or_else(|| load_error(format!("{repo}@{revision} has no config.json")))?;
    let manifest = ModelManifest::of_dir(&snapshot).map_err(|e| load_error(e.to_string()))?;
    std::fs::write(snapshot.join(MANIFEST_FILE), manifest.to_json())
        .map_err(|e| load_error(format!("{}: {e}", snapshot.display())))?;
    cache
        .downloads
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    tracing::info!(%repo, commit = %info.sha, bytes = manifest.total_bytes(), seconds = started.elapsed().as_secs_f64(), "model downloaded");
    Ok(snapshot)
}

#[cfg(not(feature = "hf-hub"))]
fn download(_cache: &ModelCache, repo: &str, revision: &str) -> Result<PathBuf, BackendError> {
    Err(load_error(format!(
        "{repo}@{revision} is in no Hugging Face cache on this node, and this agent was built \
         without hub downloads (the `hf-hub` feature); download it into HF_HOME or push it \
         to S3 with `resident model push`"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fetches_what_an_encoder_loads_only() {
        for path in [
            "config.json",
            "model.safetensors",
            "model-00001-of-00002.safetensors",
            "model.safetensors.index.json",
            "tokenizer.json",
            "vocab.txt",
            "sentencepiece.bpe.model",
            "1_Pooling/config.json",
            "2_Normalize/config.json",
        ] {
            assert!(wanted(path), "{path}");
        }
        for path in [
            "pytorch_model.bin",
            "onnx/model.onnx",
            "openvino/openvino_model.xml",
            "onnx/config.json",
            "tf_model.h5",
            "README.md",
            "1_Pooling/deep/config.json",
        ] {
            assert!(!wanted(path), "{path}");
        }
    }

    #[test]
    fn finds_a_snapshot_by_branch_or_commit() {
        let hub = tempfile::tempdir().unwrap();
        let commit = "0123456789abcdef0123456789abcdef01234567";
        let root = hub.path().join("models--org--name");
        std::fs::create_dir_all(root.join("refs")).unwrap();
        std::fs::write(root.join("refs/main"), commit).unwrap();
        let snapshot = root.join("snapshots").join(commit);
        std::fs::create_dir_all(&snapshot).unwrap();
        std::fs::write(snapshot.join("config.json"), "{}").unwrap();
        assert_eq!(
            cached_snapshot(hub.path(), "org/name", "main"),
            Some(snapshot.clone())
        );
        assert_eq!(
            cached_snapshot(hub.path(), "org/name", commit),
            Some(snapshot)
        );
        assert_eq!(cached_snapshot(hub.path(), "org/name", "v2"), None);
        assert_eq!(cached_snapshot(hub.path(), "org/other", "main"), None);
    }
}
