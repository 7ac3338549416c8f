//! File helpers every job shares: content hashes, atomic writes, and a small file written
//! to (or read from) a directory or an S3 prefix alike.

use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::storage::{Location, S3Client, S3Options, key_under};

/// The SHA-256 of `bytes`, in hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Writes `bytes` to `path` through a temporary file and a rename, so readers only ever see
/// a complete file. Errors name the file.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let named = |file: &Path, e: std::io::Error| {
        std::io::Error::new(e.kind(), format!("{}: {e}", file.display()))
    };
    let temp = path.with_extension(format!("tmp-{}", std::process::id()));
    let mut file = std::fs::File::create(&temp).map_err(|e| named(&temp, e))?;
    file.write_all(bytes).map_err(|e| named(&temp, e))?;
    file.sync_all().map_err(|e| named(&temp, e))?;
    std::fs::rename(&temp, path).map_err(|e| named(path, e))?;
    sync_parent_dir(path).map_err(|e| named(path, e))
}

/// Writes `bytes` as `name` under `location`: a file in the directory (made if missing),
/// written atomically, or an object under the S3 prefix, reached with `s3`. Errors name
/// where.
pub async fn write_under(
    location: &Location,
    name: &str,
    bytes: Vec<u8>,
    s3: &S3Options,
) -> std::io::Result<()> {
    match location {
        Location::Local(dir) => {
            std::fs::create_dir_all(dir)
                .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
            write_atomically(&dir.join(name), &bytes)
        }
        Location::S3 { bucket, prefix } => {
            let key = key_under(prefix, name);
            let client = S3Client::connect(s3).await;
            let put = client.put(bucket, &key, bytes).await;
            put.map_err(|e| std::io::Error::other(format!("s3://{bucket}/{key}: {e}")))
        }
    }
}

/// The file `name` under `location` (a directory or an S3 prefix, reached with `s3`), or
/// `None` when there is none. Errors name where.
pub async fn read_under(
    location: &Location,
    name: &str,
    s3: &S3Options,
) -> std::io::Result<Option<Vec<u8>>> {
    match location {
        Location::Local(dir) => {
            let path = dir.join(name);
            match std::fs::read(&path) {
                Ok(bytes) => Ok(Some(bytes)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(std::io::Error::new(
                    e.kind(),
                    format!("{}: {e}", path.display()),
                )),
            }
        }
        Location::S3 { bucket, prefix } => {
            let key = key_under(prefix, name);
            let client = S3Client::connect(s3).await;
            let got = client.get(bucket, &key).await;
            got.map_err(|e| std::io::Error::other(format!("s3://{bucket}/{key}: {e}")))
        }
    }
}

/// Makes a rename or a new file in `path`'s directory durable (the directory entry itself
/// is only on disk once the directory is synced).
pub fn sync_parent_dir(path: &Path) -> std::io::Result<()> {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => std::fs::File::open(dir)?.sync_all(),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_of_a_known_string() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn atomic_write_replaces_the_whole_file_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.json");
        write_atomically(&path, b"first, longer").unwrap();
        write_atomically(&path, b"second").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        let missing = dir.path().join("no/such/dir/b.json");
        let error = write_atomically(&missing, b"x").unwrap_err().to_string();
        assert!(error.contains("no/such/dir"), "{error}");
    }
}

/// An exclusive lock on an output directory for as long as a run writes it: a second run on
/// the same directory (in any process on this host, or on a shared filesystem with working
/// `flock`) is refused instead of interleaving its writes.
#[derive(Debug)]
pub struct OutputLock {
    _file: std::fs::File,
}

/// Why an output directory could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum OutputLockError {
    /// Another run (of any process on this host) holds the lock.
    #[error(
        "another run is writing {}{holder}; wait for it to finish or stop it (a rerun then resumes), or choose another output",
        .dir.display()
    )]
    Held {
        /// The output directory.
        dir: PathBuf,
        /// ` (pid N on HOST)` as the holder wrote it, or empty.
        holder: String,
    },
    /// The lock file could not be opened.
    #[error("cannot open {}: {reason}", .path.display())]
    Open {
        /// The lock file.
        path: PathBuf,
        /// Why.
        reason: std::io::Error,
    },
    /// The filesystem failed the lock call itself.
    #[error("cannot lock {}: {reason}", .path.display())]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// Why.
        reason: std::io::Error,
    },
}

/// The lock file inside a locked directory.
pub const OUTPUT_LOCK_FILE: &str = ".resident.lock";

impl OutputLock {
    /// Locks `dir` (which must exist), or says who holds it.
    pub fn acquire(dir: &Path) -> Result<Self, OutputLockError> {
        let path = dir.join(OUTPUT_LOCK_FILE);
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|reason| OutputLockError::Open {
                path: path.clone(),
                reason,
            })?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let holder = std::fs::read_to_string(&path).unwrap_or_default();
                let holder = holder.trim();
                let holder = if holder.is_empty() {
                    String::new()
                } else {
                    format!(" ({holder})")
                };
                return Err(OutputLockError::Held {
                    dir: dir.to_owned(),
                    holder,
                });
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(OutputLockError::Lock { path, reason: e });
            }
        }
        let host = this_host();
        let _ = file.set_len(0);
        let _ = write!(file, "pid {} on {host}", std::process::id());
        Ok(Self { _file: file })
    }
}

/// This machine's name, for lock and lease holders' descriptions ("this host" where the
/// system will not say).
pub(crate) fn this_host() -> String {
    hostname::get()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "this host".to_owned())
}

#[cfg(test)]
mod lock_tests {
    use super::*;

    #[test]
    fn a_second_run_on_one_output_is_refused_until_the_first_ends() {
        let dir = tempfile::tempdir().unwrap();
        let first = OutputLock::acquire(dir.path()).unwrap();
        let refused = OutputLock::acquire(dir.path()).unwrap_err().to_string();
        assert!(refused.contains("another run is writing"), "{refused}");
        assert!(
            refused.contains(&format!("pid {}", std::process::id())),
            "{refused}"
        );
        drop(first);
        assert!(OutputLock::acquire(dir.path()).is_ok());
    }
}
