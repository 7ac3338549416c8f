//! Where a job reads and writes: a local path or an `s3://bucket/prefix`.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::error::LocationError;

/// How to reach the store.
#[derive(Clone, Debug)]
pub struct S3Options {
    /// An S3-compatible endpoint (`http://127.0.0.1:9000`); path-style addressing is used
    /// with it. `None` = AWS (or `AWS_ENDPOINT_URL`).
    pub endpoint: Option<String>,
    /// Files larger than this are uploaded in parts of this size (at least 5 MiB, S3's
    /// smallest part).
    pub part_bytes: usize,
    /// A fixed access key and secret instead of the standard credential chain.
    pub static_credentials: Option<(String, String)>,
}

impl Default for S3Options {
    fn default() -> Self {
        Self {
            endpoint: None,
            part_bytes: 64 << 20,
            static_credentials: None,
        }
    }
}

/// One object under a listed prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    /// The object's key, the prefix included.
    pub key: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its entity tag as the server gives it (quotes trimmed): changes when the object
    /// does.
    pub etag: String,
}

/// A local path or an S3 prefix, parsed from `s3://bucket/prefix` or a plain path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// A path on this machine.
    Local(PathBuf),
    /// `s3://bucket/prefix`.
    S3 {
        /// The bucket's name.
        bucket: String,
        /// The key prefix, without a trailing `/` (empty for the whole bucket).
        prefix: String,
    },
}

impl Location {
    /// Parses `s3://bucket[/prefix]`; anything else is a local path.
    pub fn parse(text: &str) -> Result<Self, LocationError> {
        let Some(rest) = text.strip_prefix("s3://") else {
            return Ok(Location::Local(PathBuf::from(text)));
        };
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(LocationError(text.to_owned()));
        }
        Ok(Location::S3 {
            bucket: bucket.to_owned(),
            prefix: prefix.trim_end_matches('/').to_owned(),
        })
    }

    /// Whether this is an `s3://` location.
    pub fn is_s3(&self) -> bool {
        matches!(self, Location::S3 { .. })
    }

    /// The local path, or `None` for an S3 location.
    pub fn as_local(&self) -> Option<&Path> {
        match self {
            Location::Local(path) => Some(path),
            Location::S3 { .. } => None,
        }
    }

    /// The location of `name` inside this one (a path below it, or a key under the prefix).
    pub fn join(&self, name: &str) -> Location {
        match self {
            Location::Local(path) => Location::Local(path.join(name)),
            Location::S3 { bucket, prefix } => Location::S3 {
                bucket: bucket.clone(),
                prefix: key_under(prefix, name),
            },
        }
    }
}

/// `prefix/name`, or `name` under an empty prefix.
pub fn key_under(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_owned()
    } else {
        format!("{prefix}/{name}")
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Local(path) => write!(f, "{}", path.display()),
            Location::S3 { bucket, prefix } if prefix.is_empty() => write!(f, "s3://{bucket}"),
            Location::S3 { bucket, prefix } => write!(f, "s3://{bucket}/{prefix}"),
        }
    }
}

/// Plain paths convert directly; strings are parsed, so `"s3://b/p"` is an S3 location.
impl From<&str> for Location {
    fn from(text: &str) -> Self {
        Location::parse(text).unwrap_or_else(|_| Location::Local(PathBuf::from(text)))
    }
}

impl From<String> for Location {
    fn from(text: String) -> Self {
        Location::from(text.as_str())
    }
}

impl From<&String> for Location {
    fn from(text: &String) -> Self {
        Location::from(text.as_str())
    }
}

impl From<PathBuf> for Location {
    fn from(path: PathBuf) -> Self {
        Location::Local(path)
    }
}

impl From<&PathBuf> for Location {
    fn from(path: &PathBuf) -> Self {
        Location::Local(path.clone())
    }
}

impl From<&Path> for Location {
    fn from(path: &Path) -> Self {
        Location::Local(path.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_s3_urls_and_paths() {
        assert_eq!(
            Location::parse("s3://corpus/wiki/2024/").unwrap(),
            Location::S3 {
                bucket: "corpus".into(),
                prefix: "wiki/2024".into()
            }
        );
        assert_eq!(
            Location::parse("s3://corpus")
                .unwrap()
                .join("manifest.json"),
            Location::S3 {
                bucket: "corpus".into(),
                prefix: "manifest.json".into()
            }
        );
        assert!(Location::parse("s3:///x").is_err());
        assert_eq!(
            Location::from("data/x.jsonl"),
            Location::Local("data/x.jsonl".into())
        );
        assert_eq!(
            Location::parse("s3://b/p")
                .unwrap()
                .join("shards/a")
                .to_string(),
            "s3://b/p/shards/a"
        );
    }
}
