use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// `pread(2)`: the file's cursor is not moved.
pub(crate) fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    file.read_exact_at(buf, offset)
}
