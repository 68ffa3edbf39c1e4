//! `GET /install.sh`: the script that joins a machine to the fleet in one command
//! (docs/install.md, "Provisioning a machine"), the enrollment check it makes before it
//! installs anything, and, for a machine given labels or a group, the bundles of the
//! release of the deployment they select (`GET /install/bundles`).
//!
//! The script is written per request from what this server serves now: its public URL,
//! each bundle of the current release (platform, sha256, where to download it), whether
//! it requires an enrollment token, and the CA agents pin (`tls.agent-ca`). Nothing
//! secret goes into it: the enrollment token is the operator's to hand out, never the
//! server's to print. The fixed part is `install.sh` beside this file; the systemd unit
//! it installs is `installer/agent.service`.

use std::io::{Cursor, Read};

use agent_protocol::layout;
use agent_protocol::properties::Properties;
use agent_protocol::wire;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use super::{AppState, Shared};
use crate::store::{Current, Release, ServedBundle};

pub(super) const SCRIPT_PATH: &str = "/install.sh";
pub(super) const CHECK_PATH: &str = "/install/check-enrollment";
pub(super) const BUNDLES_PATH: &str = "/install/bundles";

/// What every script runs; the lines before it are this server's.
const BODY: &str = include_str!("install.sh");
/// The unit the script installs where systemd runs, for a prefix of `/opt`.
const UNIT: &str = include_str!("../../../../installer/agent.service");

pub(super) async fn script(State(state): State<AppState>) -> Response {
    let text = render(&state.inner);
    (
        [
            (header::CONTENT_TYPE, "text/x-shellscript; charset=utf-8"),
            // The sha256 inside changes with the release: never a stale copy.
            (header::CACHE_CONTROL, "no-store"),
        ],
        text,
    )
        .into_response()
}

/// `GET /install/check-enrollment` with `Enrollment-Token`: answers `200` with `ok`, or
/// `refused` and the reason on the next line. A refusal is the check's answer, not the
/// request's failure, and busybox's `wget` shows no body of an error status.
pub(super) async fn check_enrollment(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Response {
    let presented = headers
        .get(wire::ENROLLMENT_HEADER)
        .and_then(|v| v.to_str().ok());
    let text = match enrollment_verdict(&state.inner.enrollment_token, presented) {
        Ok(()) => "ok\n".to_owned(),
        Err(why) => format!("refused\n{why}\n"),
    };
    (
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        text,
    )
        .into_response()
}

fn enrollment_verdict(required: &str, presented: Option<&str>) -> Result<(), &'static str> {
    if required.is_empty() {
        return Ok(());
    }
    match presented {
        None => Err(
            "this server enrolls new agents only with its enrollment token: pass --enroll-token",
        ),
        Some(given) if bool::from(given.trim().as_bytes().ct_eq(required.as_bytes())) => Ok(()),
        Some(_) => {
            Err("the enrollment token is wrong: ask the server's operator for the right one")
        }
    }
}

/// `GET /install/bundles?platform=T&group=G&labels=k=v,k=v`: what a new machine with
/// these labels (and the built-in ones of its platform and group) installs. The first
/// line is `deployment NAME RELEASE`, then the release's bundles as the script lists
/// them. `200` with `refused` and the reason on the next line for labels that are not
/// labels, or a deployment whose release this server has not loaded yet (busybox's
/// `wget` shows no body of an error status).
#[derive(Debug, Default, serde::Deserialize)]
pub(super) struct BundlesQuery {
    #[serde(default)]
    platform: String,
    #[serde(default)]
    group: String,
    #[serde(default)]
    labels: String,
}

pub(super) async fn bundles(
    State(state): State<AppState>,
    Query(query): Query<BundlesQuery>,
) -> Response {
    let text = match selected_bundles(&state.inner, &query) {
        Ok(text) => text,
        Err(why) => format!("refused\n{why}\n"),
    };
    (
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        text,
    )
        .into_response()
}

fn selected_bundles(s: &Shared, query: &BundlesQuery) -> Result<String, String> {
    let given: Vec<&str> = query
        .labels
        .split(',')
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let own = agent_protocol::labels::parse_assignments(&given)?;
    agent_protocol::labels::check(&own)?;
    let labels = agent_fleet::labels::effective(
        &own,
        &agent_fleet::labels::Labels::new(),
        agent_fleet::labels::built_in(&query.platform, &query.group, ""),
    );
    let table = s.fleet.deployments.table().get();
    let chosen = agent_fleet::deployments::choose(&table, &labels);
    let name = chosen.map_or(agent_fleet::deployments::DEFAULT, |d| d.name.as_str());
    let (release, id) = match chosen.and_then(|d| d.release.clone()) {
        None => match s.store.current() {
            // default's: the paths the script of this server names anyway.
            Current::Ready(release) => (release, None),
            Current::Unavailable(_) => {
                return Err(format!(
                    "these labels select deployment {name}, whose release this server does not serve right now; ask its operator, then run this again"
                ));
            }
        },
        Some(id) => match s.catalog.get(&id) {
            Some(release) => (release, Some(id)),
            None => {
                return Err(format!(
                    "these labels select deployment {name}, whose release {id} this server has not loaded yet; run this again in a minute"
                ));
            }
        },
    };
    let offers = offers(&release, id.as_deref());
    Ok(format!(
        "deployment {name} {}\n{}",
        release.version(),
        offer_lines(&offers).join("\n")
    ))
}

