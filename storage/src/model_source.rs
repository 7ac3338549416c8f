//! What a pool's model spec names. Pure: parsing only, no I/O beyond asking whether a local
//! directory exists (a local directory always wins over a look-alike hub id).

use std::path::{Path, PathBuf};

use crate::Location;
use crate::error::ModelSpecError;

/// Where a model comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelSource {
    /// A directory on this node, or a Hugging Face id already in the node's own hub cache
    /// (`HF_HOME`), loaded where it is.
    Local(String),
    /// `s3://bucket/prefix/`, with a `resident-model.json` manifest at the prefix.
    S3 {
        /// The bucket's name.
        bucket: String,
        /// The key prefix the manifest and files are under.
        prefix: String,
    },
    /// `org/name` on the Hugging Face hub, at a revision (a commit, branch or tag).
    Hub {
        /// `org/name`.
        repo: String,
        /// A commit, branch or tag (`main` when not given).
        revision: String,
    },
}

/// The node's Hugging Face hub cache: `HF_HUB_CACHE`, else `HF_HOME/hub`, else
/// `~/.cache/huggingface/hub` (as huggingface_hub and hf-hub read it).
pub fn hf_hub_cache_dir() -> Option<PathBuf> {
    std::env::var_os("HF_HUB_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HF_HOME").map(|h| PathBuf::from(h).join("hub")))
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/huggingface/hub"))
        })
}

/// The commit a hub cache (`hub`) holds for `repo` at `revision`: the revision itself when it
/// is a commit, else what its `refs/<revision>` file names.
pub fn cached_hub_commit(hub: &Path, repo: &str, revision: &str) -> Option<String> {
    if is_commit(revision) {
        return Some(revision.to_ascii_lowercase());
    }
    let reference = hub
        .join(format!("models--{}", repo.replace('/', "--")))
        .join("refs")
        .join(revision);
    let commit = std::fs::read_to_string(reference).ok()?;
    let commit = commit.trim();
    is_commit(commit).then(|| commit.to_owned())
}

/// A 40-hex git commit id: the only revision that cannot move.
pub fn is_commit(revision: &str) -> bool {
    revision.len() == 40 && revision.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Whether `spec` looks like a hub id: `org/name`, nothing path-like.
fn looks_like_hub_id(spec: &str) -> bool {
    let Some((org, name)) = spec.split_once('/') else {
        return false;
    };
    let part_ok = |part: &str| {
        !part.is_empty()
            && !part.starts_with(['.', '-'])
            && part
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    };
    part_ok(org) && part_ok(name)
}

impl ModelSource {
    /// Parses a pool's `model` (and `model_revision`, which pins a hub id or an S3 model's
    /// manifest digest). `org/name@rev` is the same as `model_revision: rev`.
    pub fn parse(spec: &str, revision: Option<&str>) -> Result<Self, ModelSpecError> {
        let spec = spec.trim();
        if spec.is_empty() {
            return Err(ModelSpecError::NoModel);
        }
        if spec.starts_with("s3://") {
            return match Location::parse(spec)? {
                Location::S3 { bucket, prefix } => Ok(ModelSource::S3 { bucket, prefix }),
                Location::Local(_) => unreachable!("s3:// parses as S3"),
            };
        }
        if Path::new(spec).is_dir() {
            return Ok(ModelSource::Local(spec.to_owned()));
        }
        let (id, inline) = match spec.split_once('@') {
            Some((id, rev)) => (id, Some(rev)),
            None => (spec, None),
        };
        if !looks_like_hub_id(id) {
            return Ok(ModelSource::Local(spec.to_owned()));
        }
        let revision = match (inline, revision.filter(|r| !r.is_empty())) {
            (Some(a), Some(b)) if a != b => {
                return Err(ModelSpecError::TwoRevisions {
                    spec: spec.to_owned(),
                    inline: a.to_owned(),
                    given: b.to_owned(),
                });
            }
            (Some(rev), _) | (None, Some(rev)) => rev.to_owned(),
            (None, None) => "main".to_owned(),
        };
        let revision_ok = revision
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./".contains(&b))
            && !revision.contains("..")
            && !revision.starts_with('/');
        if revision.is_empty() || !revision_ok {
            return Err(ModelSpecError::BadRevision {
                spec: spec.to_owned(),
                revision,
            });
        }
        Ok(ModelSource::Hub {
            repo: id.to_owned(),
            revision,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s3_prefixes_hub_ids_and_paths() {
        assert_eq!(
            ModelSource::parse("s3://models/minilm/v1/", None).unwrap(),
            ModelSource::S3 {
                bucket: "models".into(),
                prefix: "minilm/v1".into()
            }
        );
        assert_eq!(
            ModelSource::parse("sentence-transformers/all-MiniLM-L6-v2", None).unwrap(),
            ModelSource::Hub {
                repo: "sentence-transformers/all-MiniLM-L6-v2".into(),
                revision: "main".into()
            }
        );
        let commit = "c9745ed1d9f207416be6d2e6f8de32d1f16199bf";
        let pinned = ModelSource::Hub {
            repo: "BAAI/bge-small-en-v1.5".into(),
            revision: commit.into(),
        };
        assert_eq!(
            ModelSource::parse(&format!("BAAI/bge-small-en-v1.5@{commit}"), None).unwrap(),
            pinned
        );
        assert_eq!(
            ModelSource::parse("BAAI/bge-small-en-v1.5", Some(commit)).unwrap(),
            pinned
        );
        assert!(is_commit(commit) && !is_commit("main"));
        for path in ["/opt/models/x", "./m", "../m/x", "a/b/c", "m"] {
            assert_eq!(
                ModelSource::parse(path, None).unwrap(),
                ModelSource::Local(path.into()),
                "{path}"
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let org = dir.path().join("org");
        std::fs::create_dir_all(org.join("name")).unwrap();
        let local = org.join("name").to_string_lossy().into_owned();
        assert_eq!(
            ModelSource::parse(&local, None).unwrap(),
            ModelSource::Local(local.clone())
        );
    }

    #[test]
    fn a_branch_resolves_through_a_hub_cache() {
        let hub = tempfile::tempdir().unwrap();
        let commit = "c9745ed1d9f207416be6d2e6f8de32d1f16199bf";
        let refs = hub.path().join("models--org--name/refs");
        std::fs::create_dir_all(&refs).unwrap();
        std::fs::write(refs.join("main"), format!("{commit}\n")).unwrap();
        std::fs::write(refs.join("broken"), "not a commit").unwrap();
        assert_eq!(
            cached_hub_commit(hub.path(), "org/name", "main").as_deref(),
            Some(commit)
        );
        assert_eq!(
            cached_hub_commit(hub.path(), "org/other", commit).as_deref(),
            Some(commit)
        );
        assert_eq!(cached_hub_commit(hub.path(), "org/name", "broken"), None);
        assert_eq!(cached_hub_commit(hub.path(), "org/other", "main"), None);
    }

    #[test]
    fn bad_specs_say_what_is_wrong() {
        let error = ModelSource::parse("", None).unwrap_err().to_string();
        assert!(error.contains("names no model"), "{error}");
        let error = ModelSource::parse("s3:///x", None).unwrap_err().to_string();
        assert!(error.contains("needs a bucket"), "{error}");
        let error = ModelSource::parse("org/name@abc", Some("def"))
            .unwrap_err()
            .to_string();
        assert!(error.contains("give one"), "{error}");
        let error = ModelSource::parse("org/name@../../etc", None)
            .unwrap_err()
            .to_string();
        assert!(error.contains("is not valid"), "{error}");
    }
}
