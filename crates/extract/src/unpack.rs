//! The one safe unpacker for distribution tarballs (`.tar.gz`).
//!
//! The `tar` crate alone is not safe for untrusted input: it skips `..` entries silently,
//! creates symlinks that point anywhere, and trusts declared sizes. Here every entry is
//! checked before anything is written:
//!
//! - only regular files, directories and symlinks; hard links, devices, FIFOs and sparse
//!   files are refused;
//! - no absolute paths, no `..` components, no duplicates, nothing beneath a symlink;
//! - a symlink target is relative, may climb with leading `..` only as far as the link's
//!   own depth, and then only descends (so it cannot escape even through other links);
//! - the number of entries and the bytes really written (not the sizes declared) are capped.
//!
//! Everything is written into a fresh staging directory that the caller then moves into
//! place with a rename; on any error the staging directory is removed.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt, symlink};
use std::path::{Component, Path, PathBuf};
use std::sync::mpsc;

use tar::EntryType;

use crate::error::{Error, IoContext, Result};

/// Caps on what one archive may do to the disk.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_entries: u64,
    pub max_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_entries: 100_000,
            max_bytes: 4 * 1024 * 1024 * 1024,
        }
    }
}

/// What an unpack wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Unpacked {
    pub entries: u64,
    pub bytes: u64,
}

/// Options of one unpack.
#[derive(Default)]
pub struct Options<'a> {
    pub limits: Limits,
    /// Every entry must live under this top directory, which is stripped.
    pub root: Option<&'a str>,
    /// Flush the written files to stable storage before returning.
    pub sync: bool,
    /// Called with the bytes written so far.
    pub progress: Option<&'a mut dyn FnMut(u64)>,
}

/// Unpacks a gzip-compressed tarball into `dest`, which must not exist yet.
pub fn unpack_tar_gz(
    reader: impl Read + Send,
    dest: &Path,
    options: Options<'_>,
) -> Result<Unpacked> {
    fs::create_dir(dest).at(dest)?;
    let result = std::thread::scope(|scope| {
        // Inflate on a second thread, like `tar xzf` piping from gzip, so that
        // decompression and writing overlap.
        let (tx, rx) = mpsc::sync_channel::<io::Result<Vec<u8>>>(4);
        scope.spawn(move || inflate_into(reader, tx));
        let mut archive = tar::Archive::new(ChannelReader::new(rx));
        unpack_entries(&mut archive, dest, options)
    });
    if result.is_err() {
        // Nothing a refused archive wrote survives. remove_dir_all does not follow links.
        let _ = fs::remove_dir_all(dest);
    }
    result
}

/// Reads one regular file of at most `max` bytes from a gzip-compressed tarball without
/// writing anything to disk: what an installer needs to know (the key the bundle ships)
/// before it decides to unpack. `wanted` is relative to `root`. `None` if absent.
pub fn read_entry(
    reader: impl Read,
    root: Option<&str>,
    wanted: &Path,
    max: u64,
    limits: Limits,
) -> Result<Option<Vec<u8>>> {
    let decoder = flate2::read::GzDecoder::new(io::BufReader::with_capacity(256 * 1024, reader));
    let mut archive = tar::Archive::new(decoder);
    let entries = archive
        .entries()
        .map_err(|e| Error::Corrupt(format!("not a tar archive: {e}")))?;
    for (n, entry) in entries.enumerate() {
        if n as u64 >= limits.max_entries {
            return Err(Error::TooManyEntries {
                limit: limits.max_entries,
            });
        }
        let entry = entry.map_err(|e| Error::Corrupt(format!("bad tar entry: {e}")))?;
        if entry.header().entry_type() != EntryType::Regular {
            continue;
        }
        let raw = entry
            .path()
            .map_err(|e| Error::Corrupt(format!("entry path: {e}")))?
            .into_owned();
        let Ok(Some(rel)) = safe_relative_path(&raw, root) else {
            continue;
        };
        if rel != wanted {
            continue;
        }
        let mut out = Vec::new();
        entry
            .take(max + 1)
            .read_to_end(&mut out)
            .map_err(|e| Error::Corrupt(format!("reading {}: {e}", raw.display())))?;
        if out.len() as u64 > max {
            return Err(Error::TooLarge {
                entry: raw.display().to_string(),
                limit: max,
            });
        }
        return Ok(Some(out));
    }
    Ok(None)
}

