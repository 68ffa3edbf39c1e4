//! Which HTTP proxy the agent's traffic goes through, decided once from `server.proxy` and
//! the environment (docs/install.md, "Networks: proxies and download sources").
//!
//! - `server.proxy = "http://[user:password@]host:port"`: every request goes through it
//!   and the environment is not read.
//! - `server.proxy = "none"`: every request goes direct, whatever the environment says.
//! - unset: `https_proxy`/`HTTPS_PROXY` for https URLs, `http_proxy`/`HTTP_PROXY` for
//!   http ones, `all_proxy`/`ALL_PROXY` for both, and `no_proxy`/`NO_PROXY` naming hosts
//!   reached directly; lowercase first, as curl reads them.
//!
//! HTTPS goes through a `CONNECT` tunnel, so the TLS session, and the pinned CA, are the
//! server's, end to end. A proxy's password never leaves this module in text: a
//! [`ProxyUrl`] shows itself as `http://user:***@host:port`, and [`redact`] does the same
//! to any URL in a message.
//!
//! The decision is a pure function of the setting and the variables ([`Proxies::decide`]);
//! reqwest is handed that decision ([`Proxies::apply`]), so the route a log line names is
//! the route the request took.

use std::fmt;
use std::net::IpAddr;

/// The `server.proxy` value that ignores the environment.
pub const NONE: &str = "none";
/// Read for https URLs, in this order.
pub const HTTPS_VARS: [&str; 2] = ["https_proxy", "HTTPS_PROXY"];
/// Read for http URLs, in this order.
pub const HTTP_VARS: [&str; 2] = ["http_proxy", "HTTP_PROXY"];
/// Read for either when the scheme's own variables are unset.
pub const ALL_VARS: [&str; 2] = ["all_proxy", "ALL_PROXY"];
/// Hosts reached directly.
pub const NO_PROXY_VARS: [&str; 2] = ["no_proxy", "NO_PROXY"];
/// Shown in place of a password.
const HIDDEN: &str = "***";

/// A proxy's address with its credentials; shown (Display, Debug) without the password.
#[derive(Clone, PartialEq, Eq)]
pub struct ProxyUrl {
    /// `http://[user:password@]host:port`, as reqwest is given it.
    url: String,
    /// The same with the password replaced.
    shown: String,
}

impl ProxyUrl {
    /// Reads `http://[user:password@]host:port` (a value without a scheme is taken as
    /// http, as curl does). `what` names where the value came from, for the error.
    pub fn parse(text: &str, what: &str) -> Result<Self, String> {
        let text = text.trim();
        let bad = |why: &str| {
            format!(
                "{what} {:?} {why}; write it as http://host:port or http://user:password@host:port",
                redact(text)
            )
        };
        let with_scheme = if text.contains("://") {
            text.to_owned()
        } else {
            format!("http://{text}")
        };
        let url =
            reqwest::Url::parse(&with_scheme).map_err(|e| bad(&format!("is no URL ({e})")))?;
        if url.scheme() != "http" {
            return Err(bad(&format!(
                "is a {}:// proxy; the agent speaks to HTTP proxies (https goes through their CONNECT tunnel)",
                url.scheme()
            )));
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(bad("names no host"));
        }
        // A proxy without a port is guessed differently by every tool (curl says 1080,
        // others 80 or 3128): ask for it.
        if url.port().is_none() {
            return Err(bad("names no port"));
        }
        if !(url.path() == "/" || url.path().is_empty()) || url.query().is_some() {
            return Err(bad("has a path; a proxy is only a host and a port"));
        }
        let url_text = url.as_str().trim_end_matches('/').to_owned();
        let mut shown = url.clone();
        if shown.password().is_some() {
            // Setting a password on an http URL with a host cannot fail.
            let _ = shown.set_password(Some(HIDDEN));
        }
        Ok(Self {
            url: url_text,
            shown: shown.as_str().trim_end_matches('/').to_owned(),
        })
    }

    /// The whole URL, credentials included: only for the HTTP client.
    fn secret_url(&self) -> &str {
        &self.url
    }

    fn has_password(&self) -> bool {
        self.url != self.shown
    }
}

impl fmt::Display for ProxyUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

impl fmt::Debug for ProxyUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ProxyUrl({})", self.shown)
    }
}

/// What `server.proxy` says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Setting {
    /// Unset: the environment decides.
    #[default]
    Environment,
    /// `"none"`: always direct.
    Direct,
    Url(ProxyUrl),
}

