//! Steps 1 to 3 of the update: from a refusal to a verified bundle handed to the updater.
//!
//! Nothing downloaded is executed before it has passed every check: size, md5 and
//! sha256 against `/agentupdate/version`, the Ed25519 signature against the trusted key,
//! the trusted comment, the version inside the bundle against the server's claim, and
//! a `signed-at` no older than the running version's (no replayed downgrade).

pub mod ahead;
pub mod delta;
pub mod download;
pub mod locks;
pub mod manual;
pub mod recovery;
pub mod retry;
pub mod room;
pub mod source;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use agent_extract::verify::{self, Trust, Verified};
use agent_protocol::journal::{Journal, Phase};
use agent_protocol::layout::{self, AgentHome};
use agent_protocol::minisign::{BundleClaim, KeyId, PublicKey, Signature};
use agent_protocol::wire::{Report, UpdateStatus, VersionInfo};
use agent_protocol::{AgentVersion, platform};
use agent_updater::state;
use tokio::sync::watch;

use crate::config::Config;
use crate::contact::backoff::{Backoff, retry_after_wait};
use crate::contact::client::Client;
use crate::sleep::sleep_or_shutdown;
use crate::state::home::Installation;
use crate::update::retry::Failure;
use delta::NoDelta;
use download::{DownloadError, Limits};

/// Failed downloads (not counting `503`s, which the server manages) before giving up
/// for this round.
const MAX_DOWNLOAD_FAILURES: u32 = 5;

/// Why a round of updating ended without a verified bundle.
#[derive(Debug)]
pub enum Outcome {
    /// The agent keeps running as it is and tries again later.
    Degraded { reason: String, failure: Failure },
    /// The agent was told to stop while it waited.
    ShuttingDown,
}

/// Timings of the last round, for logs and benchmarks.
#[derive(Debug, Default, Clone, Copy)]
pub struct Timings {
    pub download: Duration,
    pub verify: Duration,
}

pub struct UpdateContext<'a> {
    pub install: &'a Installation,
    pub config: &'a Config,
    pub client: &'a Client,
    pub agent_id: &'a str,
    pub shutdown: watch::Receiver<bool>,
}

/// A bundle that passed every check, ready to hand over.
pub struct Ready {
    pub path: PathBuf,
    pub info: VersionInfo,
    pub verified: Verified,
    pub timings: Timings,
    /// Where the bytes came from, for the `INSTALLING` report (see [`source::Attempt`]).
    pub bundle_from: Option<&'static str>,
}

fn degraded(reason: impl Into<String>) -> Outcome {
    Outcome::Degraded {
        reason: reason.into(),
        failure: Failure::Transient,
    }
}

/// What the agent got does not verify: the bundle's fault, told to the server at once.
fn rejected(reason: impl Into<String>) -> Outcome {
    Outcome::Degraded {
        reason: reason.into(),
        failure: Failure::Rejected,
    }
}

