//! Making a delta from one bundle to another: the server's side, run off the request path.
//!
//! A bundle is taken apart into its stub, the zip's bytes before the distribution, the
//! distribution's segmented tarball, and the zip's bytes after it. A part that did not
//! change is named by its place in the old bundle. A tar entry that changed is sent as a
//! bsdiff of its uncompressed bytes, which the agent compresses again; anything else that
//! changed is a bsdiff of the part, or the part itself where that is smaller.
//!
//! Memory: both bundles, the two tarballs uncompressed, and bsdiff's suffix array over
//! the old file being diffed (about five times that file). Files larger than
//! [`Limits::max_diff_input`] are sent whole instead of diffed, which bounds the suffix
//! sort; one core is used, since the server has agents to answer meanwhile.

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::ops::Range;
use std::path::Path;

use agent_extract::payload::Payload;
use qbsdiff::{Bsdiff, ParallelScheme};
use sha2::{Digest, Sha256};

use crate::error::{DeltaError, IoContext, Result};
use crate::format::{self, Header, Op};
use crate::segmented::{GZIP_HEADER, LEVEL, Segmented};

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
struct Parts {
    stub: Range<usize>,
    before_dist: Range<usize>,
    dist: Range<usize>,
    after_dist: Range<usize>,
}

impl Parts {
    fn of(path: &Path, len: usize) -> Result<Parts> {
        let unreadable = |reason: String| DeltaError::Bundle {
            path: path.to_owned(),
            reason,
        };
        let mut payload = Payload::open(path).map_err(|e| unreadable(e.to_string()))?;
        let facts = payload.facts().map_err(|e| unreadable(e.to_string()))?;
        let dist = payload
            .dist_range(&facts.version)
            .map_err(|e| unreadable(e.to_string()))?;
        let stub = usize::try_from(payload.stub_len()).unwrap_or(usize::MAX);
        let (start, end) = (
            usize::try_from(dist.start).unwrap_or(usize::MAX),
            usize::try_from(dist.end).unwrap_or(usize::MAX),
        );
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

/// Operations in the order they write the new bundle; neighbouring copies and literals
/// are merged.
#[derive(Default)]
struct Ops {
    ops: Vec<Op>,
    made: Made,
}

impl Ops {
    fn copy(&mut self, offset: usize, len: usize) {
        self.made.copied += len as u64;
        if let Some(Op::Copy {
            offset: prev,
            len: prev_len,
        }) = self.ops.last_mut()
            && *prev + *prev_len == offset as u64
        {
            *prev_len += len as u64;
            return;
        }
        self.ops.push(Op::Copy {
            offset: offset as u64,
            len: len as u64,
        });
    }

    fn literal(&mut self, bytes: &[u8]) {
        self.made.literal += bytes.len() as u64;
        if let Some(Op::Literal(prev)) = self.ops.last_mut() {
            prev.extend_from_slice(bytes);
            return;
        }
        self.ops.push(Op::Literal(bytes.to_vec()));
    }

    fn patched(&mut self, op: Op, patch_len: usize) {
        self.made.patch_bytes += patch_len as u64;
        self.made.patched += 1;
        self.ops.push(op);
    }
}

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

/// A new bundle taken apart once: its bytes, its parts, its tarball uncompressed and its
/// sha256. A server makes deltas to one release from several bases; each is made from
/// the same `Target`, so the new bundle is read, inflated and hashed once per release,
/// not once per base.
pub struct Target {
    bytes: Vec<u8>,
    parts: Parts,
    segmented: Option<Segmented>,
    sha256: [u8; 32],
}

impl Target {
    /// Reads and takes apart the bundle at `path`.
    pub fn open(path: &Path) -> Result<Target> {
        let bytes = fs::read(path).at(path)?;
        let parts = Parts::of(path, bytes.len())?;
        let segmented = Segmented::parse(&bytes[parts.dist.clone()]);
        let sha256 = Sha256::digest(&bytes).into();
        Ok(Target {
            bytes,
            parts,
            segmented,
            sha256,
        })
    }

    /// The bundle's sha256, hex.
    pub fn sha256_hex(&self) -> String {
        hex::encode(self.sha256)
    }

    /// The bundle's size in bytes.
    pub fn len(&self) -> u64 {
        self.bytes.len() as u64
    }

    /// True for an empty file (which no bundle is).
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

/// Makes the delta from bundle `old` to bundle `new` into `out`.
pub fn make(old: &Path, new: &Path, out: &mut impl Write, limits: Limits) -> Result<Made> {
    make_to(old, &Target::open(new)?, out, limits)
}

/// Makes the delta from bundle `old` to the bundle `target` took apart into `out`.
pub fn make_to(old: &Path, target: &Target, out: &mut impl Write, limits: Limits) -> Result<Made> {
    let old_bytes = fs::read(old).at(old)?;
    let new_bytes = &target.bytes;
    let old_parts = Parts::of(old, old_bytes.len())?;
    let new_parts = &target.parts;
    let mut ops = Ops::default();
    let diffable = |a: &[u8], b: &[u8]| {
        !a.is_empty()
            && a.len() <= limits.max_diff_input.min(qbsdiff::bsdiff::MAX_LENGTH)
            && b.len() <= limits.max_diff_input
    };

    let region = |ops: &mut Ops, old_range: Range<usize>, new: &[u8]| -> Result<()> {
        let before = &old_bytes[old_range.clone()];
        if new.is_empty() {
        } else if before == new {
            ops.copy(old_range.start, new.len());
        } else if diffable(before, new) {
            let patch = bsdiff(before, new).at(old)?;
            if patch.len() + OP_OVERHEAD < new.len() {
                let len = patch.len();
                ops.patched(
                    Op::Patch {
                        offset: old_range.start as u64,
                        len: old_range.len() as u64,
                        patch,
                    },
                    len,
                );
            } else {
                ops.literal(new);
            }
        } else {
            ops.literal(new);
        }
        Ok(())
    };

    region(
        &mut ops,
        old_parts.stub.clone(),
        &new_bytes[new_parts.stub.clone()],
    )?;
    region(
        &mut ops,
        old_parts.before_dist.clone(),
        &new_bytes[new_parts.before_dist.clone()],
    )?;
    let old_gz = &old_bytes[old_parts.dist.clone()];
    let new_gz = &new_bytes[new_parts.dist.clone()];
    match (Segmented::parse(old_gz), target.segmented.as_ref()) {
        (Some(before), Some(after)) => {
            let base = old_parts.dist.start;
            let by_bytes: HashMap<&[u8], usize> = before
                .parts
                .iter()
                .map(|p| (&old_gz[p.packed.clone()], base + p.packed.start))
                .collect();
            let mut by_name = HashMap::new();
            for part in &before.parts {
                by_name.entry(part.name.as_slice()).or_insert(part);
            }
            ops.literal(&new_gz[..GZIP_HEADER.len()]);
            for (i, part) in after.parts.iter().enumerate() {
                let packed = &new_gz[part.packed.clone()];
                if let Some(offset) = by_bytes.get(packed) {
                    ops.copy(*offset, packed.len());
                    continue;
                }
                let plain = &after.tar[part.plain.clone()];
                let patch = match by_name.get(part.name.as_slice()) {
                    Some(was) if diffable(&before.tar[was.plain.clone()], plain) => {
                        let patch = bsdiff(&before.tar[was.plain.clone()], plain).at(old)?;
                        (patch.len() + OP_OVERHEAD < packed.len()).then_some((was, patch))
                    }
                    _ => None,
                };
                match patch {
                    Some((was, patch)) => {
                        let len = patch.len();
                        ops.patched(
                            Op::Deflate {
                                offset: (base + was.packed.start) as u64,
                                len: was.packed.len() as u64,
                                patch,
                                last: i + 1 == after.parts.len(),
                            },
                            len,
                        );
                    }
                    None => ops.literal(packed),
                }
            }
            ops.literal(&new_gz[new_gz.len() - 8..]);
        }
        _ => region(&mut ops, old_parts.dist.clone(), new_gz)?,
    }
    region(
        &mut ops,
        old_parts.after_dist.clone(),
        &new_bytes[new_parts.after_dist.clone()],
    )?;

    let header = Header {
        from: Sha256::digest(&old_bytes).into(),
        to: target.sha256,
        to_size: new_bytes.len() as u64,
        level: LEVEL,
    };
    let out_path = Path::new("the delta");
    format::write_header(out, &header).at(out_path)?;
    for op in &ops.ops {
        format::write_op(out, op).at(out_path)?;
    }
    format::write_end(out).at(out_path)?;
    let mut made = ops.made;
    made.size = format::HEADER_LEN + ops.ops.iter().map(Op::encoded_len).sum::<u64>() + 1;
    made.bundle_size = new_bytes.len() as u64;
    made.base_sha256 = hex::encode(header.from);
    made.sha256 = hex::encode(header.to);
    Ok(made)
}
