//! `agent-bundle pack`: a distribution directory into a signed, self-installing bundle.
//!
//! The bundle is the stub executable, then a zip whose offsets count from the start of
//! the file (so both the kernel and `unzip` are happy), holding the properties, the
//! distribution tarball (stored, it is already compressed), README.txt and LICENSE.
//! The detached signature's trusted comment names version, build, platform, sha256 and
//! the signing time.

use std::fs::{self, File};
use std::io::{self, BufWriter, Seek, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use agent_extract::atomic;
use agent_protocol::digest::Digests;
use agent_protocol::layout::{self, AGENT_VERSION_FILE};
use agent_protocol::minisign::{BundleClaim, SecretKey};
use agent_protocol::properties::Properties;
use agent_protocol::rotation::{self, Statement};
use agent_protocol::version::AgentVersion;
use zip::write::SimpleFileOptions;

use crate::error::{BundleError, IoContext, Result};
use crate::shipped_key::{self, Verdict};

/// The key a distribution ships, relative to its root: what a fresh install trusts.
const SHIPPED_KEY: &str = "conf.default/update.pub";

pub struct PackRequest<'a> {
    pub dist: &'a Path,
    pub version: AgentVersion,
    pub platform: String,
    pub key: &'a SecretKey,
    pub out_dir: &'a Path,
    /// The executable put in front of the payload.
    pub stub: &'a Path,
    /// Unix seconds for `signed-at`; `None` is now.
    pub signed_at: Option<u64>,
    /// Key rotation statements, oldest first, leading to `key`.
    pub rotations: &'a [Statement],
    /// Pack although `conf.default/update.pub` is another key with no rotation to
    /// `key` (see [`shipped_key`]).
    pub allow_other_key: bool,
}

pub struct Packed {
    pub bundle: PathBuf,
    pub signature: PathBuf,
    pub digests: Digests,
    pub claim: BundleClaim,
    /// What fresh installs trust when it is not simply the signing key.
    pub shipped_key: Verdict,
}

pub fn pack(req: &PackRequest<'_>) -> Result<Packed> {
    rotation::check_links(req.rotations, req.key.key_id())
        .map_err(|e| BundleError::Invalid(format!("--rotation: {e}")))?;
    for required in ["bin", "README.txt", "LICENSE"] {
        if !req.dist.join(required).exists() {
            return Err(BundleError::Invalid(format!(
                "{} has no {required}; a distribution is laid out like versions/<v>/ (bin/agent, README.txt, LICENSE, conf.default/)",
                req.dist.display()
            )));
        }
    }
    let shipped_path = req.dist.join(SHIPPED_KEY);
    let shipped = if shipped_path.exists() {
        Some(crate::install::read_public_key(&shipped_path)?)
    } else {
        None
    };
    let shipped_key = shipped_key::verdict(
        shipped.as_ref(),
        &req.key.public_key(),
        req.rotations,
        req.allow_other_key,
    );
    if let Verdict::Refused { shipped, signer } = shipped_key {
        return Err(BundleError::Invalid(shipped_key::refusal(
            &shipped_path,
            shipped,
            signer,
        )));
    }
    fs::create_dir_all(req.out_dir).at(req.out_dir)?;
    let tarball = tempfile::Builder::new()
        .prefix(".dist-")
        .tempfile_in(req.out_dir)
        .at(req.out_dir)?;
    write_tarball(req, tarball.as_file())?;

    let name = layout::bundle_file_name(&req.version);
    let bundle_path = req.out_dir.join(&name);
    let mut bundle = tempfile::Builder::new()
        .prefix(".bundle-")
        .tempfile_in(req.out_dir)
        .at(req.out_dir)?;
    write_bundle(req, tarball.path(), bundle.as_file_mut())?;
    bundle
        .as_file()
        .sync_all()
        .at(bundle.path().to_path_buf())?;

    let digests = Digests::of_reader(File::open(bundle.path()).at(bundle.path().to_path_buf())?)
        .at(bundle.path().to_path_buf())?;
    let claim = BundleClaim {
        version: req.version.clone(),
        platform: req.platform.clone(),
        sha256: digests.sha256_hex(),
        signed_at: req.signed_at.unwrap_or_else(now_secs),
    };
    let signature = req
        .key
        .sign_prehashed(&digests.blake2b, &claim.to_comment())?;
    agent_extract::os::set_file_mode(bundle.as_file(), 0o755).at(&bundle_path)?;
    bundle
        .persist(&bundle_path)
        .map_err(|e| e.error)
        .at(&bundle_path)?;
    let sig_path = req.out_dir.join(layout::signature_file_name(&name));
    // Public: it is served beside the bundle and fetched with wget.
    atomic::write_with_mode(
        &sig_path,
        signature.to_file_string().as_bytes(),
        Some(0o644),
    )?;
    Ok(Packed {
        bundle: bundle_path,
        signature: sig_path,
        digests,
        claim,
        shipped_key,
    })
}

pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The distribution rooted at `agent/`, with `agent-version.properties` written from the
/// requested version (whatever the directory held) and the signing key's public half as
/// `conf.default/update.pub` when the directory has none.
///
/// The tarball is written plain to a scratch file first, then compressed entry by entry
/// (`agent_delta::segmented`) so that a file unchanged between two releases keeps its
/// compressed bytes, and a delta can name them instead of sending them.
fn write_tarball(req: &PackRequest<'_>, out: &File) -> Result<()> {
    let mut plain = tempfile::Builder::new()
        .prefix(".dist-tar-")
        .tempfile_in(req.out_dir)
        .at(req.out_dir)?;
    write_plain_tarball(req, BufWriter::with_capacity(1 << 20, plain.as_file_mut()))?;
    plain
        .as_file_mut()
        .seek(io::SeekFrom::Start(0))
        .at(plain.path().to_path_buf())?;
    let mut gz = BufWriter::with_capacity(1 << 20, out);
    agent_delta::segmented::write_gzip(
        io::BufReader::with_capacity(1 << 20, plain.as_file()),
        &mut gz,
    )
    .at(req.dist)?;
    gz.flush().at(req.dist)?;
    Ok(())
}