/// Downloads and verifies the server's bundle. `expected` is what the `409` named.
pub async fn fetch_verified(
    ctx: &mut UpdateContext<'_>,
    expected: Option<&AgentVersion>,
) -> Result<Ready, Outcome> {
    let home = &ctx.install.home;
    match state::open_transaction(home) {
        Ok(Some(j)) => {
            return Err(degraded(format!(
                "an update from {} to {} is already under way (journal phase {:?}); not starting another",
                j.from, j.to, j.phase
            )));
        }
        Ok(None) => {}
        Err(e) => return Err(degraded(format!("cannot read the update journal: {e}"))),
    }
    let info = ctx
        .client
        .version_info(expected)
        .await
        .map_err(|e| degraded(format!("cannot learn the server's bundle: {e}")))?;
    if let Some(expected) = expected
        && info.agent != *expected
    {
        return Err(degraded(format!(
            "the server's 409 names {expected} but /agentupdate/version offers {}; the bundle may be changing, trying again later",
            info.agent
        )));
    }
    if info.agent == ctx.install.version {
        return Err(degraded(format!(
            "the server refuses {} but offers that same version; nothing to update to (check agents.accept on the server)",
            info.agent
        )));
    }
    match state::is_bad(home, &info.sha256) {
        Ok(true) => {
            return Err(Outcome::Degraded {
                reason: format!(
                    "bundle {} (sha256 {}) failed to come up here before and is in data/bad-versions; not retrying it until the server offers a different bundle (agent update --clear-bad forgets)",
                    info.agent, info.sha256
                ),
                failure: Failure::BadBundle,
            });
        }
        Ok(false) => {}
        Err(e) => return Err(degraded(format!("cannot read data/bad-versions: {e}"))),
    }
    let Offered {
        key,
        retired,
        signature,
    } = check_offer(ctx.client, ctx.config, ctx.install, &info).await?;
    let dir = home.update_dir();
    download::prepare_dir(&dir).map_err(|e| degraded(e.to_string()))?;
    // Room for this update: the bundle and its unpacked copy; what the agent may lose
    // (versions it does not run) is freed first, and said.
    match crate::update::room::make_room(home, &ctx.install.version_dir, info.size) {
        Ok(freed) => {
            for f in freed {
                tracing::warn!(
                    "the disk was short for the update to {}: deleted {} ({} bytes), which this agent does not run",
                    info.agent,
                    f.path.display(),
                    f.bytes
                );
            }
        }
        Err(short) => {
            return Err(degraded(
                download::DownloadError::DiskSpace {
                    dir: dir.clone(),
                    need: short.need,
                    free: short.free,
                }
                .to_string(),
            ));
        }
    }

    tracing::info!(
        "downloading agent {} ({} bytes) from {}",
        info.agent,
        info.size,
        ctx.client.base()
    );
    let limits = Limits {
        read_timeout: ctx.config.update.read_timeout,
        deadline: ctx.config.update.download_timeout,
    };
    // A version this machine kept (the one before, for rollback) with the very bundle
    // the server names: nothing crosses the wire. Its bytes are checked below as a
    // download's are, against the server's hashes and its new signature.
    if take_kept_bundle(home, &info, &dir) {
        tracing::info!(
            "{} is kept here (versions/{}/bundle, same sha256): switching back to it without a download",
            info.agent,
            info.agent
        );
    }
    let via_delta = if ctx.config.update.deltas && !download::bundle_path(&dir, &info).exists() {
        let claim = running_claim(&ctx.install.version_dir);
        let request = delta::Request {
            http: ctx.client.http(),
            base_url: ctx.client.base(),
            info: &info,
            dir: &dir,
            limits: &limits,
            max_retry_after: ctx.config.update.max_retry_after,
        };
        let base = delta::Base {
            kept: ctx.install.version_dir.join(layout::KEPT_BUNDLE_FILE),
            claimed_sha256: claim.as_ref().map(|c| c.sha256.as_str()),
        };
        match delta::fetch(&request, &base, &mut ctx.shutdown).await {
            Ok(rebuilt) => Some(rebuilt),
            Err(NoDelta::ShuttingDown) => return Err(Outcome::ShuttingDown),
            Err(NoDelta::Fallback(reason)) => {
                tracing::info!("no delta: {reason}; downloading the whole bundle");
                None
            }
        }
    } else {
        None
    };
    // Deltas stay with the server; a whole bundle comes from its download source, if
    // it names one that serves it.
    let from_source = match via_delta {
        Some(_) => source::Attempt::NoSource,
        None => source::try_source(ctx.client, &info, &dir, &limits).await,
    };
    let bundle_from = from_source.bundle_from();
    let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
    let mut attempt = 0u32;
    let downloaded = if let Some(rebuilt) = via_delta {
        rebuilt
    } else if let Some(downloaded) = from_source.downloaded() {
        downloaded
    } else {
        loop {
            attempt += 1;
            tracing::info!("requesting the bundle (attempt {attempt})");
            match download::fetch(ctx.client.http(), ctx.client.base(), &info, &dir, &limits).await
            {
                Ok(d) => break d,
                Err(DownloadError::RetryAfter(told)) => {
                    let wait =
                        retry_after_wait(told, ctx.config.update.max_retry_after, &mut rand::rng());
                    tracing::info!(
                        "server busy (503, Retry-After {}s); trying again in {:.1}s",
                        told.as_secs(),
                        wait.as_secs_f64()
                    );
                    if sleep_or_shutdown(wait, &mut ctx.shutdown).await {
                        return Err(Outcome::ShuttingDown);
                    }
                }
                Err(DownloadError::Forbidden) => {
                    return Err(Outcome::Degraded {
                        reason: DownloadError::Forbidden.to_string(),
                        failure: Failure::NeedsChange,
                    });
                }
                Err(e @ DownloadError::DiskSpace { .. }) => return Err(degraded(e.to_string())),
                Err(e @ DownloadError::HashMismatch { .. }) => {
                    return Err(rejected(format!("refusing the downloaded bundle: {e}")));
                }
                Err(e) => {
                    if backoff.attempts() + 1 >= MAX_DOWNLOAD_FAILURES {
                        return Err(degraded(format!(
                            "download failed {MAX_DOWNLOAD_FAILURES} times, last: {e}"
                        )));
                    }
                    let wait = backoff.next_wait(&mut rand::rng());
                    tracing::warn!(
                        "download failed: {e}; retrying in {:.1}s",
                        wait.as_secs_f64()
                    );
                    if sleep_or_shutdown(wait, &mut ctx.shutdown).await {
                        return Err(Outcome::ShuttingDown);
                    }
                }
            }
        }
    };
    tracing::info!(
        "downloaded {} bytes in {:.2}s; size, md5 and sha256 match /agentupdate/version",
        downloaded.fetched,
        downloaded.elapsed.as_secs_f64()
    );

    let verify_started = Instant::now();
    let verified = match verify_download(key, retired, signature, &info, &downloaded).await {
        Ok(v) => v,
        Err(reason) => {
            // Unverified bytes never stay where they could be run.
            let _ = fs::remove_file(&downloaded.path);
            // The same bytes will never verify: wait for the server to offer others.
            return Err(rejected(format!(
                "refusing the downloaded bundle: {reason}"
            )));
        }
    };
    let timings = Timings {
        download: downloaded.elapsed,
        verify: verify_started.elapsed(),
    };
    tracing::info!(
        "bundle {} verified in {:.3}s: signed by key {} at {}",
        info.agent,
        timings.verify.as_secs_f64(),
        verified.signature.key_id(),
        verified.claim.signed_at
    );
    if let Some(chain) = &verified.chain {
        tracing::info!(
            "the bundle carries the key rotation {chain}: once the update commits, this agent trusts only key {}",
            chain.end.key_id()
        );
    }
    Ok(Ready {
        path: downloaded.path,
        info,
        verified,
        timings,
        bundle_from,
    })
}

