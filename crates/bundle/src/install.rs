//! `agent-bundle-<v> --install[=PREFIX]`: a fresh agent from the bundle that runs it.
//!
//! The whole `PREFIX/agent/` tree is built in a staging directory beside it (same
//! filesystem) and renamed into place at the end, so a failed install leaves nothing.
//! With `--force` over an existing agent, only the version directory and `current` are
//! replaced; the operator's `conf/`, `data/` and `logs/` are kept (missing conf files
//! are added from the new defaults, `conf/workload/` only when it is absent).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use agent_extract::payload::{self, BundleFacts, Payload, PayloadProblem};
use agent_extract::unpack::{self, Options};
use agent_extract::verify::{self, Trust};
use agent_extract::{atomic, current};
use agent_protocol::layout::{self, AgentHome};
use agent_protocol::minisign::{PublicKey, Signature};
use agent_protocol::rotation::Chain;

use agent_updater::process;

use crate::error::{BundleError, IoContext, Result};
use crate::progress::Progress;

pub struct InstallRequest<'a> {
    /// The running bundle.
    pub bundle: &'a Path,
    pub prefix: &'a Path,
    pub trust_key: Option<&'a Path>,
    pub force: bool,
    /// A private CA to pin for HTTPS servers: copied to `conf/ca.pem`.
    pub ca_file: Option<&'a Path>,
    /// Presented when registering with a server that requires enrollment.
    pub enroll_token: Option<&'a str>,
    /// `agent.group`: the rollout group and configuration set this machine joins.
    pub group: Option<&'a str>,
    /// `server.urls`: the one server the new agent talks to (the install script's own).
    pub server_url: Option<&'a str>,
    /// `server.proxy`: `http://[user:password@]host:port` or `none`.
    pub proxy: Option<&'a str>,
    /// `--label KEY=VALUE`s, as given: set in `agent.labels` (others there are kept).
    pub labels: &'a [String],
    /// `--check-server`: the server must say it enrolls the new agent before it is put
    /// in place (what the MSI asks, so that a wrong token fails the install).
    pub check_server: bool,
}

/// Where `--ca-file` is kept, relative to AGENT_HOME.
pub const CA_FILE: &str = "conf/ca.pem";

/// Which key the new agent trusts for its updates, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrustSource {
    /// `--trust-key FILE`, and the bundle's signature verified with it.
    Operator { path: PathBuf, key_id: String },
    /// The key shipped in the bundle; its signature verified with it when present.
    Bundle {
        key_id: String,
        signature_checked: bool,
    },
}

pub struct Installed {
    pub home: PathBuf,
    pub facts: BundleFacts,
    pub trust: TrustSource,
    /// The key rotation followed from the trusted key to the bundle's signer.
    pub chain: Option<Chain>,
}

