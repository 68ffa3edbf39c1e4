//! Downloading the server's bundle into `data/update/`, hashing while the bytes arrive.
//!
//! The agent names its own files (never from `Content-Disposition`), writes at most the
//! advertised size (a byte more is an attack, not a bonus), resumes a partial file with
//! `Range` + `If-Range` when the server still serves the same bytes, and gives up on a
//! body that stalls or outlives its deadline. Hashing runs on its own thread, fed while
//! the network delivers, so verifying costs little more than the download itself.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agent_protocol::digest::{self, Digests, MultiHasher};
use agent_protocol::layout;
use agent_protocol::wire::{self, VersionInfo};
use reqwest::StatusCode;
use reqwest::header::{CONTENT_LENGTH, CONTENT_RANGE, IF_RANGE, RANGE};
use tokio::sync::mpsc;

use crate::contact::backoff::retry_after_of;
use crate::contact::client::error_chain;

/// Hash in batches this large so BLAKE2b runs beside md5 + sha256 on a second core.
const HASH_BATCH: usize = 1024 * 1024;

/// Feeds a [`MultiHasher`] in batches of [`HASH_BATCH`], however small the pieces that
/// arrive (network chunks, a rebuilt bundle's writes).
pub(crate) struct BatchedHasher {
    hasher: MultiHasher,
    batch: Vec<u8>,
}

impl BatchedHasher {
    pub(crate) fn new(hasher: MultiHasher) -> Self {
        Self {
            hasher,
            batch: Vec::with_capacity(HASH_BATCH),
        }
    }

    pub(crate) fn update(&mut self, data: &[u8]) {
        self.batch.extend_from_slice(data);
        if self.batch.len() >= HASH_BATCH {
            self.hasher.update(&self.batch);
            self.batch.clear();
        }
    }