impl Setting {
    /// Reads a `server.proxy` value; an error never shows the password.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text.trim() {
            "" => Ok(Setting::Environment),
            t if t.eq_ignore_ascii_case(NONE) => Ok(Setting::Direct),
            t => ProxyUrl::parse(t, "server.proxy").map(Setting::Url),
        }
    }
}

/// A proxy and where it was named (`server.proxy`, or the variable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chosen {
    pub url: ProxyUrl,
    pub from: &'static str,
}

impl fmt::Display for Chosen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.url, self.from)
    }
}

/// The agent's routes: the proxy for http URLs, the one for https URLs, and the hosts
/// reached directly.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Proxies {
    http: Option<Chosen>,
    https: Option<Chosen>,
    direct: NoProxy,
}

impl Proxies {
    /// The routes `setting` and the environment (`env` looks a variable up) give.
    pub fn decide(setting: &Setting, env: &dyn Fn(&str) -> Option<String>) -> Result<Self, String> {
        match setting {
            Setting::Direct => Ok(Self::default()),
            Setting::Url(url) => {
                let chosen = Chosen {
                    url: url.clone(),
                    from: "server.proxy",
                };
                Ok(Self {
                    http: Some(chosen.clone()),
                    https: Some(chosen),
                    direct: NoProxy::default(),
                })
            }
            Setting::Environment => {
                let first = |names: &[&'static str]| {
                    names.iter().find_map(|name| {
                        env(name)
                            .filter(|v| !v.trim().is_empty())
                            .map(|v| (*name, v))
                    })
                };
                let chosen = |names: &[&'static str]| -> Result<Option<Chosen>, String> {
                    match first(names).or_else(|| first(&ALL_VARS)) {
                        None => Ok(None),
                        Some((name, value)) => Ok(Some(Chosen {
                            url: ProxyUrl::parse(&value, &format!("the environment's {name}"))
                                .map_err(|e| {
                                    format!("{e}, or unset it (server.proxy = \"none\" ignores it)")
                                })?,
                            from: name,
                        })),
                    }
                };
                Ok(Self {
                    http: chosen(&HTTP_VARS)?,
                    https: chosen(&HTTPS_VARS)?,
                    direct: NoProxy::parse(
                        &first(&NO_PROXY_VARS).map(|(_, v)| v).unwrap_or_default(),
                    ),
                })
            }
        }
    }

    /// The proxy a request to `url` goes through, or `None` for a direct connection.
    pub fn for_url(&self, url: &str) -> Option<&Chosen> {
        let parsed = reqwest::Url::parse(url).ok()?;
        self.for_parsed(&parsed)
    }

    fn for_parsed(&self, url: &reqwest::Url) -> Option<&Chosen> {
        let chosen = match url.scheme() {
            "https" => self.https.as_ref(),
            "http" => self.http.as_ref(),
            _ => None,
        }?;
        match url.host_str() {
            Some(host) if self.direct.matches(host) => None,
            _ => Some(chosen),
        }
    }

    /// True when no request goes through a proxy.
    pub fn is_direct(&self) -> bool {
        self.http.is_none() && self.https.is_none()
    }

    /// One line for the log and `agent status`, without passwords: `None` when every
    /// request goes direct.
    pub fn describe(&self) -> Option<String> {
        let mut parts = Vec::new();
        match (&self.https, &self.http) {
            (Some(s), Some(h)) if s == h => parts.push(format!("{s}")),
            (s, h) => {
                if let Some(s) = s {
                    parts.push(format!("https through {s}"));
                }
                if let Some(h) = h {
                    parts.push(format!("http through {h}"));
                }
            }
        }
        if parts.is_empty() {
            return None;
        }
        if !self.direct.is_empty() {
            parts.push(format!("direct to {}", self.direct.text));
        }
        Some(parts.join("; "))
    }

    /// ` through the proxy http://user:***@host:port` when `url` goes through one (for
    /// error messages), else nothing.
    pub fn note(&self, url: &str) -> String {
        match self.for_url(url) {
            Some(chosen) => format!(" (through the proxy {chosen})"),
            None => String::new(),
        }
    }

    /// Makes `builder` route requests as decided, and only so: reqwest's own reading of
    /// the environment is turned off.
    pub fn apply(&self, builder: reqwest::ClientBuilder) -> reqwest::ClientBuilder {
        let builder = builder.no_proxy();
        if self.is_direct() {
            return builder;
        }
        let routes = self.clone();
        builder.proxy(reqwest::Proxy::custom(move |url| {
            routes
                .for_parsed(url)
                .map(|chosen| chosen.url.secret_url().to_owned())
        }))
    }

