//! Authentication and authorization at the gRPC edge.
//!
//! [`AuthGate`] is a tonic interceptor: it turns the bearer token of each call into a
//! [`Principal`] (or refuses the call) and hands it to the handlers in the request's
//! extensions; the handlers ask [`roles::authorize`] whether that principal may act. The gate
//! holds the table of token hashes behind a lock so the file can be re-read while serving.

pub mod audit;
pub mod pki;
pub mod roles;
pub mod token_file;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use subtle::ConstantTimeEq;
use tokio_util::sync::CancellationToken;

pub use roles::{
    AccessRefusal, Action, Principal, Role, Scope, authorize, may_annotate, may_cancel,
    may_manage_pool,
};
pub use token_file::{AuthFile, AuthFileError, TOKEN_PREFIX};

/// The tokens a scheduler accepts, as hashes.
#[derive(Clone, Debug, Default)]
struct TokenTable {
    entries: Vec<([u8; 32], Principal)>,
}

impl TokenTable {
    fn from_file(file: &AuthFile) -> Self {
        Self {
            entries: file
                .hashed_entries()
                .into_iter()
                .map(|(hash, entry)| {
                    let principal = Principal {
                        name: entry.name.clone(),
                        role: entry.role,
                    };
                    (hash, principal)
                })
                .collect(),
        }
    }

    /// Compares against every entry in constant time, so timing tells nothing of which
    /// entry (if any) matched.
    fn lookup(&self, token: &str) -> Option<Principal> {
        let presented = token_file::hash_token(token);
        let mut found = None;
        for (hash, principal) in &self.entries {
            if bool::from(hash.ct_eq(&presented)) {
                found = Some(principal);
            }
        }
        found.cloned()
    }
}

/// Why a call without a token is refused, and what to do.
pub const MISSING_TOKEN: &str = "this cluster needs a token; pass --token or set RESIDENT_TOKEN";
/// Why a call with an unknown token is refused, and what to do.
pub const UNKNOWN_TOKEN: &str = "the token is not known to this cluster (mistyped, or revoked); pass a token from `resident token create`";

/// Authenticates every call; cheap to clone (one shared table).
#[derive(Clone)]
pub struct AuthGate {
    /// `None`: auth is off and every caller is [`Principal::anonymous`].
    tokens: Option<Arc<RwLock<TokenTable>>>,
}

impl AuthGate {
    /// No tokens: loopback, `--insecure`, in-process clusters.
    pub fn open() -> Self {
        Self { tokens: None }
    }

    /// Tokens from `path`; an unreadable or invalid file is an error at start.
    pub fn from_file(path: &Path) -> Result<Self, AuthFileError> {
        Ok(Self::with_tokens(&AuthFile::load(path, false)?))
    }

    /// Tokens from an auth file already read (or built in memory).
    pub fn with_tokens(file: &AuthFile) -> Self {
        Self {
            tokens: Some(Arc::new(RwLock::new(TokenTable::from_file(file)))),
        }
    }

    /// Whether auth is off (every call allowed).
    pub fn is_open(&self) -> bool {
        self.tokens.is_none()
    }

    /// Re-reads the file; returns the names now valid. On error the tokens in force stay
    /// as they were.
    pub fn reload(&self, path: &Path) -> Result<BTreeSet<String>, AuthFileError> {
        let Some(tokens) = &self.tokens else {
            return Ok(BTreeSet::new());
        };
        let table = TokenTable::from_file(&AuthFile::load(path, false)?);
        let names = table.entries.iter().map(|(_, p)| p.name.clone()).collect();
        *tokens
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = table;
        Ok(names)
    }

    /// The principal behind `token`, or why there is none.
    pub fn authenticate(&self, token: Option<&str>) -> Result<Principal, tonic::Status> {
        let Some(tokens) = &self.tokens else {
            return Ok(Principal::anonymous());
        };
        let Some(token) = token else {
            return Err(tonic::Status::unauthenticated(MISSING_TOKEN));
        };
        tokens
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .lookup(token)
            .ok_or_else(|| tonic::Status::unauthenticated(UNKNOWN_TOKEN))
    }
}

impl tonic::service::Interceptor for AuthGate {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        match self.authenticate(resident_proto::connect::bearer_token(&request)) {
            Ok(principal) => {
                request.extensions_mut().insert(principal);
                Ok(request)
            }
            Err(status) => {
                audit::refused_unauthenticated(request.remote_addr(), status.message());
                Err(status)
            }
        }
    }
}

