//! Writes that are either wholly done or not done at all, even across a power cut.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use crate::error::{IoContext, Result};

/// Replaces `path` with `contents`: temp file in the same directory, fsync, rename, fsync
/// the directory. Readers see the old file or the new one, never a mix.
pub fn write(path: &Path, contents: &[u8]) -> Result<()> {
    write_with_mode(path, contents, None)
}

pub fn write_with_mode(path: &Path, contents: &[u8], mode: Option<u32>) -> Result<()> {
    let dir = parent(path);
    let mut tmp = tempfile::Builder::new()
        .prefix(".tmp-")
        .tempfile_in(&dir)
        .at(&dir)?;
    tmp.write_all(contents).at(tmp.path().to_path_buf())?;
    if let Some(mode) = mode {
        crate::os::set_file_mode(tmp.as_file(), mode).at(path)?;
    }
    tmp.as_file().sync_all().at(path)?;
    put_in_place(tmp, path)?;
    fsync_dir(&dir)
}

/// Makes a rename or create inside `dir` durable.
pub fn fsync_dir(dir: &Path) -> Result<()> {
    crate::os::fsync_dir(dir).at(dir)
}

/// Points `link` at `target` by renaming a fresh symlink over it: there is no instant at
/// which `link` does not exist.
pub fn replace_symlink(link: &Path, target: &Path) -> Result<()> {
    let dir = parent(link);
    let name = link
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.new-{}", std::process::id()));
    match fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).at(&tmp),
    }
    crate::os::symlink(target, &tmp).at(&tmp)?;
    fs::rename(&tmp, link).at(link)?;
    fsync_dir(&dir)
}

/// Gives the program `target` (a file name in `link`'s directory) the second name
/// `link`, replacing what had it: a symlink on Unix; on Windows, which runs a program
/// by its own file, a hard link or a copy.
pub fn name_program(link: &Path, target: &Path) -> Result<()> {
    crate::os::name_program(link, target)
}

/// Reads a file of at most `max` bytes; larger files are an error, not a truncation.
pub fn read_limited(path: &Path, max: u64) -> Result<Vec<u8>> {
    let file = File::open(path).at(path)?;
    let mut buf = Vec::new();
    file.take(max + 1).read_to_end(&mut buf).at(path)?;
    if buf.len() as u64 > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than {max} bytes"),
        ))
        .at(path);
    }
    Ok(buf)
}

/// Like [`read_limited`], as UTF-8 text.
pub fn read_text(path: &Path, max: u64) -> Result<String> {
    let bytes = read_limited(path, max)?;
    String::from_utf8(bytes)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not UTF-8 text"))
        .at(path)
}

/// The last `max` bytes of a file (all of it if smaller), as text with invalid UTF-8
/// replaced: for showing the end of a log.
pub fn read_tail(path: &Path, max: u64) -> Result<String> {
    use std::io::{Seek, SeekFrom};
    let mut file = File::open(path).at(path)?;
    let len = file.metadata().at(path)?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(max)))
        .at(path)?;
    let mut buf = Vec::new();
    file.take(max).read_to_end(&mut buf).at(path)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// The last `lines` lines of a text file (empty if it cannot be read).
