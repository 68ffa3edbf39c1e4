//! The zip payload appended to a bundle executable.
//!
//! The zip is written with offsets that count from the start of the file, so the bundle
//! is both a runnable program and an archive that `unzip -l` lists.

use std::collections::HashSet;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use agent_protocol::layout;
use agent_protocol::properties::{MAX_PROPERTIES_BYTES, Properties};
use agent_protocol::version::AgentVersion;

use crate::error::{Error, IoContext, Result};

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
    archive: zip::ZipArchive<File>,
}

impl Payload {
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).at(path)?;
        let archive = zip::ZipArchive::new(file).map_err(|e| Error::NotABundle {
            path: path.to_owned(),
            reason: format!("no zip payload ({e})"),
        })?;
        let mut names = HashSet::new();
        for i in 0..archive.len() {
            let name = archive.name_for_index(i).unwrap_or_default();
            if !names.insert(name.to_owned()) {
                return Err(Error::NotABundle {
                    path: path.to_owned(),
                    reason: format!("duplicate payload entry {name:?}"),
                });
            }
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

    /// A reader over the distribution tarball of `version`.
    pub fn dist(&mut self, version: &AgentVersion) -> Result<impl Read + Send + '_> {
        self.entry(&layout::dist_entry(version))
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

    fn entry(&mut self, name: &str) -> Result<zip::read::ZipFile<'_, File>> {
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
