//! `stamp`: fakes versions so anyone can test version skew.
//!
//! - `stamp agent` rewrites the version an installed agent believes it runs. The version
//!   directory is copied under its new name and `current` flipped to it, so that the
//!   directory name and `agent-version.properties` agree and the real version can later
//!   be installed beside it.
//! - `stamp server` rewrites a server's bundle as another version and signs it again.
//!
//! It owns nothing; it must never leave a half-written file, and refuses (changing
//! nothing) a malformed version, a missing target or a bundle that does not verify.

use std::fs;
use std::io;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use agent_bundle::pack::{self, PackRequest};
use agent_extract::atomic;
use agent_extract::payload::{self, Payload};
use agent_extract::unpack::{self, Options};
use agent_extract::verify;
use agent_protocol::AgentVersion;
use agent_protocol::layout::{self, AgentHome};
use agent_protocol::minisign::Signature;
use agent_protocol::properties::Properties;

pub mod cli;

#[derive(Debug, thiserror::Error)]
pub enum StampError {
    #[error("{0:?} is not a version: {1}")]
    BadVersion(String, String),
    #[error("{0}")]
    Missing(String),
    #[error("{0}")]
    Refused(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Extract(#[from] agent_extract::Error),
    #[error(transparent)]
    Bundle(#[from] agent_bundle::BundleError),
}

pub type Result<T, E = StampError> = std::result::Result<T, E>;

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> StampError + '_ {
    move |source| StampError::Io {
        path: path.to_owned(),
        source,
    }
}

pub fn parse_version(version: &str, build: &str) -> Result<AgentVersion> {
    AgentVersion::new(version, build)
        .map_err(|e| StampError::BadVersion(format!("{version}+{build}"), e.to_string()))
}

/// The installed agent's version directory (what `current` points at).
fn current_dir(home: &Path) -> Result<PathBuf> {
    let home = AgentHome::new(home);
    agent_extract::current::read_dir(&home.current()).map_err(|e| {
        StampError::Missing(format!(
            "no installed agent at {}: {} ({e}); pass the AGENT_HOME that --install made",
            home.root().display(),
            home.current().display()
        ))
    })
}

/// The version an installed agent believes it runs.
pub fn show_agent(home: &Path) -> Result<AgentVersion> {
    Ok(payload::installed_version(&current_dir(home)?)?)
}

/// Stamps the agent at `home` as `version`; returns the version it had.
pub fn stamp_agent(home: &Path, version: &AgentVersion) -> Result<AgentVersion> {
    let dir = current_dir(home)?;
    let was = payload::installed_version(&dir)?;
    let agent_home = AgentHome::new(home);
    let props = version_properties(version);
    let name = version.to_string();
    if dir.file_name().is_some_and(|n| n == name.as_str()) {
        atomic::write(&dir.join(layout::AGENT_VERSION_FILE), props.as_bytes())?;
        return Ok(was);
    }
    let target = agent_home.versions().join(&name);
    if target.exists() {
        return Err(StampError::Refused(format!(
            "{} already exists; stamp another version or remove it",
            target.display()
        )));
    }
    let staging = agent_home.versions().join(format!(".stamp-{name}"));
    if staging.exists() {
        fs::remove_dir_all(&staging).map_err(io_at(&staging))?;
    }
    let result = copy_tree(&dir, &staging)
        .and_then(|()| {
            Ok(atomic::write(
                &staging.join(layout::AGENT_VERSION_FILE),
                props.as_bytes(),
            )?)
        })
        .and_then(|()| fs::rename(&staging, &target).map_err(io_at(&target)));
    if let Err(e) = result {
        let _ = fs::remove_dir_all(&staging);
        return Err(e);
    }
    agent_extract::current::point(&agent_home.current(), &name)?;
    fs::remove_dir_all(&dir).map_err(io_at(&dir))?;
    Ok(was)
}

fn version_properties(version: &AgentVersion) -> String {
    let mut p = Properties::new();
    p.set(layout::PROP_AGENT_VERSION, &version.version_str());
    p.set(layout::PROP_AGENT_BUILD, version.build());
    p.to_text()
}

/// Copies a version directory: files (with their modes), directories and symlinks.
fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    fs::create_dir(to).map_err(io_at(to))?;
    for entry in fs::read_dir(from).map_err(io_at(from))? {
        let entry = entry.map_err(io_at(from))?;
        let src = entry.path();
        let dest = to.join(entry.file_name());
        let kind = entry.file_type().map_err(io_at(&src))?;
        if kind.is_dir() {
            copy_tree(&src, &dest)?;
        } else if kind.is_symlink() {
            let target = fs::read_link(&src).map_err(io_at(&src))?;
            symlink(&target, &dest).map_err(io_at(&dest))?;
        } else if kind.is_file() {
            fs::copy(&src, &dest).map_err(io_at(&dest))?;
        }
    }
    let mode = fs::metadata(from)
        .map_err(io_at(from))?
        .permissions()
        .mode();
    fs::set_permissions(to, fs::Permissions::from_mode(mode)).map_err(io_at(to))
}

/// What `stamp server` did.
pub struct StampedBundle {
    pub was: AgentVersion,
    pub bundle: PathBuf,
    pub sha256: String,
}

/// The one bundle in a server's download directory, and its signature.
fn find_bundle(dir: &Path) -> Result<(PathBuf, PathBuf)> {
    let entries = fs::read_dir(dir).map_err(|e| {
        StampError::Missing(format!(
            "cannot read the bundle directory {}: {e}",
            dir.display()
        ))
    })?;
    let mut bundles: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.is_file()
                && p.file_name().is_some_and(|n| {
                    let n = n.to_string_lossy();
                    n.starts_with("agent-bundle-") && !n.ends_with(".minisig")
                })
        })
        .collect();
    match bundles.len() {
        0 => Err(StampError::Missing(format!(
            "no agent-bundle-<version> in {}",
            dir.display()
        ))),
        1 => {
            let bundle = bundles.remove(0);
            let sig = PathBuf::from(format!("{}.minisig", bundle.display()));
            if !sig.is_file() {
                return Err(StampError::Missing(format!(
                    "{} has no signature beside it ({})",
                    bundle.display(),
                    sig.display()
                )));
            }
            Ok((bundle, sig))
        }
        n => Err(StampError::Refused(format!(
            "{n} bundles in {}; a server serves exactly one, remove the others first",
            dir.display()
        ))),
    }
}

