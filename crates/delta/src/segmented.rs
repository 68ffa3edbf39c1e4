//! The distribution tarball as the packer writes it, and how a delta finds its files again.
//!
//! A gzip stream over a whole tarball changes almost everywhere when one file changes:
//! the compressor's window carries every earlier byte into every later one. So each tar
//! entry (its header, its data, its padding) is deflated by a fresh compressor, and every
//! entry but the last ends with a sync flush, which closes the entry on a byte boundary.
//! The concatenation is one valid deflate stream in one ordinary gzip member, so `tar xz`,
//! `gunzip` and the unpacker read it as before; an unchanged file keeps its compressed
//! bytes, and a changed one can be compressed again, alone, to the very same bytes.
//!
//! Those bytes depend on the compressor (flate2 over zlib-rs, pinned in Cargo.lock), the
//! level and the way input is fed to it. All three are fixed here and used by the packer,
//! the server that makes a delta, and the agent that applies one. Should a future build
//! compress differently, a delta's result no longer matches the signed bundle's sha256
//! and the agent downloads the whole bundle: a wasted delta, never a wrong install.

use std::io::{self, Read, Write};
use std::ops::Range;

use agent_protocol::digest::fill;
use flate2::{Compress, Compression, Crc, Decompress, FlushCompress, FlushDecompress, Status};

/// The deflate level every segment is compressed at.
pub const LEVEL: u8 = 6;

/// Magic, deflate, no flags, no modification time, no extra flags, OS unknown: the same
/// ten bytes for every bundle, so nothing about the machine that packed leaks or differs.
pub const GZIP_HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];

/// Input is fed to the compressor in chunks of exactly this size (the last shorter), on
/// every side, so that the output cannot depend on how a reader happened to split it.
const CHUNK: usize = 64 * 1024;

/// A tarball this large is not taken apart in memory by the delta maker.
pub const MAX_TAR: usize = 1 << 31;

const BLOCK: usize = 512;

/// One tar entry of a segmented stream: where it lies uncompressed (in the tarball) and
/// compressed (in the gzip member), and its name, by which a changed file finds its
/// predecessor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    pub name: Vec<u8>,
    pub plain: Range<usize>,
    pub packed: Range<usize>,
}

/// A gzip member the packer wrote, taken apart.
#[derive(Debug)]
pub struct Segmented {
    pub tar: Vec<u8>,
    pub parts: Vec<Part>,
}

/// The ranges of `tar` that are one entry each (a header, its data and padding; long-name
/// and pax headers are entries of their own); the end-of-archive zeros are the last one.
/// A tarball without them gets an empty last segment, so there is always a last one to
/// finish the deflate stream.
pub fn tar_segments(tar: &[u8]) -> Result<Vec<Range<usize>>, String> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < tar.len() {
        let Some(header) = tar.get(at..at + BLOCK) else {
            return Err(format!("a tar header at {at} is cut short"));
        };
        if header.iter().all(|b| *b == 0) {
            out.push(at..tar.len());
            return Ok(out);
        }
        let size = entry_size(header).ok_or_else(|| format!("a tar header at {at} has no size"))?;
        let data = usize::try_from(size.div_ceil(BLOCK as u64) * BLOCK as u64)
            .map_err(|_| format!("a tar entry at {at} is too large"))?;
        let end = at
            .checked_add(BLOCK + data)
            .filter(|end| *end <= tar.len())
            .ok_or_else(|| format!("the tar entry at {at} runs past the end"))?;
        out.push(at..end);
        at = end;
    }
    out.push(tar.len()..tar.len());
    Ok(out)
}

/// The size field of a tar header: octal text, or GNU's base-256 for large sizes.
fn entry_size(header: &[u8]) -> Option<u64> {
    let field = header.get(124..136)?;
    if field[0] & 0x80 != 0 {
        return field[4..].iter().try_fold(0u64, |acc, b| {
            acc.checked_mul(256)?.checked_add(u64::from(*b))
        });
    }
    let text = std::str::from_utf8(field).ok()?;
    let digits = text.trim_matches(|c: char| c == '\0' || c == ' ');
    if digits.is_empty() {
        return Some(0);
    }
    u64::from_str_radix(digits, 8).ok()
}

/// The name field of a tar header (without a ustar prefix: enough to pair a file with its
/// predecessor, which is all it is used for).
pub fn entry_name(segment: &[u8]) -> Vec<u8> {
    let field = segment.get(..100).unwrap_or(&[]);
    let end = field.iter().position(|b| *b == 0).unwrap_or(field.len());
    field[..end].to_vec()
}

