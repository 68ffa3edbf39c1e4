// Win32 calls have no safe wrapper in std for what is done here (MoveFileExW's flags).
#![allow(unsafe_code)]

use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::windows::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use windows_sys::Win32::Foundation::{ERROR_ACCESS_DENIED, ERROR_SHARING_VIOLATION};
use windows_sys::Win32::Storage::FileSystem::{
    GetDiskFreeSpaceExW, MOVEFILE_REPLACE_EXISTING, MOVEFILE_WRITE_THROUGH, MoveFileExW,
};

/// A path from the raw bytes an archive names it with: UTF-8 only (Windows names are
/// UTF-16; any other encoding would be guessed).
/// `current` is a file naming the version: Windows cannot swap a directory link
/// atomically, and Wine cannot make one.
pub const CURRENT_IS_LINK: bool = false;

pub fn path_from_bytes(bytes: &[u8]) -> Result<PathBuf, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "a name that is not UTF-8".to_owned())?;
    if text.contains('\\') {
        // A backslash is a separator here and a name character on Unix: the archive
        // would mean different files on the two.
        return Err("a backslash in a name".into());
    }
    Ok(PathBuf::from(text))
}

pub fn path_bytes(path: &Path) -> Vec<u8> {
    path.to_string_lossy().into_owned().into_bytes()
}

/// Names Windows gives another meaning: devices (`CON`, `NUL`, `COM1`…, with any
/// extension), alternate data streams (`:`), and trailing dots or spaces (dropped by
/// Win32, so two entries could name one file).
pub fn reserved_name(name: &OsStr) -> Option<&'static str> {
    let name = name.to_string_lossy();
    if name.contains(':') {
        return Some("a ':' (an alternate data stream) in a name");
    }
    if name.ends_with('.') || name.ends_with(' ') {
        return Some("a name ending in a dot or a space");
    }
    let stem = name
        .split('.')
        .next()
        .unwrap_or("")
        .trim_end()
        .to_ascii_uppercase();
    let device = matches!(stem.as_str(), "CON" | "PRN" | "AUX" | "NUL")
        || ((stem.starts_with("COM") || stem.starts_with("LPT"))
            && stem.len() == 4
            && stem.as_bytes()[3].is_ascii_digit());
    device.then_some("a Windows device name")
}

/// Opens a new file; the installation's directory ACL decides who may read it.
pub fn create_private(path: &Path) -> io::Result<File> {
    OpenOptions::new().write(true).create_new(true).open(path)
}

/// Unix modes have no meaning here: the directory ACL governs.
pub fn set_file_mode(_file: &File, _mode: u32) -> io::Result<()> {
    Ok(())
}

pub fn set_path_mode(_path: &Path, _mode: u32) -> io::Result<()> {
    Ok(())
}

/// Archives for Windows carry no links: creating one needs a privilege most services
/// lack, and Wine reports success while creating nothing.
pub fn symlink(_target: &Path, _link: &Path) -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "symbolic links are not unpacked on Windows",
    ))
}

/// NTFS journals its metadata and [`replace_file`] writes through: a directory handle
/// cannot be flushed here (FlushFileBuffers refuses one).
pub fn fsync_dir(_dir: &Path) -> io::Result<()> {
    Ok(())
}

/// Each file was flushed as it was written ([`replace_file`] writes through).
pub fn sync_tree(_dir: &Path) -> io::Result<()> {
    Ok(())
}

fn wide(path: &Path) -> Vec<u16> {
    path.as_os_str().encode_wide().chain(Some(0)).collect()
}