    /// True when some route carries a password (an error text must then be redacted).
    pub fn has_password(&self) -> bool {
        [&self.http, &self.https]
            .into_iter()
            .flatten()
            .any(|c| c.url.has_password())
    }
}

/// `agent status`'s proxy line, without passwords: `None` when nothing names a proxy.
/// `agent status` runs in the operator's shell, whose environment may not be the
/// running agent's: a route from the environment says so.
pub fn status_line(setting: &Setting, env: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    match setting {
        Setting::Direct => {
            Some("none (server.proxy = \"none\": the environment is ignored)".into())
        }
        Setting::Url(url) => Some(format!("{url} (server.proxy)")),
        Setting::Environment => match Proxies::decide(setting, env) {
            Ok(p) => p.describe().map(|d| {
                format!("{d}, as this shell's environment says (the running agent reads its own)")
            }),
            Err(e) => Some(e),
        },
    }
}

/// What a failure through a proxy means, in an operator's words, from the error's text.
pub fn explain(message: &str, via: &Chosen) -> Option<String> {
    let lower = message.to_ascii_lowercase();
    let proxy = &via.url;
    if lower.contains("proxy authorization required")
        || lower.contains("proxy authentication required")
        || lower.contains("answered 407")
    {
        Some(format!(
            "the proxy {proxy} refused the agent's credentials (407 Proxy Authentication Required): check the user and password of {}",
            via.from
        ))
    } else if lower.contains("tunnel error: unsuccessful") {
        Some(format!(
            "the proxy {proxy} did not open a CONNECT tunnel to the server: the server may be down, or the proxy may not allow CONNECT to its host and port (ask its operator)"
        ))
    } else if lower.contains("failed to create underlying connection")
        || lower.contains("tunnel error: unexpected end of file")
        // The only connection the agent makes itself is to the proxy.
        || lower.contains("tcp connect error")
        || lower.contains("connection refused")
    {
        Some(format!(
            "cannot reach the proxy {proxy}: check that it runs, or change {}",
            via.from
        ))
    } else {
        None
    }
}

/// `text` with the password of every `scheme://user:password@` in it replaced by `***`.
pub fn redact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (before, after) = rest.split_at(at + 3);
        out.push_str(before);
        // The authority ends at the first '/', whitespace or quote; its userinfo at the
        // last '@' in it.
        let end = after
            .find(|c: char| c == '/' || c.is_whitespace() || c == '"' || c == '\'' || c == ')')
            .unwrap_or(after.len());
        let authority = &after[..end];
        match authority.rfind('@') {
            Some(at_sign) => {
                let userinfo = &authority[..at_sign];
                match userinfo.split_once(':') {
                    Some((user, _)) => {
                        out.push_str(user);
                        out.push(':');
                        out.push_str(HIDDEN);
                    }
                    None => out.push_str(userinfo),
                }
                out.push_str(&authority[at_sign..]);
            }
            None => out.push_str(authority),
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// `no_proxy`: hosts reached directly. As curl reads it: a comma-separated list of host
/// names (each also matching its subdomains; a leading `.` or `*.` changes nothing), IP
/// addresses, networks in CIDR notation, and `*` for every host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NoProxy {
    text: String,
    entries: Vec<Entry>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    All,
    Domain(String),
    Ip(IpAddr),
    Net(IpAddr, u8),
}