pub fn tail_lines(path: &Path, lines: usize) -> String {
    let Ok(text) = read_tail(path, 64 * 1024) else {
        return String::new();
    };
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Copies the directories and regular files under `src` to a new `dest`, through a
/// temporary sibling renamed into place (so `dest` is whole or absent); symlinks and
/// other special files are left out. `dest` must not exist.
pub fn copy_tree(src: &Path, dest: &Path) -> Result<u64> {
    fn walk(src: &Path, dest: &Path, n: &mut u64) -> Result<()> {
        fs::create_dir_all(dest).at(dest)?;
        for entry in fs::read_dir(src).at(src)? {
            let entry = entry.at(src)?;
            let kind = entry.file_type().at(entry.path())?;
            let to = dest.join(entry.file_name());
            if kind.is_dir() {
                walk(&entry.path(), &to, n)?;
            } else if kind.is_file() {
                fs::copy(entry.path(), &to).at(&to)?;
                *n += 1;
            }
        }
        Ok(())
    }
    let dir = parent(dest);
    let tmp = tempfile::Builder::new()
        .prefix(".tmp-tree-")
        .tempdir_in(&dir)
        .at(&dir)?;
    let mut n = 0;
    walk(src, tmp.path(), &mut n)?;
    let staged = tmp.keep();
    fs::rename(&staged, dest).at(dest)?;
    fsync_dir(&dir)?;
    Ok(n)
}

/// Copies a regular file to `dest` through a temp file and rename; keeps the mode.
pub fn copy_file(src: &Path, dest: &Path) -> Result<u64> {
    let dir = parent(dest);
    let mut input = File::open(src).at(src)?;
    let perms = input.metadata().at(src)?.permissions();
    let mut tmp = tempfile::Builder::new()
        .prefix(".tmp-")
        .tempfile_in(&dir)
        .at(&dir)?;
    let n = io::copy(&mut input, tmp.as_file_mut()).at(dest)?;
    tmp.as_file().set_permissions(perms).at(dest)?;
    tmp.as_file().sync_all().at(dest)?;
    put_in_place(tmp, dest)?;
    fsync_dir(&dir)?;
    Ok(n)
}

/// Moves a written temp file over `dest` by the platform's replace, not tempfile's
/// persist: on Windows a reader that has `dest` open for a moment (an agent reading the
/// journal while its updater writes it) refuses a plain move, and the replace waits that
/// moment out. The temp file is removed if the move fails.
fn put_in_place(tmp: tempfile::NamedTempFile, dest: &Path) -> Result<()> {
    let tmp = tmp.into_temp_path();
    crate::os::replace_file(&tmp, dest).at(dest)?;
    // Moved: nothing is left at the temp path to remove.
    let _ = tmp.keep();
    Ok(())
}

/// Makes `dest` a second name of `src` when both lie on one filesystem (no bytes copied),
/// and a copy otherwise. For files nobody writes in place again.
pub fn link_or_copy(src: &Path, dest: &Path) -> Result<()> {
    match fs::hard_link(src, dest) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Err(e).at(dest),
        Err(_) => copy_file(src, dest).map(drop),
    }
}

fn parent(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn copy_tree_copies_files_and_directories_whole() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        fs::create_dir_all(src.join("sub")).unwrap();
        fs::write(src.join("a.yml"), "a").unwrap();
        fs::write(src.join("sub/b.yml"), "b").unwrap();
        // A link is never followed out of the tree (Windows makes none without a privilege).
        #[cfg(unix)]
        std::os::unix::fs::symlink("/etc/passwd", src.join("link")).unwrap();
        let dest = dir.path().join("conf/workload");
        fs::create_dir_all(dir.path().join("conf")).unwrap();
        assert_eq!(copy_tree(&src, &dest).unwrap(), 2);
        assert_eq!(fs::read_to_string(dest.join("sub/b.yml")).unwrap(), "b");
        assert!(fs::symlink_metadata(dest.join("link")).is_err());
        assert_eq!(tail_lines(&dest.join("a.yml"), 3), "a");
    }

    use super::*;

    #[test]
    fn write_replaces_whole_file_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        write(&p, b"one").unwrap();
        write(&p, b"two").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn replace_symlink_flips_target() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("current");
        replace_symlink(&link, Path::new("versions/a")).unwrap();
        replace_symlink(&link, Path::new("versions/b")).unwrap();
        assert_eq!(fs::read_link(&link).unwrap(), Path::new("versions/b"));
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn read_limited_refuses_large_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        fs::write(&p, vec![b'a'; 11]).unwrap();
        assert!(read_limited(&p, 10).is_err());
        assert_eq!(read_limited(&p, 11).unwrap().len(), 11);
    }
}