/// `MoveFileExW(REPLACE_EXISTING | WRITE_THROUGH)`: `to` is the old file or the new one,
/// never absent. A reader holding `to` open for a moment makes Windows refuse with a
/// sharing violation (or access denied): retried for up to two seconds.
pub fn replace_file(from: &Path, to: &Path) -> io::Result<()> {
    let (from_w, to_w) = (wide(from), wide(to));
    let mut waited = Duration::ZERO;
    loop {
        // SAFETY: both are NUL-terminated UTF-16 strings that outlive the call.
        let ok = unsafe {
            MoveFileExW(
                from_w.as_ptr(),
                to_w.as_ptr(),
                MOVEFILE_REPLACE_EXISTING | MOVEFILE_WRITE_THROUGH,
            )
        };
        if ok != 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        let busy = matches!(
            err.raw_os_error().map(|c| c as u32),
            Some(ERROR_SHARING_VIOLATION | ERROR_ACCESS_DENIED)
        );
        if !busy || waited >= Duration::from_secs(2) {
            return Err(err);
        }
        std::thread::sleep(Duration::from_millis(20));
        waited += Duration::from_millis(20);
    }
}

/// Modes have no meaning here; the directory ACL governs.
pub fn with_mode(opts: &mut OpenOptions, _mode: u32) -> &mut OpenOptions {
    opts
}

/// The distribution holds no links on Windows and Wine cannot make them; a reparse point
/// at the last component is opened as itself rather than followed.
pub fn no_follow(opts: &mut OpenOptions) -> &mut OpenOptions {
    use std::os::windows::fs::OpenOptionsExt;
    opts.custom_flags(windows_sys::Win32::Storage::FileSystem::FILE_FLAG_OPEN_REPARSE_POINT)
}

/// Unix permission bits as Windows' read-only attribute implies them.
pub fn mode_of(meta: &fs::Metadata) -> u32 {
    if meta.permissions().readonly() {
        0o500
    } else {
        0o700
    }
}

/// Windows runs a file by its extension, not a mode bit: every file counts, and
/// CreateProcess says what it cannot run.
pub fn is_executable(_meta: &fs::Metadata) -> bool {
    true
}

pub fn free_bytes(path: &Path) -> io::Result<u64> {
    let dir = wide(path);
    let mut free: u64 = 0;
    // SAFETY: a NUL-terminated path and a valid out pointer; the other outs may be null.
    let ok = unsafe {
        GetDiskFreeSpaceExW(
            dir.as_ptr(),
            &mut free,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    if ok == 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(free)
}

/// The absolute path with every link resolved, in the plain `C:\…` form when it has one
/// (std answers the `\\?\C:\…` form, which other programs and string comparisons do not
/// take for the same path).
pub fn canonical(path: &Path) -> io::Result<PathBuf> {
    let full = fs::canonicalize(path)?;
    let text = full.display().to_string();
    match text.strip_prefix(r"\\?\") {
        Some(rest) if rest.as_bytes().get(1) == Some(&b':') => Ok(PathBuf::from(rest)),
        _ => Ok(full),
    }
}

/// Creates one directory; its ACL comes from its parent.
pub fn create_dir_with_mode(dir: &Path, _mode: u32) -> io::Result<()> {
    fs::create_dir(dir)
}

pub(crate) fn name_program(link: &Path, target: &Path) -> crate::Result<()> {
    use crate::error::IoContext;
    let dir = link.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(".updater.new-{}.exe", std::process::id()));
    let _ = fs::remove_file(&tmp);
    // A copy, never a link: this name is the one run, and a running program's file (any
    // link to it) cannot be deleted; the bundle itself must stay deletable.
    crate::atomic::copy_file(&dir.join(target), &tmp)?;
    replace_file(&tmp, link).at(link)
}

/// The program to start as the updater: the copy [`name_program`] made.
pub fn updater_to_run<'a>(_bundle: &'a Path, named: &'a Path) -> &'a Path {
    named
}

/// Removes a file; one that cannot go (a running program) is renamed aside to a
/// `.deleted-` name, for a later [`remove_or_set_aside`] in that directory to remove.
pub fn remove_or_set_aside(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => {
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
            if name.as_deref().is_some_and(|n| n.starts_with(".deleted-")) {
                return Err(e);
            }
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            let aside =
                path.with_file_name(format!(".deleted-{nanos}-{}", name.unwrap_or_default()));
            fs::rename(path, aside)
        }
    }
}