/// Deflates `input` with a fresh compressor. All but the last segment end with a sync
/// flush; the last one finishes the stream. Returns the bytes read.
pub fn deflate_segment(
    mut input: impl Read,
    level: u8,
    last: bool,
    out: &mut impl Write,
) -> io::Result<u64> {
    let mut compress = Compress::new(Compression::new(u32::from(level.min(9))), false);
    let mut inbuf = vec![0u8; CHUNK];
    let mut outbuf = vec![0u8; CHUNK + CHUNK / 2];
    let mut read = 0u64;
    loop {
        let filled = fill(&mut input, &mut inbuf)?;
        read += filled as u64;
        let ending = filled < CHUNK;
        let flush = match (ending, last) {
            (false, _) => FlushCompress::None,
            (true, false) => FlushCompress::Sync,
            (true, true) => FlushCompress::Finish,
        };
        let mut taken = 0;
        loop {
            let (in_before, out_before) = (compress.total_in(), compress.total_out());
            let status = compress
                .compress(&inbuf[taken..filled], &mut outbuf, flush)
                .map_err(io::Error::other)?;
            taken += (compress.total_in() - in_before) as usize;
            let produced = (compress.total_out() - out_before) as usize;
            out.write_all(&outbuf[..produced])?;
            let done = match flush {
                FlushCompress::Finish => status == Status::StreamEnd,
                FlushCompress::Sync => taken == filled && produced < outbuf.len(),
                _ => taken == filled,
            };
            if done {
                break;
            }
        }
        if ending {
            return Ok(read);
        }
    }
}

/// Writes the tarball read from `tar` as a segmented gzip member (what the packer does).
/// The tarball is read once, entry by entry, and never held whole.
pub fn write_gzip(tar: impl Read, out: &mut impl Write) -> io::Result<()> {
    let mut tar = CrcReader {
        inner: tar,
        crc: Crc::new(),
    };
    out.write_all(&GZIP_HEADER)?;
    let mut header = [0u8; BLOCK];
    loop {
        let got = fill(&mut tar, &mut header)?;
        if got == 0 {
            deflate_segment(io::empty(), LEVEL, true, out)?;
            break;
        }
        if got < BLOCK {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the tarball ends inside a header",
            ));
        }
        if header.iter().all(|b| *b == 0) {
            deflate_segment(io::Read::chain(&header[..], &mut tar), LEVEL, true, out)?;
            break;
        }
        let size = entry_size(&header).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidData, "a tar header has no size")
        })?;
        let data = size.div_ceil(BLOCK as u64) * BLOCK as u64;
        let taken = deflate_segment(
            io::Read::chain(&header[..], (&mut tar).take(data)),
            LEVEL,
            false,
            out,
        )?;
        if taken != BLOCK as u64 + data {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the tarball ends inside an entry",
            ));
        }
    }
    out.write_all(&tar.crc.sum().to_le_bytes())?;
    out.write_all(&tar.crc.amount().to_le_bytes())?;
    Ok(())
}

struct CrcReader<R> {
    inner: R,
    crc: Crc,
}

impl<R: Read> Read for CrcReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.crc.update(&buf[..n]);
        Ok(n)
    }
}

/// Inflates a raw deflate stream into at most `cap` bytes. A stream that ends on a sync
/// flush (a segment that is not the last) ends where its input does.
pub fn inflate_raw(packed: &[u8], cap: usize) -> Result<Vec<u8>, String> {
    let mut inflate = Decompress::new(false);
    let mut out = Vec::new();
    let mut buf = vec![0u8; CHUNK];
    loop {
        let (in_before, out_before) = (inflate.total_in() as usize, inflate.total_out());
        let status = inflate
            .decompress(&packed[in_before..], &mut buf, FlushDecompress::None)
            .map_err(|e| format!("not deflate data: {e}"))?;
        let produced = (inflate.total_out() - out_before) as usize;
        if out.len() + produced > cap {
            return Err(format!("inflates to more than {cap} bytes"));
        }
        out.extend_from_slice(&buf[..produced]);
        let consumed = inflate.total_in() as usize;
        if status == Status::StreamEnd || (consumed == packed.len() && produced < buf.len()) {
            return Ok(out);
        }
        if consumed == in_before && produced == 0 {
            return Err("deflate data cut short".to_owned());
        }
    }
}