pub fn install(req: &InstallRequest<'_>) -> Result<Installed> {
    let mut payload = open_payload(req.bundle)?;
    let facts = payload.facts()?;
    if facts.platform != layout::PLATFORM {
        return Err(BundleError::Invalid(format!(
            "this bundle carries agent {} for {}, but this machine runs {}; download the bundle made for {}",
            facts.version,
            facts.platform,
            layout::PLATFORM,
            layout::PLATFORM
        )));
    }
    // An interrupted install removes what it staged (the check is between steps and
    // while unpacking); one killed outright is cleaned up by the next install.
    let cancel = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        let _ = signal_hook::flag::register(signal, Arc::clone(&cancel));
    }
    let check = || {
        if cancel.load(Ordering::Relaxed) {
            Err(BundleError::Extract(agent_extract::Error::Interrupted))
        } else {
            Ok(())
        }
    };
    // What the operator gave is checked before anything is made.
    let ca_pem = match req.ca_file {
        Some(path) => Some(read_ca(path)?),
        None => None,
    };
    if let Some(token) = req.enroll_token
        && (token.trim().is_empty() || token.contains(['\n', '\r', '"']))
    {
        return Err(BundleError::Invalid(
            "--enroll-token must be one line of text without quotes".into(),
        ));
    }
    if let Some(group) = req.group
        && !valid_group(group)
    {
        return Err(BundleError::Invalid(format!(
            "--group {group:?}: a group name is letters, digits, '.', '_' and '-' (at most 64)"
        )));
    }
    let labels = agent_protocol::labels::parse_assignments(req.labels)
        .map_err(|e| BundleError::Invalid(format!("--label: {e}")))?;
    if let Some(url) = req.server_url
        && (!(url.starts_with("http://") || url.starts_with("https://"))
            || url.contains(|c: char| c.is_whitespace() || c == '"'))
    {
        return Err(BundleError::Invalid(
            "--server-url must be one http:// or https:// URL".into(),
        ));
    }
    if let Some(proxy) = req.proxy
        && !valid_proxy(proxy)
    {
        return Err(BundleError::Invalid(format!(
            "--proxy {}: give http://host:port, http://user:password@host:port, or none",
            shown_proxy(proxy)
        )));
    }
    // Trust is decided before a byte of the payload is unpacked.
    let signature_path = PathBuf::from(format!("{}.minisig", req.bundle.display()));
    let (trust, chain) = decide_trust(req, &mut payload, &facts, &signature_path)?;
    // The installation trusts the key that signs its bundles: the end of a rotation
    // chain, or the operator's key.
    let key_file = match (&chain, req.trust_key) {
        (Some(chain), _) => Some(chain.end_file.clone()),
        (None, Some(path)) => Some(atomic::read_limited(path, 64 * 1024)?),
        (None, None) => None,
    };
    check()?;

    let mut made = MadeDirs::create(req.prefix)?;
    let prefix = agent_extract::os::canonical(req.prefix).at(req.prefix)?;
    remove_stale_staging(&prefix);
    let home = AgentHome::new(prefix.join(layout::DIST_ROOT));
    let exists = home.root().exists();
    // What `agent uninstall` leaves (conf/, data/, logs/, no `current`) is no installed
    // agent: installed over, keeping the operator's files, without --force.
    let leftovers = exists && fs::symlink_metadata(home.current()).is_err();
    if exists && !req.force && !leftovers {
        return Err(BundleError::Exists(home.root().to_path_buf()));
    }
    if exists {
        refuse_if_running(&home)?;
    }

    let staging = tempfile::Builder::new()
        .prefix(&format!("{STAGING_PREFIX}{}-", std::process::id()))
        .tempdir_in(&prefix)
        .at(&prefix)?;
    let version_stage = staging.path().join("version");
    let unpacked_size = payload.dist_unpacked_size_hint(&facts.version).unwrap_or(0);
    let mut progress = Progress::new(format!("Installing agent {}", facts.version), unpacked_size);
    let mut on_progress = |n: u64| progress.update(n);
    unpack::unpack_tar_gz(
        payload.dist(&facts.version)?,
        &version_stage,
        Options {
            root: Some(layout::DIST_ROOT),
            sync: true,
            progress: Some(&mut on_progress),
            cancel: Some(&cancel),
            ..Options::default()
        },
    )?;
    progress.finish();
    check()?;
    check_unpacked_version(&version_stage, &facts)?;

    if signature_path.exists() {
        atomic::copy_file(
            &signature_path,
            &version_stage.join(layout::VERSION_SIGNATURE_FILE),
        )?;
    }
    // The bundle stays with its version: the base of the next update's delta. Only a
    // saving, so an install without it (a full disk) goes on.
    if let Err(e) =
        crate::service::keep_bundle(req.bundle, &version_stage.join(layout::KEPT_BUNDLE_FILE))
    {
        tracing::warn!(
            "not keeping the bundle for deltas ({e}); the first update downloads the whole bundle"
        );
    }
    atomic::write(
        &version_stage.join(layout::COMPLETE_MARKER),
        facts.version.to_string().as_bytes(),
    )?;

    let server = ServerSettings {
        ca_pem: ca_pem.as_deref(),
        enroll_token: req.enroll_token,
        group: req.group,
        server_url: req.server_url,
        proxy: req.proxy,
        labels: &labels,
    };
    if exists {
        let operator_key = match trust {
            TrustSource::Operator { .. } => key_file.as_deref(),
            TrustSource::Bundle { .. } => None,
        };
        reinstall_over(&home, &facts, &version_stage, operator_key)?;
        server.apply(&home)?;
        retire_chain(&home, chain.as_ref())?;
        if req.check_server {
            check_enrollment(&home, &facts)?;
        }
    } else {
        fresh_tree(staging.path(), &facts, &version_stage, key_file.as_deref())?;
        let staged = AgentHome::new(staging.path().join(layout::DIST_ROOT));
        server.apply(&staged)?;
        retire_chain(&staged, chain.as_ref())?;
        // Asked of the staged tree: a refusal leaves nothing behind.
        if req.check_server {
            check_enrollment(&staged, &facts)?;
        }
        fs::rename(staging.path().join("agent"), home.root()).at(home.root())?;
        atomic::fsync_dir(&prefix)?;
    }
    made.keep();
    Ok(Installed {
        home: home.root().to_path_buf(),
        facts,
        trust,
        chain,
    })
}

