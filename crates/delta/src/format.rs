//! The delta file: a header naming the two bundles, then the operations that write the
//! new bundle from front to back.
//!
//! ```text
//! "AGDELTA1"  from sha256 (32)  to sha256 (32)  to size (u64)  deflate level (u8)
//! op*  then 0
//!   1 copy     offset len                   bytes of the old bundle
//!   2 literal  len bytes                    bytes sent
//!   3 patch    offset len plen patch        bspatch(old[offset..offset+len], patch)
//!   4 deflate  offset len plen patch        a changed tar entry: inflate old[offset..+len],
//!   5 deflate-last                          bspatch it, deflate it as a segment
//! ```
//! Integers are little-endian u64. Every length is checked against what is left of the
//! file and of the new bundle before anything is allocated, so a hostile delta is an
//! error and never a panic or a memory bomb.

use std::io::{self, Read, Write};

use crate::error::{DeltaError, Result};

pub const MAGIC: &[u8; 8] = b"AGDELTA1";
/// Header bytes: magic, two hashes, the size and the level.
pub const HEADER_LEN: u64 = 8 + 32 + 32 + 8 + 1;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub from: [u8; 32],
    pub to: [u8; 32],
    pub to_size: u64,
    pub level: u8,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Copy {
        offset: u64,
        len: u64,
    },
    Literal(Vec<u8>),
    Patch {
        offset: u64,
        len: u64,
        patch: Vec<u8>,
    },
    Deflate {
        offset: u64,
        len: u64,
        patch: Vec<u8>,
        last: bool,
    },
}

impl Op {
    /// Bytes this operation takes in a delta file.
    pub fn encoded_len(&self) -> u64 {
        1 + match self {
            Op::Copy { .. } => 16,
            Op::Literal(bytes) => 8 + bytes.len() as u64,
            Op::Patch { patch, .. } | Op::Deflate { patch, .. } => 24 + patch.len() as u64,
        }
    }
}

pub fn write_header(out: &mut impl Write, header: &Header) -> io::Result<()> {
    out.write_all(MAGIC)?;
    out.write_all(&header.from)?;
    out.write_all(&header.to)?;
    out.write_all(&header.to_size.to_le_bytes())?;
    out.write_all(&[header.level])
}

pub fn write_op(out: &mut impl Write, op: &Op) -> io::Result<()> {
    let u64s = |out: &mut dyn Write, values: &[u64]| -> io::Result<()> {
        values
            .iter()
            .try_for_each(|v| out.write_all(&v.to_le_bytes()))
    };
    match op {
        Op::Copy { offset, len } => {
            out.write_all(&[1])?;
            u64s(out, &[*offset, *len])
        }
        Op::Literal(bytes) => {
            write_literal_start(out, bytes.len() as u64)?;
            out.write_all(bytes)
        }
        Op::Patch { offset, len, patch } => {
            out.write_all(&[3])?;
            u64s(out, &[*offset, *len, patch.len() as u64])?;
            out.write_all(patch)
        }
        Op::Deflate {
            offset,
            len,
            patch,
            last,
        } => {
            out.write_all(&[if *last { 5 } else { 4 }])?;
            u64s(out, &[*offset, *len, patch.len() as u64])?;
            out.write_all(patch)
        }
    }
}

/// The start of a literal of `len` bytes, whose bytes the caller writes next (a literal
/// too large to hold, written from where it lies).
pub fn write_literal_start(out: &mut impl Write, len: u64) -> io::Result<()> {
    out.write_all(&[2])?;
    out.write_all(&len.to_le_bytes())
}

pub fn write_end(out: &mut impl Write) -> io::Result<()> {
    out.write_all(&[0])
}

/// Reads a delta of `size` bytes, never trusting a length it declares.
pub struct DeltaReader<R> {
    inner: R,
    left: u64,
}

fn corrupt(what: impl Into<String>) -> DeltaError {
    DeltaError::Corrupt(what.into())
}

impl<R: Read> DeltaReader<R> {
    pub fn new(inner: R, size: u64) -> Self {
        Self { inner, left: size }
    }