    pub(crate) fn finish(mut self) -> MultiHasher {
        self.hasher.update(&self.batch);
        self.hasher
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DownloadError {
    #[error("the server is busy (503); it asks to come back in {0:?}")]
    RetryAfter(Duration),
    #[error("the server refuses downloads (403): auto-update is off or the download limit is 0")]
    Forbidden,
    #[error("{0}")]
    Network(String),
    #[error("download answered {status}: {detail}")]
    Status { status: u16, detail: String },
    #[error("the server sent more than the advertised {expected} bytes; download abandoned")]
    TooLong { expected: u64 },
    #[error("the download ended after {got} of {expected} bytes")]
    TooShort { got: u64, expected: u64 },
    #[error("no data for {0:?}; download abandoned (it resumes on the next attempt)")]
    Stalled(Duration),
    #[error("the download took longer than {0:?}; abandoned (it resumes on the next attempt)")]
    Deadline(Duration),
    #[error(
        "{what} mismatch: /agentupdate/version says {expected}, the downloaded file has {actual}; file deleted"
    )]
    HashMismatch {
        what: &'static str,
        expected: String,
        actual: String,
    },
    #[error("not enough disk space in {dir}: need {need} bytes, {free} free; free some space")]
    DiskSpace { dir: PathBuf, need: u64, free: u64 },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl DownloadError {
    fn io(path: &Path, source: io::Error) -> Self {
        DownloadError::Io {
            path: path.to_owned(),
            source,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Limits {
    pub read_timeout: Duration,
    pub deadline: Duration,
}

#[derive(Debug)]
pub struct Downloaded {
    pub path: PathBuf,
    pub digests: Digests,
    /// Bytes that came over the network in this attempt (less than the size on resume).
    pub fetched: u64,
    pub elapsed: Duration,
}

/// `data/update/`, created with mode 0700 (only the agent's user may write there).
pub fn prepare_dir(dir: &Path) -> Result<(), DownloadError> {
    fs::create_dir_all(dir).map_err(|e| DownloadError::io(dir, e))?;
    agent_extract::os::set_path_mode(dir, 0o700).map_err(|e| DownloadError::io(dir, e))
}

/// The bundle's final name: chosen by the agent from the checked version.
pub fn bundle_path(dir: &Path, info: &VersionInfo) -> PathBuf {
    // Windows runs programs by their extension.
    dir.join(format!(
        "{}{}",
        agent_protocol::layout::bundle_file_name(&info.agent),
        std::env::consts::EXE_SUFFIX
    ))
}

fn part_path(dir: &Path, info: &VersionInfo) -> PathBuf {
    dir.join(format!("bundle-{}.part", info.sha256))
}

/// Downloads the bundle `info` describes from the server at `base` into `dir`, resuming
/// a partial file, and checks size, md5 and sha256. On any mismatch the file is deleted.
pub async fn fetch(
    http: &reqwest::Client,
    base: &str,
    info: &VersionInfo,
    dir: &Path,
    limits: &Limits,
) -> Result<Downloaded, DownloadError> {
    // The release named: a deployment's may be another than the server's current one.
    let url = format!(
        "{base}{}",
        wire::for_release(
            wire::DOWNLOAD_PATH,
            layout::PLATFORM,
            &info.agent.to_string()
        )
    );
    fetch_from(http, &url, info, dir, limits).await
}

/// [`fetch`] from `url`, wherever it is (the server, or its download source).
pub async fn fetch_from(
    http: &reqwest::Client,
    url: &str,
    info: &VersionInfo,
    dir: &Path,
    limits: &Limits,
) -> Result<Downloaded, DownloadError> {
    let started = Instant::now();
    let part = part_path(dir, info);
    let final_path = bundle_path(dir, info);
    remove_stale(dir, &part)?;
    // A complete earlier download of this very bundle (the round failed after it) is
    // used again once its hashes match; only hashed bytes count.
    if let Some(digests) = complete_download(&final_path, info)? {
        return Ok(Downloaded {
            path: final_path,
            digests,
            fetched: 0,
            elapsed: started.elapsed(),
        });
    }

    // What is already on disk (a cut download), hashed again: the file may have been
    // written by a crashed agent, and only hashed bytes count.
    let mut have = match fs::metadata(&part) {
        Ok(m) if m.len() <= info.size => m.len(),
        Ok(_) => {
            remove(&part)?;
            0
        }
        Err(_) => 0,
    };
    let mut prefix = MultiHasher::new();
    if have > 0 {
        let file = File::open(&part).map_err(|e| DownloadError::io(&part, e))?;
        prefix = hash_prefix(file, have).map_err(|e| DownloadError::io(&part, e))?;
    }

    let mut fetched = 0;
    if have < info.size {
        let mut req = http.get(url);
        if have > 0 {
            req = req
                .header(RANGE, format!("bytes={have}-"))
                .header(IF_RANGE, format!("\"{}\"", info.sha256));
        }
        let resp = tokio::time::timeout(limits.read_timeout, req.send())
            .await
            .map_err(|_| DownloadError::Stalled(limits.read_timeout))?
            .map_err(|e| DownloadError::Network(format!("{url}: {}", error_chain(&e))))?;
        let status = resp.status();
        let resumed = match status {
            StatusCode::PARTIAL_CONTENT if have > 0 => {
                let start = resp
                    .headers()
                    .get(CONTENT_RANGE)
                    .and_then(|v| v.to_str().ok())
                    .and_then(parse_content_range_start);
                if start != Some(have) {
                    remove(&part)?;
                    return Err(DownloadError::Network(format!(
                        "{url}: asked for bytes from {have}, got a range starting at {start:?}; starting over next time"
                    )));
                }
                true
            }
            StatusCode::OK => false,
            StatusCode::SERVICE_UNAVAILABLE => {
                return Err(DownloadError::RetryAfter(retry_after_of(
                    &resp,
                    Duration::from_secs(30),
                )));
            }
            StatusCode::FORBIDDEN => return Err(DownloadError::Forbidden),
            StatusCode::RANGE_NOT_SATISFIABLE => {
                remove(&part)?;
                return Err(DownloadError::Status {
                    status: 416,
                    detail: "the partial file no longer fits the server's bundle; starting over"
                        .into(),
                });
            }
            s => {
                return Err(DownloadError::Status {
                    status: s.as_u16(),
                    detail: s.canonical_reason().unwrap_or("unexpected").into(),
                });
            }
        };
        if !resumed {
            have = 0;
            prefix = MultiHasher::new();
        }
        let remaining = info.size - have;
        if let Some(len) = resp
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            && len > remaining
        {
            return Err(DownloadError::TooLong {
                expected: info.size,
            });
        }

        let file = agent_extract::os::with_mode(
            OpenOptions::new()
                .create(true)
                .write(true)
                .truncate(!resumed)
                .append(resumed),
            0o600,
        )
        .open(&part)
        .map_err(|e| DownloadError::io(&part, e))?;
        let (tx, rx) = mpsc::channel::<bytes::Bytes>(64);
        let sink_path = part.clone();
        let sink = tokio::task::spawn_blocking(move || sink(file, prefix, rx, &sink_path));

        let deadline = tokio::time::Instant::now() + limits.deadline;
        let mut resp = resp;
        let mut received: u64 = 0;
        let outcome: Result<(), DownloadError> = loop {
            let next = tokio::time::timeout(limits.read_timeout, resp.chunk());
            let chunk = match tokio::time::timeout_at(deadline, next).await {
                Err(_) => break Err(DownloadError::Deadline(limits.deadline)),
                Ok(Err(_)) => break Err(DownloadError::Stalled(limits.read_timeout)),
                Ok(Ok(Err(e))) => break Err(DownloadError::Network(error_chain(&e))),
                Ok(Ok(Ok(None))) => break Ok(()),
                Ok(Ok(Ok(Some(chunk)))) => chunk,
            };
            received += chunk.len() as u64;
            crate::telemetry::downloaded(chunk.len() as u64);
            if received > remaining {
                // Write only up to the advertised size; the excess is dropped unread.
                let keep = chunk.len() - (received - remaining) as usize;
                let _ = tx.send(chunk.slice(..keep)).await;
                break Err(DownloadError::TooLong {
                    expected: info.size,
                });
            }
            if tx.send(chunk).await.is_err() {
                break Ok(()); // the sink failed; its error is reported below
            }
        };
        drop(tx);
        let hashed = sink
            .await
            .map_err(|e| DownloadError::Network(format!("hashing thread: {e}")))?;
        let hasher = hashed?;
        if let Err(e) = outcome {
            if matches!(e, DownloadError::TooLong { .. }) {
                remove(&part)?; // a lying server gets no resume
            }
            return Err(e);
        }
        fetched = received;
        have = hasher.size();
        prefix = hasher;
    }

    if have != info.size {
        return Err(DownloadError::TooShort {
            got: have,
            expected: info.size,
        });
    }
    let digests = prefix.finish();
    for (what, expected, actual) in [
        ("md5", &info.md5, digests.md5_hex()),
        ("sha256", &info.sha256, digests.sha256_hex()),
    ] {
        if *expected != actual {
            remove(&part)?;
            return Err(DownloadError::HashMismatch {
                what,
                expected: expected.clone(),
                actual,
            });
        }
    }
    fs::rename(&part, &final_path).map_err(|e| DownloadError::io(&final_path, e))?;
    Ok(Downloaded {
        path: final_path,
        digests,
        fetched,
        elapsed: started.elapsed(),
    })
}

/// Removes the partial download of the bundle `info` describes, if any.
pub fn discard_partial(dir: &Path, info: &VersionInfo) -> Result<(), DownloadError> {
    remove(&part_path(dir, info))
}

/// The digests of `path` if it is already the whole bundle `info` describes; a file of
/// the right size with other bytes is removed.
fn complete_download(path: &Path, info: &VersionInfo) -> Result<Option<Digests>, DownloadError> {
    match fs::metadata(path) {
        Ok(m) if m.is_file() && m.len() == info.size => {}
        _ => return Ok(None),
    }
    let file = File::open(path).map_err(|e| DownloadError::io(path, e))?;
    let digests = hash_prefix(file, info.size)
        .map_err(|e| DownloadError::io(path, e))?
        .finish();
    if digests.size == info.size
        && digests.md5_hex() == info.md5
        && digests.sha256_hex() == info.sha256
    {
        tracing::info!(
            "{} is already downloaded and its hashes match; not downloading it again",
            path.display()
        );
        Ok(Some(digests))
    } else {
        remove(path)?;
        Ok(None)
    }
}

/// Writes and hashes what the network delivers; returns the hasher over the whole file.
fn sink(
    mut file: File,
    hasher: MultiHasher,
    mut rx: mpsc::Receiver<bytes::Bytes>,
    path: &Path,
) -> Result<MultiHasher, DownloadError> {
    let mut hasher = BatchedHasher::new(hasher);
    while let Some(chunk) = rx.blocking_recv() {
        file.write_all(&chunk)
            .map_err(|e| DownloadError::io(path, e))?;
        hasher.update(&chunk);
    }
    file.sync_all().map_err(|e| DownloadError::io(path, e))?;
    Ok(hasher.finish())
}

fn hash_prefix(mut file: File, len: u64) -> io::Result<MultiHasher> {
    let mut hasher = MultiHasher::new();
    let mut buf = vec![0u8; digest::CHUNK];
    let mut reader = (&mut file).take(len);
    loop {
        let n = digest::fill(&mut reader, &mut buf)?;
        if n == 0 {
            return Ok(hasher);
        }
        hasher.update(&buf[..n]);
    }
}

/// Removes partial files of other bundles and earlier final bundles: only the bundle
/// being fetched may take space.
fn remove_stale(dir: &Path, keep: &Path) -> Result<(), DownloadError> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(DownloadError::io(dir, e)),
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        // Deltas and bundles rebuilt from them that a crash left behind go too.
        let partial = ["bundle-", "delta-", "rebuilt-"]
            .iter()
            .any(|prefix| name.starts_with(prefix));
        if path != keep && partial && name.ends_with(".part") {
            remove(&path)?;
        }
    }
    Ok(())
}

fn remove(path: &Path) -> Result<(), DownloadError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(DownloadError::io(path, e)),
    }
}

