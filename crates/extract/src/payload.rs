//! The zip payload appended to a bundle executable.
//!
//! The zip is written with offsets that count from the start of the file, so the bundle
//! is both a runnable program and an archive that `unzip -l` lists.

use std::collections::HashSet;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use agent_protocol::layout;
use agent_protocol::minisign::Signature;
use agent_protocol::properties::{MAX_PROPERTIES_BYTES, Properties};
use agent_protocol::rotation::{self, Statement};
use agent_protocol::version::AgentVersion;

use crate::error::{Error, IoContext, Result};
use crate::pe::{self, Window};

/// Size of the text entries (README, LICENSE) that are read whole.
pub const MAX_TEXT_ENTRY: u64 = 1024 * 1024;

/// What a bundle says about itself, from `agent-update-version.properties`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleFacts {
    pub version: AgentVersion,
    pub platform: String,
    pub properties: Properties,
}

pub struct Payload {
    path: PathBuf,
    archive: zip::ZipArchive<Window>,
}

impl Payload {
    pub fn open(path: &Path) -> Result<Self> {
        let mut file = File::open(path).at(path)?;
        let len = file.metadata().at(path)?.len();
        // An Authenticode signature follows the payload of a signed Windows bundle: the
        // zip is read as if it were not there.
        let len = pe::unsigned_len(&mut file, len).unwrap_or(len);
        let mut file = Window::new(file, len);
        // The zip crate keeps entries in a map by name, so a second entry of the same
        // name would be invisible to it while `unzip` shows it: read the names from the
        // central directory itself, and refuse duplicates.
        let names = central_directory_names(&mut file, len).map_err(|reason| Error::NoZip {
            path: path.to_owned(),
            reason,
        })?;
        let mut seen = HashSet::new();
        for name in &names {
            if !seen.insert(name.as_str()) {
                return Err(Error::NotABundle {
                    path: path.to_owned(),
                    reason: format!(
                        "duplicate payload entry {}",
                        crate::unpack::shown(name.as_bytes())
                    ),
                });
            }
        }
        let archive = zip::ZipArchive::new(file).map_err(|e| Error::NoZip {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        if archive.len() != names.len() {
            return Err(Error::NotABundle {
                path: path.to_owned(),
                reason: format!(
                    "the zip payload lists {} entries but {} can be read",
                    names.len(),
                    archive.len()
                ),
            });
        }
        Ok(Self {
            path: path.to_owned(),
            archive,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Byte offset at which the zip starts: the length of the stub executable. The
    /// payload's offsets are absolute (so `unzip -l` reads it), so this is where the first
    /// entry's local header lies, not the zip crate's notion of a prefix.
    pub fn stub_len(&mut self) -> u64 {
        let mut first = u64::MAX;
        for i in 0..self.archive.len() {
            if let Ok(entry) = self.archive.by_index_raw(i) {
                first = first.min(entry.header_start());
            }
        }
        if first == u64::MAX {
            self.archive.offset()
        } else {
            first
        }
    }

    pub fn entry_names(&self) -> Vec<String> {
        self.archive.file_names().map(str::to_owned).collect()
    }

    pub fn facts(&mut self) -> Result<BundleFacts> {
        let text = self.read_text(layout::PROPERTIES_ENTRY, MAX_PROPERTIES_BYTES as u64)?;
        let format = |source| Error::Format {
            path: self.path.clone(),
            entry: layout::PROPERTIES_ENTRY.to_owned(),
            source,
        };
        let properties = Properties::parse(&text).map_err(format)?;
        let version = AgentVersion::new(
            properties
                .require(layout::PROP_LATEST_VERSION)
                .map_err(format)?,
            properties
                .require(layout::PROP_LATEST_BUILD)
                .map_err(format)?,
        )
        .map_err(format)?;
        let platform = properties
            .require(layout::PROP_LATEST_PLATFORM)
            .map_err(format)?
            .to_owned();
        Ok(BundleFacts {
            version,
            platform,
            properties,
        })
    }

    /// The key rotation chain under `rotations/`, oldest first: pairs `NN-<id>.pub` and
    /// `NN-<id>.minisig`, numbered from 1 without gaps. Empty when the bundle has none.
    pub fn rotations(&mut self) -> Result<Vec<Statement>> {
        let mut stems: Vec<(usize, String)> = Vec::new();
        for name in self.entry_names() {
            let Some(rest) = name.strip_prefix(layout::ROTATIONS_DIR) else {
                continue;
            };
            if rest.is_empty() {
                continue; // the directory entry itself
            }
            let stem = rest
                .strip_suffix(".minisig")
                .or_else(|| rest.strip_suffix(".pub"));
            let number = stem
                .and_then(|s| s.split_once('-'))
                .and_then(|(n, _)| n.parse::<usize>().ok());
            let (Some(stem), Some(number)) = (stem, number) else {
                return Err(self.corrupt(
                    &name,
                    "not a rotation statement (rotations/NN-<key id>.pub or .minisig)",
                ));
            };
            if !stems.iter().any(|(_, s)| s == stem) {
                stems.push((number, stem.to_owned()));
            }
        }
        if stems.len() > rotation::MAX_STATEMENTS {
            return Err(self.corrupt(
                layout::ROTATIONS_DIR,
                &format!(
                    "{} rotation statements, more than {}",
                    stems.len(),
                    rotation::MAX_STATEMENTS
                ),
            ));
        }
        stems.sort();
        let mut statements = Vec::with_capacity(stems.len());
        for (i, (number, stem)) in stems.iter().enumerate() {
            if *number != i + 1 {
                return Err(self.corrupt(
                    layout::ROTATIONS_DIR,
                    &format!(
                        "statements are not numbered 1, 2, ...: {stem} is number {}",
                        i + 1
                    ),
                ));
            }
            let key_name = format!("{}{stem}.pub", layout::ROTATIONS_DIR);
            let sig_name = format!("{}{stem}.minisig", layout::ROTATIONS_DIR);
            let key_file = self.read_bytes(&key_name, rotation::MAX_KEY_FILE as u64)?;
            let sig_text = self.read_text(&sig_name, 4096)?;
            let signature =
                Signature::parse(&sig_text).map_err(|e| self.corrupt(&sig_name, &e.to_string()))?;
            statements.push(Statement {
                key_file,
                signature,
            });
        }
        Ok(statements)
    }

    /// Reads a small entry whole; an entry larger than `max` is refused, whatever it declares.
    pub fn read_bytes(&mut self, name: &str, max: u64) -> Result<Vec<u8>> {
        let entry = self.entry(name)?;
        let mut out = Vec::new();
        let read = entry.take(max + 1).read_to_end(&mut out);
        read.map_err(|e| self.corrupt(name, &e.to_string()))?;
        if out.len() as u64 > max {
            return Err(self.corrupt(name, &format!("larger than {max} bytes")));
        }
        Ok(out)
    }

    pub fn read_text(&mut self, name: &str, max: u64) -> Result<String> {
        let bytes = self.read_bytes(name, max)?;
        String::from_utf8(bytes).map_err(|_| self.corrupt(name, "not UTF-8 text"))
    }

    /// A reader over the distribution tarball of `version`, which fails rather than
    /// yield more bytes than the entry declares (an inflating bomb is stopped at its
    /// declared size, and that size is capped).
    pub fn dist(&mut self, version: &AgentVersion) -> Result<impl Read + Send + '_> {
        let name = layout::dist_entry(version);
        let path = self.path.clone();
        let entry = self.entry(&name)?;
        let declared = entry.size();
        if declared > MAX_DIST_ENTRY {
            return Err(Error::NotABundle {
                path,
                reason: format!(
                    "entry {name} declares {declared} bytes, more than the {MAX_DIST_ENTRY} a distribution may have"
                ),
            });
        }
        Ok(Declared {
            inner: entry,
            left: declared,
            declared,
        })
    }

    /// How many bytes the distribution tarball inflates to, counted as it is inflated
    /// (never held) and no further than `stop`: a bomb costs the time to inflate `stop`
    /// bytes, nothing more. A result of `stop` means "at least `stop`".
    pub fn dist_unpacked_size(&mut self, version: &AgentVersion, stop: u64) -> Result<u64> {
        let path = self.path.clone();
        let name = layout::dist_entry(version);
        let dist = self.dist(version)?;
        let mut decoder =
            flate2::bufread::GzDecoder::new(std::io::BufReader::with_capacity(256 * 1024, dist))
                .take(stop);
        let mut buf = vec![0u8; 256 * 1024];
        let mut total = 0u64;
        loop {
            match decoder.read(&mut buf) {
                Ok(0) => return Ok(total),
                Ok(n) => total += n as u64,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(Error::NotABundle {
                        path,
                        reason: format!("entry {name} does not inflate: {e}"),
                    });
                }
            }
        }
    }

    /// Where the distribution tarball's bytes lie in the bundle file. The entry is stored
    /// (the tarball is compressed already), so these are the tarball's own bytes.
    pub fn dist_range(&mut self, version: &AgentVersion) -> Result<std::ops::Range<u64>> {
        let name = layout::dist_entry(version);
        let path = self.path.clone();
        let entry = self.entry(&name)?;
        if entry.compression() != zip::CompressionMethod::Stored {
            return Err(Error::NotABundle {
                path,
                reason: format!("entry {name} is compressed again inside the zip"),
            });
        }
        let start = entry.data_start();
        Ok(start..start + entry.compressed_size())
    }

    /// The distribution's unpacked size from its gzip trailer (modulo 4 GiB), for progress.
    pub fn dist_unpacked_size_hint(&mut self, version: &AgentVersion) -> Option<u64> {
        use std::io::{Seek, SeekFrom};
        let (start, size) = {
            let entry = self.archive.by_name(&layout::dist_entry(version)).ok()?;
            (entry.data_start(), entry.compressed_size())
        };
        let mut file = File::open(&self.path).ok()?;
        file.seek(SeekFrom::Start(start + size.checked_sub(4)?))
            .ok()?;
        let mut trailer = [0u8; 4];
        file.read_exact(&mut trailer).ok()?;
        Some(u64::from(u32::from_le_bytes(trailer)))
    }

    fn entry(&mut self, name: &str) -> Result<zip::read::ZipFile<'_, Window>> {
        let path = self.path.clone();
        self.archive.by_name(name).map_err(|e| Error::NotABundle {
            path,
            reason: format!("entry {name}: {e}"),
        })
    }

    fn corrupt(&self, name: &str, reason: &str) -> Error {
        Error::NotABundle {
            path: self.path.clone(),
            reason: format!("entry {name}: {reason}"),
        }
    }
}

/// Why a file has no usable payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PayloadProblem {
    /// The file is a plain program: nothing follows it (the bare `agent-bundle` stub).
    Missing,
    /// Bytes follow the program but they are not a whole zip: a cut download or a
    /// damaged copy.
    Damaged { trailing: u64 },
    /// Not a program this tool knows how to measure; treat as damaged.
    Unknown,
}

/// Tells a bare stub from a truncated or damaged bundle, for the message a user gets.
/// Reads only the ELF headers of `path`.
pub fn diagnose(path: &Path) -> PayloadProblem {
    let Ok(mut file) = File::open(path) else {
        return PayloadProblem::Unknown;
    };
    let Ok(len) = file.metadata().map(|m| m.len()) else {
        return PayloadProblem::Unknown;
    };
    match elf_end(&mut file) {
        Some(end) if end >= len => PayloadProblem::Missing,
        Some(end) => PayloadProblem::Damaged {
            trailing: len - end,
        },
        None => PayloadProblem::Unknown,
    }
}

/// Where a 64-bit little-endian ELF file's own bytes end: the furthest of its section
/// header table, its sections and its segments. Anything after that was appended.
fn elf_end(file: &mut File) -> Option<u64> {
    use std::io::{Seek, SeekFrom};
    let mut header = [0u8; 64];
    file.read_exact(&mut header).ok()?;
    if &header[..4] != b"\x7fELF" || header[4] != 2 || header[5] != 1 {
        return None;
    }
    let u16_at =
        |b: &[u8], at: usize| Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?));
    let u32_at =
        |b: &[u8], at: usize| Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?));
    let u64_at =
        |b: &[u8], at: usize| Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?));
    let phoff = u64_at(&header, 0x20)?;
    let shoff = u64_at(&header, 0x28)?;
    let phentsize = u64::from(u16_at(&header, 0x36)?);
    let phnum = u64::from(u16_at(&header, 0x38)?);
    let shentsize = u64::from(u16_at(&header, 0x3A)?);
    let shnum = u64::from(u16_at(&header, 0x3C)?);
    // Real programs have a few dozen of each; more is not an ELF file we made.
    if phnum > 4096 || shnum > 65_535 || phentsize < 0x38 || (shnum > 0 && shentsize < 0x40) {
        return None;
    }
    let mut end = shoff.checked_add(shnum.checked_mul(shentsize)?)?;
    end = end.max(phoff.checked_add(phnum.checked_mul(phentsize)?)?);
    let mut read_table = |offset: u64, count: u64, size: u64| -> Option<Vec<u8>> {
        file.seek(SeekFrom::Start(offset)).ok()?;
        let mut table = vec![0u8; usize::try_from(count.checked_mul(size)?).ok()?];
        file.read_exact(&mut table).ok()?;
        Some(table)
    };
    let segments = read_table(phoff, phnum, phentsize)?;
    for entry in segments.chunks_exact(usize::try_from(phentsize).ok()?) {
        let offset = u64_at(entry, 0x08)?;
        let filesz = u64_at(entry, 0x20)?;
        end = end.max(offset.checked_add(filesz)?);
    }
    if shnum > 0 {
        let sections = read_table(shoff, shnum, shentsize)?;
        for entry in sections.chunks_exact(usize::try_from(shentsize).ok()?) {
            const SHT_NOBITS: u32 = 8;
            if u32_at(entry, 0x04)? == SHT_NOBITS {
                continue;
            }
            let offset = u64_at(entry, 0x18)?;
            let size = u64_at(entry, 0x20)?;
            end = end.max(offset.checked_add(size)?);
        }
    }
    Some(end)
}

