//! `agent-bundle keygen`: a signing key pair in minisign's format; `agent-bundle
//! rotate-key`: a statement, signed by the old key, that hands trust to a new one.

use std::fs;
use std::path::{Path, PathBuf};

use agent_extract::atomic;
use agent_protocol::layout;
use agent_protocol::minisign::{PublicKey, SecretKey, Signature};
use agent_protocol::rotation::{self, Statement};

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
    let text = atomic::read_text(path, 64 * 1024)?;
    let key = SecretKey::parse(&text)
        .map_err(|e| BundleError::Invalid(format!("{}: {e}", path.display())))?;
    if let Ok(meta) = fs::metadata(path)
        && agent_extract::os::mode_of(&meta) & 0o077 != 0
    {
        tracing::warn!(
            "{} can be read by other users; chmod 600 it and keep it off servers",
            path.display()
        );
    }
    Ok(key)
}

pub struct RotationFiles {
    pub signature: PathBuf,
    pub public: PathBuf,
    pub from: String,
    pub to: String,
}

/// Writes `rotation-<new id>.minisig` (the new public key file signed by the old key)
/// and `rotation-<new id>.pub` (the exact bytes signed) into `out`.
pub fn rotate_key(
    old_key: &Path,
    new_pub: &Path,
    out: &Path,
    signed_at: u64,
) -> Result<RotationFiles> {
    let old = read_secret_key(old_key)?;
    let new_file = atomic::read_limited(new_pub, rotation::MAX_KEY_FILE as u64)?;
    let new_key = std::str::from_utf8(&new_file)
        .map_err(|_| "not text".to_owned())
        .and_then(|t| PublicKey::parse(t).map_err(|e| e.to_string()))
        .map_err(|e| {
            BundleError::Invalid(format!(
                "--new {}: {e}; pass the new key's public half (update.pub from `agent-bundle keygen`)",
                new_pub.display()
            ))
        })?;
    let statement = Statement::sign(&old, &new_file, signed_at)
        .map_err(|e| BundleError::Invalid(e.to_string()))?;
    fs::create_dir_all(out).at(out)?;
    let (pub_name, sig_name) = layout::rotation_file_names(&new_key.key_id().to_string());
    let public = out.join(pub_name);
    let signature = out.join(sig_name);
    atomic::write_with_mode(&public, &statement.key_file, Some(0o644))?;
    atomic::write_with_mode(
        &signature,
        statement.signature.to_file_string().as_bytes(),
        Some(0o644),
    )?;
    Ok(RotationFiles {
        signature,
        public,
        from: old.key_id().to_string(),
        to: new_key.key_id().to_string(),
    })
}

/// Reads a statement `rotate-key` wrote, given either of its two files.
pub fn read_rotation(path: &Path) -> Result<Statement> {
    let shown = path.display().to_string();
    let (sig_path, pub_path) = if let Some(stem) = shown.strip_suffix(".pub") {
        (PathBuf::from(format!("{stem}.minisig")), path.to_path_buf())
    } else if let Some(stem) = shown.strip_suffix(".minisig") {
        (path.to_path_buf(), PathBuf::from(format!("{stem}.pub")))
    } else {
        return Err(BundleError::Invalid(format!(
            "--rotation {shown}: expected a rotation-<key id>.minisig written by `agent-bundle rotate-key`"
        )));
    };
    let sig_text = atomic::read_text(&sig_path, 4096)?;
    let signature = Signature::parse(&sig_text)
        .map_err(|e| BundleError::Invalid(format!("{}: {e}", sig_path.display())))?;
    let key_file = atomic::read_limited(&pub_path, rotation::MAX_KEY_FILE as u64).map_err(|e| {
        BundleError::Invalid(format!(
            "the rotation statement {} needs the public key it signs beside it: {e} (rotate-key writes both files)",
            sig_path.display()
        ))
    })?;
    let statement = Statement {
        key_file,
        signature,
    };
    rotation::RotationClaim::parse(statement.signature.trusted_comment())
        .and_then(|_| statement.new_key())
        .map_err(|e| BundleError::Invalid(format!("{}: {e}", sig_path.display())))?;
    Ok(statement)
}
