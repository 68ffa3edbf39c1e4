//! Where a bundle's payload ends when the bundle is Authenticode-signed.
//!
//! A Windows bundle is signed after its zip is appended (`osslsigncode sign`), so that
//! the signature covers the payload: the signer pads the file to eight bytes and appends
//! its certificate table, which the PE header's security directory points at. The zip's
//! end record is then no longer at the end of the file; the payload is read up to the
//! security directory's offset, less the padding, as if the signature were not there.
//! A certificate table that is not at the end of the file (a signed stub with a payload
//! appended after it) is a part of the program like any other and changes nothing.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};

/// The index of the security (certificate table) entry among a PE file's data
/// directories.
const SECURITY_DIRECTORY: u64 = 4;

/// Where the bytes before an Authenticode signature at the end of `file` (`len` bytes)
/// end, less the signer's zero padding after a zip end record; `None` when the file is
/// no PE file or carries no signature at its end.
pub fn unsigned_len(file: &mut File, len: u64) -> Option<u64> {
    let (offset, size) = security_directory(file)?;
    if offset == 0 || size == 0 || offset.checked_add(size)? != len {
        return None;
    }
    Some(offset - zero_padding_after_zip(file, offset).unwrap_or(0))
}

/// The security directory's file offset and size, as the PE header says them.
fn security_directory(file: &mut File) -> Option<(u64, u64)> {
    let u16_at =
        |b: &[u8], at: usize| Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?));
    let u32_at =
        |b: &[u8], at: usize| Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?));
    let mut dos = [0u8; 64];
    file.seek(SeekFrom::Start(0)).ok()?;
    file.read_exact(&mut dos).ok()?;
    if &dos[..2] != b"MZ" {
        return None;
    }
    let pe_at = u64::from(u32_at(&dos, 0x3C)?);
    // The PE signature, the COFF header (20 bytes) and the optional header up to the
    // end of its data directories (240 bytes for PE32+).
    let mut header = [0u8; 4 + 20 + 240];
    file.seek(SeekFrom::Start(pe_at)).ok()?;
    file.read_exact(&mut header).ok()?;
    if &header[..4] != b"PE\0\0" {
        return None;
    }
    let optional = 24;
    // PE32 (0x10b) and PE32+ (0x20b) place the directory count and the directories
    // differently.
    let (count_at, directories_at) = match u16_at(&header, optional)? {
        0x10b => (optional + 92, optional + 96),
        0x20b => (optional + 108, optional + 112),
        _ => return None,
    };
    if u64::from(u32_at(&header, count_at)?) <= SECURITY_DIRECTORY {
        return None;
    }
    let entry = directories_at + 8 * SECURITY_DIRECTORY as usize;
    Some((
        u64::from(u32_at(&header, entry)?),
        u64::from(u32_at(&header, entry + 4)?),
    ))
}

/// How many zero bytes (at most seven: the signer aligns the certificate table to eight)
/// lie between a zip end record (without comment) and `end`.
fn zero_padding_after_zip(file: &mut File, end: u64) -> Option<u64> {
    const EOCD: usize = 22;
    let window = end.min(EOCD as u64 + 7);
    let mut tail = vec![0u8; usize::try_from(window).ok()?];
    file.seek(SeekFrom::Start(end - window)).ok()?;
    file.read_exact(&mut tail).ok()?;
    (0..8usize).find_map(|pad| {
        let record_at = tail.len().checked_sub(pad + EOCD)?;
        let record = &tail[record_at..tail.len() - pad];
        let is_end = record[..4] == [0x50, 0x4b, 0x05, 0x06] && record[20..22] == [0, 0];
        let zeros = tail[tail.len() - pad..].iter().all(|&b| b == 0);
        (is_end && zeros).then_some(pad as u64)
    })
}

/// A file seen up to `len` bytes: what the zip reader reads of a signed bundle.
pub struct Window {
    file: File,
    len: u64,
    pos: u64,
}

impl Window {
    pub fn new(file: File, len: u64) -> Self {
        Self { file, len, pos: 0 }
    }
}

impl Read for Window {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.len.saturating_sub(self.pos);
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        if want == 0 {
            return Ok(0);
        }
        self.file.seek(SeekFrom::Start(self.pos))?;
        let n = self.file.read(&mut buf[..want])?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl Seek for Window {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        let target = match to {
            SeekFrom::Start(n) => Some(n),
            SeekFrom::End(d) => self.len.checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        self.pos = target.ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "a seek before the start of the payload",
            )
        })?;
        Ok(self.pos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A minimal PE32+ header whose security directory says `offset`, `size`.
    fn pe(offset: u32, size: u32) -> Vec<u8> {
        let mut b = vec![0u8; 0x200];
        b[..2].copy_from_slice(b"MZ");
        b[0x3C..0x40].copy_from_slice(&0x80u32.to_le_bytes());
        b[0x80..0x84].copy_from_slice(b"PE\0\0");
        let opt = 0x80 + 24;
        b[opt..opt + 2].copy_from_slice(&0x20bu16.to_le_bytes());
        b[opt + 108..opt + 112].copy_from_slice(&16u32.to_le_bytes());
        let entry = opt + 112 + 32;
        b[entry..entry + 4].copy_from_slice(&offset.to_le_bytes());
        b[entry + 4..entry + 8].copy_from_slice(&size.to_le_bytes());
        b
    }

    fn end_record() -> Vec<u8> {
        let mut r = vec![0u8; 22];
        r[..4].copy_from_slice(&[0x50, 0x4b, 0x05, 0x06]);
        r
    }

    fn file(bytes: &[u8]) -> (tempfile::NamedTempFile, u64) {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(bytes).unwrap();
        (f, bytes.len() as u64)
    }

    #[test]
    fn a_signature_at_the_end_bounds_the_payload_less_its_padding() {
        // program (0x200) + end record (22) + 2 zero bytes + a 16-byte table at 0x218.
        let mut bytes = pe(0x218, 16);
        bytes.extend(end_record());
        bytes.extend([0, 0]);
        bytes.extend([0xAA; 16]);
        let (f, len) = file(&bytes);
        let got = unsigned_len(&mut f.reopen().unwrap(), len);
        assert_eq!(got, Some(0x200 + 22));
    }

    #[test]
    fn no_signature_or_one_inside_the_file_changes_nothing() {
        let mut unsigned = pe(0, 0);
        unsigned.extend(end_record());
        let (f, len) = file(&unsigned);
        assert_eq!(unsigned_len(&mut f.reopen().unwrap(), len), None);
        // A signed stub with a payload after its table: the table is part of the program.
        let mut inner = pe(0x200, 16);
        inner.extend([0xAA; 16]);
        inner.extend(end_record());
        let (f, len) = file(&inner);
        assert_eq!(unsigned_len(&mut f.reopen().unwrap(), len), None);
        let (f, len) =
            file(b"\x7fELF not a PE file at all, but long enough to read....................");
        assert_eq!(unsigned_len(&mut f.reopen().unwrap(), len), None);
    }

    #[test]
    fn the_window_reads_and_seeks_only_inside_its_length() {
        let (f, _) = file(b"0123456789");
        let mut w = Window::new(f.reopen().unwrap(), 6);
        assert_eq!(w.seek(SeekFrom::End(-2)).unwrap(), 4);
        let mut out = Vec::new();
        w.read_to_end(&mut out).unwrap();
        assert_eq!(out, b"45");
        assert!(w.seek(SeekFrom::Current(-10)).is_err());
    }
}
