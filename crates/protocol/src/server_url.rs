//! A server's address as people type it: `host:port` is read as `http://host:port`, so
//! every `--server` takes what `server.listen` says.

/// What a server address may look like, for error messages.
pub const SERVER_URL_FORMS: &str =
    "http://HOST:PORT, https://HOST:PORT or HOST:PORT (read as http://HOST:PORT)";

/// `text` as a base URL without a trailing `/`: `host:port` gains `http://`; another
/// scheme, or nothing that names a host, is an error saying what is expected.
pub fn base_url(text: &str) -> Result<String, String> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(format!("no server address; write {SERVER_URL_FORMS}"));
    }
    let url = match trimmed.split_once("://") {
        Some((scheme, rest)) => {
            if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
                return Err(format!(
                    "{text:?}: the scheme {scheme:?} is not http or https; write {SERVER_URL_FORMS}"
                ));
            }
            if rest.is_empty() || rest.starts_with('/') {
                return Err(format!("{text:?} names no host; write {SERVER_URL_FORMS}"));
            }
            trimmed.trim_end_matches('/').to_owned()
        }
        None => {
            if trimmed.starts_with('/') || trimmed.starts_with(':') || trimmed.contains(' ') {
                return Err(format!("{text:?} names no host; write {SERVER_URL_FORMS}"));
            }
            format!("http://{}", trimmed.trim_end_matches('/'))
        }
    };
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_and_port_is_read_as_http() {
        assert_eq!(base_url("127.0.0.1:7080").unwrap(), "http://127.0.0.1:7080");
        assert_eq!(
            base_url("updates.example:80/").unwrap(),
            "http://updates.example:80"
        );
        assert_eq!(base_url("https://u.example/").unwrap(), "https://u.example");
        assert_eq!(base_url("HTTP://u:1").unwrap(), "HTTP://u:1");
        for bad in ["", "ftp://u:1", "http://", ":7080", "/path"] {
            let err = base_url(bad).unwrap_err();
            assert!(err.contains("HOST:PORT"), "{bad}: {err}");
        }
    }
}
