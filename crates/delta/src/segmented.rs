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
use sha2::{Digest, Sha256};

/// The deflate level every segment is compressed at.
pub const LEVEL: u8 = 6;

/// Magic, deflate, no flags, no modification time, no extra flags, OS unknown: the same
/// ten bytes for every bundle, so nothing about the machine that packed leaks or differs.
pub const GZIP_HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];

/// Input is fed to the compressor in chunks of exactly this size (the last shorter), on
/// every side, so that the output cannot depend on how a reader happened to split it.
const CHUNK: usize = 64 * 1024;

/// A tarball that inflates past this is not taken apart by the delta maker (its member is
/// opaque bytes to it), and no patch may make a file larger.
pub const MAX_TAR: usize = 1 << 31;

const BLOCK: usize = 512;

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

/// Bytes that can be read at any offset without a cursor: a bundle file, or (in tests)
/// memory.
pub trait ReadAt {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
}

impl ReadAt for std::fs::File {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        crate::os::read_exact_at(self, buf, offset)
    }
}

impl ReadAt for [u8] {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        let bytes = start
            .checked_add(buf.len())
            .and_then(|end| self.get(start..end))
            .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
        buf.copy_from_slice(bytes);
        Ok(())
    }
}

/// Reads `pos..end` of a [`ReadAt`] front to back.
pub struct Span<'a, R: ?Sized> {
    src: &'a R,
    pos: u64,
    end: u64,
}

impl<'a, R: ReadAt + ?Sized> Span<'a, R> {
    pub fn new(src: &'a R, range: Range<u64>) -> Self {
        Self {
            src,
            pos: range.start,
            end: range.end.max(range.start),
        }
    }
}

impl<R: ReadAt + ?Sized> Read for Span<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = usize::try_from(self.end - self.pos)
            .unwrap_or(usize::MAX)
            .min(buf.len());
        if n == 0 {
            return Ok(0);
        }
        self.src.read_exact_at(&mut buf[..n], self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

/// One segment's compressor, fed as its bytes come: the very calls [`deflate_segment`]
/// makes (input in chunks of exactly [`CHUNK`], the same flushes, the same output
/// buffer), so the bytes out are the same however the input arrives.
pub struct SegmentDeflater {
    compress: Compress,
    inbuf: Vec<u8>,
    filled: usize,
    outbuf: Vec<u8>,
}

impl SegmentDeflater {
    pub fn new(level: u8) -> Self {
        Self {
            compress: Compress::new(Compression::new(u32::from(level.min(9))), false),
            inbuf: vec![0u8; CHUNK],
            filled: 0,
            outbuf: vec![0u8; CHUNK + CHUNK / 2],
        }
    }

    /// Takes more of the segment's bytes.
    pub fn write(&mut self, mut data: &[u8], out: &mut impl Write) -> io::Result<()> {
        while !data.is_empty() {
            let n = (CHUNK - self.filled).min(data.len());
            self.inbuf[self.filled..self.filled + n].copy_from_slice(&data[..n]);
            self.filled += n;
            data = &data[n..];
            if self.filled == CHUNK {
                self.run(FlushCompress::None, out)?;
                self.filled = 0;
            }
        }
        Ok(())
    }

    /// Ends the segment: a sync flush, or the end of the stream for the `last` one.
    pub fn finish(mut self, last: bool, out: &mut impl Write) -> io::Result<()> {
        let flush = if last {
            FlushCompress::Finish
        } else {
            FlushCompress::Sync
        };
        self.run(flush, out)
    }

    fn run(&mut self, flush: FlushCompress, out: &mut impl Write) -> io::Result<()> {
        let filled = self.filled;
        let mut taken = 0;
        loop {
            let compress = &mut self.compress;
            let (in_before, out_before) = (compress.total_in(), compress.total_out());
            let status = compress
                .compress(&self.inbuf[taken..filled], &mut self.outbuf, flush)
                .map_err(io::Error::other)?;
            taken += (compress.total_in() - in_before) as usize;
            let produced = (compress.total_out() - out_before) as usize;
            out.write_all(&self.outbuf[..produced])?;
            let done = match flush {
                FlushCompress::Finish => status == Status::StreamEnd,
                FlushCompress::Sync => taken == filled && produced < self.outbuf.len(),
                _ => taken == filled,
            };
            if done {
                return Ok(());
            }
        }
    }
}

/// One tar entry of a segmented member, found by [`Layout::scan`]: where it lies
/// uncompressed (in the tarball) and compressed (in the member), its name, and the
/// sha256 of its compressed bytes, by which an unchanged entry is recognised without
/// holding either member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    pub name: Vec<u8>,
    pub plain: Range<u64>,
    pub packed: Range<u64>,
    pub packed_sha256: [u8; 32],
}

