//! `agent-bundle-<v> --install[=PREFIX]`: a fresh agent from the bundle that runs it.
//!
//! The whole `PREFIX/agent/` tree is built in a staging directory beside it (same
//! filesystem) and renamed into place at the end, so a failed install leaves nothing.
//! With `--force` over an existing agent, only the version directory and `current` are
//! replaced; the operator's `conf/`, `data/` and `logs/` are kept (missing conf files
//! are added from the new defaults).

use std::fs;
use std::path::{Path, PathBuf};

use agent_extract::atomic;
use agent_extract::payload::{BundleFacts, Payload};
use agent_extract::unpack::{self, Options};
use agent_extract::verify;
use agent_protocol::layout::{self, AgentHome};
use agent_protocol::minisign::{PublicKey, Signature};

use crate::error::{BundleError, IoContext, Result};
use crate::progress::Progress;

pub struct InstallRequest<'a> {
    /// The running bundle.
    pub bundle: &'a Path,
    pub prefix: &'a Path,
    pub trust_key: Option<&'a Path>,
    pub force: bool,
}

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
}

pub fn install(req: &InstallRequest<'_>) -> Result<Installed> {
    let mut payload = Payload::open(req.bundle).map_err(|_| BundleError::NoPayload)?;
    let facts = payload.facts()?;
    fs::create_dir_all(req.prefix).at(req.prefix)?;
    let prefix = fs::canonicalize(req.prefix).at(req.prefix)?;
    let home = AgentHome::new(prefix.join(layout::DIST_ROOT));
    let exists = home.root().exists();
    if exists && !req.force {
        return Err(BundleError::Exists(home.root().to_path_buf()));
    }

    // Unpack and check the version before deciding anything about trust.
    let staging = tempfile::Builder::new()
        .prefix(".agent-install-")
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
            ..Options::default()
        },
    )?;
    progress.finish();
    check_unpacked_version(&version_stage, &facts)?;

    let signature_path = PathBuf::from(format!("{}.minisig", req.bundle.display()));
    let trust = decide_trust(req, &version_stage, &signature_path)?;
    if signature_path.exists() {
        atomic::copy_file(
            &signature_path,
            &version_stage.join(layout::VERSION_SIGNATURE_FILE),
        )?;
    }
    atomic::write(
        &version_stage.join(layout::COMPLETE_MARKER),
        facts.version.to_string().as_bytes(),
    )?;

    if exists {
        reinstall_over(&home, &facts, &version_stage, &trust, req.trust_key)?;
    } else {
        fresh_tree(staging.path(), &facts, &version_stage, req.trust_key)?;
        fs::rename(staging.path().join("agent"), home.root()).at(home.root())?;
        atomic::fsync_dir(&prefix)?;
    }
    Ok(Installed {
        home: home.root().to_path_buf(),
        facts,
        trust,
    })
}

fn check_unpacked_version(version_dir: &Path, facts: &BundleFacts) -> Result<()> {
    let inner = agent_extract::payload::installed_version(version_dir)?;
    if inner != facts.version {
        return Err(BundleError::Invalid(format!(
            "the bundle says {} but its distribution says {inner}; the bundle is inconsistent",
            facts.version
        )));
    }
    if !version_dir.join("bin/agent").is_file() {
        return Err(BundleError::Invalid(
            "the distribution has no bin/agent".into(),
        ));
    }
    Ok(())
}

fn decide_trust(
    req: &InstallRequest<'_>,
    version_dir: &Path,
    signature_path: &Path,
) -> Result<TrustSource> {
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
        let key = read_public_key(key_path)?;
        let Some(signature) = signature else {
            return Err(BundleError::Invalid(format!(
                "--trust-key needs the bundle's signature beside it: download {} too",
                signature_path.display()
            )));
        };
        verify::verify_file(req.bundle, &signature, &key)?;
        return Ok(TrustSource::Operator {
            path: key_path.to_path_buf(),
            key_id: key.key_id().to_string(),
        });
    }
    let key = read_public_key(&version_dir.join("conf.default/update.pub"))?;
    let signature_checked = match signature {
        Some(signature) => {
            verify::verify_file(req.bundle, &signature, &key)?;
            true
        }
        None => false,
    };
    Ok(TrustSource::Bundle {
        key_id: key.key_id().to_string(),
        signature_checked,
    })
}

pub fn read_public_key(path: &Path) -> Result<PublicKey> {
    let text = atomic::read_text(path, 64 * 1024)?;
    PublicKey::parse(&text).map_err(|e| BundleError::Invalid(format!("{}: {e}", path.display())))
}

/// Lays out a whole new AGENT_HOME under `staging/agent`.
fn fresh_tree(
    staging: &Path,
    facts: &BundleFacts,
    version_stage: &Path,
    trust_key: Option<&Path>,
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
    populate_conf(&home, &version_dir, trust_key)?;
    set_private(&home.data())?;
    atomic::replace_symlink(&home.current(), &relative_version_dir(facts))?;
    Ok(())
}

/// `--force` over an existing agent: replace this version's directory and `current`,
/// keep what the operator owns.
fn reinstall_over(
    home: &AgentHome,
    facts: &BundleFacts,
    version_stage: &Path,
    trust: &TrustSource,
    trust_key: Option<&Path>,
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
        atomic::replace_symlink(&home.current(), &relative_version_dir(facts))?;
        let _ = fs::remove_dir_all(&old);
    } else {
        fs::rename(&fresh, &version_dir).at(&version_dir)?;
        atomic::replace_symlink(&home.current(), &relative_version_dir(facts))?;
    }
    populate_conf(home, &version_dir, None)?;
    if let (TrustSource::Operator { .. }, Some(key)) = (trust, trust_key) {
        let dest = home.conf().join("update.pub");
        if dest.exists() {
            atomic::copy_file(&dest, &home.conf().join("update.pub.bak"))?;
        }
        atomic::copy_file(key, &dest)?;
    }
    Ok(())
}

/// Copies each file of `conf.default/` into `conf/` unless the operator already has it;
/// `update.pub` comes from `--trust-key` when given.
fn populate_conf(home: &AgentHome, version_dir: &Path, trust_key: Option<&Path>) -> Result<()> {
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
    if let Some(key) = trust_key {
        atomic::copy_file(key, &home.conf().join("update.pub"))?;
    }
    Ok(())
}

fn set_private(dir: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).at(dir)
}

fn relative_version_dir(facts: &BundleFacts) -> PathBuf {
    Path::new("versions").join(facts.version.to_string())
}