/// What the checks before a download found: the key to verify with, the keys no longer
/// trusted, and the server's signature over its bundle.
pub struct Offered {
    pub key: PublicKey,
    pub retired: Vec<KeyId>,
    pub signature: Signature,
}

/// What can be checked before the download is: a bundle that cannot be verified, or
/// whose signed claim does not match what the server says, is not worth a byte. Also
/// what `agent update --check` tells an operator.
pub async fn check_offer(
    client: &Client,
    config: &Config,
    install: &Installation,
    info: &VersionInfo,
) -> Result<Offered, Outcome> {
    let home = &install.home;
    let key = trusted_key(config, home.root()).map_err(|reason| Outcome::Degraded {
        reason,
        failure: Failure::NeedsChange,
    })?;
    let retired = state::retired_keys(home)
        .map_err(|e| degraded(format!("cannot read data/retired-keys: {e}")))?;
    let signature = client.signature(&info.agent).await.map_err(|e| match e {
        // The server names a bundle it has no signature for: no agent can install it.
        crate::contact::client::CommError::Status { status: 404, .. } => rejected(format!(
            "refusing the server's bundle {}: the server serves no signature for it ({e}); the release is missing its .minisig, publish the bundle with its signature",
            info.agent
        )),
        crate::contact::client::CommError::Garbage { .. } => rejected(format!(
            "refusing the server's bundle {}: its signature is not a minisign signature ({e})",
            info.agent
        )),
        e => degraded(format!("cannot fetch the signature: {e}")),
    })?;
    let key_path = config.public_key_path(home.root());
    let trust = Trust {
        key: &key,
        retired: &retired,
    };
    if let Err(retired) = trust.check_signer(signature.key_id()) {
        return Err(rejected(format!("refusing the server's bundle: {retired}")));
    }
    check_claim(&key, &key_path, &signature, info, &install.version_dir)
        .map_err(|reason| rejected(format!("refusing the server's bundle: {reason}")))?;
    Ok(Offered {
        key,
        retired,
        signature,
    })
}