fn inflate_into(reader: impl Read, tx: mpsc::SyncSender<io::Result<Vec<u8>>>) {
    let mut decoder =
        flate2::read::GzDecoder::new(io::BufReader::with_capacity(256 * 1024, reader));
    loop {
        let mut buf = vec![0u8; 1024 * 1024];
        let filled = match agent_protocol::digest::fill(&mut decoder, &mut buf) {
            Ok(n) => n,
            Err(e) => {
                let _ = tx.send(Err(e));
                return;
            }
        };
        if filled == 0 {
            return;
        }
        buf.truncate(filled);
        if tx.send(Ok(buf)).is_err() {
            return; // the consumer stopped: an entry was refused
        }
    }
}

struct ChannelReader {
    rx: mpsc::Receiver<io::Result<Vec<u8>>>,
    buf: Vec<u8>,
    pos: usize,
}

impl ChannelReader {
    fn new(rx: mpsc::Receiver<io::Result<Vec<u8>>>) -> Self {
        Self {
            rx,
            buf: Vec::new(),
            pos: 0,
        }
    }
}

impl Read for ChannelReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.pos == self.buf.len() {
            match self.rx.recv() {
                Ok(Ok(buf)) => {
                    self.buf = buf;
                    self.pos = 0;
                }
                Ok(Err(e)) => return Err(e),
                Err(_) => return Ok(0),
            }
        }
        let n = out.len().min(self.buf.len() - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

fn unsafe_entry(entry: &str, reason: impl Into<String>) -> Error {
    Error::UnsafeEntry {
        entry: entry.to_owned(),
        reason: reason.into(),
    }
}

fn unpack_entries<R: Read>(
    archive: &mut tar::Archive<R>,
    dest: &Path,
    mut options: Options<'_>,
) -> Result<Unpacked> {
    let limits = options.limits;
    let mut seen: HashSet<PathBuf> = HashSet::new();
    let mut links: HashSet<PathBuf> = HashSet::new();
    let mut stats = Unpacked::default();
    let mut buf = vec![0u8; 256 * 1024];

    let entries = archive
        .entries()
        .map_err(|e| Error::Corrupt(format!("not a tar archive: {e}")))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| Error::Corrupt(format!("bad tar entry: {e}")))?;
        stats.entries += 1;
        if stats.entries > limits.max_entries {
            return Err(Error::TooManyEntries {
                limit: limits.max_entries,
            });
        }
        let raw_path = entry
            .path()
            .map_err(|e| Error::Corrupt(format!("entry path: {e}")))?
            .into_owned();
        let shown = raw_path.to_string_lossy().into_owned();
        let kind = entry.header().entry_type();
        if matches!(kind, EntryType::XGlobalHeader | EntryType::XHeader) {
            continue;
        }
        let Some(rel) =
            safe_relative_path(&raw_path, options.root).map_err(|r| unsafe_entry(&shown, r))?
        else {
            continue; // the root directory itself
        };
        if !seen.insert(rel.clone()) {
            return Err(unsafe_entry(&shown, "duplicate entry"));
        }
        if let Some(link) = rel.ancestors().skip(1).find(|a| links.contains(*a)) {
            return Err(unsafe_entry(
                &shown,
                format!("lies beneath the symlink {}", link.display()),
            ));
        }
        let target = dest.join(&rel);
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent).at(parent)?;
        }
        let mode = entry.header().mode().unwrap_or(0o644);
        match kind {
            EntryType::Regular | EntryType::Continuous => {
                let mut file = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&target)
                    .at(&target)?;
                loop {
                    let n = match entry.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(Error::Corrupt(format!("reading {shown}: {e}"))),
                    };
                    stats.bytes += n as u64;
                    if stats.bytes > limits.max_bytes {
                        return Err(Error::TooLarge {
                            entry: shown,
                            limit: limits.max_bytes,
                        });
                    }
                    file.write_all(&buf[..n]).at(&target)?;
                    if let Some(progress) = options.progress.as_mut() {
                        progress(stats.bytes);
                    }
                }
                // Owner-writable only, whatever the archive asked for; no setuid.
                file.set_permissions(fs::Permissions::from_mode(mode & 0o755 | 0o400))
                    .at(&target)?;
            }
            EntryType::Directory => match fs::create_dir(&target) {
                Ok(()) => {
                    fs::set_permissions(&target, fs::Permissions::from_mode(mode & 0o755 | 0o700))
                        .at(&target)?;
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && target.is_dir() => {}
                Err(e) => return Err(e).at(&target),
            },
            EntryType::Symlink => {
                let link_target = entry
                    .link_name()
                    .map_err(|e| Error::Corrupt(format!("link target of {shown}: {e}")))?
                    .ok_or_else(|| unsafe_entry(&shown, "symlink without a target"))?
                    .into_owned();
                check_link_target(&rel, &link_target).map_err(|r| unsafe_entry(&shown, r))?;
                symlink(&link_target, &target).at(&target)?;
                links.insert(rel);
            }
            EntryType::Link => return Err(unsafe_entry(&shown, "hard links are not allowed")),
            EntryType::Char | EntryType::Block => {
                return Err(unsafe_entry(&shown, "device files are not allowed"));
            }
            EntryType::Fifo => return Err(unsafe_entry(&shown, "FIFOs are not allowed")),
            other => {
                return Err(unsafe_entry(
                    &shown,
                    format!("entry type {other:?} is not allowed"),
                ));
            }
        }
    }
    if options.sync {
        let dir = File::open(dest).at(dest)?;
        nix::unistd::syncfs(&dir)
            .map_err(io::Error::from)
            .at(dest)?;
    }
    Ok(stats)
}

