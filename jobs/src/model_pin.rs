//! Pinning a job's model before any actor starts, so every agent loads the same bytes and a
//! resumed job knows it has the same model:
//! - a local file (a GGUF model): the SHA-256 of its bytes, no pin;
//! - a local directory: its content (the digest of a manifest of its files), no pin (agents
//!   load their own copy, and each chunk's content fingerprint is checked against the first);
//! - `s3://bucket/prefix/`: the digest of the `resident-model.json` there, which agents check
//!   before they download and load, so the same files in another bucket or on-prem give the
//!   same fingerprint;
//! - a Hugging Face id: the commit its revision names now (asked of the hub, or read from
//!   the local hub cache when the hub cannot be reached).

use std::path::PathBuf;

use resident_storage::model_manifest::{MANIFEST_FILE, ModelManifest};
use resident_storage::model_source::{ModelSource, cached_hub_commit, hf_hub_cache_dir, is_commit};
use resident_storage::{S3Client, S3Options, key_under};

use crate::files::sha256_hex;

/// A job's model as every actor of the job must load it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PinnedModel {
    /// The spec as given (`s3://…`, `org/name`, a path), for the pool.
    pub spec: String,
    /// What the agents must find: an S3 manifest digest or a hub commit.
    pub revision: Option<String>,
    /// Compared on resume; the model's content identity where one can be computed.
    pub fingerprint: String,
}

/// Pins `model` (a directory, `s3://bucket/prefix/`, `org/name[@revision]`).
pub async fn pin_model(model: &str, s3: &S3Options) -> Result<PinnedModel, String> {
    let pinned = |revision: Option<String>, fingerprint: String| PinnedModel {
        spec: model.to_owned(),
        revision,
        fingerprint,
    };
    match ModelSource::parse(model, None).map_err(|refused| refused.to_string())? {
        ModelSource::Local(path) => {
            let dir = PathBuf::from(&path);
            if dir.is_file() {
                // One file (a GGUF model): its content is its identity.
                let file = dir.clone();
                let digest = tokio::task::spawn_blocking(move || file_sha256(&file))
                    .await
                    .map_err(|e| e.to_string())?
                    .map_err(|e| format!("model {path}: {e}"))?;
                return Ok(pinned(None, digest));
            }
            if !dir.is_dir() {
                // The agents may hold it where the client does not; they say if not.
                return Ok(pinned(None, sha256_hex(format!("path:{path}").as_bytes())));
            }
            let manifest = tokio::task::spawn_blocking(move || ModelManifest::of_dir(&dir))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| format!("model {path}: {e}"))?;
            Ok(pinned(None, manifest.digest()))
        }
        ModelSource::S3 { bucket, prefix } => {
            let client = S3Client::connect(s3).await;
            let key = key_under(&prefix, MANIFEST_FILE);
            let bytes = client.get(&bucket, &key).await?.ok_or_else(|| {
                format!(
                    "{model} has no {MANIFEST_FILE}; upload the model with \
                     `resident model push DIR {model}`, which writes it after the files"
                )
            })?;
            let digest = ModelManifest::parse(&bytes)
                .map_err(|e| format!("s3://{bucket}/{key}: {e}"))?
                .digest();
            Ok(pinned(Some(digest.clone()), digest))
        }
        ModelSource::Hub { repo, revision } => {
            let commit = hub_commit(&repo, &revision).await?;
            let fingerprint = sha256_hex(format!("hf:{repo}@{commit}").as_bytes());
            Ok(pinned(Some(commit), fingerprint))
        }
    }
}

/// The SHA-256 of a file's bytes, streamed.
fn file_sha256(path: &std::path::Path) -> std::io::Result<String> {
    let (_, digest) = crate::storage::model_manifest::sha256_of(std::fs::File::open(path)?)?;
    Ok(digest)
}

/// The commit `revision` of `repo` names: itself if it is one, else the hub's answer, else
/// the local hub cache's ref.
async fn hub_commit(repo: &str, revision: &str) -> Result<String, String> {
    if is_commit(revision) {
        return Ok(revision.to_ascii_lowercase());
    }
    let asked = ask_hub(repo.to_owned(), revision.to_owned()).await;
    match asked {
        Ok(commit) => Ok(commit),
        Err(error) => local_hub_ref(repo, revision).ok_or_else(|| {
            format!(
                "cannot pin {repo}@{revision} to a commit ({error}); name the commit \
                 ({repo}@<40-hex commit>), a model directory (a path that exists only on the \
                 agents: write it ./{repo} or absolute), or an s3:// model"
            )
        }),
    }
}

#[cfg(feature = "hf-hub")]
async fn ask_hub(repo: String, revision: String) -> Result<String, String> {
    tokio::task::spawn_blocking(move || {
        let api = hf_hub::api::sync::ApiBuilder::from_env()
            .with_progress(false)
            .build()
            .map_err(|e| e.to_string())?;
        let info = api
            .repo(hf_hub::Repo::with_revision(
                repo,
                hf_hub::RepoType::Model,
                revision,
            ))
            .info()
            .map_err(|e| e.to_string())?;
        Ok(info.sha)
    })
    .await
    .map_err(|e| e.to_string())?
}

#[cfg(not(feature = "hf-hub"))]
async fn ask_hub(_repo: String, _revision: String) -> Result<String, String> {
    Err("built without the hub client (the `hf-hub` feature)".into())
}

/// The commit the local hub cache (`HF_HUB_CACHE`, `HF_HOME/hub`, `~/.cache/huggingface/hub`)
/// has for `repo`'s `revision`.
fn local_hub_ref(repo: &str, revision: &str) -> Option<String> {
    cached_hub_commit(&hf_hub_cache_dir()?, repo, revision)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_directory_is_pinned_by_its_content() {
        let one = tempfile::tempdir().unwrap();
        let two = tempfile::tempdir().unwrap();
        for dir in [&one, &two] {
            std::fs::write(dir.path().join("config.json"), "{}").unwrap();
            std::fs::write(dir.path().join("model.safetensors"), [1u8; 64]).unwrap();
        }
        let s3 = S3Options::default();
        let first = pin_model(one.path().to_str().unwrap(), &s3).await.unwrap();
        let second = pin_model(two.path().to_str().unwrap(), &s3).await.unwrap();
        assert_eq!(first.fingerprint, second.fingerprint);
        assert_eq!(first.revision, None);
        std::fs::write(two.path().join("model.safetensors"), [2u8; 64]).unwrap();
        let changed = pin_model(two.path().to_str().unwrap(), &s3).await.unwrap();
        assert_ne!(first.fingerprint, changed.fingerprint);
    }

    #[tokio::test]
    async fn a_hub_commit_pins_itself() {
        let commit = "c9745ed1d9f207416be6d2e6f8de32d1f16199bf";
        let pinned = pin_model(&format!("org/name@{commit}"), &S3Options::default())
            .await
            .unwrap();
        assert_eq!(pinned.revision.as_deref(), Some(commit));
    }
}
