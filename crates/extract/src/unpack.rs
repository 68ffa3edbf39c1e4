//! The one safe unpacker for distribution tarballs (`.tar.gz`).
//!
//! The `tar` crate alone is not safe for untrusted input: it skips `..` entries silently,
//! creates symlinks that point anywhere, trusts declared sizes, and reads GNU long names
//! and PAX headers whole into memory. Here the archive is walked raw and every entry is
//! checked before anything is written:
//!
//! - only regular files, directories and symlinks; hard links, devices, FIFOs and sparse
//!   files are refused; a directory or a link carries no data;
//! - extension headers (GNU long names and links, PAX records) are read only up to
//!   [`MAX_EXTENSION`] bytes, names up to [`MAX_NAME`], and refusals quote names cut short;
//! - no absolute paths, no `..` components, no duplicates, nothing beneath a symlink;
//! - a symlink target is relative, may climb with leading `..` only as far as the link's
//!   own depth, and then only descends (so it cannot escape even through other links);
//! - the number of entries, the bytes really written, and every byte decompressed (those
//!   the walk skips included) are capped;
//! - after the archive's end there may be only zeros, and nothing after the gzip stream.
//!
//! Everything is written into a fresh staging directory that the caller then moves into
//! place with a rename; on any error the staging directory is removed.

use std::collections::HashSet;
use std::fs;
use std::io::{self, BufRead, Read, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

use tar::EntryType;

use crate::error::{Error, IoContext, Result};

/// The most an extension header (a GNU long name or long link, a set of PAX records) may
/// carry: names far longer than any file system allows fit in it.
pub const MAX_EXTENSION: u64 = 64 * 1024;
/// The longest path or link target accepted.
pub const MAX_NAME: usize = 4096;

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

impl Limits {
    /// Every byte the gzip layer may produce: the files, plus a header and padding per
    /// entry, plus the end of the archive.
    pub fn max_stream(&self) -> u64 {
        self.max_bytes
            .saturating_add(
                self.max_entries
                    .saturating_mul(2 * 512 + MAX_EXTENSION / 32),
            )
            .saturating_add(1 << 20)
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
    /// Set (by a signal handler) to stop the unpack as soon as possible.
    pub cancel: Option<&'a AtomicBool>,
}

/// A name as it may appear in a message: cut short if long, never the whole of a name
/// an archive made huge.
pub fn shown(name: &[u8]) -> String {
    const MAX: usize = 120;
    let text = String::from_utf8_lossy(&name[..name.len().min(MAX)]).into_owned();
    if name.len() > MAX {
        format!("{text}… ({} bytes)", name.len())
    } else {
        text
    }
}

/// Unpacks a gzip-compressed tarball into `dest`, which must not exist yet.
pub fn unpack_tar_gz(
    reader: impl Read + Send,
    dest: &Path,
    options: Options<'_>,
) -> Result<Unpacked> {
    fs::create_dir(dest).at(dest)?;
    let limits = options.limits;
    let result = std::thread::scope(|scope| {
        // Inflate on a second thread, like `tar xzf` piping from gzip, so that
        // decompression and writing overlap.
        let (tx, rx) = mpsc::sync_channel::<io::Result<Vec<u8>>>(4);
        scope.spawn(move || inflate_into(reader, limits.max_stream(), tx));
        let mut archive = tar::Archive::new(ChannelReader::new(rx));
        let stats = unpack_entries(&mut archive, dest, options)?;
        only_zeros_after_the_end(archive.into_inner())?;
        Ok(stats)
    });
    if result.is_err() {
        // Nothing a refused archive wrote survives. remove_dir_all does not follow links.
        let _ = fs::remove_dir_all(dest);
    }
    result
}

/// The most padding accepted after the end of a tar archive (its second end block and
/// the padding to a whole record: 10 KiB from GNU tar by default).
const MAX_TRAILER: u64 = 1 << 20;

/// The end of a tar archive is followed by zeros (its second end block and the padding
/// to a whole record), nothing else, and not gigabytes of them.
fn only_zeros_after_the_end(mut rest: impl Read) -> Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut seen: u64 = 0;
    loop {
        let n = match rest.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(stream_error(e)),
        };
        if buf[..n].iter().any(|b| *b != 0) {
            return Err(Error::Corrupt(
                "data after the end of the tar archive".into(),
            ));
        }
        seen += n as u64;
        if seen > MAX_TRAILER {
            return Err(Error::Corrupt(format!(
                "more than {MAX_TRAILER} bytes of padding after the end of the tar archive"
            )));
        }
    }
}

