//! The checks a request of the fleet page must pass (the admin token, the session
//! cookie, the CSRF field, the origin) and the cookies themselves. Pure but for the
//! random tokens.
//!
//! The sessions are kept in the fleet database ([`agent_fleet::sessions`]): a restart
//! signs no one out, and every server of a PostgreSQL fleet knows them.

use std::time::Duration;

use subtle::ConstantTimeEq;

pub use agent_fleet::sessions::SignedIn;

/// The session cookie's name.
pub const COOKIE: &str = "fleet_session";
/// The sign-in form's own CSRF cookie (no session exists yet to bind it to).
pub const SIGNIN_COOKIE: &str = "fleet_signin";
/// The hidden form field every form carries.
pub const CSRF_FIELD: &str = "csrf";

/// A session unused this long ends.
pub const IDLE: Duration = Duration::from_millis(agent_fleet::sessions::IDLE_MS as u64);
/// A session ends this long after sign-in, used or not: the cookie's lifetime.
pub const MAX_AGE: Duration = Duration::from_millis(agent_fleet::sessions::MAX_AGE_MS as u64);

/// 32 random bytes, hex: the sign-in form's CSRF nonce.
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