/// `agent check-enrollment` of the (staged) home's version: the server's words when it
/// refuses, or cannot be reached, are the install's error.
fn check_enrollment(home: &AgentHome, facts: &BundleFacts) -> Result<()> {
    let agent = home.version_dir(&facts.version).join("bin").join(format!(
        "agent{}",
        agent_protocol::platform::exe_suffix(&facts.platform)
    ));
    let out = std::process::Command::new(&agent)
        .arg("--home")
        .arg(home.root())
        .arg("check-enrollment")
        .stdin(std::process::Stdio::null())
        .output()
        .at(&agent)?;
    if out.status.success() {
        return Ok(());
    }
    let said = format!(
        "{} {}",
        String::from_utf8_lossy(&out.stdout).trim(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Err(BundleError::Invalid(format!(
        "the agent cannot join its server: {}; nothing was installed (fix --server-url, --enroll-token or --proxy and install again)",
        said.trim()
    )))
}

/// The keys a rotation passed are refused from the start, as an updated agent refuses them.
fn retire_chain(home: &AgentHome, chain: Option<&Chain>) -> Result<()> {
    if let Some(chain) = chain {
        agent_updater::state::retire_keys(home, chain.retired(), chain.end.key_id())
            .map_err(|e| BundleError::Invalid(format!("cannot write data/retired-keys: {e}")))?;
    }
    Ok(())
}

/// A CA file that looks like one: PEM with at least one certificate.
fn read_ca(path: &Path) -> Result<Vec<u8>> {
    let pem = atomic::read_limited(path, 1024 * 1024)
        .map_err(|e| BundleError::Invalid(format!("cannot use --ca-file: {e}")))?;
    if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
        return Err(BundleError::Invalid(format!(
            "--ca-file {}: no PEM certificate in it (-----BEGIN CERTIFICATE-----)",
            path.display()
        )));
    }
    Ok(pem)
}

/// A rollout group name: what `group:NAME` waves and configuration sets can name, and
/// safe to write into TOML and to show.
fn valid_group(group: &str) -> bool {
    !group.is_empty()
        && group.len() <= 64
        && group
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// What `--ca-file`, `--enroll-token`, `--group` and `--server-url` put in the new
/// agent's `conf/`.
struct ServerSettings<'a> {
    ca_pem: Option<&'a [u8]>,
    enroll_token: Option<&'a str>,
    group: Option<&'a str>,
    server_url: Option<&'a str>,
    proxy: Option<&'a str>,
    labels: &'a agent_protocol::labels::Labels,
}

impl ServerSettings<'_> {
    /// Copies the CA to `conf/ca.pem` and sets `server.ca-file`,
    /// `server.enrollment-token`, `server.urls` and `agent.group` in `conf/agent.toml`,
    /// keeping everything else in it.
    fn apply(&self, home: &AgentHome) -> Result<()> {
        if self.ca_pem.is_none()
            && self.enroll_token.is_none()
            && self.group.is_none()
            && self.server_url.is_none()
            && self.proxy.is_none()
            && self.labels.is_empty()
        {
            return Ok(());
        }
        let conf = home.agent_toml();
        let text = match fs::read_to_string(&conf) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(e).at(&conf),
        };
        let mut doc: toml_edit::DocumentMut = text
            .parse()
            .map_err(|e| BundleError::Invalid(format!("{} does not parse: {e}", conf.display())))?;
        if !doc.contains_table("server") {
            doc["server"] = toml_edit::table();
        }
        if let Some(pem) = self.ca_pem {
            atomic::write(&home.root().join(CA_FILE), pem)?;
            doc["server"]["ca-file"] = toml_edit::value(CA_FILE);
        }
        if let Some(token) = self.enroll_token {
            doc["server"]["enrollment-token"] = toml_edit::value(token.trim());
        }
        if let Some(url) = self.server_url {
            let mut urls = toml_edit::Array::new();
            urls.push(url.trim_end_matches('/'));
            doc["server"]["urls"] = toml_edit::value(urls);
        }
        if let Some(proxy) = self.proxy {
            doc["server"]["proxy"] = toml_edit::value(proxy.trim());
        }
        if let Some(group) = self.group {
            if !doc.contains_table("agent") {
                doc["agent"] = toml_edit::table();
            }
            doc["agent"]["group"] = toml_edit::value(group);
        }
        if !self.labels.is_empty() {
            if !doc.contains_table("agent") {
                doc["agent"] = toml_edit::table();
            }
            let kept = doc["agent"]
                .get("labels")
                .is_some_and(|l| l.is_inline_table() || l.is_table());
            if !kept {
                doc["agent"]["labels"] = toml_edit::value(toml_edit::InlineTable::new());
            }
            for (key, value) in self.labels {
                doc["agent"]["labels"][key.as_str()] = toml_edit::value(value.as_str());
            }
        }
        fs::create_dir_all(home.conf()).at(home.conf())?;
        atomic::write_with_mode(&conf, doc.to_string().as_bytes(), Some(0o600))?;
        Ok(())
    }
}