/// Copies the bundle a kept version was installed from to where a download of `info`
/// goes, when it is that very bundle (its sha256 is the server's); true if it did.
fn take_kept_bundle(home: &AgentHome, info: &VersionInfo, dir: &Path) -> bool {
    let kept = home.version_dir(&info.agent).join(layout::KEPT_BUNDLE_FILE);
    let target = download::bundle_path(dir, info);
    if target.exists() || !kept.is_file() {
        return false;
    }
    let same = std::fs::File::open(&kept)
        .and_then(agent_protocol::digest::Digests::of_reader)
        .is_ok_and(|d| d.sha256_hex() == info.sha256 && d.size == info.size);
    if !same {
        return false;
    }
    match std::fs::copy(&kept, &target) {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(
                "cannot take the kept bundle {} ({e}); downloading instead",
                kept.display()
            );
            let _ = std::fs::remove_file(&target);
            false
        }
    }
}

/// The key bundles must be signed with (`update.public-key`), or why there is none.
pub fn trusted_key(config: &Config, home: &Path) -> Result<PublicKey, String> {
    let key_path = config.public_key_path(home);
    let key_text = agent_extract::atomic::read_text(&key_path, 4096).map_err(|e| {
        format!(
            "cannot read the trusted update key ({e}); no bundle can be verified without it. Put the signing key's public half (update.pub) at {} or point update.public-key at it",
            key_path.display()
        )
    })?;
    PublicKey::parse(&key_text).map_err(|e| {
        format!(
            "{}: {e}; no bundle can be verified with it. Put the signing key's public half (update.pub) there",
            key_path.display()
        )
    })
}

/// The checks that need only the signature and the server's description: the key, the
/// trusted comment, and what it vouches for against what the server names. A bundle
/// signed by another key can only be checked once its rotation chain is at hand, after
/// the download; its claim is checked here all the same, and authenticated then.
fn check_claim(
    key: &PublicKey,
    key_path: &Path,
    signature: &Signature,
    info: &VersionInfo,
    running_dir: &Path,
) -> Result<BundleClaim, String> {
    if signature.key_id() == key.key_id() {
        signature
            .verify_trusted_comment(key)
            .map_err(|e| format!("signature check failed: {e}"))?;
    } else {
        tracing::info!(
            "the server's bundle is signed by key {}, not by the trusted key {} ({}): it must carry a key rotation from it, checked after the download",
            signature.key_id(),
            key.key_id(),
            key_path.display()
        );
    }
    let claim = BundleClaim::parse(signature.trusted_comment())
        .map_err(|e| format!("signature check failed: {e}"))?;
    if claim.version != info.agent || claim.sha256 != info.sha256 {
        return Err(format!(
            "mix-and-match: the server names {} (sha256 {}) but the signature vouches for {} (sha256 {})",
            info.agent, info.sha256, claim.version, claim.sha256
        ));
    }
    // Its own platform, or the static musl one of its architecture (which runs on
    // any Linux of that architecture).
    if !platform::runs_on(&claim.platform, layout::PLATFORM) {
        return Err(format!(
            "a bundle for another platform: it is for {}, this agent runs on {}",
            claim.platform,
            layout::PLATFORM
        ));
    }
    if let Some(running) = running_claim(running_dir)
        && claim.signed_at < running.signed_at
    {
        return Err(format!(
            "rollback attack: the bundle was signed at {}, before the running version's signature ({}); a deliberate downgrade must be signed again",
            claim.signed_at, running.signed_at
        ));
    }
    Ok(claim)
}

