//! `agent-bundle keygen`: a signing key pair in minisign's format.

use std::fs;
use std::path::{Path, PathBuf};

use agent_extract::atomic;
use agent_protocol::minisign::SecretKey;

use crate::error::{BundleError, IoContext, Result};

pub const SECRET_KEY_FILE: &str = "update.key";
pub const PUBLIC_KEY_FILE: &str = "update.pub";

pub struct KeyFiles {
    pub secret: PathBuf,
    pub public: PathBuf,
    pub key_id: String,
}

/// Writes `update.key` (mode 0600) and `update.pub` into `out`.
pub fn keygen(out: &Path, force: bool) -> Result<KeyFiles> {
    fs::create_dir_all(out).at(out)?;
    let secret = out.join(SECRET_KEY_FILE);
    let public = out.join(PUBLIC_KEY_FILE);
    if !force {
        for path in [&secret, &public] {
            if path.exists() {
                return Err(BundleError::Exists(path.clone()));
            }
        }
    }
    let key = SecretKey::generate()?;
    atomic::write_with_mode(&secret, key.to_file_string().as_bytes(), Some(0o600))?;
    atomic::write_with_mode(
        &public,
        key.public_key().to_file_string().as_bytes(),
        Some(0o644),
    )?;
    Ok(KeyFiles {
        secret,
        public,
        key_id: key.key_id().to_string(),
    })
}

/// Reads a secret key file, warning if others can read it.
pub fn read_secret_key(path: &Path) -> Result<SecretKey> {
    use std::os::unix::fs::PermissionsExt;
    let text = atomic::read_text(path, 64 * 1024)?;
    let key = SecretKey::parse(&text)
        .map_err(|e| BundleError::Invalid(format!("{}: {e}", path.display())))?;
    if let Ok(meta) = fs::metadata(path)
        && meta.permissions().mode() & 0o077 != 0
    {
        tracing::warn!(
            "{} can be read by other users; chmod 600 it and keep it off servers",
            path.display()
        );
    }
    Ok(key)
}
