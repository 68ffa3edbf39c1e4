//! Rebuilding the new bundle from the old one and a delta: the agent's side.
//!
//! Nothing here is trusted: every offset is checked against the old bundle, every length
//! against what is left of the delta and of the new bundle, and the output stops at the
//! size the delta announced. What comes out is still only bytes; the caller checks them
//! exactly as it checks a downloaded bundle before anything is run.
//!
//! Memory: one changed file at a time, old and new uncompressed, plus its patch.

use std::fs::File;
use std::io::{self, BufReader, Read, Write};
use std::path::Path;

use qbsdiff::Bspatch;
use sha2::{Digest, Sha256};

use crate::error::{DeltaError, IoContext, Result};
use crate::format::{DeltaReader, Header, Op};
use crate::segmented::{self, MAX_TAR};

fn corrupt(what: impl Into<String>) -> DeltaError {
    DeltaError::Corrupt(what.into())
}

/// Writes at most `left` bytes, and counts them.
struct Bounded<W> {
    inner: W,
    left: u64,
}

impl<W: Write> Write for Bounded<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.len() as u64 > self.left {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the delta writes more than the bundle size it announced",
            ));
        }
        let n = self.inner.write(buf)?;
        self.left -= n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// A write error of the output is the caller's (a full disk), not the delta's fault.
enum Failure {
    Delta(DeltaError),
    Output(io::Error),
}

/// Rebuilds into `out` the bundle the delta at `delta` makes from the bundle at `old`.
/// Returns the delta's header (the hash and size the result must have). Errors of `out`
/// come back as [`DeltaError::Io`] on `out_name`.
pub fn apply(old: &Path, delta: &Path, out: &mut impl Write, out_name: &Path) -> Result<Header> {
    let base = File::open(old).at(old)?;
    let base_len = base.metadata().at(old)?.len();
    let file = File::open(delta).at(delta)?;
    let size = file.metadata().at(delta)?.len();
    let mut reader = DeltaReader::new(BufReader::with_capacity(256 * 1024, file), size);
    let header = reader.header()?;

    let actual = sha256_of(old).at(old)?;
    if actual != header.from {
        return Err(DeltaError::WrongBase {
            expected: hex::encode(header.from),
            actual: hex::encode(actual),
        });
    }

    let mut bounded = Bounded {
        inner: out,
        left: header.to_size,
    };
    let result = (|| -> std::result::Result<(), Failure> {
        while let Some(op) = reader.next_op().map_err(Failure::Delta)? {
            run(&op, &base, base_len, old, header.level, &mut bounded)?;
        }
        Ok(())
    })();
    match result {
        Ok(()) => {}
        Err(Failure::Delta(e)) => return Err(e),
        Err(Failure::Output(e)) if e.kind() == io::ErrorKind::InvalidData => {
            return Err(corrupt(e.to_string()));
        }
        Err(Failure::Output(source)) => {
            return Err(DeltaError::Io {
                path: out_name.to_owned(),
                source,
            });
        }
    }
    if bounded.left != 0 {
        return Err(corrupt(format!(
            "it rebuilt {} bytes of the {} it announced",
            header.to_size - bounded.left,
            header.to_size
        )));
    }
    bounded.flush().at(out_name)?;
    Ok(header)
}

