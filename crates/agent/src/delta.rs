//! Updating through a delta: the served bundle rebuilt from the one this version was
//! installed from, then handed to the very checks a downloaded bundle passes.
//!
//! A delta only ever saves bytes. No kept bundle, no delta on the server, a delta cut
//! short, damaged or too large, a result whose size or hashes are not the ones
//! `/agentupdate/version` names: each ends in the whole download, and the log says which.
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
use tokio::sync::watch;

use crate::backoff::retry_after_wait;
use crate::client::error_chain;
use crate::download::{self, BatchedHasher, Downloaded, Limits};
use crate::sleep::sleep_or_shutdown;

/// Busy answers (`503`) a delta request waits out before the whole bundle is asked for.
const MAX_BUSY: u32 = 5;

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
        wire::delta_path(&from_hex, layout::PLATFORM)
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
    let delta_size = loop {
        match transfer(req, url, delta_path).await {
            Ok(size) => break size,
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
}

/// Streams the delta into `path`: no larger than the bundle (a delta that is not smaller
/// is no delta), within the download's stall and overall limits.
async fn transfer(req: &Request<'_>, url: &str, path: &Path) -> Result<u64, Transfer> {
    let refused = |reason: String| Transfer::Refused(reason);
    let resp = tokio::time::timeout(req.limits.read_timeout, req.http.get(url).send())
        .await
        .map_err(|_| refused(format!("{url}: no answer in {:?}", req.limits.read_timeout)))?
        .map_err(|e| refused(format!("{url}: {}", error_chain(&e))))?;
    match resp.status() {
        StatusCode::OK => {}
        StatusCode::SERVICE_UNAVAILABLE => {
            return Err(Transfer::Busy(download::retry_after_of(
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
    let cap = req.info.size;
    let mut file = agent_extract::os::with_mode(
        OpenOptions::new().create(true).write(true).truncate(true),
        0o600,
    )
    .open(path)
    .map_err(|e| refused(format!("{}: {e}", path.display())))?;
    let deadline = tokio::time::Instant::now() + req.limits.deadline;
    let mut resp = resp;
    let mut received = 0u64;
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
                return Err(refused(format!(
                    "the delta stalled for {:?}",
                    req.limits.read_timeout
                )));
            }
            Ok(Ok(Err(e))) => {
                return Err(refused(format!("the delta was cut: {}", error_chain(&e))));
            }
            Ok(Ok(Ok(None))) => break,
            Ok(Ok(Ok(Some(chunk)))) => chunk,
        };
        received += chunk.len() as u64;
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