/// One bundle of the release, as the script lists it.
struct Offer {
    platform: String,
    sha256: String,
    path: String,
    signature_path: Option<String>,
    filename: String,
}

fn render(state: &Shared) -> String {
    let offers = match state.store.current() {
        Current::Ready(release) => offers(&release, None),
        // The script then says that there is nothing to install, and why to ask.
        Current::Unavailable(_) => Vec::new(),
    };
    let bundles = offer_lines(&offers);
    let mut out = String::new();
    out.push_str("#!/bin/sh\n");
    out.push_str(&format!(
        "# Joins this machine to the fleet of the update server at {url}, which wrote this\n\
         # script for itself. Run it as:\n\
         #   curl -fsSL {url}/install.sh | sh -s -- [--prefix /opt] [--enroll-token T] [--group G] [--no-systemd]\n\
         # or with wget -qO- instead of curl -fsSL.\n",
        url = comment_safe(&state.public_url)
    ));
    out.push_str(&format!("SERVER_URL={}\n", quote(&state.public_url)));
    out.push_str(
        "# The current release, one bundle a line: platform, sha256, download path,\n\
         # signature path (- for none), file name.\n",
    );
    out.push_str(&format!("BUNDLES={}\n", quote(&bundles.join("\n"))));
    out.push_str(&format!(
        "ENROLLMENT_REQUIRED={}\n",
        if state.enrollment_token.is_empty() {
            "no"
        } else {
            "yes"
        }
    ));
    out.push_str("# The CA that agents pin to verify this server (empty: the system's roots).\n");
    out.push_str(&format!(
        "CA_PEM={}\n",
        quote(state.agent_ca.as_deref().unwrap_or("").trim_end())
    ));
    out.push_str(&BODY.replace("@UNIT@", UNIT.trim_end()));
    out
}

/// The offers as the script reads them, one a line: platform, sha256, download path,
/// signature path (`-` for none), file name.
fn offer_lines(offers: &[Offer]) -> Vec<String> {
    offers
        .iter()
        .map(|o| {
            format!(
                "{} {} {} {} {}",
                o.platform,
                o.sha256,
                o.path,
                o.signature_path.as_deref().unwrap_or("-"),
                o.filename
            )
        })
        .collect()
}

/// Each bundle of `release` as an offer; `named`: the release a deployment names, which
/// its paths ask for by name (`None`: the current release).
fn offers(release: &Release, named: Option<&str>) -> Vec<Offer> {
    release
        .bundles()
        .iter()
        .filter_map(|b| offer(b, release.is_single(), named))
        .collect()
}

/// A served bundle as an offer, its platform read from the properties inside it (the
/// content is the authority, as for its version). `None` for a bundle without them,
/// which the store would not serve anyway. The paths of a release of several name the
/// bundle's platform; those of a `named` release name it too.
fn offer(bundle: &ServedBundle, single: bool, named: Option<&str>) -> Option<Offer> {
    let platform = bundle_platform(&bundle.data)?;
    let path = |p: &str| match named {
        Some(id) => wire::for_release(p, &platform, id),
        None if single => p.to_owned(),
        None => wire::for_platform(p, &platform),
    };
    Some(Offer {
        sha256: bundle.info.sha256.clone(),
        path: path(wire::DOWNLOAD_PATH),
        signature_path: bundle
            .signature
            .as_ref()
            .map(|_| path(wire::SIGNATURE_PATH)),
        platform,
        filename: script_word(&bundle.info.filename).unwrap_or_else(|| "agent-bundle".into()),
    })
}

/// `agent.latest.platform` of a bundle's payload, if it is a plain target triple.
fn bundle_platform(data: &bytes::Bytes) -> Option<String> {
    let mut archive = zip::ZipArchive::new(Cursor::new(data.clone())).ok()?;
    let entry = archive.by_name(layout::PROPERTIES_ENTRY).ok()?;
    let mut text = String::new();
    entry.take(64 * 1024).read_to_string(&mut text).ok()?;
    let props = Properties::parse(&text).ok()?;
    script_word(props.get(layout::PROP_LATEST_PLATFORM)?)
}

/// A value that the script may carry as one unquoted word of a `read` line.
fn script_word(s: &str) -> Option<String> {
    let ok = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '+'));
    ok.then(|| s.to_owned())
}

/// A POSIX shell single-quoted string: nothing inside is expanded.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// A URL shown in a comment line: no line breaks.
fn comment_safe(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quote_survives_single_quotes() {
        assert_eq!(quote("a'b"), r"'a'\''b'");
        assert_eq!(quote(""), "''");
    }

    #[test]
    fn script_words_are_plain() {
        assert_eq!(
            script_word("x86_64-unknown-linux-musl").as_deref(),
            Some("x86_64-unknown-linux-musl")
        );
        assert_eq!(script_word("a b"), None);
        assert_eq!(script_word("$(reboot)"), None);
        assert_eq!(script_word(""), None);
    }

    #[test]
    fn enrollment_is_checked_when_required() {
        assert!(enrollment_verdict("", None).is_ok());
        assert!(enrollment_verdict("s3cret", Some("s3cret")).is_ok());
        assert!(enrollment_verdict("s3cret", Some("wrong")).is_err());
        assert!(enrollment_verdict("s3cret", None).is_err());
    }

    #[test]
    fn the_unit_is_for_opt() {
        // The script fills in its prefix by replacing this path.
        assert!(UNIT.contains("/opt/agent/"));
        assert!(!UNIT.lines().any(|l| l == "UNIT"));
    }
}