    fn bytes(&mut self, len: u64, what: &str) -> Result<Vec<u8>> {
        if len > self.left {
            return Err(corrupt(format!(
                "{what} declares {len} bytes but only {} are left in the delta",
                self.left
            )));
        }
        let mut buf = vec![0u8; len as usize];
        self.inner
            .read_exact(&mut buf)
            .map_err(|e| corrupt(format!("reading {what}: {e}")))?;
        self.left -= len;
        Ok(buf)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let bytes = self.bytes(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(&bytes);
        Ok(out)
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array::<8>(what)?))
    }

    pub fn header(&mut self) -> Result<Header> {
        if self.array::<8>("the magic")? != *MAGIC {
            return Err(corrupt("not a delta (no AGDELTA1 magic)"));
        }
        Ok(Header {
            from: self.array("the base hash")?,
            to: self.array("the result hash")?,
            to_size: self.u64("the result size")?,
            level: self.array::<1>("the level")?[0],
        })
    }

    /// The next operation; `None` at the end mark, after which nothing may follow.
    pub fn next_op(&mut self) -> Result<Option<Op>> {
        let [tag] = self.array::<1>("an operation")?;
        let op = match tag {
            0 => {
                if self.left != 0 {
                    return Err(corrupt(format!(
                        "{} bytes after the end of the delta",
                        self.left
                    )));
                }
                return Ok(None);
            }
            1 => Op::Copy {
                offset: self.u64("a copy's offset")?,
                len: self.u64("a copy's length")?,
            },
            2 => {
                let len = self.u64("a literal's length")?;
                Op::Literal(self.bytes(len, "a literal")?)
            }
            3..=5 => {
                let offset = self.u64("a patch's offset")?;
                let len = self.u64("a patch's length")?;
                let plen = self.u64("a patch's size")?;
                let patch = self.bytes(plen, "a patch")?;
                if tag == 3 {
                    Op::Patch { offset, len, patch }
                } else {
                    Op::Deflate {
                        offset,
                        len,
                        patch,
                        last: tag == 5,
                    }
                }
            }
            other => return Err(corrupt(format!("unknown operation {other}"))),
        };
        Ok(Some(op))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_read_back_as_written() {
        let header = Header {
            from: [1; 32],
            to: [2; 32],
            to_size: 99,
            level: 6,
        };
        let ops = vec![
            Op::Copy { offset: 5, len: 7 },
            Op::Literal(b"abc".to_vec()),
            Op::Patch {
                offset: 1,
                len: 2,
                patch: vec![9; 4],
            },
            Op::Deflate {
                offset: 3,
                len: 4,
                patch: vec![8; 2],
                last: true,
            },
        ];
        let mut bytes = Vec::new();
        write_header(&mut bytes, &header).expect("header");
        for op in &ops {
            write_op(&mut bytes, op).expect("op");
        }
        write_end(&mut bytes).expect("end");
        let expected_len = HEADER_LEN + ops.iter().map(Op::encoded_len).sum::<u64>() + 1;
        assert_eq!(bytes.len() as u64, expected_len);

        let mut reader = DeltaReader::new(&bytes[..], bytes.len() as u64);
        assert_eq!(reader.header().expect("header"), header);
        let mut back = Vec::new();
        while let Some(op) = reader.next_op().expect("op") {
            back.push(op);
        }
        assert_eq!(back, ops);
    }

    #[test]
    fn a_length_past_the_file_is_refused_before_it_is_allocated() {
        let mut bytes = Vec::new();
        write_header(
            &mut bytes,
            &Header {
                from: [0; 32],
                to: [0; 32],
                to_size: 1,
                level: 6,
            },
        )
        .expect("header");
        bytes.push(2);
        bytes.extend_from_slice(&u64::MAX.to_le_bytes());
        let mut reader = DeltaReader::new(&bytes[..], bytes.len() as u64);
        reader.header().expect("header");
        let err = reader.next_op().expect_err("refused");
        assert!(err.to_string().contains("only 0 are left"), "{err}");
    }
}
