//! The auth file: token names, roles and SHA-256 hashes of the tokens (never the tokens).
//!
//! ```toml
//! [[token]]
//! name = "alice"
//! role = "submit"
//! sha256 = "9f86d0..."
//! created_unix = 1795000000
//! ```
//!
//! Tokens are 256 random bits, so a plain SHA-256 is enough to keep them from being read
//! back out of the file: there is nothing to brute-force as there would be with a password.

use std::io::{Read, Write};
use std::path::Path;

use sha2::{Digest, Sha256};

use super::roles::Role;

/// Refuse auth files larger than this: the scheduler reads the file on every change.
const MAX_AUTH_FILE_BYTES: u64 = 4 << 20;
/// Printed tokens start with this, so they are recognisable in logs and secret scanners.
pub const TOKEN_PREFIX: &str = "rsd_";

/// Why the auth file could not be read, written or changed; each message names the file.
#[derive(Debug, thiserror::Error)]
pub enum AuthFileError {
    /// The file cannot be read.
    #[error("cannot read the auth file {path}: {reason}")]
    Read {
        /// The file.
        path: String,
        /// What the system said.
        reason: String,
    },
    /// The file is not a valid auth file.
    #[error("the auth file {path} is not valid: {reason}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong in it.
        reason: String,
    },
    /// The file cannot be written.
    #[error("cannot write the auth file {path}: {reason}")]
    Write {
        /// The file.
        path: String,
        /// What the system said.
        reason: String,
    },
    /// The change is refused (a name taken, a role tokens cannot have, no randomness): why.
    #[error("{0}")]
    Refused(String),
}

/// One token of the auth file: its name, role and hash (never the token itself).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TokenEntry {
    /// The name the token authenticates as (audit logs, owners of jobs and pools).
    pub name: String,
    /// What the token may do.
    pub role: Role,
    /// Hex SHA-256 of the token.
    pub sha256: String,
    /// When it was created, Unix seconds (0 when unknown).
    #[serde(default)]
    pub created_unix: u64,
}

/// The auth file (`auth.toml`): the cluster's tokens.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AuthFile {
    /// Every token, by `[[token]]` table.
    #[serde(rename = "token", default)]
    pub tokens: Vec<TokenEntry>,
}

/// SHA-256 of a token (surrounding whitespace ignored), as the auth file keeps it.
pub fn hash_token(token: &str) -> [u8; 32] {
    Sha256::digest(token.trim().as_bytes()).into()
}

fn from_hex(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// A fresh token: 256 bits from the operating system's generator.
pub fn generate_token() -> Result<String, AuthFileError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)
        .map_err(|e| AuthFileError::Refused(format!("no randomness from the system: {e}")))?;
    Ok(format!("{TOKEN_PREFIX}{}", hex::encode(bytes)))
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@'))
}