/// The normalised relative path of an entry, `None` for the root itself, or why not.
fn safe_relative_path(
    raw: &Path,
    root: Option<&str>,
) -> std::result::Result<Option<PathBuf>, String> {
    let mut out = PathBuf::new();
    for component in raw.components() {
        match component {
            Component::Normal(c) => out.push(c),
            Component::CurDir => {}
            Component::ParentDir => return Err("path contains '..'".into()),
            Component::RootDir | Component::Prefix(_) => return Err("absolute path".into()),
        }
    }
    let Some(root) = root else {
        return Ok((!out.as_os_str().is_empty()).then_some(out));
    };
    match out.strip_prefix(root) {
        Ok(rest) if rest.as_os_str().is_empty() => Ok(None),
        Ok(rest) => Ok(Some(rest.to_path_buf())),
        Err(_) if out.as_os_str().is_empty() => Ok(None),
        Err(_) => Err(format!("outside the top directory {root}/")),
    }
}

/// A link may climb with leading `..` no higher than its own directory's depth, then only
/// descend. Links cannot be reached beneath other links (checked by the caller), so the
/// climb happens through real directories, and every link resolves inside the tree.
fn check_link_target(link: &Path, target: &Path) -> std::result::Result<(), String> {
    if target.as_os_str().is_empty() {
        return Err("symlink with an empty target".into());
    }
    let depth = link.components().count().saturating_sub(1);
    let mut climbed = 0;
    let mut descended = false;
    for component in target.components() {
        match component {
            Component::ParentDir if !descended => {
                climbed += 1;
                if climbed > depth {
                    return Err(format!(
                        "symlink target {} leaves the tree",
                        target.display()
                    ));
                }
            }
            Component::ParentDir => {
                return Err(format!(
                    "symlink target {} has '..' after a name",
                    target.display()
                ));
            }
            Component::Normal(_) => descended = true,
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => {
                return Err(format!("symlink target {} is absolute", target.display()));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_are_normalised_or_refused() {
        let ok = |s: &str| safe_relative_path(Path::new(s), Some("agent")).unwrap();
        assert_eq!(ok("agent/bin/agent"), Some(PathBuf::from("bin/agent")));
        assert_eq!(ok("./agent/./bin"), Some(PathBuf::from("bin")));
        assert_eq!(ok("agent/"), None);
        assert_eq!(ok("./"), None);
        for bad in ["../x", "agent/../../x", "/etc/passwd", "other/x"] {
            assert!(
                safe_relative_path(Path::new(bad), Some("agent")).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn link_targets_stay_inside() {
        let check = |l: &str, t: &str| check_link_target(Path::new(l), Path::new(t));
        assert!(check("bin/agent", "../lib/agent").is_ok());
        assert!(check("a", "b/c").is_ok());
        assert!(check("a", "../x").is_err());
        assert!(check("bin/a", "../../x").is_err());
        assert!(check("bin/a", "/etc").is_err());
        assert!(check("a", "s/..").is_err());
        assert!(check("a", "").is_err());
    }
}
