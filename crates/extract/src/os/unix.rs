use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// A path from the raw bytes an archive names it with.
/// `current` is a symlink, flipped by rename(2).
pub const CURRENT_IS_LINK: bool = true;

pub fn path_from_bytes(bytes: &[u8]) -> Result<PathBuf, String> {
    Ok(PathBuf::from(OsStr::from_bytes(bytes)))
}

/// The raw bytes of a path, for messages.
pub fn path_bytes(path: &Path) -> Vec<u8> {
    path.as_os_str().as_bytes().to_vec()
}

/// A name an archive may not use on this platform, or `None`.
pub fn reserved_name(_name: &OsStr) -> Option<&'static str> {
    None
}

/// Opens a new file only its owner can read and write.
pub fn create_private(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

pub fn set_file_mode(file: &File, mode: u32) -> io::Result<()> {
    file.set_permissions(fs::Permissions::from_mode(mode))
}

pub fn set_path_mode(path: &Path, mode: u32) -> io::Result<()> {
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
}

pub fn symlink(target: &Path, link: &Path) -> io::Result<()> {
    std::os::unix::fs::symlink(target, link)
}

/// Makes a rename or create inside `dir` durable.
pub fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir).and_then(|d| d.sync_all())
}

/// Flushes everything written under `dir` (one syncfs(2) for a whole unpacked tree).
pub fn sync_tree(dir: &Path) -> io::Result<()> {
    let dir = File::open(dir)?;
    nix::unistd::syncfs(&dir).map_err(io::Error::from)
}

/// Renames `from` over `to` (both in one directory): `to` is the old file or the new one,
/// never absent.
pub fn replace_file(from: &Path, to: &Path) -> io::Result<()> {
    fs::rename(from, to)
}

/// Asks for `mode` on the file `opts` creates.
pub fn with_mode(opts: &mut OpenOptions, mode: u32) -> &mut OpenOptions {
    opts.mode(mode)
}

/// Refuses to open through a symlink at the last component.
pub fn no_follow(opts: &mut OpenOptions) -> &mut OpenOptions {
    opts.custom_flags(nix::libc::O_NOFOLLOW)
}

/// A file's permission bits.
pub fn mode_of(meta: &fs::Metadata) -> u32 {
    meta.permissions().mode()
}

/// Whether a file may be run as a program (any execute bit).
pub fn is_executable(meta: &fs::Metadata) -> bool {
    meta.permissions().mode() & 0o111 != 0
}

/// Bytes free for unprivileged writers on the filesystem holding `path`.
pub fn free_bytes(path: &Path) -> io::Result<u64> {
    let stat = nix::sys::statvfs::statvfs(path).map_err(io::Error::from)?;
    #[allow(clippy::useless_conversion)] // the field types differ between platforms
    Ok(u64::from(stat.blocks_available()).saturating_mul(u64::from(stat.fragment_size())))
}

/// The absolute path with every link resolved.
pub fn canonical(path: &Path) -> io::Result<PathBuf> {
    fs::canonicalize(path)
}

/// Creates one directory with `mode` (before the umask).
pub fn create_dir_with_mode(dir: &Path, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new().mode(mode).create(dir)
}

pub(crate) fn name_program(link: &Path, target: &Path) -> crate::Result<()> {
    crate::atomic::replace_symlink(link, target)
}

/// The program to start as the updater: the bundle itself (a symlink names it for the
/// wrapper's recovery).
pub fn updater_to_run<'a>(bundle: &'a Path, _named: &'a Path) -> &'a Path {
    bundle
}

/// Removes a file (Unix removes a running program's name like any other).
pub fn remove_or_set_aside(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}
