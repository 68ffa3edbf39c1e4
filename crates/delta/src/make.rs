//! Making a delta from one bundle to another: the server's side, run off the request path.
//!
//! A bundle is taken apart into its stub, the zip's bytes before the distribution, the
//! distribution's segmented tarball, and the zip's bytes after it. A part that did not
//! change is named by its place in the old bundle. A tar entry that changed is sent as a
//! bsdiff of its uncompressed bytes, which the agent compresses again; anything else that
//! changed is a bsdiff of the part, or the part itself where that is smaller.
//!
//! Memory is bounded by [`Limits::max_diff_input`], never by the bundles' sizes or what
//! they inflate to: the bundles are read from their files a piece at a time, their
//! tarballs are taken apart as they are inflated (see [`Layout::scan`]), an entry is
//! recognised by the sha256 of its compressed bytes, the delta is written as it is made
//! (a literal straight from the new bundle's file), and only the two sides of one diff
//! are ever held: a changed file (or part) and its predecessor, at most
//! `max_diff_input` each, with bsdiff's suffix array over the old one (about five times
//! its size). Files larger than that are sent whole instead of diffed; one core is used,
//! since the server has agents to answer meanwhile.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};

use agent_extract::payload::Payload;
use qbsdiff::{Bsdiff, ParallelScheme};
use sha2::{Digest, Sha256};

use crate::error::{DeltaError, IoContext, Result};
use crate::format::{self, Header, Op};
use crate::segmented::{GZIP_HEADER, LEVEL, Layout, ReadAt};

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The largest file (old or new) bsdiff is run on.
    pub max_diff_input: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_diff_input: 64 << 20,
        }
    }
}

/// What a delta is made of, for logs and benchmarks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Made {
    /// Bytes of the delta file.
    pub size: u64,
    /// Bytes of the new bundle, for comparison.
    pub bundle_size: u64,
    /// Bytes of the new bundle named in the old one rather than sent.
    pub copied: u64,
    /// Bytes sent as they are.
    pub literal: u64,
    /// Bytes of bsdiff patches, and how many changed files and parts they rebuild.
    pub patch_bytes: u64,
    pub patched: usize,
    pub base_sha256: String,
    pub sha256: String,
}

/// The four parts of a bundle file, as byte ranges.
#[derive(Debug, Clone)]
struct Parts {
    stub: Range<u64>,
    before_dist: Range<u64>,
    dist: Range<u64>,
    after_dist: Range<u64>,
}

impl Parts {
    fn of(path: &Path, len: u64) -> Result<Parts> {
        let unreadable = |reason: String| DeltaError::Bundle {
            path: path.to_owned(),
            reason,
        };
        let mut payload = Payload::open(path).map_err(|e| unreadable(e.to_string()))?;
        let facts = payload.facts().map_err(|e| unreadable(e.to_string()))?;
        let dist = payload
            .dist_range(&facts.version)
            .map_err(|e| unreadable(e.to_string()))?;
        let stub = payload.stub_len();
        let (start, end) = (dist.start, dist.end);
        if !(stub <= start && start <= end && end <= len) {
            return Err(unreadable(format!(
                "the distribution lies at {start}..{end}, outside the zip of a {len}-byte file"
            )));
        }
        Ok(Parts {
            stub: 0..stub,
            before_dist: stub..start,
            dist: start..end,
            after_dist: end..len,
        })
    }
}

/// One bundle file, open, with its parts and its distribution's layout.
struct Bundle {
    path: PathBuf,
    file: File,
    len: u64,
    parts: Parts,
    layout: Option<Layout>,
    sha256: [u8; 32],
}

impl Bundle {
    fn open(path: &Path) -> Result<Bundle> {
        let file = File::open(path).at(path)?;
        let len = file.metadata().at(path)?.len();
        let sha256 = sha256_of(&file, len).at(path)?;
        let parts = Parts::of(path, len)?;
        let layout = Layout::scan(&file, parts.dist.clone()).at(path)?;
        Ok(Bundle {
            path: path.to_owned(),
            file,
            len,
            parts,
            layout,
            sha256,
        })
    }

    /// Bytes `range` of the file, read whole (for a diff: never more than the limit).
    fn read(&self, range: &Range<u64>) -> Result<Vec<u8>> {
        let len = usize::try_from(range.end - range.start).map_err(|_| DeltaError::Bundle {
            path: self.path.clone(),
            reason: "a part larger than memory".into(),
        })?;
        let mut buf = vec![0u8; len];
        self.file
            .read_exact_at(&mut buf, range.start)
            .at(&self.path)?;
        Ok(buf)
    }
}

/// The sha256 of the first `len` bytes of `file`, read a chunk at a time.
fn sha256_of(file: &File, len: u64) -> io::Result<[u8; 32]> {
    let mut hasher = Sha256::new();
    let mut chunk = vec![0u8; CHUNK];
    let mut at = 0;
    while at < len {
        let n = usize::try_from(len - at).unwrap_or(usize::MAX).min(CHUNK);
        file.read_exact_at(&mut chunk[..n], at)?;
        hasher.update(&chunk[..n]);
        at += n as u64;
    }
    Ok(hasher.finalize().into())
}