fn write_plain_tarball(req: &PackRequest<'_>, out: impl Write) -> Result<()> {
    let mut tar = tar::Builder::new(out);
    // Sparse entries would be refused by the safe unpacker: store holes as zeros.
    tar.sparse(false);
    tar.mode(tar::HeaderMode::Deterministic);
    tar.follow_symlinks(false);

    let mut files = Vec::new();
    walk(req.dist, Path::new(""), &mut files)?;
    files.sort();
    let root = Path::new(layout::DIST_ROOT);
    tar.append_dir(root, req.dist).at(req.dist)?;
    for rel in &files {
        if rel == Path::new(AGENT_VERSION_FILE) {
            continue;
        }
        let src = req.dist.join(rel);
        tar.append_path_with_name(&src, root.join(rel)).at(&src)?;
    }

    let mut props = Properties::new();
    props.set(layout::PROP_AGENT_VERSION, &req.version.version_str());
    props.set(layout::PROP_AGENT_BUILD, req.version.build());
    append_generated(
        &mut tar,
        &root.join(AGENT_VERSION_FILE),
        props.to_text().as_bytes(),
    )?;
    if !req.dist.join(SHIPPED_KEY).exists() {
        let public = req.key.public_key().to_file_string();
        append_generated(&mut tar, &root.join(SHIPPED_KEY), public.as_bytes())?;
    }
    let mut writer = tar.into_inner().at(req.dist)?;
    writer.flush().at(req.dist)?;
    Ok(())
}

fn append_generated<W: Write>(tar: &mut tar::Builder<W>, path: &Path, bytes: &[u8]) -> Result<()> {
    let mut header = tar::Header::new_gnu();
    header.set_size(bytes.len() as u64);
    header.set_mode(0o644);
    header.set_entry_type(tar::EntryType::Regular);
    tar.append_data(&mut header, path, bytes).at(path)
}

/// Relative paths of everything under `dir`, without following symlinks.
fn walk(base: &Path, rel: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let dir = base.join(rel);
    for entry in fs::read_dir(&dir).at(&dir)? {
        let entry = entry.at(&dir)?;
        let rel_child = rel.join(entry.file_name());
        let kind = entry.file_type().at(entry.path())?;
        out.push(rel_child.clone());
        if kind.is_dir() {
            walk(base, &rel_child, out)?;
        }
    }
    Ok(())
}

fn write_bundle(req: &PackRequest<'_>, tarball: &Path, out: &mut File) -> Result<()> {
    let mut stub = File::open(req.stub).at(req.stub)?;
    let stub_len = stub_length(req.stub)?;
    io::copy(&mut io::Read::take(&mut stub, stub_len), out).at(req.stub)?;

    // The zip starts where the stub ends, and records offsets from the file's start.
    let mut zip = zip::ZipWriter::new(BufWriter::with_capacity(1 << 20, &mut *out));
    let text = SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .unix_permissions(0o644);

    let mut props = Properties::new();
    props.set(layout::PROP_LATEST_VERSION, &req.version.version_str());
    props.set(layout::PROP_LATEST_BUILD, req.version.build());
    props.set(layout::PROP_LATEST_PLATFORM, &req.platform);
    let zip_err =
        |e: zip::result::ZipError| BundleError::Invalid(format!("writing the zip payload: {e}"));
    zip.start_file(layout::PROPERTIES_ENTRY, text)
        .map_err(zip_err)?;
    zip.write_all(props.to_text().as_bytes()).at(req.out_dir)?;

    let dist_len = fs::metadata(tarball).at(tarball)?.len();
    let stored = SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Stored)
        .unix_permissions(0o644)
        .large_file(dist_len >= u32::MAX as u64);
    zip.start_file(layout::dist_entry(&req.version), stored)
        .map_err(zip_err)?;
    io::copy(&mut File::open(tarball).at(tarball)?, &mut zip).at(tarball)?;

    for entry in [layout::README_ENTRY, layout::LICENSE_ENTRY] {
        let src = req.dist.join(entry);
        zip.start_file(entry, text).map_err(zip_err)?;
        io::copy(&mut File::open(&src).at(&src)?, &mut zip).at(&src)?;
    }
    for (i, statement) in req.rotations.iter().enumerate() {
        let to = statement
            .new_key()
            .map_err(|e| BundleError::Invalid(format!("--rotation: {e}")))?
            .key_id()
            .to_string();
        let (key_entry, sig_entry) = layout::rotation_entries(i + 1, &to);
        zip.start_file(key_entry, text).map_err(zip_err)?;
        zip.write_all(&statement.key_file).at(req.out_dir)?;
        zip.start_file(sig_entry, text).map_err(zip_err)?;
        zip.write_all(statement.signature.to_file_string().as_bytes())
            .at(req.out_dir)?;
    }
    let mut writer = zip.finish().map_err(zip_err)?;
    writer.flush().at(req.out_dir)?;
    Ok(())
}

/// The stub is the executable without any payload it may already carry, so that a bundle
/// can pack another bundle.
fn stub_length(stub: &Path) -> Result<u64> {
    match agent_extract::payload::Payload::open(stub) {
        Ok(mut payload) => Ok(payload.stub_len()),
        Err(_) => Ok(fs::metadata(stub).at(stub)?.len()),
    }
}