/// The signature over the downloaded bytes (their BLAKE2b was computed while they
/// arrived), and the payload's own version against the signed claim.
async fn verify_download(
    key: PublicKey,
    retired: Vec<KeyId>,
    signature: Signature,
    info: &VersionInfo,
    downloaded: &download::Downloaded,
) -> Result<Verified, String> {
    let path = downloaded.path.clone();
    let digests = downloaded.digests.clone();
    let verified = tokio::task::spawn_blocking(move || {
        let trust = Trust {
            key: &key,
            retired: &retired,
        };
        verify::verify_with_digests(&path, &digests, &signature, &trust)
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| format!("signature check failed: {e}"))?;
    if verified.claim.version != info.agent {
        return Err(format!(
            "mix-and-match: the server names {} but the signed bundle is {}",
            info.agent, verified.claim.version
        ));
    }
    Ok(verified)
}

/// The signed claim of the running version, kept beside it at install and update.
pub fn running_claim(version_dir: &Path) -> Option<BundleClaim> {
    let text =
        agent_extract::atomic::read_text(&version_dir.join(layout::VERSION_SIGNATURE_FILE), 4096)
            .ok()?;
    let sig = Signature::parse(&text).ok()?;
    BundleClaim::parse(sig.trusted_comment()).ok()
}

/// Step 3: journal, recovery link, `INSTALLING`, then the updater in its own session.
pub async fn hand_off(ctx: &UpdateContext<'_>, ready: &Ready) -> Result<u32, String> {
    let home = &ctx.install.home;
    agent_extract::os::set_path_mode(&ready.path, 0o700)
        .map_err(|e| format!("{}: {e}", ready.path.display()))?;
    let journal = Journal {
        from: ctx.install.version.clone(),
        to: ready.info.agent.clone(),
        bundle_sha256: ready.info.sha256.clone(),
        bundle_path: ready.path.display().to_string(),
        phase: Phase::Prepared,
        started_at: state::now_secs(),
        boot_count: 0,
        reason: None,
        from_dir: ctx
            .install
            .version_dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned()),
        trust: ready
            .verified
            .chain
            .as_ref()
            .map(|chain| state::trust_change(chain, &ctx.config.public_key_path(home.root()))),
        ended_at: None,
        abandoned: false,
        planned_stop: None,
    };
    let link = home.update_dir().join(layout::updater_file_name());
    let file_name = ready
        .path
        .file_name()
        .ok_or_else(|| "bundle path has no file name".to_owned())?;
    agent_extract::atomic::name_program(&link, Path::new(file_name)).map_err(|e| e.to_string())?;
    // The signature goes with the bundle: the updater keeps it beside the new version,
    // where the next update's replay check finds it.
    let sig_path = PathBuf::from(format!("{}.minisig", ready.path.display()));
    agent_extract::atomic::write(
        &sig_path,
        ready.verified.signature.to_file_string().as_bytes(),
    )
    .map_err(|e| e.to_string())?;
    state::write_journal(home, &journal).map_err(|e| e.to_string())?;

    let report = Report {
        id: ctx.agent_id.to_owned(),
        from: journal.from.to_string(),
        to: journal.to.to_string(),
        status: UpdateStatus::Installing,
        error: None,
    };
    if let Err(e) = ctx.client.report_from(&report, ready.bundle_from).await {
        tracing::warn!("could not report INSTALLING ({e}); it is not needed for the update");
    }

    let updater = agent_extract::os::updater_to_run(&ready.path, &link);
    match spawn_updater(home, updater, std::process::id()) {
        Ok(pid) => Ok(pid),
        Err(e) => {
            // No updater runs: the journal must not claim one does.
            let _ = fs::remove_file(home.journal());
            Err(e)
        }
    }
}