/// Bytes read from a bundle at a time, where they are not held for a diff.
const CHUNK: usize = 1 << 20;

/// Whether `a` of `old` and `b` of `new` hold the same bytes, compared a chunk at a time.
fn same_bytes(old: &Bundle, a: &Range<u64>, new: &Bundle, b: &Range<u64>) -> Result<bool> {
    if a.end - a.start != b.end - b.start {
        return Ok(false);
    }
    let (mut left, mut right) = (vec![0u8; CHUNK], vec![0u8; CHUNK]);
    let (mut at, mut bt) = (a.start, b.start);
    while at < a.end {
        let n = usize::try_from(a.end - at).unwrap_or(usize::MAX).min(CHUNK);
        old.file.read_exact_at(&mut left[..n], at).at(&old.path)?;
        new.file.read_exact_at(&mut right[..n], bt).at(&new.path)?;
        if left[..n] != right[..n] {
            return Ok(false);
        }
        at += n as u64;
        bt += n as u64;
    }
    Ok(true)
}

/// A copy or literal not written yet: the next operation may extend it.
enum Pending {
    Copy {
        offset: u64,
        len: u64,
    },
    /// Bytes of the new bundle, sent as they are.
    Literal(Range<u64>),
}

/// Writes the operations as they are decided, in the order they write the new bundle;
/// neighbouring copies and literals are merged. A literal is read from the new bundle's
/// file when it is written, never held.
struct Ops<'a, W: Write> {
    out: &'a mut W,
    new: &'a Bundle,
    pending: Option<Pending>,
    made: Made,
    written: u64,
}

impl<W: Write> Ops<'_, W> {
    fn copy(&mut self, offset: u64, len: u64) -> Result<()> {
        self.made.copied += len;
        if let Some(Pending::Copy {
            offset: prev,
            len: prev_len,
        }) = &mut self.pending
            && *prev + *prev_len == offset
        {
            *prev_len += len;
            return Ok(());
        }
        self.flush()?;
        self.pending = Some(Pending::Copy { offset, len });
        Ok(())
    }

    /// Bytes `range` of the new bundle, sent as they are: always the bytes that follow
    /// what the operations before wrote, so a literal after a literal extends it.
    fn literal(&mut self, range: Range<u64>) -> Result<()> {
        self.made.literal += range.end - range.start;
        if let Some(Pending::Literal(prev)) = &mut self.pending
            && prev.end == range.start
        {
            prev.end = range.end;
            return Ok(());
        }
        self.flush()?;
        self.pending = Some(Pending::Literal(range));
        Ok(())
    }

    fn patched(&mut self, op: Op, patch_len: usize) -> Result<()> {
        self.made.patch_bytes += patch_len as u64;
        self.made.patched += 1;
        self.flush()?;
        self.write(&op)
    }

    fn write(&mut self, op: &Op) -> Result<()> {
        format::write_op(self.out, op).at(OUT)?;
        self.written += op.encoded_len();
        Ok(())
    }

    /// Writes the pending copy or literal.
    fn flush(&mut self) -> Result<()> {
        match self.pending.take() {
            None => Ok(()),
            Some(Pending::Copy { offset, len }) => self.write(&Op::Copy { offset, len }),
            Some(Pending::Literal(range)) => {
                let len = range.end - range.start;
                format::write_literal_start(self.out, len).at(OUT)?;
                let mut chunk = vec![0u8; usize::try_from(len).unwrap_or(CHUNK).min(CHUNK)];
                let mut at = range.start;
                while at < range.end {
                    let n = usize::try_from(range.end - at)
                        .unwrap_or(usize::MAX)
                        .min(CHUNK);
                    self.new
                        .file
                        .read_exact_at(&mut chunk[..n], at)
                        .at(&self.new.path)?;
                    self.out.write_all(&chunk[..n]).at(OUT)?;
                    at += n as u64;
                }
                self.written += Op::Literal(Vec::new()).encoded_len() + len;
                Ok(())
            }
        }
    }
}

/// What errors writing the delta are said to be about.
const OUT: &str = "the delta";

fn bsdiff(source: &[u8], target: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut patch = Vec::new();
    Bsdiff::new(source, target)
        .parallel_scheme(ParallelScheme::Never)
        .compression_level(9)
        .compare(&mut patch)?;
    Ok(patch)
}

/// Bytes an operation costs beyond its payload: a patch smaller than the part by less
/// than this is not worth the agent's work.
const OP_OVERHEAD: usize = 25;

/// A new bundle taken apart once: its file held open, its parts, its tarball's layout and
/// its sha256. A server makes deltas to one release from several bases; each is made from
/// the same `Target`, so the new bundle is read, inflated and hashed once per release,
/// not once per base. It holds no bundle bytes: a few hundred bytes per tar entry.
pub struct Target {
    bundle: Bundle,
}

impl Target {
    /// Opens and takes apart the bundle at `path`.
    pub fn open(path: &Path) -> Result<Target> {
        Ok(Target {
            bundle: Bundle::open(path)?,
        })
    }