impl Segmented {
    /// Takes apart a gzip member the packer wrote: `None` for one it did not (an older
    /// packer's single stream, another compressor), which a delta then treats as opaque
    /// bytes. Every part is compressed again and compared, so a part is only ever named
    /// when compressing it here gives exactly the bytes in the bundle.
    pub fn parse(gz: &[u8]) -> Option<Segmented> {
        let body_end = gz.len().checked_sub(8)?;
        if gz.get(..GZIP_HEADER.len())? != GZIP_HEADER || body_end < GZIP_HEADER.len() {
            return None;
        }
        let tar = inflate_raw(&gz[GZIP_HEADER.len()..body_end], MAX_TAR).ok()?;
        let mut crc = Crc::new();
        crc.update(&tar);
        let trailer = &gz[body_end..];
        if trailer[..4] != crc.sum().to_le_bytes() || trailer[4..] != crc.amount().to_le_bytes() {
            return None;
        }
        let segments = tar_segments(&tar).ok()?;
        let mut parts = Vec::with_capacity(segments.len());
        let mut at = GZIP_HEADER.len();
        let mut packed = Vec::new();
        for (i, plain) in segments.iter().enumerate() {
            packed.clear();
            let last = i + 1 == segments.len();
            deflate_segment(&tar[plain.clone()], LEVEL, last, &mut packed).ok()?;
            let end = at + packed.len();
            if gz.get(at..end)? != packed.as_slice() {
                return None;
            }
            parts.push(Part {
                name: entry_name(&tar[plain.clone()]),
                plain: plain.clone(),
                packed: at..end,
            });
            at = end;
        }
        (at == body_end).then_some(Segmented { tar, parts })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tarball(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        builder.mode(tar::HeaderMode::Deterministic);
        for (name, data) in files {
            let mut header = tar::Header::new_gnu();
            header.set_size(data.len() as u64);
            header.set_mode(0o644);
            header.set_entry_type(tar::EntryType::Regular);
            builder
                .append_data(&mut header, name, *data)
                .expect("append");
        }
        builder.into_inner().expect("finish")
    }

    fn segmented(tar: &[u8]) -> Vec<u8> {
        let mut gz = Vec::new();
        write_gzip(tar, &mut gz).expect("write");
        gz
    }

    fn noise(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect()
    }

    #[test]
    fn a_segmented_member_is_ordinary_gzip_and_the_tarball_is_intact() {
        let big = noise(300_000, 1);
        let tar = tarball(&[("agent/a.txt", b"hello\n"), ("agent/bin/big", &big)]);
        let gz = segmented(&tar);
        let mut plain = Vec::new();
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_end(&mut plain)
            .expect("gunzip");
        assert_eq!(plain, tar);
    }

    #[test]
    fn an_unchanged_file_keeps_its_compressed_bytes() {
        let big = noise(200_000, 2);
        let old = Segmented::parse(&segmented(&tarball(&[
            ("agent/a.txt", b"one\n"),
            ("agent/bin/big", &big),
        ])))
        .expect("parse old");
        let new_gz = segmented(&tarball(&[
            ("agent/a.txt", b"two!\n"),
            ("agent/bin/big", &big),
        ]));
        let new = Segmented::parse(&new_gz).expect("parse new");
        assert_eq!(old.parts.len(), new.parts.len());
        assert_eq!(new.parts[1].name, b"agent/bin/big");
        let old_gz = segmented(&old.tar);
        assert_eq!(
            old_gz[old.parts[1].packed.clone()],
            new_gz[new.parts[1].packed.clone()]
        );
        assert_ne!(
            old_gz[old.parts[0].packed.clone()],
            new_gz[new.parts[0].packed.clone()]
        );
    }

    #[test]
    fn a_single_stream_is_not_taken_for_a_segmented_one() {
        let tar = tarball(&[("agent/a.txt", &noise(10_000, 3)), ("agent/b", b"x")]);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&tar).expect("gzip");
        assert!(Segmented::parse(&gz.finish().expect("finish")).is_none());
    }

    #[test]
    fn feeding_a_segment_in_any_pieces_compresses_it_the_same() {
        struct Trickle<'a>(&'a [u8]);
        impl Read for Trickle<'_> {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                let n = buf.len().min(self.0.len()).min(777);
                buf[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let data = noise(CHUNK * 3 + 5, 4);
        let (mut whole, mut trickled) = (Vec::new(), Vec::new());
        deflate_segment(&data[..], LEVEL, false, &mut whole).expect("whole");
        deflate_segment(Trickle(&data), LEVEL, false, &mut trickled).expect("trickled");
        assert_eq!(whole, trickled);
        assert_eq!(inflate_raw(&whole, data.len()).expect("inflate"), data);
    }

    #[test]
    fn hostile_tar_headers_are_errors_not_panics() {
        let mut tar = tarball(&[("agent/a", b"abc")]);
        tar[124..136].copy_from_slice(b"77777777777\0");
        assert!(tar_segments(&tar).is_err());
        assert!(tar_segments(&tar[..100]).is_err());
        assert!(inflate_raw(&[0xff; 64], 1024).is_err());
    }
}