/// `none`, or `http://[user:password@]host:port` (the agent reads it again, fully, at
/// every start; this catches what would stop it there).
fn valid_proxy(proxy: &str) -> bool {
    let proxy = proxy.trim();
    if proxy.eq_ignore_ascii_case("none") {
        return true;
    }
    if proxy.contains(|c: char| c.is_whitespace() || c == '"' || c == '\\') {
        return false;
    }
    let Some(rest) = proxy.strip_prefix("http://") else {
        return false;
    };
    let host_port = rest.trim_end_matches('/');
    let host_port = host_port.rsplit_once('@').map_or(host_port, |(_, hp)| hp);
    host_port.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty() && !host.contains('/') && port.parse::<u16>().is_ok_and(|p| p > 0)
    })
}

/// A proxy URL with its password, if any, replaced by `***`.
pub fn shown_proxy(proxy: &str) -> String {
    let proxy = proxy.trim();
    let Some((scheme, rest)) = proxy.split_once("://") else {
        return proxy.to_owned();
    };
    match rest.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
            None => proxy.to_owned(),
        },
        None => proxy.to_owned(),
    }
}

/// Staging directories of installs: `.agent-install-<pid>-<random>` under the prefix.
const STAGING_PREFIX: &str = ".agent-install-";

/// Removes the staging directories of installs whose process is gone (killed, or from a
/// version that did not clean up); a live install's is left alone.
fn remove_stale_staging(prefix: &Path) {
    let Ok(entries) = fs::read_dir(prefix) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(STAGING_PREFIX) else {
            continue;
        };
        let owner = rest
            .split('-')
            .next()
            .and_then(|pid| pid.parse::<u32>().ok());
        let stale = match owner {
            Some(pid) => !process::is_alive(pid),
            // No pid in the name: an older installer's, stale once it is an hour old.
            None => entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > std::time::Duration::from_secs(3600)),
        };
        if stale && entry.file_type().is_ok_and(|t| t.is_dir()) {
            match fs::remove_dir_all(entry.path()) {
                Ok(()) => tracing::warn!(
                    "removed {} left by an interrupted install",
                    entry.path().display()
                ),
                Err(e) => tracing::warn!("cannot remove {}: {e}", entry.path().display()),
            }
        }
    }
}

