//! `current`: which version directory an installation runs. On Unix it is a symlink
//! `current -> versions/<v>`, flipped by renaming a fresh link over it; on Windows, which
//! cannot swap a directory link atomically (and under Wine cannot make one at all), it is
//! a small file holding `<v>`, replaced by `MoveFileExW`. Readers accept either form on
//! every platform, so tools on one machine can read a home written by the other.

use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};

use crate::error::{IoContext, Result};

/// At most this many bytes are read from a `current` file: a version directory's name.
const MAX_FILE: u64 = 512;

/// The name (`2.2.0+1234`) of the version directory `current` names, relative to
/// `versions/`. Errors when `current` is absent, unreadable, or names anything but one
/// directory of `versions/`.
pub fn read_name(current: &Path) -> Result<String> {
    let meta = fs::symlink_metadata(current).at(current)?;
    let named = if meta.file_type().is_symlink() {
        fs::read_link(current).at(current)?
    } else {
        let text = crate::atomic::read_text(current, MAX_FILE)?;
        PathBuf::from("versions").join(text.trim())
    };
    name_of(&named).ok_or_else(|| crate::Error::Io {
        path: current.to_path_buf(),
        source: io::Error::new(
            io::ErrorKind::InvalidData,
            format!("names {}, not a directory of versions/", named.display()),
        ),
    })
}

/// The version directory `current` names, under the home holding it.
pub fn read_dir(current: &Path) -> Result<PathBuf> {
    let name = read_name(current)?;
    let home = current.parent().unwrap_or(Path::new("."));
    Ok(home.join("versions").join(name))
}

/// `versions/<name>` (either separator) to `<name>`; anything else is `None`.
fn name_of(named: &Path) -> Option<String> {
    let parts: Vec<Component<'_>> = named
        .components()
        .filter(|c| !matches!(c, Component::CurDir))
        .collect();
    match parts.as_slice() {
        [Component::Normal(dir), Component::Normal(name)] if *dir == "versions" => {
            let name = name.to_str()?;
            (!name.is_empty() && !name.contains(['/', '\\'])).then(|| name.to_owned())
        }
        _ => None,
    }
}

/// Points `current` at `versions/<name>`, keeping the form it has (a home written on
/// Windows and stamped on Linux stays a Windows home), else in this platform's form;
/// there is no instant at which `current` does not exist.
pub fn point(current: &Path, name: &str) -> Result<()> {
    let is_file = fs::symlink_metadata(current).is_ok_and(|m| m.file_type().is_file());
    if is_file || !crate::os::CURRENT_IS_LINK {
        write_file(current, name)
    } else {
        crate::atomic::replace_symlink(current, &Path::new("versions").join(name))
    }
}

/// The file form: a written and flushed temp file moved over `current`.
fn write_file(current: &Path, name: &str) -> Result<()> {
    use std::io::Write;
    let dir = current.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(".current.new-{}", std::process::id()));
    let write = || -> io::Result<()> {
        let mut file = fs::File::create(&tmp)?;
        file.write_all(format!("{name}\n").as_bytes())?;
        file.sync_all()
    };
    write().at(&tmp)?;
    crate::os::replace_file(&tmp, current).at(current)?;
    crate::atomic::fsync_dir(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_forms_read_and_a_flip_is_seen() {
        let dir = tempfile::tempdir().unwrap();
        let current = dir.path().join("current");
        point(&current, "1.0.0+1").unwrap();
        assert_eq!(read_name(&current).unwrap(), "1.0.0+1");
        point(&current, "2.0.0+2").unwrap();
        assert_eq!(read_name(&current).unwrap(), "2.0.0+2");
        assert_eq!(
            read_dir(&current).unwrap(),
            dir.path().join("versions").join("2.0.0+2")
        );
        // The other form, as the other platform writes it, is read and kept.
        fs::remove_file(&current).unwrap();
        fs::write(&current, "3.0.0+3\r\n").unwrap();
        assert_eq!(read_name(&current).unwrap(), "3.0.0+3");
        point(&current, "4.0.0+4").unwrap();
        assert_eq!(read_name(&current).unwrap(), "4.0.0+4");
        assert!(
            fs::symlink_metadata(&current)
                .unwrap()
                .file_type()
                .is_file()
        );
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn anything_but_a_version_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let current = dir.path().join("current");
        for bad in ["", "../etc", "a/b", "C:\\x", "..\\x"] {
            fs::write(&current, bad).unwrap();
            assert!(read_name(&current).is_err(), "{bad:?}");
        }
        assert!(read_name(&dir.path().join("none")).is_err());
    }
}
