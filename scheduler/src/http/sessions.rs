//! Dashboard logins. The login page checks a token once and sets a cookie holding a random
//! session id, never the token: a cookie leaked from a browser (a profile copied, a debug
//! dump) names a session that ends at logout, at its expiry or at the scheduler's restart,
//! and cannot be used over gRPC. The session keeps the token, which is checked again on
//! every request, so revoking the token ends its sessions at once.
//!
//! Sessions live in memory: a restarted scheduler asks browsers to log in again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, header};

/// The login cookie's name; it holds a session id.
pub(super) const COOKIE: &str = "resident_session";
/// How long a login lasts (a working day and then some); the token itself may be revoked
/// sooner, which ends it at once.
pub(super) const LOGIN_LIFETIME: Duration = Duration::from_secs(12 * 3600);

/// Sessions kept at most; the one closest to expiry goes first when a login needs room.
const MAX_SESSIONS: usize = 10_000;

/// A random session id: 256 bits, hex.
fn new_session_id() -> String {
    let mut bits = [0u8; 32];
    getrandom::fill(&mut bits).expect("the operating system's random source");
    hex::encode(bits)
}

/// The session id in the login cookie, if the request carries one.
pub(super) fn cookie_session(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value)
}

struct Session {
    token: String,
    expires: Instant,
}

/// The logged-in browsers: session id to token, each until it expires.
#[derive(Clone)]
pub(super) struct DashboardSessions {
    lifetime: Duration,
    sessions: Arc<Mutex<HashMap<String, Session>>>,
}

impl DashboardSessions {
    pub fn new(lifetime: Duration) -> Self {
        Self {
            lifetime,
            sessions: Arc::default(),
        }
    }

    /// Starts a session for `token` (already checked) and returns its id.
    pub fn start(&self, token: &str) -> String {
        let now = Instant::now();
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        sessions.retain(|_, s| s.expires > now);
        if sessions.len() >= MAX_SESSIONS
            && let Some(oldest) = sessions
                .iter()
                .min_by_key(|(_, s)| s.expires)
                .map(|(id, _)| id.clone())
        {
            sessions.remove(&oldest);
        }
        let id = new_session_id();
        sessions.insert(
            id.clone(),
            Session {
                token: token.to_owned(),
                expires: now + self.lifetime,
            },
        );
        id
    }

    /// The token of a live session.
    pub fn token(&self, id: &str) -> Option<String> {
        let sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        sessions
            .get(id)
            .filter(|s| s.expires > Instant::now())
            .map(|s| s.token.clone())
    }

    /// Ends a session (logout).
    pub fn end(&self, id: &str) {
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        sessions.remove(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn the_login_cookie_is_found_among_others() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("theme=dark; resident_session=0a1b; x=1"),
        );
        assert_eq!(cookie_session(&headers), Some("0a1b"));
        assert_eq!(cookie_session(&HeaderMap::new()), None);
    }

    #[test]
    fn a_session_names_its_token_until_it_ends_or_expires() {
        let sessions = DashboardSessions::new(Duration::from_secs(60));
        let id = sessions.start("rtk_secret");
        assert_eq!(id.len(), 64);
        assert!(!id.contains("rtk_secret"));
        assert_eq!(sessions.token(&id).as_deref(), Some("rtk_secret"));
        assert_eq!(sessions.token("not-a-session"), None);
        let other = sessions.start("rtk_secret");
        assert_ne!(id, other, "every login gets its own id");
        sessions.end(&id);
        assert_eq!(sessions.token(&id), None);
        assert!(sessions.token(&other).is_some());

        let short = DashboardSessions::new(Duration::ZERO);
        let id = short.start("rtk_secret");
        assert_eq!(short.token(&id), None, "expired");
    }
}