/// Rewrites the server's bundle in `dir` as `version`, signed again with `key_path`.
pub fn stamp_server(dir: &Path, version: &AgentVersion, key_path: &Path) -> Result<StampedBundle> {
    let key = agent_bundle::keygen::read_secret_key(key_path)?;
    let (bundle, sig_path) = find_bundle(dir)?;
    let sig = Signature::parse(&atomic::read_text(&sig_path, 4096)?)
        .map_err(|e| StampError::Refused(format!("{}: {e}", sig_path.display())))?;
    verify::verify_file(&bundle, &sig, &verify::Trust::key(&key.public_key())).map_err(|e| {
        StampError::Refused(format!(
            "{} does not verify with the key {} ({e}); refusing to sign it again",
            bundle.display(),
            key_path.display()
        ))
    })?;
    let mut payload = Payload::open(&bundle)?;
    let facts = payload.facts()?;
    // A key rotation the bundle carried is carried on: it still ends at this key.
    let rotations = payload.rotations()?;

    // Everything is built in a hidden directory beside the bundle, then renamed in.
    let work = tempfile::Builder::new()
        .prefix(".stamp-")
        .tempdir_in(dir)
        .map_err(io_at(dir))?;
    let dist = work.path().join("dist");
    unpack::unpack_tar_gz(
        payload.dist(&facts.version)?,
        &dist,
        Options {
            root: Some(layout::DIST_ROOT),
            ..Options::default()
        },
    )?;
    let out = work.path().join("out");
    let packed = pack::pack(&PackRequest {
        dist: &dist,
        version: version.clone(),
        platform: facts.platform.clone(),
        key: &key,
        out_dir: &out,
        // pack takes the stub from a bundle, leaving its payload behind.
        stub: &bundle,
        signed_at: None,
        rotations: &rotations,
        // A restamp keeps the distribution as it was, its shipped key included: stamp
        // makes version skew for tests, and the key it signs with is the tester's.
        allow_other_key: true,
    })?;
    let name = layout::bundle_file_name(version);
    let new_bundle = dir.join(&name);
    let new_sig = dir.join(layout::signature_file_name(&name));
    fs::rename(&packed.signature, &new_sig).map_err(io_at(&new_sig))?;
    fs::rename(&packed.bundle, &new_bundle).map_err(io_at(&new_bundle))?;
    if bundle != new_bundle {
        fs::remove_file(&bundle).map_err(io_at(&bundle))?;
        fs::remove_file(&sig_path).map_err(io_at(&sig_path))?;
    }
    let cache = dir.join("server-agent-versions.properties");
    match fs::remove_file(&cache) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_at(&cache)(e)),
    }
    atomic::fsync_dir(dir)?;
    Ok(StampedBundle {
        was: facts.version,
        bundle: new_bundle,
        sha256: packed.digests.sha256_hex(),
    })
}