impl AuthFile {
    /// Reads the file; a missing file is an empty one only when `missing_ok`.
    pub fn load(path: &Path, missing_ok: bool) -> Result<Self, AuthFileError> {
        let read_error = |reason: String| AuthFileError::Read {
            path: path.display().to_string(),
            reason,
        };
        let file = match std::fs::File::open(path) {
            Ok(file) => file,
            Err(e) if missing_ok && e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Self::default());
            }
            Err(e) => return Err(read_error(e.to_string())),
        };
        let meta = file.metadata().map_err(|e| read_error(e.to_string()))?;
        if !meta.is_file() || meta.len() > MAX_AUTH_FILE_BYTES {
            return Err(read_error(format!(
                "not a regular file of at most {MAX_AUTH_FILE_BYTES} bytes"
            )));
        }
        let mut text = String::new();
        file.take(MAX_AUTH_FILE_BYTES)
            .read_to_string(&mut text)
            .map_err(|e| read_error(e.to_string()))?;
        let parsed: AuthFile = toml::from_str(&text).map_err(|e| AuthFileError::Invalid {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        parsed.validate().map_err(|reason| AuthFileError::Invalid {
            path: path.display().to_string(),
            reason,
        })?;
        Ok(parsed)
    }

    fn validate(&self) -> Result<(), String> {
        let mut seen = std::collections::BTreeSet::new();
        for entry in &self.tokens {
            if !valid_name(&entry.name) {
                return Err(format!("token name `{}` is not valid", entry.name));
            }
            if !seen.insert(entry.name.as_str()) {
                return Err(format!("token name `{}` appears twice", entry.name));
            }
            if from_hex(&entry.sha256).is_none() {
                return Err(format!(
                    "token `{}`: sha256 must be 64 hex digits",
                    entry.name
                ));
            }
        }
        Ok(())
    }

    /// Reads the file, applies `change` and writes it back, holding an exclusive lock on
    /// `.NAME.lock` beside it throughout: concurrent `resident token create`/`revoke` runs
    /// take turns, so every one of them lands (and a revoke never brings back what another
    /// run removed). A missing file is an empty one only when `missing_ok`. Nothing is
    /// written when `change` fails.
    pub fn edit<T>(
        path: &Path,
        missing_ok: bool,
        change: impl FnOnce(&mut AuthFile) -> Result<T, AuthFileError>,
    ) -> Result<T, AuthFileError> {
        let _lock = EditLock::take(path)?;
        let mut file = Self::load(path, missing_ok)?;
        let changed = change(&mut file)?;
        file.save(path)?;
        Ok(changed)
    }

    /// Writes the file atomically and durably, readable by its owner only. Use
    /// [`AuthFile::edit`] to change a file other processes may change too.
    pub fn save(&self, path: &Path) -> Result<(), AuthFileError> {
        let write_error = |reason: String| AuthFileError::Write {
            path: path.display().to_string(),
            reason,
        };
        let mut text = String::from(
            "# Resident tokens: names, roles and SHA-256 hashes. Manage with `resident token`.\n",
        );
        text.push_str(&toml::to_string(self).map_err(|e| write_error(e.to_string()))?);
        let dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(|e| write_error(e.to_string()))?;
        // A name of its own per write: two writers never share (or rename away) a temp file.
        let mut unique = [0u8; 8];
        getrandom::fill(&mut unique).map_err(|e| write_error(e.to_string()))?;
        let temp = dir.join(format!(
            ".{}.{}.{}.tmp",
            path.file_name().unwrap_or_default().to_string_lossy(),
            std::process::id(),
            hex::encode(unique)
        ));
        {
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode_owner_only()
                .open(&temp)
                .map_err(|e| write_error(e.to_string()))?;
            file.write_all(text.as_bytes())
                .and_then(|()| file.sync_all())
                .map_err(|e| write_error(e.to_string()))?;
        }
        if let Err(error) = std::fs::rename(&temp, path) {
            let _ = std::fs::remove_file(&temp);
            return Err(write_error(error.to_string()));
        }
        // The rename is durable once the directory is: `resident token revoke` answers
        // only after that.
        #[cfg(unix)]
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| write_error(e.to_string()))?;
        Ok(())
    }

    /// Adds a token named `name`; returns the token, which is not stored anywhere.
    pub fn create(&mut self, name: &str, role: Role) -> Result<String, AuthFileError> {
        if !valid_name(name) {
            return Err(AuthFileError::Refused(format!(
                "token name `{name}` is not valid: use 1-64 letters, digits, `-`, `_`, `.` or `@`"
            )));
        }
        if role == Role::Open {
            return Err(AuthFileError::Refused(
                "role open is not a token role; roles: admin, submit, read, agent".into(),
            ));
        }
        if self.tokens.iter().any(|t| t.name == name) {
            return Err(AuthFileError::Refused(format!(
                "a token named `{name}` exists; revoke it first (`resident token revoke --name {name}`) or pick another name"
            )));
        }
        let token = generate_token()?;
        let created_unix = resident_proto::unix_ms_now() / 1000;
        self.tokens.push(TokenEntry {
            name: name.to_owned(),
            role,
            sha256: hex::encode(hash_token(&token)),
            created_unix,
        });
        Ok(token)
    }

    /// Removes the token named `name`.
    pub fn revoke(&mut self, name: &str) -> Result<TokenEntry, AuthFileError> {
        let index = self
            .tokens
            .iter()
            .position(|t| t.name == name)
            .ok_or_else(|| {
                let known: Vec<&str> = self.tokens.iter().map(|t| t.name.as_str()).collect();
                AuthFileError::Refused(format!(
                    "no token named `{name}`; known: {}",
                    if known.is_empty() {
                        "none".to_owned()
                    } else {
                        known.join(", ")
                    }
                ))
            })?;
        Ok(self.tokens.remove(index))
    }

    /// The hashes with their principals, for lookups.
    pub fn hashed_entries(&self) -> Vec<([u8; 32], &TokenEntry)> {
        self.tokens
            .iter()
            .filter_map(|t| from_hex(&t.sha256).map(|hash| (hash, t)))
            .collect()
    }
}

