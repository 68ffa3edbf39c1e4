//! Signed-in people: sessions held in this server's memory, each with its CSRF token,
//! and the checks a request must pass (the admin token, the session cookie, the CSRF
//! field, the origin). Pure but for the random ids and a mutex; times are passed in.
//!
//! A session lives in one server's memory: a restart signs everyone out, and on a
//! fleet of several servers a person stays on the server they signed in to.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use subtle::ConstantTimeEq;

/// The session cookie's name.
pub const COOKIE: &str = "fleet_session";
/// The sign-in form's own CSRF cookie (no session exists yet to bind it to).
pub const SIGNIN_COOKIE: &str = "fleet_signin";
/// The hidden form field every form carries.
pub const CSRF_FIELD: &str = "csrf";

/// A session unused this long ends.
pub const IDLE: Duration = Duration::from_secs(8 * 3600);
/// A session ends this long after sign-in, used or not.
pub const MAX_AGE: Duration = Duration::from_secs(24 * 3600);
/// Sessions held at most; the oldest goes first.
pub const MAX_SESSIONS: usize = 1024;

/// 32 random bytes, hex: session ids and CSRF tokens.
pub fn random_token() -> String {
    let mut bytes = [0u8; 32];
    // Without randomness no id is safe to hand out; nothing to fall back on.
    getrandom::fill(&mut bytes).expect("the operating system's random generator failed");
    hex::encode(bytes)
}

/// Compares in constant time; an empty expected value matches nothing.
pub fn secret_matches(given: &str, expected: &str) -> bool {
    !expected.is_empty() && bool::from(given.as_bytes().ct_eq(expected.as_bytes()))
}

#[derive(Debug, Clone)]
struct Session {
    csrf: String,
    started: Instant,
    seen: Instant,
    who: SignedIn,
}

/// Who a session is: the operator's name and role, and for a named token its hash, so
/// every request can ask the fleet database whether it was revoked meanwhile (the
/// token itself is never kept).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedIn {
    pub name: String,
    pub role: agent_fleet::operators::Role,
    pub token_hash: Option<String>,
}

impl Session {
    fn live(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.seen) < IDLE
            && now.saturating_duration_since(self.started) < MAX_AGE
    }
}

/// The sessions of this server.
#[derive(Debug, Default)]
pub struct Sessions {
    map: Mutex<HashMap<String, Session>>,
}

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Session>> {
        // A panic while holding the lock leaves a map that is still a valid map.
        self.map
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A new session for `who`: its id (the cookie) and its CSRF token.
    pub fn start(&self, now: Instant, who: SignedIn) -> (String, String) {
        let id = random_token();
        let csrf = random_token();
        let mut map = self.lock();
        map.retain(|_, s| s.live(now));
        if map.len() >= MAX_SESSIONS {
            if let Some(oldest) = map
                .iter()
                .min_by_key(|(_, s)| s.seen)
                .map(|(k, _)| k.clone())
            {
                map.remove(&oldest);
            }
        }
        map.insert(
            id.clone(),
            Session {
                csrf: csrf.clone(),
                started: now,
                seen: now,
                who,
            },
        );
        (id, csrf)
    }

    /// The CSRF token of the live session `id` and who it is, marking it used; `None`
    /// for an unknown, ended or expired one.
    pub fn check(&self, id: &str, now: Instant) -> Option<(String, SignedIn)> {
        let mut map = self.lock();
        let session = map.get_mut(id)?;
        if !session.live(now) {
            map.remove(id);
            return None;
        }
        session.seen = now;
        Some((session.csrf.clone(), session.who.clone()))
    }

    /// Signs out: the cookie is worth nothing from now on, even replayed.
    pub fn end(&self, id: &str) {
        self.lock().remove(id);
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The value of cookie `name` in a `Cookie` header.
pub fn cookie<'a>(header: &'a str, name: &str) -> Option<&'a str> {
    header
        .split(';')
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim())
}

/// `Set-Cookie` for `name`: HttpOnly, SameSite=Strict, for the whole site; `Secure`
/// over HTTPS. An empty value with `max_age` 0 removes it.
pub fn set_cookie(name: &str, value: &str, max_age: Duration, secure: bool) -> String {
    format!(
        "{name}={value}; Path=/; Max-Age={}; HttpOnly; SameSite=Strict{}",
        max_age.as_secs(),
        if secure { "; Secure" } else { "" }
    )
}

