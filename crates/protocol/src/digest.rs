//! The digests of a bundle, computed in one read of the stream.
//!
//! md5 and sha256 are what the server advertises; BLAKE2b-512 is what a minisign `ED`
//! signature covers. Verifying a download must not read it three times, so all three
//! are fed from the same buffer, split over two threads for large buffers (the
//! machines this runs on have at least two cores and hashing is the bottleneck).

use std::io::{self, Read};

use blake2::Blake2b512;
use md5::Md5;
use sha2::{Digest, Sha256};

/// Buffers smaller than this are hashed on the calling thread: a thread hand-off costs more.
const PARALLEL_THRESHOLD: usize = 256 * 1024;
/// Read size for [`Digests::of_reader`].
pub const CHUNK: usize = 4 * 1024 * 1024;

/// The three digests of the same bytes, plus their count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Digests {
    pub size: u64,
    pub md5: [u8; 16],
    pub sha256: [u8; 32],
    pub blake2b: [u8; 64],
}

impl Digests {
    pub fn md5_hex(&self) -> String {
        hex::encode(self.md5)
    }

    pub fn sha256_hex(&self) -> String {
        hex::encode(self.sha256)
    }

    /// Hashes everything `reader` yields.
    pub fn of_reader(mut reader: impl Read) -> io::Result<Self> {
        let mut hasher = MultiHasher::new();
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = fill(&mut reader, &mut buf)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
        }
        Ok(hasher.finish())
    }
}

/// Reads until `buf` is full or the stream ends, so every chunk is large enough to split.
pub fn fill(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Incremental form of [`Digests::of_reader`], for bytes that arrive from a socket.
#[derive(Clone, Default)]
pub struct MultiHasher {
    size: u64,
    md5: Md5,
    sha256: Sha256,
    blake2b: Blake2b512,
}

impl MultiHasher {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn update(&mut self, data: &[u8]) {
        self.size += data.len() as u64;
        if data.len() < PARALLEL_THRESHOLD {
            self.md5.update(data);
            self.sha256.update(data);
            self.blake2b.update(data);
            return;
        }
        let (md5, sha256, blake2b) = (&mut self.md5, &mut self.sha256, &mut self.blake2b);
        // BLAKE2b is about as costly as md5 and sha256 together, so it gets a thread alone.
        std::thread::scope(|scope| {
            scope.spawn(|| blake2b.update(data));
            sha256.update(data);
            md5.update(data);
        });
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn finish(self) -> Digests {
        Digests {
            size: self.size,
            md5: self.md5.finalize().into(),
            sha256: self.sha256.finalize().into(),
            blake2b: self.blake2b.finalize().into(),
        }
    }
}

impl io::Write for MultiHasher {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_answers_for_abc() {
        let d = Digests::of_reader(&b"abc"[..]).unwrap();
        assert_eq!(d.size, 3);
        assert_eq!(d.md5_hex(), "900150983cd24fb0d6963f7d28e17f72");
        assert_eq!(
            d.sha256_hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(hex::encode(d.blake2b).starts_with("ba80a53f981c4d0d6a2797b69f12f6e9"));
    }

    #[test]
    fn split_and_parallel_paths_agree() {
        let data: Vec<u8> = (0..(3 * PARALLEL_THRESHOLD + 17))
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        let whole = Digests::of_reader(&data[..]).unwrap();
        let mut pieces = MultiHasher::new();
        for chunk in data.chunks(1000) {
            pieces.update(chunk);
        }
        assert_eq!(whole, pieces.finish());
    }
}