/// An exclusive lock on `.NAME.lock` beside an auth file, held while one process edits it
/// (the file itself is replaced by a rename, so it cannot carry the lock). Released when
/// dropped, or when the process dies.
struct EditLock {
    _held: std::fs::File,
}

impl EditLock {
    fn take(path: &Path) -> Result<Self, AuthFileError> {
        let lock_error = |reason: String| AuthFileError::Write {
            path: path.display().to_string(),
            reason: format!("cannot lock it for editing: {reason}"),
        };
        let dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(|e| lock_error(e.to_string()))?;
        let lock_path = dir.join(format!(
            ".{}.lock",
            path.file_name().unwrap_or_default().to_string_lossy()
        ));
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode_owner_only()
            .open(&lock_path)
            .map_err(|e| lock_error(format!("{}: {e}", lock_path.display())))?;
        file.lock()
            .map_err(|e| lock_error(format!("{}: {e}", lock_path.display())))?;
        Ok(Self { _held: file })
    }
}

/// `OpenOptions` for a file only its owner can read.
trait OwnerOnly {
    fn mode_owner_only(&mut self) -> &mut Self;
}

impl OwnerOnly for std::fs::OpenOptions {
    fn mode_owner_only(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.mode(0o600)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_save_load_revoke() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("auth.toml");
        let mut file = AuthFile::load(&path, true).unwrap();
        let token = file.create("alice", Role::Submit).unwrap();
        assert!(token.starts_with(TOKEN_PREFIX) && token.len() == 4 + 64);
        file.save(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains(&token), "the token itself is never stored");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);

        let mut loaded = AuthFile::load(&path, false).unwrap();
        assert_eq!(loaded, file);
        assert_eq!(loaded.hashed_entries()[0].0, hash_token(&token));
        let again = loaded.create("alice", Role::Read).unwrap_err();
        assert!(again.to_string().contains("revoke it first"), "{again}");
        loaded.revoke("alice").unwrap();
        let missing = loaded.revoke("alice").unwrap_err();
        assert!(missing.to_string().contains("known: none"), "{missing}");
    }

    /// Issue 48: twenty concurrent creates and a revoke racing them all land; every
    /// printed token is in the file.
    #[test]
    fn concurrent_edits_all_land() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("auth.toml");
        AuthFile::edit(&path, true, |f| f.create("doomed", Role::Read)).unwrap();
        let tokens: Vec<(String, String)> = std::thread::scope(|scope| {
            let revoke = scope.spawn(|| AuthFile::edit(&path, false, |f| f.revoke("doomed")));
            let creates: Vec<_> = (0..20)
                .map(|i| {
                    let path = &path;
                    scope.spawn(move || {
                        let name = format!("user-{i}");
                        let token =
                            AuthFile::edit(path, true, |f| f.create(&name, Role::Submit)).unwrap();
                        (name, token)
                    })
                })
                .collect();
            revoke.join().unwrap().unwrap();
            creates.into_iter().map(|c| c.join().unwrap()).collect()
        });
        let file = AuthFile::load(&path, false).unwrap();
        assert_eq!(file.tokens.len(), 20, "{:?}", file.tokens);
        assert!(
            file.tokens.iter().all(|t| t.name != "doomed"),
            "the revoke stayed"
        );
        for (name, token) in tokens {
            let entry = file
                .tokens
                .iter()
                .find(|t| t.name == name)
                .expect("created");
            assert_eq!(entry.sha256, hex::encode(hash_token(&token)), "{name}");
        }
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }

    #[test]
    fn bad_files_and_names_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("auth.toml");
        assert!(AuthFile::load(&path, false).is_err());
        std::fs::write(
            &path,
            "[[token]]\nname = \"x\"\nrole = \"root\"\nsha256 = \"00\"\n",
        )
        .unwrap();
        let invalid = AuthFile::load(&path, false).unwrap_err();
        assert!(invalid.to_string().contains("not valid"), "{invalid}");
        let mut file = AuthFile::default();
        assert!(file.create("has space", Role::Read).is_err());
        assert!(file.create("ok", Role::Open).is_err());
    }
}