impl Located {
    /// The entry's uncompressed bytes, inflated from its own compressed bytes in `gz`
    /// (the member, at `member_start` of `src`): each segment is a compressor's fresh
    /// stream, so it inflates alone. `None` if they do not inflate to the entry.
    pub fn plain_bytes<R: ReadAt + ?Sized>(
        &self,
        src: &R,
        member_start: u64,
    ) -> io::Result<Option<Vec<u8>>> {
        let len = usize::try_from(self.packed.end - self.packed.start)
            .map_err(|_| io::Error::other("a segment larger than memory"))?;
        let plain_len = usize::try_from(self.plain.end - self.plain.start)
            .map_err(|_| io::Error::other("a segment larger than memory"))?;
        let mut packed = vec![0u8; len];
        src.read_exact_at(&mut packed, member_start + self.packed.start)?;
        Ok(inflate_raw(&packed, plain_len)
            .ok()
            .filter(|plain| plain.len() == plain_len))
    }
}

/// A gzip member the packer wrote, taken apart as it is read (see [`Layout::scan`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub parts: Vec<Located>,
}

/// What [`Layout::scan`] is looking for next in the tarball.
enum Want {
    /// A header block, of which `got` bytes are in.
    Header { got: usize },
    /// `left` bytes of an entry's data and padding.
    Data { left: u64 },
    /// Everything to the end: the end-of-archive zeros and whatever follows them.
    Rest,
}

/// Cuts the tarball, as it is inflated, into the segments [`tar_segments`] names, and
/// compresses each again into a [`Compared`].
struct Splitter {
    header: [u8; BLOCK],
    want: Want,
    segment: Option<SegmentDeflater>,
    segment_start: u64,
    /// Where the segment's compressed bytes start in the member.
    packed_start: u64,
    at: u64,
    name: Vec<u8>,
    parts: Vec<Located>,
}

impl Splitter {
    fn new() -> Self {
        Self {
            header: [0u8; BLOCK],
            want: Want::Header { got: 0 },
            segment: None,
            segment_start: 0,
            packed_start: 0,
            at: 0,
            name: Vec::new(),
            parts: Vec::new(),
        }
    }

    /// Takes more of the tarball; `false` when it is not one the packer wrote.
    fn push<R: ReadAt + ?Sized>(
        &mut self,
        mut data: &[u8],
        out: &mut Compared<'_, R>,
    ) -> io::Result<bool> {
        while !data.is_empty() {
            match self.want {
                Want::Header { got } => {
                    let n = (BLOCK - got).min(data.len());
                    self.header[got..got + n].copy_from_slice(&data[..n]);
                    data = &data[n..];
                    self.at += n as u64;
                    if got + n < BLOCK {
                        self.want = Want::Header { got: got + n };
                        continue;
                    }
                    self.segment_start = self.at - BLOCK as u64;
                    self.packed_start = out.at;
                    self.name = entry_name(&self.header);
                    let mut segment = SegmentDeflater::new(LEVEL);
                    segment.write(&self.header, out)?;
                    self.segment = Some(segment);
                    if self.header.iter().all(|b| *b == 0) {
                        self.want = Want::Rest;
                        continue;
                    }
                    let Some(left) = entry_size(&self.header)
                        .and_then(|size| size.div_ceil(BLOCK as u64).checked_mul(BLOCK as u64))
                    else {
                        return Ok(false);
                    };
                    self.want = Want::Data { left };
                    if left == 0 {
                        self.end_segment(false, out)?;
                    }
                }
                Want::Data { left } => {
                    let n = usize::try_from(left).unwrap_or(usize::MAX).min(data.len());
                    if let Some(segment) = self.segment.as_mut() {
                        segment.write(&data[..n], out)?;
                    }
                    data = &data[n..];
                    self.at += n as u64;
                    self.want = Want::Data {
                        left: left - n as u64,
                    };
                    if left == n as u64 {
                        self.end_segment(false, out)?;
                    }
                }
                Want::Rest => {
                    if let Some(segment) = self.segment.as_mut() {
                        segment.write(data, out)?;
                    }
                    self.at += data.len() as u64;
                    data = &[];
                }
            }
        }
        Ok(true)
    }