/// The principal the gate attached to a request.
pub fn principal_of<T>(request: &tonic::Request<T>) -> Result<Principal, tonic::Status> {
    request
        .extensions()
        .get::<Principal>()
        .cloned()
        .ok_or_else(|| tonic::Status::internal("the request passed no auth gate"))
}

/// Authorizes `action` for the request's principal; a refusal is audit-logged and becomes
/// `PermissionDenied` with the reason.
pub fn require(
    principal: &Principal,
    action: Action,
    call: &str,
    subject: &str,
) -> Result<Scope, tonic::Status> {
    authorize(principal, action).map_err(|refused| {
        let reason = refused.to_string();
        audit::refused(principal, call, subject, &reason);
        tonic::Status::permission_denied(reason)
    })
}

/// Re-reads the auth file on SIGHUP and whenever its size or modification time changes, so
/// tokens are added and revoked without a restart.
pub fn watch_auth_file(
    gate: AuthGate,
    path: PathBuf,
    poll: Duration,
    on_reload: impl Fn(BTreeSet<String>) + Send + 'static,
    cancel: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    // The stat and the reload touch the disk: they run on tokio's blocking pool, never on
    // a runtime thread (a slow or hung mount must not stall the API).
    async fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
        let meta = tokio::fs::metadata(path).await.ok()?;
        Some((meta.modified().ok()?, meta.len()))
    }
    tokio::spawn(async move {
        let mut hangup =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        let mut last = stamp(&path).await;
        let mut interval = tokio::time::interval(poll);
        loop {
            let why = tokio::select! {
                _ = cancel.cancelled() => return,
                Some(()) = async { match hangup.as_mut() { Some(h) => h.recv().await, None => std::future::pending().await } } => "SIGHUP",
                _ = interval.tick() => {
                    let now = stamp(&path).await;
                    if now == last { continue; }
                    last = now;
                    "the file changed"
                }
            };
            let reloaded = {
                let (gate, path) = (gate.clone(), path.clone());
                tokio::task::spawn_blocking(move || gate.reload(&path)).await
            };
            let reloaded = reloaded.unwrap_or_else(|panic| {
                Err(AuthFileError::Read {
                    path: path.display().to_string(),
                    reason: format!("the reload panicked: {panic}"),
                })
            });
            match reloaded {
                Ok(names) => {
                    tracing::info!(
                        target: audit::TARGET,
                        path = %path.display(),
                        tokens = names.len(),
                        reason = why,
                        "auth file reloaded"
                    );
                    on_reload(names);
                }
                Err(error) => tracing::error!(
                    target: audit::TARGET,
                    %error,
                    reason = why,
                    "auth file not reloaded; the tokens in force stay"
                ),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_authenticate_and_reload_revokes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("auth.toml");
        let mut file = AuthFile::default();
        let alice = file.create("alice", Role::Submit).unwrap();
        let ops = file.create("ops", Role::Admin).unwrap();
        file.save(&path).unwrap();
        let gate = AuthGate::from_file(&path).unwrap();
        assert_eq!(gate.authenticate(Some(&alice)).unwrap().name, "alice");
        assert_eq!(gate.authenticate(Some(&ops)).unwrap().role, Role::Admin);
        let missing = gate.authenticate(None).unwrap_err();
        assert_eq!(missing.code(), tonic::Code::Unauthenticated);
        assert!(missing.message().contains("RESIDENT_TOKEN"));
        assert!(gate.authenticate(Some("rsd_wrong")).is_err());

        file.revoke("alice").unwrap();
        file.save(&path).unwrap();
        assert_eq!(
            gate.reload(&path).unwrap(),
            BTreeSet::from(["ops".to_owned()])
        );
        let revoked = gate.authenticate(Some(&alice)).unwrap_err();
        assert!(revoked.message().contains("revoked"), "{revoked}");
        assert!(gate.authenticate(Some(&ops)).is_ok());

        std::fs::write(&path, "not toml [").unwrap();
        assert!(gate.reload(&path).is_err());
        assert!(
            gate.authenticate(Some(&ops)).is_ok(),
            "a broken file keeps the tokens in force"
        );
    }

    #[test]
    fn open_gate_lets_everyone_in() {
        let gate = AuthGate::open();
        assert_eq!(gate.authenticate(None).unwrap(), Principal::anonymous());
    }
}