/// The bundle's payload, or a message that tells a bare stub from a cut download.
pub fn open_payload(bundle: &Path) -> Result<Payload> {
    let e = match Payload::open(bundle) {
        Ok(payload) => return Ok(payload),
        // A payload that is there but wrong says so itself.
        Err(e @ agent_extract::Error::NotABundle { .. }) => return Err(e.into()),
        Err(e) => e,
    };
    Err(match payload::diagnose(bundle) {
        PayloadProblem::Missing => BundleError::NoPayload,
        PayloadProblem::Damaged { trailing } => BundleError::Damaged(format!(
            "{} is truncated or damaged: {trailing} bytes follow the program, but they are not a whole zip payload",
            bundle.display()
        )),
        PayloadProblem::Unknown => {
            BundleError::Damaged(format!("{} is truncated or damaged: {e}", bundle.display()))
        }
    })
}

/// `--force` replaces `current` under a running agent only if nothing runs it.
fn refuse_if_running(home: &AgentHome) -> Result<()> {
    let running = process::running_agent(home)
        .map(|pid| format!("agent pid {pid}"))
        .or_else(|| process::running_supervisor(home).map(|pid| format!("its wrapper pid {pid}")));
    match running {
        Some(what) => Err(BundleError::Invalid(format!(
            "the agent at {} is running ({what}); stop it first with {}, then install again",
            home.root().display(),
            crate::service::stop_command(home.root())
        ))),
        None => Ok(()),
    }
}

/// The directories an install created for its prefix; removed again (if still empty)
/// unless the install succeeds, so that a failed install leaves nothing behind.
struct MadeDirs {
    dirs: Vec<PathBuf>,
}

impl MadeDirs {
    fn create(prefix: &Path) -> Result<Self> {
        let absolute = std::path::absolute(prefix).at(prefix)?;
        let dirs: Vec<PathBuf> = absolute
            .ancestors()
            .take_while(|dir| !dir.exists())
            .map(Path::to_path_buf)
            .collect();
        fs::create_dir_all(&absolute).at(&absolute)?;
        Ok(Self { dirs })
    }

    fn keep(&mut self) {
        self.dirs.clear();
    }
}

impl Drop for MadeDirs {
    fn drop(&mut self) {
        // Deepest first; remove_dir refuses a directory that is not empty.
        for dir in &self.dirs {
            let _ = fs::remove_dir(dir);
        }
    }
}

fn check_unpacked_version(version_dir: &Path, facts: &BundleFacts) -> Result<()> {
    let inner = agent_extract::payload::installed_version(version_dir)?;
    if inner != facts.version {
        return Err(BundleError::Invalid(format!(
            "the bundle says {} but its distribution says {inner}; the bundle is inconsistent",
            facts.version
        )));
    }
    let agent = format!(
        "agent{}",
        agent_protocol::platform::exe_suffix(&facts.platform)
    );
    if !version_dir.join("bin").join(&agent).is_file() {
        return Err(BundleError::Invalid(format!(
            "the distribution has no bin/{agent}"
        )));
    }
    Ok(())
}

/// Which key to trust, with the bundle's signature checked against it when there is one.
/// Reads at most the key the bundle ships; unpacks nothing.
fn decide_trust(
    req: &InstallRequest<'_>,
    payload: &mut Payload,
    facts: &BundleFacts,
    signature_path: &Path,
) -> Result<(TrustSource, Option<Chain>)> {
    let signature = if signature_path.exists() {
        let text = atomic::read_text(signature_path, 64 * 1024)?;
        Some(
            Signature::parse(&text)
                .map_err(|e| BundleError::Invalid(format!("{}: {e}", signature_path.display())))?,
        )
    } else {
        None
    };
    if let Some(key_path) = req.trust_key {
        let key = read_public_key(key_path)
            .map_err(|e| BundleError::Invalid(format!("cannot use --trust-key: {e}")))?;
        let Some(signature) = signature else {
            return Err(BundleError::Invalid(format!(
                "--trust-key needs the bundle's signature beside it: download {} too",
                signature_path.display()
            )));
        };
        let verified = verify::verify_file(req.bundle, &signature, &Trust::key(&key))?;
        return Ok((
            TrustSource::Operator {
                path: key_path.to_path_buf(),
                key_id: key.key_id().to_string(),
            },
            verified.chain,
        ));
    }
    let shipped = unpack::read_entry(
        payload.dist(&facts.version)?,
        Some(layout::DIST_ROOT),
        Path::new(SHIPPED_KEY),
        64 * 1024,
        unpack::Limits::default(),
    )?
    .ok_or_else(|| {
        BundleError::Invalid(format!(
            "the bundle ships no {SHIPPED_KEY}; pass --trust-key with the signing key's public half"
        ))
    })?;
    let key = PublicKey::parse(&String::from_utf8_lossy(&shipped))
        .map_err(|e| BundleError::Invalid(format!("the bundle's {SHIPPED_KEY}: {e}")))?;
    let (signature_checked, chain) = match signature {
        Some(signature) => (
            true,
            verify::verify_file(req.bundle, &signature, &Trust::key(&key))?.chain,
        ),
        None => (false, None),
    };
    Ok((
        TrustSource::Bundle {
            key_id: key.key_id().to_string(),
            signature_checked,
        },
        chain,
    ))
}