    /// The bundle's sha256, hex.
    pub fn sha256_hex(&self) -> String {
        hex::encode(self.bundle.sha256)
    }

    /// The bundle's size in bytes.
    pub fn len(&self) -> u64 {
        self.bundle.len
    }

    /// True for an empty file (which no bundle is).
    pub fn is_empty(&self) -> bool {
        self.bundle.len == 0
    }
}

/// Makes the delta from bundle `old` to bundle `new` into `out`.
pub fn make(old: &Path, new: &Path, out: &mut impl Write, limits: Limits) -> Result<Made> {
    make_to(old, &Target::open(new)?, out, limits)
}

/// Makes the delta from bundle `old` to the bundle `target` took apart into `out`, which
/// is written as the delta is made (on an error, what it holds is no delta).
pub fn make_to(old: &Path, target: &Target, out: &mut impl Write, limits: Limits) -> Result<Made> {
    let old = Bundle::open(old)?;
    let new = &target.bundle;
    let header = Header {
        from: old.sha256,
        to: new.sha256,
        to_size: new.len,
        level: LEVEL,
    };
    format::write_header(out, &header).at(OUT)?;
    let mut ops = Ops {
        out,
        new,
        pending: None,
        made: Made::default(),
        written: format::HEADER_LEN,
    };
    let max = limits.max_diff_input as u64;
    let diffable =
        |a: u64, b: u64| a != 0 && a <= max.min(qbsdiff::bsdiff::MAX_LENGTH as u64) && b <= max;
    let span = |r: &Range<u64>| r.end - r.start;

    let region = |ops: &mut Ops<'_, _>, before: &Range<u64>, after: &Range<u64>| -> Result<()> {
        if after.is_empty() {
        } else if same_bytes(&old, before, new, after)? {
            ops.copy(before.start, span(after))?;
        } else if diffable(span(before), span(after)) {
            let after_bytes = new.read(after)?;
            let patch = bsdiff(&old.read(before)?, &after_bytes).at(&old.path)?;
            if patch.len() + OP_OVERHEAD < after_bytes.len() {
                let len = patch.len();
                let op = Op::Patch {
                    offset: before.start,
                    len: span(before),
                    patch,
                };
                ops.patched(op, len)?;
            } else {
                ops.literal(after.clone())?;
            }
        } else {
            ops.literal(after.clone())?;
        }
        Ok(())
    };

    region(&mut ops, &old.parts.stub, &new.parts.stub)?;
    region(&mut ops, &old.parts.before_dist, &new.parts.before_dist)?;
    let (old_dist, new_dist) = (&old.parts.dist, &new.parts.dist);
    match (&old.layout, &new.layout) {
        (Some(before), Some(after)) => {
            let base = old_dist.start;
            // An entry whose compressed bytes are in the old bundle is named there (the
            // last of equal ones, as a map of them keeps).
            let by_bytes: HashMap<(u64, [u8; 32]), u64> = before
                .parts
                .iter()
                .map(|p| ((span(&p.packed), p.packed_sha256), base + p.packed.start))
                .collect();
            let mut by_name = HashMap::new();
            for part in &before.parts {
                by_name.entry(part.name.as_slice()).or_insert(part);
            }
            ops.literal(new_dist.start..new_dist.start + GZIP_HEADER.len() as u64)?;
            for (i, part) in after.parts.iter().enumerate() {
                let packed = span(&part.packed);
                if let Some(offset) = by_bytes.get(&(packed, part.packed_sha256)) {
                    ops.copy(*offset, packed)?;
                    continue;
                }
                let patch = match by_name.get(part.name.as_slice()) {
                    Some(was) if diffable(span(&was.plain), span(&part.plain)) => {
                        let plain_before = was.plain_bytes(&old.file, base).at(&old.path)?;
                        let plain_after =
                            part.plain_bytes(&new.file, new_dist.start).at(&new.path)?;
                        match (plain_before, plain_after) {
                            (Some(before), Some(after)) => {
                                let patch = bsdiff(&before, &after).at(&old.path)?;
                                (((patch.len() + OP_OVERHEAD) as u64) < packed)
                                    .then_some((was, patch))
                            }
                            _ => None,
                        }
                    }
                    _ => None,
                };
                match patch {
                    Some((was, patch)) => {
                        let len = patch.len();
                        let op = Op::Deflate {
                            offset: base + was.packed.start,
                            len: span(&was.packed),
                            patch,
                            last: i + 1 == after.parts.len(),
                        };
                        ops.patched(op, len)?;
                    }
                    None => ops.literal(
                        new_dist.start + part.packed.start..new_dist.start + part.packed.end,
                    )?,
                }
            }
            ops.literal(new_dist.end - 8..new_dist.end)?;
        }
        _ => region(&mut ops, old_dist, new_dist)?,
    }
    region(&mut ops, &old.parts.after_dist, &new.parts.after_dist)?;

    ops.flush()?;
    format::write_end(ops.out).at(OUT)?;
    let mut made = ops.made;
    made.size = ops.written + 1;
    made.bundle_size = new.len;
    made.base_sha256 = hex::encode(header.from);
    made.sha256 = hex::encode(header.to);
    Ok(made)
}
