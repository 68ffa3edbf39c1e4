//! Updating through a delta: the served bundle rebuilt from the one this version was
//! installed from, then handed to the very checks a downloaded bundle passes.
//!
//! A delta only ever saves bytes. No kept bundle, no delta on the server, a delta
//! damaged or too large, a result whose size or hashes are not the ones
//! `/agentupdate/version` names: each ends in the whole download, and the log says which.
//! A delta cut short (or stalled) is asked for again from where it stopped, with `Range`
//! and `If-Range` on its `ETag`, up to [`MAX_RESUMES`] times before the whole download.
//! Nothing rebuilt is kept unless its md5 and sha256 match; the signature is checked
//! afterwards on those bytes, exactly as for a download.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agent_protocol::digest::{Digests, MultiHasher};
use agent_protocol::layout;
use agent_protocol::wire::{self, VersionInfo};
use reqwest::StatusCode;
use reqwest::header::{CONTENT_RANGE, ETAG, IF_RANGE, RANGE};
use tokio::sync::watch;

use crate::contact::backoff::retry_after_wait;
use crate::contact::client::error_chain;
use crate::sleep::sleep_or_shutdown;
use crate::update::download::{self, BatchedHasher, Downloaded, Limits};

/// Busy answers (`503`) a delta request waits out before the whole bundle is asked for:
/// about half a minute at the server's `Retry-After: 2` while it makes the delta. Five
/// (12 s) were too few for a 36 MB bundle's delta on a loaded server, and the whole
/// bundle then cost the fleet far more than the wait.
const MAX_BUSY: u32 = 12;
/// Times a delta cut short is asked for again from where it stopped before the whole
/// bundle is downloaded instead.
pub const MAX_RESUMES: u32 = 3;

/// Why the whole bundle is downloaded instead.
#[derive(Debug)]
pub enum NoDelta {
    Fallback(String),
    ShuttingDown,
}

fn fallback(reason: impl Into<String>) -> NoDelta {
    NoDelta::Fallback(reason.into())
}

/// Where the agent's own bundle comes from.
pub struct Base<'a> {
    /// `versions/<v>/bundle`.
    pub kept: PathBuf,
    /// The sha256 its signature's claim names, when the version kept one.
    pub claimed_sha256: Option<&'a str>,
}

pub struct Request<'a> {
    pub http: &'a reqwest::Client,
    pub base_url: &'a str,
    pub info: &'a VersionInfo,
    pub dir: &'a Path,
    pub limits: &'a Limits,
    pub max_retry_after: Duration,
}

/// Fetches a delta from `base` to the bundle `req.info` names and rebuilds that bundle
/// into `req.dir`, under the name a download would give it.
pub async fn fetch(
    req: &Request<'_>,
    base: &Base<'_>,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<Downloaded, NoDelta> {
    let started = Instant::now();
    let kept = base.kept.clone();
    let from = tokio::task::spawn_blocking(move || agent_delta::apply::sha256_of(&kept))
        .await
        .map_err(|e| fallback(format!("hashing the kept bundle: {e}")))?
        .map_err(|e| {
            fallback(format!(
                "this version keeps no bundle to start from ({}: {e})",
                base.kept.display()
            ))
        })?;
    let from_hex = hex::encode(from);
    if let Some(claimed) = base.claimed_sha256
        && claimed != from_hex
    {
        return Err(fallback(format!(
            "the kept bundle {} has sha256 {from_hex}, its signature names {claimed}; it is not used",
            base.kept.display()
        )));
    }

    let url = format!(
        "{}{}",
        req.base_url,
        wire::delta_path_to(&from_hex, layout::PLATFORM, &req.info.agent.to_string())
    );
    let delta_path = req.dir.join(format!(
        "delta-{}-{}.part",
        short(&from_hex),
        short(&req.info.sha256)
    ));
    tracing::info!(
        "asking for a delta from the bundle this version was installed from (sha256 {}…) to {} ({} bytes whole)",
        short(&from_hex),
        req.info.agent,
        req.info.size
    );
    let result = rebuild_through(req, base, &url, &delta_path, shutdown).await;
    let _ = fs::remove_file(&delta_path);
    let (downloaded, delta_size) = result?;
    tracing::info!(
        "rebuilt {} from a delta of {} bytes ({:.2} % of the bundle) in {:.2}s; size, md5 and sha256 match /agentupdate/version",
        req.info.agent,
        delta_size,
        delta_size as f64 * 100.0 / req.info.size.max(1) as f64,
        started.elapsed().as_secs_f64()
    );
    Ok(Downloaded {
        elapsed: started.elapsed(),
        ..downloaded
    })
}

