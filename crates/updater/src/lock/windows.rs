//! The lock file opened for writing with only reads shared, and deleted on close: a
//! second updater's open fails with a sharing violation until the holder's handle
//! closes, which Windows does when its process ends, however it ends; and the file
//! exists only while it is held.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::windows::fs::OpenOptionsExt;
use std::path::Path;

use windows_sys::Win32::Foundation::{GENERIC_READ, GENERIC_WRITE};
use windows_sys::Win32::Storage::FileSystem::{
    DELETE, FILE_FLAG_DELETE_ON_CLOSE, FILE_SHARE_DELETE, FILE_SHARE_READ, FILE_SHARE_WRITE,
};

/// ERROR_SHARING_VIOLATION: another updater holds it.
const SHARING_VIOLATION: i32 = 32;
/// ERROR_ACCESS_DENIED: also what an open meets while the last holder's file is being
/// deleted (a reader still had it open when the holder closed it).
const ACCESS_DENIED: i32 = 5;

use crate::error::{Result, UpdateError};
use crate::state::io_at;

pub(super) type Held = File;

pub(super) fn acquire(path: &Path) -> Result<Held> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).map_err(|e| io_at(dir, e))?;
    }
    let open = || {
        OpenOptions::new()
            // std asks for write before it creates; the access itself is access_mode's.
            .read(true)
            .write(true)
            .access_mode(GENERIC_READ | GENERIC_WRITE | DELETE)
            .create(true)
            .truncate(false)
            .share_mode(FILE_SHARE_READ)
            .custom_flags(FILE_FLAG_DELETE_ON_CLOSE)
            .open(path)
    };
    let mut opened = open();
    for _ in 0..20 {
        match &opened {
            Err(e) if e.raw_os_error() == Some(ACCESS_DENIED) => {
                std::thread::sleep(std::time::Duration::from_millis(25));
                opened = open();
            }
            _ => break,
        }
    }
    match opened {
        Ok(mut file) => {
            let _ = file.set_len(0);
            let _ = file.rewind();
            let _ = writeln!(file, "{}", std::process::id());
            let _ = file.sync_all();
            Ok(file)
        }
        Err(e) if e.raw_os_error() == Some(SHARING_VIOLATION) => Err(UpdateError::Locked {
            lock: path.to_owned(),
            holder: read_pid(path).map(|p| p.to_string()).unwrap_or_default(),
        }),
        Err(e) => Err(io_at(path, e)),
    }
}

fn read_pid(path: &Path) -> Option<u32> {
    let mut text = String::new();
    OpenOptions::new()
        .read(true)
        .share_mode(FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE)
        .open(path)
        .ok()?
        .read_to_string(&mut text)
        .ok()?;
    text.trim().parse().ok()
}

/// The file exists only while held (deleted on close), and names its holder; the pid
/// must still run (a file whose delete is pending names a process that is gone).
pub(super) fn holder(path: &Path) -> Option<u32> {
    let pid = read_pid(path)?;
    crate::process::is_alive(pid).then_some(pid)
}