    fn end_segment<R: ReadAt + ?Sized>(
        &mut self,
        last: bool,
        out: &mut Compared<'_, R>,
    ) -> io::Result<()> {
        if let Some(segment) = self.segment.take() {
            segment.finish(last, out)?;
        }
        self.parts.push(Located {
            name: std::mem::take(&mut self.name),
            plain: self.segment_start..self.at,
            packed: self.packed_start..out.at,
            packed_sha256: out.take_digest(),
        });
        self.want = Want::Header { got: 0 };
        Ok(())
    }

    /// The tarball ended: the last segment; `false` if it ended inside an entry.
    fn finish<R: ReadAt + ?Sized>(
        mut self,
        out: &mut Compared<'_, R>,
    ) -> io::Result<Option<Vec<Located>>> {
        match self.want {
            Want::Header { got: 0 } => {
                // No end-of-archive zeros: an empty last segment finishes the stream.
                self.segment_start = self.at;
                self.packed_start = out.at;
                self.segment = Some(SegmentDeflater::new(LEVEL));
                self.end_segment(true, out)?;
            }
            Want::Rest => self.end_segment(true, out)?,
            Want::Header { .. } | Want::Data { .. } => return Ok(None),
        }
        Ok(Some(self.parts))
    }
}

/// A writer that checks what is written against the member's own bytes, from `at` on,
/// and hashes them: compressing an entry again "into" it says whether the member holds
/// exactly those bytes there.
struct Compared<'a, R: ?Sized> {
    member: io::BufReader<Span<'a, R>>,
    at: u64,
    end: u64,
    digest: Sha256,
    buf: Vec<u8>,
    differs: bool,
}

impl<R: ReadAt + ?Sized> Compared<'_, R> {
    fn take_digest(&mut self) -> [u8; 32] {
        std::mem::take(&mut self.digest).finalize().into()
    }
}