/// The key a distribution ships, relative to its root.
const SHIPPED_KEY: &str = "conf.default/update.pub";

pub fn read_public_key(path: &Path) -> Result<PublicKey> {
    let text = atomic::read_text(path, 64 * 1024)?;
    PublicKey::parse(&text).map_err(|e| BundleError::Invalid(format!("{}: {e}", path.display())))
}

/// Lays out a whole new AGENT_HOME under `staging/agent`.
fn fresh_tree(
    staging: &Path,
    facts: &BundleFacts,
    version_stage: &Path,
    key_file: Option<&[u8]>,
) -> Result<()> {
    let home = AgentHome::new(staging.join(layout::DIST_ROOT));
    for dir in [
        home.root().to_path_buf(),
        home.versions(),
        home.conf(),
        home.data(),
        home.logs(),
        home.run(),
    ] {
        fs::create_dir_all(&dir).at(&dir)?;
    }
    let version_dir = home.version_dir(&facts.version);
    fs::rename(version_stage, &version_dir).at(&version_dir)?;
    populate_conf(&home, &version_dir, key_file)?;
    set_private(&home.data())?;
    current::point(&home.current(), &facts.version.to_string())?;
    Ok(())
}

/// `--force` over an existing agent: replace this version's directory and `current`,
/// keep what the operator owns.
fn reinstall_over(
    home: &AgentHome,
    facts: &BundleFacts,
    version_stage: &Path,
    operator_key: Option<&[u8]>,
) -> Result<()> {
    for dir in [
        home.versions(),
        home.conf(),
        home.data(),
        home.logs(),
        home.run(),
    ] {
        fs::create_dir_all(&dir).at(&dir)?;
    }
    let version_dir = home.version_dir(&facts.version);
    let fresh = home.versions().join(format!(".{}.new", facts.version));
    let _ = fs::remove_dir_all(&fresh);
    fs::rename(version_stage, &fresh).at(&fresh)?;
    if version_dir.exists() {
        let old = home.versions().join(format!(".{}.old", facts.version));
        let _ = fs::remove_dir_all(&old);
        fs::rename(&version_dir, &old).at(&old)?;
        fs::rename(&fresh, &version_dir).at(&version_dir)?;
        current::point(&home.current(), &facts.version.to_string())?;
        let _ = fs::remove_dir_all(&old);
    } else {
        fs::rename(&fresh, &version_dir).at(&version_dir)?;
        current::point(&home.current(), &facts.version.to_string())?;
    }
    populate_conf(home, &version_dir, None)?;
    if let Some(key) = operator_key {
        let dest = home.conf().join("update.pub");
        if dest.exists() {
            atomic::copy_file(&dest, &home.conf().join("update.pub.bak"))?;
        }
        atomic::write_with_mode(&dest, key, Some(0o644))?;
    }
    Ok(())
}