/// The largest distribution tarball (compressed) a bundle may carry.
pub const MAX_DIST_ENTRY: u64 = 8 * 1024 * 1024 * 1024;
/// More entries than a bundle ever has (four, and a few key rotations).
pub const MAX_PAYLOAD_ENTRIES: u64 = 1024;

/// Reads at most `declared` bytes, and fails if the entry has more.
struct Declared<R> {
    inner: R,
    left: u64,
    declared: u64,
}

impl<R: Read> Read for Declared<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.left == 0 {
            // One byte more than declared is a lie, not a bonus.
            let mut probe = [0u8; 1];
            return match self.inner.read(&mut probe)? {
                0 => Ok(0),
                _ => Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!(
                        "the entry inflates past its declared {} bytes",
                        self.declared
                    ),
                )),
            };
        }
        let want = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        self.left -= n as u64;
        Ok(n)
    }
}

/// The names in a zip's central directory, in order, read from the directory itself.
/// Works with data in front of the zip (the stub of a bundle) whatever its offsets say:
/// the directory is found from the end-of-directory record, within the first `len` bytes
/// of `file` (a signed bundle's signature follows them).
pub fn central_directory_names(
    file: &mut (impl Read + std::io::Seek),
    len: u64,
) -> std::result::Result<Vec<String>, String> {
    use std::io::SeekFrom;
    let le16 = |b: &[u8], at: usize| u16::from_le_bytes([b[at], b[at + 1]]);
    let le32 = |b: &[u8], at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    let le64 = |b: &[u8], at: usize| {
        let mut x = [0u8; 8];
        x.copy_from_slice(&b[at..at + 8]);
        u64::from_le_bytes(x)
    };
    // The end record is 22 bytes plus a comment of at most 65535.
    let tail_len = len.min(22 + 65_535);
    let tail_start = len - tail_len;
    let mut tail = vec![0u8; tail_len as usize];
    file.seek(SeekFrom::Start(tail_start))
        .and_then(|_| file.read_exact(&mut tail))
        .map_err(|e| format!("cannot read its end: {e}"))?;
    let eocd = (0..tail.len().saturating_sub(21))
        .rev()
        .find(|&i| tail[i..i + 4] == [0x50, 0x4b, 0x05, 0x06])
        .ok_or_else(|| "no end-of-directory record".to_owned())?;
    let record = &tail[eocd..];
    let mut count = u64::from(le16(record, 10));
    let mut cd_size = u64::from(le32(record, 12));
    let mut end_of_cd = tail_start + eocd as u64;
    if count == 0xFFFF || cd_size == 0xFFFF_FFFF || le32(record, 16) == 0xFFFF_FFFF {
        // Zip64: the locator sits just before the end record.
        if eocd < 20 || tail[eocd - 20..eocd - 16] != [0x50, 0x4b, 0x06, 0x07] {
            return Err("a zip64 payload without its locator".into());
        }
        let z64_at = le64(&tail, eocd - 20 + 8);
        let z64_pos = len_check(z64_at, len)?;
        let mut z64 = [0u8; 56];
        file.seek(SeekFrom::Start(z64_pos))
            .and_then(|_| file.read_exact(&mut z64))
            .map_err(|e| format!("cannot read the zip64 end record: {e}"))?;
        if z64[..4] != [0x50, 0x4b, 0x06, 0x06] {
            return Err("a damaged zip64 end record".into());
        }
        count = le64(&z64, 32);
        cd_size = le64(&z64, 40);
        end_of_cd = z64_pos;
    }
    if count > MAX_PAYLOAD_ENTRIES {
        return Err(format!(
            "the zip payload lists {count} entries; a bundle has a handful"
        ));
    }
    if cd_size > 4 * 1024 * 1024 || cd_size > end_of_cd {
        return Err(format!("a zip central directory of {cd_size} bytes"));
    }
    let mut cd = vec![0u8; cd_size as usize];
    file.seek(SeekFrom::Start(end_of_cd - cd_size))
        .and_then(|_| file.read_exact(&mut cd))
        .map_err(|e| format!("cannot read the zip central directory: {e}"))?;
    let mut names = Vec::with_capacity(count as usize);
    let mut at = 0usize;
    for _ in 0..count {
        if at + 46 > cd.len() || cd[at..at + 4] != [0x50, 0x4b, 0x01, 0x02] {
            return Err("a damaged zip central directory".into());
        }
        let name_len = usize::from(le16(&cd, at + 28));
        let extra_len = usize::from(le16(&cd, at + 30));
        let comment_len = usize::from(le16(&cd, at + 32));
        let name_end = at + 46 + name_len;
        if name_end > cd.len() {
            return Err("a damaged zip central directory".into());
        }
        names.push(String::from_utf8_lossy(&cd[at + 46..name_end]).into_owned());
        at = name_end + extra_len + comment_len;
    }
    Ok(names)
}

fn len_check(pos: u64, len: u64) -> std::result::Result<u64, String> {
    if pos.saturating_add(56) > len {
        Err("a zip64 end record outside the file".into())
    } else {
        Ok(pos)
    }
}

/// The version an unpacked distribution records in its `agent-version.properties`.
pub fn installed_version(version_dir: &Path) -> Result<AgentVersion> {
    let path = version_dir.join(layout::AGENT_VERSION_FILE);
    let text = crate::atomic::read_text(&path, MAX_PROPERTIES_BYTES as u64)?;
    let format = |source| Error::Format {
        path: path.clone(),
        entry: layout::AGENT_VERSION_FILE.to_owned(),
        source,
    };
    let props = Properties::parse(&text).map_err(format)?;
    AgentVersion::new(
        props.require(layout::PROP_AGENT_VERSION).map_err(format)?,
        props.require(layout::PROP_AGENT_BUILD).map_err(format)?,
    )
    .map_err(format)
}
