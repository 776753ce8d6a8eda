//! Console sessions: a random id held in memory (a server restart signs
//! everyone out), each with an absolute expiry and its own CSRF token.
//! The id travels only in an HttpOnly, Secure, SameSite=Strict cookie; the
//! API token is checked at sign-in and never stored in the browser. A
//! session keeps its token's id and role: every request checks that the
//! token is still live (a revoked or expired token ends the session).

use crate::error::Result;
use crate::pki;
use axum::http::{header, HeaderMap, Uri};
use knit_api::state::TokenRole;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// `__Host-`: the browser keeps it only when Secure, with `Path=/` and no
/// `Domain`, so no other host or path can set or shadow it.
pub const COOKIE: &str = "__Host-knit-console";

/// The form field (or `X-CSRF-Token` header) carrying a session's CSRF token.
pub const CSRF_FIELD: &str = "csrf";
pub const CSRF_HEADER: &str = "x-csrf-token";

/// One signed-in browser.
#[derive(Debug, Clone)]
pub struct Session {
    pub id: String,
    /// Sent back with every state-changing request (hidden field or header).
    pub csrf: String,
    pub expires: Instant,
    /// The API token signed in with, and its role.
    pub token_id: String,
    pub role: TokenRole,
}

impl Session {
    /// Whether this session's role may do what needs `role`.
    pub fn may(&self, role: TokenRole) -> bool {
        self.role >= role
    }

    /// Whether `token` is this session's CSRF token (constant time).
    pub fn csrf_matches(&self, token: &str) -> bool {
        pki::secrets_equal(token, &self.csrf)
    }
}

/// The signed-in sessions, by id.
pub struct Sessions {
    ttl: Duration,
    live: Mutex<HashMap<String, Session>>,
}

impl Sessions {
    pub fn new(ttl: Duration) -> Sessions {
        Sessions {
            ttl,
            live: Mutex::new(HashMap::new()),
        }
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// A new session for a token (expired ones are dropped on the way);
    /// it ends with the session TTL or `token_left`, whichever is first.
    pub fn create(
        &self,
        token_id: &str,
        role: TokenRole,
        token_left: Option<Duration>,
    ) -> Result<Session> {
        let now = Instant::now();
        let ttl = token_left.map_or(self.ttl, |left| left.min(self.ttl));
        let session = Session {
            id: pki::random_hex(32)?,
            csrf: pki::random_hex(32)?,
            expires: now + ttl,
            token_id: token_id.to_string(),
            role,
        };
        let mut live = self.lock();
        live.retain(|_, s| s.expires > now);
        live.insert(session.id.clone(), session.clone());
        Ok(session)
    }

    /// The live session with this id; an expired one is removed.
    pub fn get(&self, id: &str) -> Option<Session> {
        let mut live = self.lock();
        match live.get(id) {
            Some(s) if s.expires > Instant::now() => Some(s.clone()),
            Some(_) => {
                live.remove(id);
                None
            }
            None => None,
        }
    }

    pub fn remove(&self, id: &str) {
        self.lock().remove(id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Session>> {
        // A panic while holding the map leaves it consistent (every change
        // is one insert or remove): keep serving.
        self.live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The session id from the request's `Cookie` headers.
pub fn cookie_id(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.trim().to_string())
}

/// The `Set-Cookie` value of a new session.
pub fn set_cookie(session: &Session, ttl: Duration) -> String {
    format!(
        "{COOKIE}={}; Path=/; Max-Age={}; HttpOnly; Secure; SameSite=Strict",
        session.id,
        ttl.as_secs().max(1)
    )
}

/// The `Set-Cookie` value that removes the session cookie.
pub fn clear_cookie() -> String {
    format!("{COOKIE}=; Path=/; Max-Age=0; HttpOnly; Secure; SameSite=Strict")
}

/// Whether the request's `Origin` is this console's own origin
/// (`https://` + the host the browser addressed). Browsers send `Origin`
/// with every POST; a missing one is refused.
pub fn same_origin(headers: &HeaderMap, uri: &Uri) -> bool {
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| uri.authority().map(|a| a.to_string()));
    let origin = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok());
    match (host, origin) {
        (Some(host), Some(origin)) => origin == format!("https://{host}"),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn a_session_expires_and_is_then_gone() {
        let sessions = Sessions::new(Duration::from_millis(30));
        let s = sessions.create("tok-a", TokenRole::Viewer, None).unwrap();
        assert!(sessions.get(&s.id).is_some());
        std::thread::sleep(Duration::from_millis(50));
        assert!(sessions.get(&s.id).is_none());
    }

    /// A session never outlives its token.
    #[test]
    fn a_session_ends_with_its_token() {
        let sessions = Sessions::new(Duration::from_secs(3600));
        let s = sessions
            .create("tok-b", TokenRole::Admin, Some(Duration::from_secs(5)))
            .unwrap();
        assert!(s.expires <= Instant::now() + Duration::from_secs(5));
        assert!(s.may(TokenRole::Operator) && s.may(TokenRole::Admin));
        let v = sessions.create("tok-c", TokenRole::Viewer, None).unwrap();
        assert!(v.may(TokenRole::Viewer) && !v.may(TokenRole::Operator));
    }

    #[test]
    fn the_cookie_is_read_among_others_and_set_with_every_guard() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; __Host-knit-console=abc; b=2"),
        );
        assert_eq!(cookie_id(&h).as_deref(), Some("abc"));
        let s = Session {
            id: "abc".into(),
            csrf: "x".into(),
            expires: Instant::now(),
            token_id: "tok-a".into(),
            role: TokenRole::Viewer,
        };
        let set = set_cookie(&s, Duration::from_secs(60));
        for part in [
            "HttpOnly",
            "Secure",
            "SameSite=Strict",
            "Max-Age=60",
            "Path=/",
        ] {
            assert!(set.contains(part), "{set}");
        }
    }

    #[test]
    fn only_the_consoles_own_origin_passes() {
        let uri: Uri = "/ui/sign-out".parse().unwrap();
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:7444"));
        assert!(!same_origin(&h, &uri), "no Origin");
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://evil.example"),
        );
        assert!(!same_origin(&h, &uri));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://127.0.0.1:7444"),
        );
        assert!(same_origin(&h, &uri));
    }
}