impl<R: ReadAt + ?Sized> Write for Compared<'_, R> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = buf.len();
        if self.at + n as u64 > self.end {
            self.differs = true;
        } else {
            self.buf.resize(n, 0);
            self.member.read_exact(&mut self.buf)?;
            self.differs |= self.buf != buf;
        }
        if self.differs {
            return Err(io::Error::other("the member holds other bytes"));
        }
        self.digest.update(buf);
        self.at += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Layout {
    /// Takes apart the gzip member at `member` of `src` as it reads it: `None` for one the
    /// packer did not write (an older packer's single stream, another compressor), which
    /// a delta then treats as opaque bytes. The tarball is inflated a chunk at a time,
    /// cut into its entries, and each entry compressed again and compared with the
    /// member's bytes, so a part is only ever named when compressing it here gives
    /// exactly the bytes in the bundle. Memory: a few chunks and one compressor, whatever
    /// the member inflates to.
    pub fn scan<R: ReadAt + ?Sized>(src: &R, member: Range<u64>) -> io::Result<Option<Layout>> {
        let len = member.end.saturating_sub(member.start);
        let header_len = GZIP_HEADER.len() as u64;
        let Some(body_end) = len.checked_sub(8).filter(|end| *end >= header_len) else {
            return Ok(None);
        };
        let mut head = [0u8; GZIP_HEADER.len()];
        src.read_exact_at(&mut head, member.start)?;
        if head != GZIP_HEADER {
            return Ok(None);
        }
        let mut trailer = [0u8; 8];
        src.read_exact_at(&mut trailer, member.start + body_end)?;

        let body = member.start + header_len..member.start + body_end;
        let body_len = body_end - header_len;
        let mut input = Span::new(src, body.clone());
        let mut compared = Compared {
            member: io::BufReader::with_capacity(CHUNK, Span::new(src, body)),
            at: header_len,
            end: body_end,
            digest: Sha256::new(),
            buf: Vec::new(),
            differs: false,
        };
        let mut splitter = Splitter::new();
        let mut inflate = Decompress::new(false);
        let mut crc = Crc::new();
        let mut inbuf = vec![0u8; CHUNK];
        let mut outbuf = vec![0u8; CHUNK];
        let (mut in_at, mut in_len) = (0usize, 0usize);
        let mut plain = 0u64;
        loop {
            if in_at == in_len {
                in_len = fill(&mut input, &mut inbuf)?;
                in_at = 0;
            }
            let (in_before, out_before) = (inflate.total_in(), inflate.total_out());
            let Ok(status) =
                inflate.decompress(&inbuf[in_at..in_len], &mut outbuf, FlushDecompress::None)
            else {
                return Ok(None);
            };
            let consumed = (inflate.total_in() - in_before) as usize;
            let produced = (inflate.total_out() - out_before) as usize;
            in_at += consumed;
            plain += produced as u64;
            if plain > MAX_TAR as u64 {
                return Ok(None);
            }
            crc.update(&outbuf[..produced]);
            match splitter.push(&outbuf[..produced], &mut compared) {
                Ok(true) => {}
                Ok(false) => return Ok(None),
                Err(_) if compared.differs => return Ok(None),
                Err(e) => return Err(e),
            }
            let all_in = inflate.total_in() == body_len;
            if status == Status::StreamEnd || (all_in && produced < outbuf.len()) {
                break;
            }
            if consumed == 0 && produced == 0 && (in_at < in_len || in_len == 0) {
                // Cut short, or stuck.
                return Ok(None);
            }
        }
        if trailer[..4] != crc.sum().to_le_bytes() || trailer[4..] != crc.amount().to_le_bytes() {
            return Ok(None);
        }
        let parts = match splitter.finish(&mut compared) {
            Ok(Some(parts)) => parts,
            Ok(None) => return Ok(None),
            Err(_) if compared.differs => return Ok(None),
            Err(e) => return Err(e),
        };
        Ok((compared.at == body_end).then_some(Layout { parts }))
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

    fn scan(gz: &[u8]) -> Option<Layout> {
        Layout::scan(gz, 0..gz.len() as u64).expect("scan")
    }

    fn packed<'a>(gz: &'a [u8], part: &Located) -> &'a [u8] {
        &gz[part.packed.start as usize..part.packed.end as usize]
    }

    #[test]
    fn an_unchanged_file_keeps_its_compressed_bytes() {
        let big = noise(200_000, 2);
        let old_gz = segmented(&tarball(&[
            ("agent/a.txt", b"one\n"),
            ("agent/bin/big", &big),
        ]));
        let old = scan(&old_gz).expect("scan old");
        let new_gz = segmented(&tarball(&[
            ("agent/a.txt", b"two!\n"),
            ("agent/bin/big", &big),
        ]));
        let new = scan(&new_gz).expect("scan new");
        assert_eq!(old.parts.len(), new.parts.len());
        assert_eq!(new.parts[1].name, b"agent/bin/big");
        assert_eq!(
            packed(&old_gz, &old.parts[1]),
            packed(&new_gz, &new.parts[1])
        );
        assert_eq!(old.parts[1].packed_sha256, new.parts[1].packed_sha256);
        assert_ne!(
            packed(&old_gz, &old.parts[0]),
            packed(&new_gz, &new.parts[0])
        );
        assert_ne!(old.parts[0].packed_sha256, new.parts[0].packed_sha256);
        let sha: [u8; 32] = Sha256::digest(packed(&new_gz, &new.parts[1])).into();
        assert_eq!(new.parts[1].packed_sha256, sha);
    }

    /// An entry as [`parse_in_memory`] finds it: its name, and where it lies uncompressed
    /// and compressed.
    type Found = (Vec<u8>, Range<usize>, Range<usize>);

    /// The delta maker's former way: the whole tarball inflated in memory, cut with
    /// [`tar_segments`], each segment compressed again and compared.
    fn parse_in_memory(gz: &[u8]) -> Option<Vec<Found>> {
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
        let mut parts = Vec::new();
        let mut at = GZIP_HEADER.len();
        for (i, plain) in segments.iter().enumerate() {
            let mut packed = Vec::new();
            deflate_segment(
                &tar[plain.clone()],
                LEVEL,
                i + 1 == segments.len(),
                &mut packed,
            )
            .ok()?;
            let end = at + packed.len();
            if gz.get(at..end)? != packed.as_slice() {
                return None;
            }
            parts.push((entry_name(&tar[plain.clone()]), plain.clone(), at..end));
            at = end;
        }
        (at == body_end).then_some(parts)
    }

    #[test]
    fn a_member_is_taken_apart_as_it_is_read_as_it_was_whole() {
        let big = noise(CHUNK * 2 + 300, 5);
        let exact = noise(CHUNK * 2 - 512, 6);
        let tars = [
            tarball(&[("agent/a.txt", b"hello\n"), ("agent/bin/big", &big)]),
            tarball(&[("agent/exact", &exact), ("agent/empty", b"")]),
            tarball(&[]),
        ];
        for tar in &tars {
            let gz = segmented(tar);
            let whole = parse_in_memory(&gz).expect("parse");
            let layout = scan(&gz).expect("scan");
            let streamed: Vec<_> = layout
                .parts
                .iter()
                .map(|p| {
                    (
                        p.name.clone(),
                        p.plain.start as usize..p.plain.end as usize,
                        p.packed.start as usize..p.packed.end as usize,
                    )
                })
                .collect();
            assert_eq!(streamed, whole);
            for part in &layout.parts {
                let plain = part
                    .plain_bytes(&gz[..], 0)
                    .expect("read")
                    .expect("inflates");
                assert_eq!(
                    plain,
                    tar[part.plain.start as usize..part.plain.end as usize]
                );
            }
        }
        // Without the end-of-archive zeros, an empty last segment ends the stream.
        let tar = &tars[0];
        let cut = &tar[..tar.len() - 1024];
        let gz = segmented(cut);
        assert_eq!(parse_in_memory(&gz).map(|p| p.len()), Some(3));
        assert_eq!(scan(&gz).map(|l| l.parts.len()), Some(3));
        // Inside a member the maker is given, in the middle of a file.
        let mut file = b"stub".to_vec();
        file.extend_from_slice(&segmented(&tars[1]));
        let len = file.len() as u64;
        file.extend_from_slice(b"rest");
        let inside = Layout::scan(&file[..], 4..len)
            .expect("scan")
            .expect("a layout");
        assert_eq!(inside, scan(&file[4..len as usize]).expect("a layout"));
    }

    #[test]
    fn a_single_stream_is_not_taken_for_a_segmented_one() {
        let tar = tarball(&[("agent/a.txt", &noise(10_000, 3)), ("agent/b", b"x")]);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&tar).expect("gzip");
        let gz = gz.finish().expect("finish");
        assert!(parse_in_memory(&gz).is_none());
        assert!(scan(&gz).is_none());
        let mut damaged = segmented(&tar);
        let at = damaged.len() / 2;
        damaged[at] ^= 1;
        assert!(scan(&damaged).is_none());
        for cut in [0, 5, 12, damaged.len() - 9] {
            assert!(scan(&segmented(&tar)[..cut]).is_none(), "{cut}");
        }
    }

    #[test]
    fn a_bomb_is_taken_apart_in_bounded_memory() {
        // 64 MiB of zeros in one entry: a member of a few dozen KiB. It is taken apart
        // without the tarball (a layout holds none), its entry found whole.
        let zeros = vec![0u8; 64 << 20];
        let gz = segmented(&tarball(&[("agent/zeros", &zeros)]));
        assert!(gz.len() < 1 << 20);
        let layout = scan(&gz).expect("scan");
        assert_eq!(layout.parts.len(), 2);
        assert_eq!(layout.parts[0].plain, 0..512 + (64 << 20));
    }

    #[test]
    fn the_streaming_compressor_writes_what_deflate_segment_writes() {
        for len in [
            0,
            1,
            511,
            CHUNK - 1,
            CHUNK,
            CHUNK + 1,
            CHUNK * 3,
            CHUNK * 3 + 5,
        ] {
            let data = noise(len, len as u64);
            for last in [false, true] {
                let mut whole = Vec::new();
                deflate_segment(&data[..], LEVEL, last, &mut whole).expect("whole");
                let mut streamed = Vec::new();
                let mut segment = SegmentDeflater::new(LEVEL);
                for piece in data.chunks(1000) {
                    segment.write(piece, &mut streamed).expect("write");
                }
                segment.finish(last, &mut streamed).expect("finish");
                assert_eq!(streamed, whole, "{len} bytes, last {last}");
            }
        }
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