/// How the agent's part of a hand-off ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandOff {
    /// The new version is wholly unpacked and the updater is about to stop this agent:
    /// leave (exit 0; the updater holds `run/update.lock`, so the wrapper lets us go).
    Leave,
    /// The update stopped before it needed this agent gone (why, in an operator's
    /// words): keep serving; the refusal brings the next attempt.
    Stay(String),
}

/// One look at the journal during a hand-off to `to`: `None` to keep waiting. The agent
/// leaves only when the journal says the new version is wholly on disk (a phase past
/// `Prepared` that is not a rollback): an abandoned, rolled-back, vanished or
/// unreadable transaction, or an updater gone without a word, keeps it serving.
pub fn hand_off_step(
    journal: &Result<Option<Journal>, String>,
    to: &AgentVersion,
    updater_alive: bool,
) -> Option<HandOff> {
    let gone = || {
        HandOff::Stay(format!(
            "the updater ended before it had unpacked {to} (see logs/update.log)"
        ))
    };
    match journal {
        Ok(Some(j)) if j.to == *to => match j.phase {
            Phase::Stopping | Phase::Unpacked | Phase::Switched | Phase::Committed => {
                Some(HandOff::Leave)
            }
            Phase::RolledBack => Some(HandOff::Stay(
                j.reason
                    .as_deref()
                    .map(agent_updater::outcome::explain)
                    .unwrap_or_else(|| "the updater rolled it back".into()),
            )),
            Phase::Prepared | Phase::RollingBack if updater_alive => None,
            Phase::Prepared | Phase::RollingBack => Some(gone()),
        },
        Ok(Some(j)) => Some(HandOff::Stay(format!(
            "the journal now names another update ({} -> {})",
            j.from, j.to
        ))),
        Ok(None) => Some(HandOff::Stay("the update journal is gone".into())),
        Err(_) if updater_alive => None,
        Err(e) => Some(HandOff::Stay(format!(
            "{}; the updater ended",
            agent_updater::outcome::explain(e)
        ))),
    }
}

/// Keeps the agent serving while the updater unpacks, and says whether to leave (see
/// [`hand_off_step`]). After `patience` it stays: the updater stops it when it is ready.
pub async fn wait_for_unpack(
    home: &AgentHome,
    to: &AgentVersion,
    updater_pid: u32,
    patience: Duration,
) -> HandOff {
    let end = tokio::time::Instant::now() + patience;
    while tokio::time::Instant::now() < end {
        let journal = state::read_journal(home).map_err(|e| e.to_string());
        let alive = agent_updater::process::is_alive(updater_pid);
        if let Some(verdict) = hand_off_step(&journal, to, alive) {
            return verdict;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    HandOff::Stay(format!(
        "the updater has not unpacked {to} within {patience:?}; serving on until it stops this agent"
    ))
}

/// Starts `<bundle> --update=<home> --wait-pid=<pid>`; the updater calls setsid(2) first
/// thing, so it outlives this process and its session.
pub fn spawn_updater(home: &AgentHome, bundle: &Path, wait_pid: u32) -> Result<u32, String> {
    fs::create_dir_all(home.logs()).map_err(|e| e.to_string())?;
    let out_path = home.logs().join("update.out");
    let out = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&out_path)
        .map_err(|e| format!("{}: {e}", out_path.display()))?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(bundle);
    crate::os::detach(&mut cmd);
    let child = cmd
        .arg(format!("--update={}", home.root().display()))
        .arg(format!("--wait-pid={wait_pid}"))
        .current_dir(home.root())
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("cannot start the updater {}: {e}", bundle.display()))?;
    let pid = child.id();
    reap(child);
    Ok(pid)
}