async fn rebuild_through(
    req: &Request<'_>,
    base: &Base<'_>,
    url: &str,
    delta_path: &Path,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<(Downloaded, u64), NoDelta> {
    let mut busy = 0;
    let mut resumes = 0;
    let mut resume: Option<Resume> = None;
    let delta_size = loop {
        match transfer(req, url, delta_path, resume.as_ref()).await {
            Ok(size) => break size,
            Err(Transfer::Cut { reason, kept }) => match kept {
                Some(kept) if resumes < MAX_RESUMES => {
                    resumes += 1;
                    tracing::info!(
                        "{reason} after {} bytes; asking for the rest (Range: bytes={}-, resume {resumes} of {MAX_RESUMES})",
                        kept.have,
                        kept.have
                    );
                    resume = Some(kept);
                }
                _ => return Err(fallback(reason)),
            },
            Err(Transfer::Busy(told)) if busy < MAX_BUSY => {
                busy += 1;
                let wait = retry_after_wait(told, req.max_retry_after, &mut rand::rng());
                tracing::info!(
                    "the server is busy with the delta (503, Retry-After {}s); asking again in {:.1}s",
                    told.as_secs(),
                    wait.as_secs_f64()
                );
                if sleep_or_shutdown(wait, shutdown).await {
                    return Err(NoDelta::ShuttingDown);
                }
            }
            Err(Transfer::Busy(_)) => {
                return Err(fallback(format!(
                    "the server answered 503 to the delta {MAX_BUSY} times"
                )));
            }
            Err(Transfer::Refused(reason)) => return Err(fallback(reason)),
        }
    };

    let rebuilt = req
        .dir
        .join(format!("rebuilt-{}.part", short(&req.info.sha256)));
    let (kept, delta, out) = (base.kept.clone(), delta_path.to_owned(), rebuilt.clone());
    let applied = tokio::task::spawn_blocking(move || apply(&kept, &delta, &out))
        .await
        .map_err(|e| fallback(format!("rebuilding the bundle: {e}")))?;
    let digests = match applied {
        Ok(digests) => digests,
        Err(reason) => {
            let _ = fs::remove_file(&rebuilt);
            return Err(fallback(reason));
        }
    };
    let mismatch = [
        ("size", req.info.size.to_string(), digests.size.to_string()),
        ("md5", req.info.md5.clone(), digests.md5_hex()),
        ("sha256", req.info.sha256.clone(), digests.sha256_hex()),
    ]
    .into_iter()
    .find(|(_, expected, actual)| expected != actual);
    if let Some((what, expected, actual)) = mismatch {
        let _ = fs::remove_file(&rebuilt);
        return Err(fallback(format!(
            "the bundle rebuilt from the delta has {what} {actual}, /agentupdate/version names {expected}; it is deleted"
        )));
    }
    let path = download::bundle_path(req.dir, req.info);
    fs::rename(&rebuilt, &path).map_err(|e| {
        let _ = fs::remove_file(&rebuilt);
        fallback(format!("{}: {e}", path.display()))
    })?;
    Ok((
        Downloaded {
            path,
            digests,
            fetched: delta_size,
            elapsed: Duration::ZERO,
        },
        delta_size,
    ))
}

fn short(sha: &str) -> &str {
    sha.get(..12).unwrap_or(sha)
}

enum Transfer {
    Busy(Duration),
    Refused(String),
    /// Cut short or stalled: why, and the part kept on disk if it can be resumed.
    Cut {
        reason: String,
        kept: Option<Resume>,
    },
}

/// A delta's first bytes on disk, and the `ETag` of the delta they belong to.
#[derive(Debug, Clone)]
struct Resume {
    have: u64,
    etag: String,
}

/// How an answer to a delta request (resumed at `asked`, if at all) is to be written.
#[derive(Debug, PartialEq, Eq)]
enum Start {
    /// From the start of the file (a `200`: the whole delta).
    Fresh,
    /// After the bytes kept (a `206` from exactly where they end).
    Append,
    /// A `206` that does not start where asked: not to be trusted.
    Misplaced(Option<u64>),
}

/// Decides from the status and `Content-Range` of an answer to a request resumed at
/// `asked` (or not resumed) how its body continues the file. Pure.
fn start_of(status: StatusCode, asked: Option<u64>, content_range: Option<&str>) -> Start {
    match (status, asked) {
        (StatusCode::PARTIAL_CONTENT, Some(have)) => {
            let start = content_range.and_then(download::parse_content_range_start);
            if start == Some(have) {
                Start::Append
            } else {
                Start::Misplaced(start)
            }
        }
        (StatusCode::PARTIAL_CONTENT, None) => Start::Misplaced(None),
        _ => Start::Fresh,
    }
}

/// Streams the delta into `path`: no larger than the bundle (a delta that is not smaller
/// is no delta), within the download's stall and overall limits. With `resume`, asks for
/// what follows the bytes kept, as long as the delta is still the one they came from
/// (`If-Range`); the server answers the whole delta otherwise.
async fn transfer(
    req: &Request<'_>,
    url: &str,
    path: &Path,
    resume: Option<&Resume>,
) -> Result<u64, Transfer> {
    let refused = |reason: String| Transfer::Refused(reason);
    let mut ask = req.http.get(url);
    if let Some(r) = resume {
        ask = ask
            .header(RANGE, format!("bytes={}-", r.have))
            .header(IF_RANGE, &r.etag);
    }
    let resp = tokio::time::timeout(req.limits.read_timeout, ask.send())
        .await
        .map_err(|_| refused(format!("{url}: no answer in {:?}", req.limits.read_timeout)))?
        .map_err(|e| refused(format!("{url}: {}", error_chain(&e))))?;
    match resp.status() {
        StatusCode::OK | StatusCode::PARTIAL_CONTENT => {}
        StatusCode::SERVICE_UNAVAILABLE => {
            return Err(Transfer::Busy(crate::contact::backoff::retry_after_of(
                &resp,
                Duration::from_secs(5),
            )));
        }
        status => {
            let body = tokio::time::timeout(req.limits.read_timeout, resp.text())
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or_default();
            // The server says why as `{"error": "..."}`; anything else is shown as it is.
            let said = serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v.get("error")?.as_str().map(str::to_owned))
                .unwrap_or(body);
            let said: String = said
                .lines()
                .next()
                .unwrap_or("")
                .chars()
                .take(300)
                .collect();
            return Err(refused(format!(
                "the server has no delta for this agent ({}{}{})",
                status.as_u16(),
                if said.is_empty() { "" } else { ": " },
                said
            )));
        }
    }
    let content_range = resp
        .headers()
        .get(CONTENT_RANGE)
        .and_then(|v| v.to_str().ok());
    let append = match start_of(resp.status(), resume.map(|r| r.have), content_range) {
        Start::Fresh => false,
        Start::Append => true,
        Start::Misplaced(start) => {
            return Err(refused(format!(
                "asked for the delta from byte {}, the server sent a range starting at {start:?}",
                resume.map_or(0, |r| r.have)
            )));
        }
    };
    // A delta without an ETag cannot be resumed: nothing would say the rest is of it.
    let etag = resp
        .headers()
        .get(ETAG)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let cap = req.info.size;
    let mut file = agent_extract::os::with_mode(
        OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(!append)
            .append(append),
        0o600,
    )
    .open(path)
    .map_err(|e| refused(format!("{}: {e}", path.display())))?;
    let deadline = tokio::time::Instant::now() + req.limits.deadline;
    let mut resp = resp;
    let mut received = if append {
        resume.map_or(0, |r| r.have)
    } else {
        0
    };
    let cut = |reason: String, have: u64| Transfer::Cut {
        reason,
        kept: etag
            .clone()
            .filter(|_| have > 0)
            .map(|etag| Resume { have, etag }),
    };
    loop {
        let next = tokio::time::timeout(req.limits.read_timeout, resp.chunk());
        let chunk = match tokio::time::timeout_at(deadline, next).await {
            Err(_) => {
                return Err(refused(format!(
                    "the delta took longer than {:?}",
                    req.limits.deadline
                )));
            }
            Ok(Err(_)) => {
                return Err(cut(
                    format!("the delta stalled for {:?}", req.limits.read_timeout),
                    received,
                ));
            }
            Ok(Ok(Err(e))) => {
                return Err(cut(
                    format!("the delta was cut: {}", error_chain(&e)),
                    received,
                ));
            }
            Ok(Ok(Ok(None))) => break,
            Ok(Ok(Ok(Some(chunk)))) => chunk,
        };
        received += chunk.len() as u64;
        crate::telemetry::downloaded(chunk.len() as u64);
        if received >= cap {
            return Err(refused(format!(
                "the delta is not smaller than the {cap}-byte bundle"
            )));
        }
        file.write_all(&chunk)
            .map_err(|e| refused(format!("{}: {e}", path.display())))?;
    }
    file.sync_all()
        .map_err(|e| refused(format!("{}: {e}", path.display())))?;
    Ok(received)
}