/// Whether a POST came from this site's own page. Browsers send `Sec-Fetch-Site` and
/// `Origin` with a form POST; a tool like curl sends neither and is judged by its CSRF
/// field alone.
pub fn same_origin(origin: Option<&str>, host: Option<&str>, fetch_site: Option<&str>) -> bool {
    if let Some(site) = fetch_site {
        if !matches!(site, "same-origin" | "none") {
            return false;
        }
    }
    match origin {
        None => true,
        // A sandboxed frame or a privacy redirect: nothing proves it is ours.
        Some("null") => false,
        Some(origin) => {
            let authority = origin
                .split_once("://")
                .map_or(origin, |(_, rest)| rest)
                .trim_end_matches('/');
            host.is_some_and(|h| h.eq_ignore_ascii_case(authority))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_tokens_are_long_and_differ() {
        let a = random_token();
        assert_eq!(a.len(), 64);
        assert_ne!(a, random_token());
    }

    #[test]
    fn secrets_match_exactly_and_never_when_unset() {
        assert!(secret_matches("s3cret", "s3cret"));
        assert!(!secret_matches("s3cre", "s3cret"));
        assert!(!secret_matches("s3cret ", "s3cret"));
        assert!(!secret_matches("", ""));
    }

    fn admin() -> SignedIn {
        SignedIn {
            name: "admin.token".into(),
            role: agent_fleet::operators::Role::Admin,
            token_hash: None,
        }
    }

    #[test]
    fn a_session_is_known_until_it_ends() {
        let sessions = Sessions::default();
        let now = Instant::now();
        let (id, csrf) = sessions.start(now, admin());
        assert_ne!(id, csrf);
        assert_eq!(
            sessions.check(&id, now).map(|(c, who)| (c, who.name)),
            Some((csrf.clone(), "admin.token".to_owned()))
        );
        assert_eq!(sessions.check("nope", now), None);
        sessions.end(&id);
        assert_eq!(
            sessions.check(&id, now),
            None,
            "a replayed cookie after sign-out"
        );
    }

    #[test]
    fn an_idle_session_expires_and_use_keeps_it_alive() {
        let sessions = Sessions::default();
        let t0 = Instant::now();
        let (id, _) = sessions.start(t0, admin());
        let (idle, _) = sessions.start(t0, admin());
        let step = IDLE - Duration::from_secs(60);
        assert!(sessions.check(&id, t0 + step).is_some());
        assert!(sessions.check(&id, t0 + step * 2).is_some());
        assert!(sessions.check(&idle, t0 + step * 2).is_none());
        assert_eq!(sessions.len(), 1, "the expired one is gone");
    }

    #[test]
    fn a_session_ends_at_its_maximum_age_however_used() {
        let sessions = Sessions::default();
        let t0 = Instant::now();
        let (id, _) = sessions.start(t0, admin());
        let mut t = t0;
        while t < t0 + MAX_AGE - Duration::from_secs(3600) {
            t += Duration::from_secs(3600);
            assert!(sessions.check(&id, t).is_some());
        }
        assert!(sessions.check(&id, t0 + MAX_AGE).is_none());
    }

    #[test]
    fn sessions_are_capped_the_least_recently_used_goes() {
        let sessions = Sessions::default();
        let t0 = Instant::now();
        let (first, _) = sessions.start(t0, admin());
        for i in 1..MAX_SESSIONS {
            sessions.start(t0 + Duration::from_millis(i as u64), admin());
        }
        assert_eq!(sessions.len(), MAX_SESSIONS);
        sessions.start(t0 + Duration::from_secs(5), admin());
        assert_eq!(sessions.len(), MAX_SESSIONS);
        assert!(
            sessions
                .check(&first, t0 + Duration::from_secs(5))
                .is_none()
        );
    }

    #[test]
    fn cookies_are_found_by_exact_name() {
        let h = "other=1; fleet_session=abc; fleet_session_x=zzz";
        assert_eq!(cookie(h, COOKIE), Some("abc"));
        assert_eq!(cookie("fleet_session_x=zzz", COOKIE), None);
        assert_eq!(cookie("", COOKIE), None);
    }

    #[test]
    fn the_cookie_is_httponly_strict_and_secure_over_https() {
        let c = set_cookie(COOKIE, "v", IDLE, false);
        assert!(c.contains("HttpOnly") && c.contains("SameSite=Strict"));
        assert!(!c.contains("Secure"));
        assert!(set_cookie(COOKIE, "v", IDLE, true).ends_with("; Secure"));
    }

    #[test]
    fn cross_site_posts_are_refused() {
        let host = Some("127.0.0.1:7080");
        assert!(same_origin(None, host, None), "curl: no browser headers");
        assert!(same_origin(
            Some("http://127.0.0.1:7080"),
            host,
            Some("same-origin")
        ));
        assert!(!same_origin(Some("http://evil.example"), host, None));
        assert!(!same_origin(None, host, Some("cross-site")));
        assert!(!same_origin(None, host, Some("same-site")));
        assert!(!same_origin(Some("null"), host, None));
        assert!(!same_origin(Some("http://127.0.0.1:7080"), None, None));
    }
}