/// A read error of the archive in `context`: the stream's own refusals keep their meaning.
fn tar_error(e: io::Error, context: &str) -> Error {
    match stream_error(e) {
        Error::Corrupt(m) => Error::Corrupt(format!("{context}: {m}")),
        other => other,
    }
}

/// The decompressed stream's errors keep their meaning (a cap, a second member).
fn stream_error(e: io::Error) -> Error {
    match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<StreamRefusal>())
    {
        Some(StreamRefusal::TooLarge(limit)) => Error::TooLarge {
            entry: "(the compressed stream)".into(),
            limit: *limit,
        },
        Some(StreamRefusal::Trailing) => Error::Corrupt(
            "data after the end of the compressed stream (a second gzip member, or garbage)".into(),
        ),
        None => Error::Corrupt(e.to_string()),
    }
}

#[derive(Debug)]
enum StreamRefusal {
    TooLarge(u64),
    Trailing,
}

impl std::fmt::Display for StreamRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StreamRefusal::TooLarge(n) => write!(f, "more than {n} bytes decompressed"),
            StreamRefusal::Trailing => f.write_str("data after the compressed stream"),
        }
    }
}

impl std::error::Error for StreamRefusal {}

fn refusal(r: StreamRefusal) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, r)
}

/// Inflates one gzip member, at most `cap` bytes of it, and refuses anything after it.
fn inflate_into(reader: impl Read, cap: u64, tx: mpsc::SyncSender<io::Result<Vec<u8>>>) {
    // The bufread decoder consumes only the bytes of its member from the buffer, so
    // what follows it is still there to be found.
    let mut decoder =
        flate2::bufread::GzDecoder::new(io::BufReader::with_capacity(256 * 1024, reader));
    let mut total: u64 = 0;
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
            break;
        }
        total += filled as u64;
        if total > cap {
            let _ = tx.send(Err(refusal(StreamRefusal::TooLarge(cap))));
            return;
        }
        buf.truncate(filled);
        if tx.send(Ok(buf)).is_err() {
            return; // the consumer stopped: an entry was refused
        }
    }
    // One member and nothing after it: what follows would be unpacked by no one, and a
    // careful reader calls an archive with it malformed.
    let mut rest = decoder.into_inner();
    match rest.fill_buf() {
        Ok([]) => {}
        Ok(_) => {
            let _ = tx.send(Err(refusal(StreamRefusal::Trailing)));
        }
        Err(e) => {
            let _ = tx.send(Err(e));
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

/// One entry of the archive after its extension headers were applied.
struct Logical {
    /// The path as the archive names it (raw bytes).
    name: Vec<u8>,
    link: Option<Vec<u8>>,
    kind: EntryType,
    mode: u32,
    size: u64,
}

/// Walks the raw entries of a tar archive, applying GNU long names and links and PAX
/// `path`/`linkpath` records itself, each read only up to [`MAX_EXTENSION`] bytes.
struct Walker<'a, R: Read> {
    entries: tar::Entries<'a, R>,
    limits: Limits,
    seen: u64,
}

impl<'a, R: Read> Walker<'a, R> {
    fn new(archive: &'a mut tar::Archive<R>, limits: Limits) -> Result<Self> {
        let entries = archive
            .entries()
            .map_err(|e| tar_error(e, "not a tar archive"))?
            .raw(true);
        Ok(Self {
            entries,
            limits,
            seen: 0,
        })
    }

    /// The next entry with its data reader, or `None` at the end of the archive.
    fn next(&mut self) -> Result<Option<(Logical, tar::Entry<'a, R>)>> {
        let mut name: Option<Vec<u8>> = None;
        let mut link: Option<Vec<u8>> = None;
        loop {
            let Some(entry) = self.entries.next() else {
                return if name.is_some() || link.is_some() {
                    Err(Error::Corrupt(
                        "the archive ends after an extension header".into(),
                    ))
                } else {
                    Ok(None)
                };
            };
            let mut entry = entry.map_err(|e| tar_error(e, "bad tar entry"))?;
            self.seen += 1;
            if self.seen > self.limits.max_entries {
                return Err(Error::TooManyEntries {
                    limit: self.limits.max_entries,
                });
            }
            let kind = entry.header().entry_type();
            let size = entry
                .header()
                .size()
                .map_err(|e| Error::Corrupt(format!("entry size: {e}")))?;
            let extension = matches!(
                kind,
                EntryType::GNULongName
                    | EntryType::GNULongLink
                    | EntryType::XHeader
                    | EntryType::XGlobalHeader
            );
            if !extension {
                let name = name.unwrap_or_else(|| entry.path_bytes().into_owned());
                let link = link.or_else(|| entry.link_name_bytes().map(|l| l.into_owned()));
                let mode = entry.header().mode().unwrap_or(0o644);
                return Ok(Some((
                    Logical {
                        name,
                        link,
                        kind,
                        mode,
                        size,
                    },
                    entry,
                )));
            }
            // Its size is checked before a byte of it is read: the tar crate would read
            // a 256 MiB "name" whole.
            if size > MAX_EXTENSION {
                return Err(unsafe_entry(
                    &shown(&entry.path_bytes()),
                    format!(
                        "an extension header ({kind:?}) of {size} bytes; at most {MAX_EXTENSION} are accepted"
                    ),
                ));
            }
            let mut data = Vec::with_capacity(size as usize);
            (&mut entry)
                .take(size)
                .read_to_end(&mut data)
                .map_err(|e| tar_error(e, "reading an extension header"))?;
            match kind {
                EntryType::GNULongName => name = Some(trim_nul(data)),
                EntryType::GNULongLink => link = Some(trim_nul(data)),
                EntryType::XHeader => {
                    for record in tar::PaxExtensions::new(&data) {
                        let record =
                            record.map_err(|e| Error::Corrupt(format!("bad PAX record: {e}")))?;
                        match record.key_bytes() {
                            b"path" => name = Some(record.value_bytes().to_vec()),
                            b"linkpath" => link = Some(record.value_bytes().to_vec()),
                            // A size other than the header's would have to be trusted to
                            // find the next header; no distribution needs one.
                            b"size" => {
                                return Err(Error::Corrupt(
                                    "a PAX size record (files over 8 GiB are not supported)".into(),
                                ));
                            }
                            _ => {}
                        }
                    }
                }
                _ => {} // a global header: read (and counted) above, applied to nothing
            }
            for n in [&name, &link].into_iter().flatten() {
                if n.len() > MAX_NAME {
                    return Err(unsafe_entry(
                        &shown(n),
                        format!(
                            "a name of {} bytes; at most {MAX_NAME} are accepted",
                            n.len()
                        ),
                    ));
                }
            }
        }
    }
}

fn trim_nul(mut data: Vec<u8>) -> Vec<u8> {
    while data.last() == Some(&0) {
        data.pop();
    }
    data
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
    let capped = Capped {
        inner: decoder,
        left: limits.max_stream(),
        cap: limits.max_stream(),
    };
    let mut archive = tar::Archive::new(capped);
    let mut walker = Walker::new(&mut archive, limits)?;
    while let Some((logical, entry)) = walker.next()? {
        if logical.kind != EntryType::Regular {
            continue;
        }
        let Ok(path) = crate::os::path_from_bytes(&logical.name) else {
            continue;
        };
        let Ok(Some(rel)) = safe_relative_path(&path, root) else {
            continue;
        };
        if rel != wanted {
            continue;
        }
        let mut out = Vec::new();
        entry
            .take(max + 1)
            .read_to_end(&mut out)
            .map_err(|e| tar_error(e, &format!("reading {}", shown(&logical.name))))?;
        if out.len() as u64 > max {
            return Err(Error::TooLarge {
                entry: shown(&logical.name),
                limit: max,
            });
        }
        return Ok(Some(out));
    }
    Ok(None)
}

/// A reader that refuses to yield more than `cap` bytes.
struct Capped<R> {
    inner: R,
    left: u64,
    cap: u64,
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n as u64 > self.left {
            return Err(refusal(StreamRefusal::TooLarge(self.cap)));
        }
        self.left -= n as u64;
        Ok(n)
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
    let cancelled =
        |options: &Options<'_>| options.cancel.is_some_and(|c| c.load(Ordering::Relaxed));

    let mut walker = Walker::new(archive, limits)?;
    loop {
        if cancelled(&options) {
            return Err(Error::Interrupted);
        }
        let Some((logical, mut entry)) = walker.next()? else {
            break;
        };
        stats.entries += 1;
        let shown_name = shown(&logical.name);
        let raw_path =
            crate::os::path_from_bytes(&logical.name).map_err(|r| unsafe_entry(&shown_name, r))?;
        if logical.name.len() > MAX_NAME {
            return Err(unsafe_entry(
                &shown_name,
                format!(
                    "a name of {} bytes; at most {MAX_NAME} are accepted",
                    logical.name.len()
                ),
            ));
        }
        // Only a regular file carries data: anything else that claims some is hiding
        // bytes the unpacker would otherwise skip.
        if logical.size > 0 && !matches!(logical.kind, EntryType::Regular | EntryType::Continuous) {
            return Err(unsafe_entry(
                &shown_name,
                format!(
                    "a {:?} entry that carries {} bytes of data",
                    logical.kind, logical.size
                ),
            ));
        }
        let Some(rel) = safe_relative_path(&raw_path, options.root)
            .map_err(|r| unsafe_entry(&shown_name, r))?
        else {
            continue; // the root directory itself
        };
        if !seen.insert(rel.clone()) {
            return Err(unsafe_entry(&shown_name, "duplicate entry"));
        }
        if let Some(link) = rel.ancestors().skip(1).find(|a| links.contains(*a)) {
            return Err(unsafe_entry(
                &shown_name,
                format!("lies beneath the symlink {}", link.display()),
            ));
        }
        let target = dest.join(&rel);
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent).at(parent)?;
        }
        let mode = logical.mode;
        match logical.kind {
            EntryType::Regular | EntryType::Continuous => {
                let mut file = crate::os::create_private(&target).at(&target)?;
                loop {
                    let n = match entry.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(tar_error(e, &format!("reading {shown_name}"))),
                    };
                    stats.bytes += n as u64;
                    if stats.bytes > limits.max_bytes {
                        return Err(Error::TooLarge {
                            entry: shown_name,
                            limit: limits.max_bytes,
                        });
                    }
                    file.write_all(&buf[..n]).at(&target)?;
                    if let Some(progress) = options.progress.as_mut() {
                        progress(stats.bytes);
                    }
                    if cancelled(&options) {
                        return Err(Error::Interrupted);
                    }
                }
                // Owner-writable only, whatever the archive asked for; no setuid.
                crate::os::set_file_mode(&file, mode & 0o755 | 0o400).at(&target)?;
            }
            EntryType::Directory => match fs::create_dir(&target) {
                Ok(()) => {
                    crate::os::set_path_mode(&target, mode & 0o755 | 0o700).at(&target)?;
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && target.is_dir() => {}
                Err(e) => return Err(e).at(&target),
            },
            EntryType::Symlink => {
                let link_target = logical
                    .link
                    .ok_or_else(|| unsafe_entry(&shown_name, "symlink without a target"))
                    .and_then(|l| {
                        crate::os::path_from_bytes(&l).map_err(|r| unsafe_entry(&shown_name, r))
                    })?;
                check_link_target(&rel, &link_target).map_err(|r| unsafe_entry(&shown_name, r))?;
                crate::os::symlink(&link_target, &target).at(&target)?;
                links.insert(rel);
            }
            EntryType::Link => return Err(unsafe_entry(&shown_name, "hard links are not allowed")),
            EntryType::Char | EntryType::Block => {
                return Err(unsafe_entry(&shown_name, "device files are not allowed"));
            }
            EntryType::Fifo => return Err(unsafe_entry(&shown_name, "FIFOs are not allowed")),
            other => {
                return Err(unsafe_entry(
                    &shown_name,
                    format!("entry type {other:?} is not allowed"),
                ));
            }
        }
    }
    if options.sync {
        crate::os::sync_tree(dest).at(dest)?;
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
            Component::Normal(c) => {
                if let Some(why) = crate::os::reserved_name(c) {
                    return Err(why.into());
                }
                out.push(c)
            }
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
    let shown_target = shown(&crate::os::path_bytes(target));
    for component in target.components() {
        match component {
            Component::ParentDir if !descended => {
                climbed += 1;
                if climbed > depth {
                    return Err(format!("symlink target {shown_target} leaves the tree"));
                }
            }
            Component::ParentDir => {
                return Err(format!(
                    "symlink target {shown_target} has '..' after a name"
                ));
            }
            Component::Normal(_) => descended = true,
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => {
                return Err(format!("symlink target {shown_target} is absolute"));
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

    #[test]
    fn names_in_messages_are_cut_short() {
        assert_eq!(shown(b"agent/bin"), "agent/bin");
        let long = vec![b'a'; 10_000];
        let s = shown(&long);
        assert!(s.len() < 200 && s.ends_with("(10000 bytes)"), "{s}");
    }
}