fn run(
    op: &Op,
    base: &File,
    base_len: u64,
    old: &Path,
    level: u8,
    out: &mut impl Write,
) -> std::result::Result<(), Failure> {
    let range = |offset: u64, len: u64| -> std::result::Result<(), Failure> {
        match offset.checked_add(len) {
            Some(end) if end <= base_len => Ok(()),
            _ => Err(Failure::Delta(corrupt(format!(
                "it names bytes {offset}+{len} of a {base_len}-byte bundle"
            )))),
        }
    };
    let read = |offset: u64, len: u64| -> std::result::Result<Vec<u8>, Failure> {
        range(offset, len)?;
        let mut buf = vec![0u8; len as usize];
        crate::os::read_exact_at(base, &mut buf, offset).map_err(|source| {
            Failure::Delta(DeltaError::Io {
                path: old.to_owned(),
                source,
            })
        })?;
        Ok(buf)
    };
    match op {
        Op::Copy { offset, len } => {
            range(*offset, *len)?;
            let mut chunk = vec![0u8; (*len).min(1 << 20) as usize];
            let (mut at, end) = (*offset, offset + len);
            while at < end {
                let n = chunk.len().min((end - at) as usize);
                crate::os::read_exact_at(base, &mut chunk[..n], at).map_err(|source| {
                    Failure::Delta(DeltaError::Io {
                        path: old.to_owned(),
                        source,
                    })
                })?;
                out.write_all(&chunk[..n]).map_err(Failure::Output)?;
                at += n as u64;
            }
        }
        Op::Literal(bytes) => out.write_all(bytes).map_err(Failure::Output)?,
        Op::Patch { offset, len, patch } => {
            let source = read(*offset, *len)?;
            let target = bspatch(&source, patch, MAX_TAR as u64).map_err(Failure::Delta)?;
            out.write_all(&target).map_err(Failure::Output)?;
        }
        Op::Deflate {
            offset,
            len,
            patch,
            last,
        } => {
            let packed = read(*offset, *len)?;
            let plain = segmented::inflate_raw(&packed, MAX_TAR)
                .map_err(|e| Failure::Delta(corrupt(format!("the old file it names: {e}"))))?;
            let target = bspatch(&plain, patch, MAX_TAR as u64).map_err(Failure::Delta)?;
            segmented::deflate_segment(&target[..], level, *last, out).map_err(Failure::Output)?;
        }
    }
    Ok(())
}

/// bsdiff's sign-and-magnitude integers.
fn offtin(bytes: &[u8]) -> i64 {
    let mut raw = [0u8; 8];
    raw.copy_from_slice(&bytes[..8]);
    let value = u64::from_le_bytes(raw);
    let magnitude = (value & !(1 << 63)) as i64;
    if value & (1 << 63) != 0 {
        -magnitude
    } else {
        magnitude
    }
}

/// Applies a bsdiff patch, after checking its header so the patcher never sees sizes that
/// do not fit the patch or the cap.
fn bspatch(source: &[u8], patch: &[u8], cap: u64) -> Result<Vec<u8>> {
    if patch.len() < 32 || &patch[..8] != b"BSDIFF40" {
        return Err(corrupt("a patch without the BSDIFF40 header"));
    }
    let (controls, diffs, target) = (
        offtin(&patch[8..]),
        offtin(&patch[16..]),
        offtin(&patch[24..]),
    );
    let fits = controls >= 0
        && diffs >= 0
        && target >= 0
        && (controls as u64)
            .checked_add(diffs as u64)
            .and_then(|n| n.checked_add(32))
            .is_some_and(|n| n <= patch.len() as u64);
    if !fits || target as u64 > cap {
        return Err(corrupt("a patch whose sizes do not fit it"));
    }
    let mut out = Vec::with_capacity(target as usize);
    let patcher = Bspatch::new(patch).map_err(|e| corrupt(format!("a patch: {e}")))?;
    let mut bounded = Bounded {
        inner: &mut out,
        left: target as u64,
    };
    patcher
        .apply(source, &mut bounded)
        .map_err(|e| corrupt(format!("a patch that does not apply: {e}")))?;
    if out.len() as u64 != target as u64 {
        return Err(corrupt("a patch that makes fewer bytes than it says"));
    }
    Ok(out)
}

/// The sha256 of a file: what a delta's base is named by, on both sides of the wire.
pub fn sha256_of(path: &Path) -> io::Result<[u8; 32]> {
    let mut file = File::open(path)?;
    let mut hasher = Sha256::new();
    let mut chunk = vec![0u8; 1 << 20];
    loop {
        let n = agent_protocol::digest::fill(&mut file, &mut chunk)?;
        if n == 0 {
            return Ok(hasher.finalize().into());
        }
        hasher.update(&chunk[..n]);
    }
}

/// Reads the header only: which bundle a delta starts from and what it makes.
pub fn header_of(delta: &Path) -> Result<Header> {
    let file = File::open(delta).at(delta)?;
    let size = file.metadata().at(delta)?.len();
    DeltaReader::new(file.take(crate::format::HEADER_LEN), size).header()
}