/// `bytes START-END/TOTAL` → START.
pub(crate) fn parse_content_range_start(value: &str) -> Option<u64> {
    let rest = value.trim().strip_prefix("bytes ")?;
    rest.split('-').next()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_range_start() {
        assert_eq!(parse_content_range_start("bytes 100-199/200"), Some(100));
        assert_eq!(parse_content_range_start("bytes */200"), None);
        assert_eq!(parse_content_range_start("items 1-2/3"), None);
    }

    /// A server that answers each connection with `body` and counts the connections.
    fn one_file_server(body: Vec<u8>) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use std::io::{BufRead, BufReader};
        use std::sync::atomic::{AtomicUsize, Ordering};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let hits = std::sync::Arc::new(AtomicUsize::new(0));
        let counter = std::sync::Arc::clone(&hits);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                counter.fetch_add(1, Ordering::SeqCst);
                let mut reader = BufReader::new(&stream);
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                    line.clear();
                }
                let mut stream = &stream;
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = stream.write_all(&body);
            }
        });
        (url, hits)
    }

    fn info_of(bytes: &[u8]) -> VersionInfo {
        let d = Digests::of_reader(bytes).unwrap();
        VersionInfo {
            server_version: "1".into(),
            server_build: "1".into(),
            agent: "2.0.0+2".parse().unwrap(),
            md5: d.md5_hex(),
            sha256: d.sha256_hex(),
            size: d.size,
            filename: "agent-bundle-2.0.0".into(),
            download_source: None,
        }
    }

    /// Regression: after a round that failed past the download, every retry fetched the
    /// whole bundle again.
    #[tokio::test]
    async fn a_complete_download_is_used_again_without_a_request() {
        let body: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let (url, hits) = one_file_server(body.clone());
        let info = info_of(&body);
        let dir = tempfile::tempdir().unwrap();
        let limits = Limits {
            read_timeout: Duration::from_secs(5),
            deadline: Duration::from_secs(30),
        };
        let http = reqwest::Client::new();
        let first = fetch(&http, &url, &info, dir.path(), &limits)
            .await
            .unwrap();
        assert_eq!(first.fetched, body.len() as u64);
        let second = fetch(&http, &url, &info, dir.path(), &limits)
            .await
            .unwrap();
        assert_eq!(second.fetched, 0);
        assert_eq!(second.digests, first.digests);
        assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 1);
        // A file of the right size but other bytes is not trusted: fetched again.
        fs::write(&second.path, vec![0u8; body.len()]).unwrap();
        let third = fetch(&http, &url, &info, dir.path(), &limits)
            .await
            .unwrap();
        assert_eq!(third.fetched, body.len() as u64);
        assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 2);
    }
}