impl NoProxy {
    pub fn parse(text: &str) -> Self {
        let entries = text
            .split([',', ' '])
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(|e| {
                if e == "*" {
                    return Entry::All;
                }
                let bare = e.trim_start_matches("*.").trim_start_matches('.');
                let bare = bare.trim_start_matches('[').trim_end_matches(']');
                if let Some((ip, bits)) = bare.split_once('/')
                    && let (Ok(ip), Ok(bits)) = (ip.parse::<IpAddr>(), bits.parse::<u8>())
                {
                    return Entry::Net(ip, bits);
                }
                match bare.parse::<IpAddr>() {
                    Ok(ip) => Entry::Ip(ip),
                    Err(_) => Entry::Domain(bare.to_ascii_lowercase()),
                }
            })
            .collect();
        Self {
            text: text.trim().to_owned(),
            entries,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// True when `host` (a name or an IP address, IPv6 with or without brackets) is to
    /// be reached directly.
    pub fn matches(&self, host: &str) -> bool {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let ip = host.parse::<IpAddr>().ok();
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        self.entries.iter().any(|entry| match (entry, ip) {
            (Entry::All, _) => true,
            (Entry::Ip(e), Some(ip)) => *e == ip,
            (Entry::Net(net, bits), Some(ip)) => in_network(ip, *net, *bits),
            (Entry::Domain(d), None) => {
                host == *d
                    || host
                        .strip_suffix(d.as_str())
                        .is_some_and(|prefix| prefix.ends_with('.'))
            }
            _ => false,
        })
    }
}

fn in_network(ip: IpAddr, net: IpAddr, bits: u8) -> bool {
    match (ip, net) {
        (IpAddr::V4(ip), IpAddr::V4(net)) if bits <= 32 => {
            let mask = u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0);
            u32::from(ip) & mask == u32::from(net) & mask
        }
        (IpAddr::V6(ip), IpAddr::V6(net)) if bits <= 128 => {
            let mask = u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0);
            u128::from(ip) & mask == u128::from(net) & mask
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }

    fn through<'a>(p: &'a Proxies, url: &str) -> Option<String> {
        p.for_url(url).map(|c: &'a Chosen| c.to_string())
    }

    #[test]
    fn none_ignores_the_environment() {
        let vars = env(&[
            ("https_proxy", "http://p:3128"),
            ("HTTP_PROXY", "http://p:3128"),
        ]);
        let p = Proxies::decide(&Setting::parse("none").unwrap(), &vars).unwrap();
        assert!(p.is_direct());
        assert_eq!(p.for_url("https://server:7080/agent/connect"), None);
        assert_eq!(p.describe(), None);
        assert_eq!(Setting::parse(" None ").unwrap(), Setting::Direct);
        assert_eq!(Setting::parse("").unwrap(), Setting::Environment);
    }

    #[test]
    fn an_explicit_url_with_credentials_takes_everything_and_hides_the_password() {
        let setting = Setting::parse("http://alice:s3cr%40t@proxy.corp:3128").unwrap();
        let vars = env(&[("no_proxy", "*"), ("https_proxy", "http://other:1")]);
        let p = Proxies::decide(&setting, &vars).unwrap();
        for url in ["https://server:7080/x", "http://10.0.0.1/y"] {
            assert_eq!(
                through(&p, url).as_deref(),
                Some("http://alice:***@proxy.corp:3128 (server.proxy)"),
                "{url}"
            );
        }
        assert!(p.has_password());
        let shown = format!("{setting:?} {p:?} {}", p.describe().unwrap());
        assert!(!shown.contains("s3cr"), "{shown}");
        let Setting::Url(url) = setting else {
            panic!("not a URL")
        };
        assert_eq!(url.secret_url(), "http://alice:s3cr%40t@proxy.corp:3128");
        // A user without a password has nothing to hide.
        let plain = ProxyUrl::parse("http://bob@proxy:3128", "x").unwrap();
        assert_eq!(plain.to_string(), "http://bob@proxy:3128");
        assert!(!plain.has_password());
    }

    #[test]
    fn bad_urls_are_refused_without_their_password() {
        for (text, needle) in [
            ("http://alice:hunter2@proxy.corp", "no port"),
            ("socks5://alice:hunter2@proxy.corp:1080", "socks5://"),
            ("https://alice:hunter2@proxy.corp:443", "https://"),
            ("http://alice:hunter2@proxy.corp:3128/path", "path"),
            ("http://alice:hunter2@:3128", "URL"),
            ("http://alice:hunter2@proxy.corp:99999", "URL"),
        ] {
            let err = Setting::parse(text).unwrap_err();
            assert!(err.contains(needle), "{text}: {err}");
            assert!(err.contains("server.proxy"), "{text}: {err}");
            assert!(!err.contains("hunter2"), "{text}: {err}");
        }
        // Without a scheme it is http, as curl reads it.
        let p = ProxyUrl::parse("proxy.corp:3128", "x").unwrap();
        assert_eq!(p.to_string(), "http://proxy.corp:3128");
    }

    #[test]
    fn the_environment_is_read_as_curl_reads_it() {
        let vars = env(&[
            ("HTTPS_PROXY", "http://upper:1"),
            ("https_proxy", "http://lower:2"),
            ("HTTP_PROXY", "http://plain:3"),
        ]);
        let p = Proxies::decide(&Setting::Environment, &vars).unwrap();
        assert_eq!(
            through(&p, "https://s:7080/").as_deref(),
            Some("http://lower:2 (https_proxy)")
        );
        assert_eq!(
            through(&p, "http://s:7080/").as_deref(),
            Some("http://plain:3 (HTTP_PROXY)")
        );
        // all_proxy fills in for a scheme without its own; an empty value is unset.
        let vars = env(&[("https_proxy", ""), ("ALL_PROXY", "http://all:4")]);
        let p = Proxies::decide(&Setting::Environment, &vars).unwrap();
        assert_eq!(
            through(&p, "https://s/").as_deref(),
            Some("http://all:4 (ALL_PROXY)")
        );
        assert_eq!(
            through(&p, "http://s/").as_deref(),
            Some("http://all:4 (ALL_PROXY)")
        );
        // Nothing set: direct.
        let p = Proxies::decide(&Setting::Environment, &env(&[])).unwrap();
        assert!(p.is_direct());
        // A value that is no proxy is an error naming the variable, never a silent bypass.
        let vars = env(&[("HTTPS_PROXY", "http://carol:pa55@proxy")]);
        let err = Proxies::decide(&Setting::Environment, &vars).unwrap_err();
        assert!(err.contains("HTTPS_PROXY") && err.contains("none"), "{err}");
        assert!(!err.contains("pa55"), "{err}");
    }

    #[test]
    fn no_proxy_names_hosts_reached_directly() {
        let vars = env(&[
            ("https_proxy", "http://p:3128"),
            ("NO_PROXY", "example.org"),
            (
                "no_proxy",
                "127.0.0.1, .corp.example, 10.1.0.0/16, ::1,*.lan",
            ),
        ]);
        let p = Proxies::decide(&Setting::Environment, &vars).unwrap();
        for direct in [
            "https://127.0.0.1:7080/",
            "https://updates.corp.example/",
            "https://corp.example/",
            "https://10.1.200.3/",
            "https://[::1]:7080/",
            "https://box.lan/",
        ] {
            assert_eq!(p.for_url(direct), None, "{direct}");
        }
        for proxied in [
            "https://127.0.0.2/",
            "https://notcorp.example/",
            "https://10.2.0.1/",
            "https://example.org/", // NO_PROXY is shadowed by no_proxy
        ] {
            assert!(p.for_url(proxied).is_some(), "{proxied}");
        }
        assert!(
            p.describe().unwrap().contains("direct to 127.0.0.1"),
            "{:?}",
            p.describe()
        );
        assert!(NoProxy::parse("*").matches("anything"));
        assert!(!NoProxy::parse("").matches("anything"));
    }

    #[test]
    fn redaction_hides_every_password_in_a_text() {
        assert_eq!(
            redact("error sending request via http://alice:s3cret@p:3128/x to https://s:1/"),
            "error sending request via http://alice:***@p:3128/x to https://s:1/"
        );
        assert_eq!(
            redact("\"http://a:b@h:1\" and (http://c:d@e:2) http://f@g:3"),
            "\"http://a:***@h:1\" and (http://c:***@e:2) http://f@g:3"
        );
        assert_eq!(redact("no url here"), "no url here");
        assert_eq!(redact("http://user:p@ss@host:1"), "http://user:***@host:1");
    }

    #[test]
    fn failures_through_a_proxy_are_explained() {
        let via = Chosen {
            url: ProxyUrl::parse("http://alice:hunter2@p:3128", "x").unwrap(),
            from: "server.proxy",
        };
        let said = explain(
            "https://s/agent/register: error sending request: client error (Connect): tunnel error: proxy authorization required",
            &via,
        )
        .unwrap();
        assert!(
            said.contains("407") && said.contains("http://alice:***@p:3128"),
            "{said}"
        );
        assert!(!said.contains("hunter2"), "{said}");
        let said = explain(
            "http://s/agent/connect: error sending request: client error (Connect): tcp connect error: Connection refused (os error 111)",
            &via,
        )
        .unwrap();
        assert!(said.contains("cannot reach the proxy"), "{said}");
        let said = explain("tunnel error: unsuccessful", &via).unwrap();
        assert!(said.contains("CONNECT"), "{said}");
        let said = explain(
            "tunnel error: failed to create underlying connection: tcp connect error: Connection refused",
            &via,
        )
        .unwrap();
        assert!(said.contains("cannot reach the proxy"), "{said}");
        assert_eq!(explain("connection reset", &via), None);
    }
}