/// Copies each file of `conf.default/` into `conf/` unless the operator already has it,
/// and `conf.default/workload/` to `conf/workload/` unless that exists;
/// `update.pub` is `key_file` when given (`--trust-key`, or the end of a key rotation).
fn populate_conf(home: &AgentHome, version_dir: &Path, key_file: Option<&[u8]>) -> Result<()> {
    let defaults = version_dir.join("conf.default");
    if defaults.is_dir() {
        for entry in fs::read_dir(&defaults).at(&defaults)? {
            let entry = entry.at(&defaults)?;
            if !entry.file_type().at(entry.path())?.is_file() {
                continue;
            }
            let dest = home.conf().join(entry.file_name());
            if !dest.exists() {
                atomic::copy_file(&entry.path(), &dest)?;
            }
        }
    }
    if let Some(key) = key_file {
        atomic::write_with_mode(&home.conf().join("update.pub"), key, Some(0o644))?;
    }
    seed_workload_conf(home, &defaults)?;
    Ok(())
}

/// The workload's configuration directory, seeded from `conf.default/workload/` when the
/// operator has none; an existing one is the operator's (or the server's) and is kept.
fn seed_workload_conf(home: &AgentHome, defaults: &Path) -> Result<()> {
    let seed = defaults.join(WORKLOAD_CONF);
    let dest = home.conf().join(WORKLOAD_CONF);
    if seed.is_dir() && fs::symlink_metadata(&dest).is_err() {
        atomic::copy_tree(&seed, &dest)?;
    }
    Ok(())
}

/// `conf.default/workload/` → `conf/workload/` (the default `workload.config-dir`).
const WORKLOAD_CONF: &str = "workload";

fn set_private(dir: &Path) -> Result<()> {
    agent_extract::os::set_path_mode(dir, 0o700).at(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_set_in_agent_toml_beside_what_is_there() {
        let dir = tempfile::tempdir().unwrap();
        let home = AgentHome::new(dir.path());
        fs::create_dir_all(home.conf()).unwrap();
        fs::write(
            home.agent_toml(),
            "[agent]\nname = \"web-1\"\nlabels = { region = \"eu\", env = \"dev\" }\n",
        )
        .unwrap();
        let labels =
            agent_protocol::labels::parse_assignments(&["env=prod", "team.example/owner=ops"])
                .unwrap();
        let settings = ServerSettings {
            ca_pem: None,
            enroll_token: None,
            group: None,
            server_url: None,
            proxy: None,
            labels: &labels,
        };
        settings.apply(&home).unwrap();
        let text = fs::read_to_string(home.agent_toml()).unwrap();
        let doc: toml_edit::DocumentMut = text.parse().unwrap();
        let agent = &doc["agent"];
        assert_eq!(agent["name"].as_str(), Some("web-1"), "{text}");
        let written = &agent["labels"];
        assert_eq!(written["env"].as_str(), Some("prod"), "{text}");
        assert_eq!(written["region"].as_str(), Some("eu"), "{text}");
        assert_eq!(
            written["team.example/owner"].as_str(),
            Some("ops"),
            "{text}"
        );
        // A fresh install: no [agent] table, no labels yet.
        fs::write(home.agent_toml(), "[server]\nurls = [\"http://s:1\"]\n").unwrap();
        settings.apply(&home).unwrap();
        let text = fs::read_to_string(home.agent_toml()).unwrap();
        let doc: toml_edit::DocumentMut = text.parse().unwrap();
        assert_eq!(
            doc["agent"]["labels"]["env"].as_str(),
            Some("prod"),
            "{text}"
        );
        assert!(text.contains("labels = {"), "{text}");
    }

    #[test]
    fn a_proxy_is_checked_and_shown_without_its_password() {
        for good in [
            "none",
            "http://proxy.corp:3128",
            "http://alice:s3cret@proxy.corp:3128/",
            "http://127.0.0.1:8080",
        ] {
            assert!(valid_proxy(good), "{good}");
        }
        for bad in [
            "proxy.corp:3128",
            "https://proxy.corp:3128",
            "http://proxy.corp",
            "http://alice:s3cret@proxy.corp:0",
            "http://:3128",
            "http://proxy.corp:3128 x",
        ] {
            assert!(!valid_proxy(bad), "{bad}");
        }
        assert_eq!(
            shown_proxy("http://alice:s3cret@proxy.corp:3128"),
            "http://alice:***@proxy.corp:3128"
        );
        assert_eq!(shown_proxy("http://proxy:1"), "http://proxy:1");
    }
}