/// The delta applied into `out`, hashed as it is written.
fn apply(kept: &Path, delta: &Path, out: &Path) -> Result<Digests, String> {
    let file = agent_extract::os::with_mode(
        OpenOptions::new().create(true).write(true).truncate(true),
        0o600,
    )
    .open(out)
    .map_err(|e| format!("{}: {e}", out.display()))?;
    let mut sink = HashingWriter {
        file: BufWriter::with_capacity(1 << 20, file),
        hasher: BatchedHasher::new(MultiHasher::new()),
    };
    agent_delta::apply::apply(kept, delta, &mut sink, out).map_err(|e| e.to_string())?;
    sink.finish().map_err(|e| format!("{}: {e}", out.display()))
}

struct HashingWriter {
    file: BufWriter<File>,
    hasher: BatchedHasher,
}

impl Write for HashingWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file.write_all(buf)?;
        self.hasher.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

impl HashingWriter {
    fn finish(mut self) -> io::Result<Digests> {
        self.file.flush()?;
        self.file.get_ref().sync_all()?;
        Ok(self.hasher.finish().finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resumed_delta_is_appended_only_from_exactly_where_it_was_cut() {
        let partial = StatusCode::PARTIAL_CONTENT;
        assert_eq!(start_of(StatusCode::OK, None, None), Start::Fresh);
        // The delta changed since (If-Range failed): the whole of it comes again.
        assert_eq!(start_of(StatusCode::OK, Some(500), None), Start::Fresh);
        assert_eq!(
            start_of(partial, Some(500), Some("bytes 500-999/1000")),
            Start::Append
        );
        assert_eq!(
            start_of(partial, Some(500), Some("bytes 400-999/1000")),
            Start::Misplaced(Some(400))
        );
        assert_eq!(start_of(partial, Some(500), None), Start::Misplaced(None));
        assert_eq!(
            start_of(partial, None, Some("bytes 0-9/10")),
            Start::Misplaced(None),
            "a range never asked for"
        );
    }
}