/// Waits for a child on a thread of its own: an agent that stays after its updater
/// ended (an abandoned update) must not keep it as a zombie.
pub fn reap(mut child: std::process::Child) {
    std::thread::spawn(move || child.wait());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundle_for_another_platform_is_refused_and_static_musl_of_the_arch_taken() {
        let secret = agent_protocol::minisign::SecretKey::generate().unwrap();
        let key = secret.public_key();
        let version: AgentVersion = "2.0.0+2".parse().unwrap();
        let sha256 = "ab".repeat(32);
        let info = VersionInfo {
            server_version: String::new(),
            server_build: String::new(),
            agent: version.clone(),
            md5: "0".repeat(32),
            sha256: sha256.clone(),
            size: 1,
            filename: "agent-bundle-2.0.0".into(),
            download_source: None,
        };
        let running = tempfile::tempdir().unwrap();
        let check = |platform: &str| {
            let claim = BundleClaim {
                version: version.clone(),
                platform: platform.into(),
                sha256: sha256.clone(),
                signed_at: 1,
            };
            let signature = secret
                .sign_prehashed(&[0; 64], &claim.to_comment())
                .unwrap();
            check_claim(
                &key,
                Path::new("update.pub"),
                &signature,
                &info,
                running.path(),
            )
        };
        assert!(check(layout::PLATFORM).is_ok());
        if let Some(musl) = platform::static_musl(layout::PLATFORM) {
            assert!(check(&musl).is_ok(), "the static musl bundle of its arch");
        }
        let e = check("riscv64gc-unknown-linux-gnu").unwrap_err();
        assert!(e.starts_with("a bundle for another platform"), "{e}");
        assert!(e.contains(layout::PLATFORM), "{e}");
    }

    fn journal(phase: Phase, reason: Option<&str>) -> Result<Option<Journal>, String> {
        Ok(Some(Journal {
            from: "1.0.0+1".parse().unwrap(),
            to: "2.0.0+2".parse().unwrap(),
            bundle_sha256: "ab".repeat(32),
            bundle_path: "/x".into(),
            phase,
            started_at: 1,
            boot_count: 0,
            reason: reason.map(str::to_owned),
            from_dir: None,
            trust: None,
            ended_at: None,
            abandoned: phase == Phase::RolledBack,
            planned_stop: None,
        }))
    }

    #[test]
    fn the_agent_leaves_only_once_the_new_version_is_unpacked() {
        let to: AgentVersion = "2.0.0+2".parse().unwrap();
        for phase in [Phase::Stopping, Phase::Unpacked, Phase::Switched] {
            assert_eq!(
                hand_off_step(&journal(phase, None), &to, true),
                Some(HandOff::Leave)
            );
        }
        assert_eq!(
            hand_off_step(&journal(Phase::Prepared, None), &to, true),
            None
        );
        let unreadable: Result<Option<Journal>, String> = Err("garbled".into());
        assert_eq!(hand_off_step(&unreadable, &to, true), None);
    }

    #[test]
    fn an_abandoned_update_keeps_the_agent_serving_and_says_why() {
        let to: AgentVersion = "2.0.0+2".parse().unwrap();
        let full = "x/LICENSE: No space left on device (os error 28)";
        let Some(HandOff::Stay(why)) =
            hand_off_step(&journal(Phase::RolledBack, Some(full)), &to, true)
        else {
            panic!("an abandoned update sent the agent away")
        };
        assert_eq!(why, format!("the disk is full ({full})"));
        // The updater died (or gave up) with the journal still at Prepared.
        let Some(HandOff::Stay(why)) = hand_off_step(&journal(Phase::Prepared, None), &to, false)
        else {
            panic!("a vanished updater sent the agent away")
        };
        assert!(
            why.contains("ended before it had unpacked 2.0.0+2"),
            "{why}"
        );
        assert!(matches!(
            hand_off_step(&Ok(None), &to, true),
            Some(HandOff::Stay(_))
        ));
        let other: AgentVersion = "3.0.0+3".parse().unwrap();
        assert!(matches!(
            hand_off_step(&journal(Phase::Stopping, None), &other, true),
            Some(HandOff::Stay(_))
        ));
        assert!(matches!(
            hand_off_step(&Err("garbled".into()), &to, false),
            Some(HandOff::Stay(_))
        ));
    }
}
