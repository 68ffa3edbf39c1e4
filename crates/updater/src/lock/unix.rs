//! An flock(2), seen by others in `/proc/locks`.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::Path;

use nix::fcntl::{Flock, FlockArg};

use crate::error::{Result, UpdateError};
use crate::state::io_at;

pub(super) type Held = Flock<File>;

pub(super) fn acquire(path: &Path) -> Result<Held> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).map_err(|e| io_at(dir, e))?;
    }
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| io_at(path, e))?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(mut locked) => {
            let _ = locked.set_len(0);
            let _ = locked.rewind();
            let _ = writeln!(locked, "{}", std::process::id());
            let _ = locked.sync_all();
            Ok(locked)
        }
        Err((mut file, _)) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            Err(UpdateError::Locked {
                lock: path.to_owned(),
                holder: holder.trim().to_owned(),
            })
        }
    }
}

/// The pid written in the lock file is listed in /proc/locks as holding an exclusive
/// flock on that very file.
pub(super) fn holder(path: &Path) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let pid: u32 = fs::read_to_string(path).ok()?.trim().parse().ok()?;
    let inode = fs::metadata(path).ok()?.ino();
    let locks = fs::read_to_string("/proc/locks").ok()?;
    locks
        .lines()
        .any(|line| holds(line, pid, inode))
        .then_some(pid)
}

/// `1: FLOCK  ADVISORY  WRITE 1234 fe:00:5366268 0 EOF`: an exclusive flock by `pid` on
/// inode `inode` (the device is not compared: the pid and inode together suffice).
pub(super) fn holds(line: &str, pid: u32, inode: u64) -> bool {
    let fields: Vec<&str> = line.split_whitespace().collect();
    matches!(
        fields.as_slice(),
        [_, "FLOCK", _, "WRITE", p, dev_inode, ..]
            if p.parse() == Ok(pid)
                && dev_inode.rsplit(':').next().and_then(|i| i.parse().ok()) == Some(inode)
    )
}

#[cfg(test)]
mod tests {
    use super::holds;

    #[test]
    fn proc_locks_lines_parse() {
        let line = "1: FLOCK  ADVISORY  WRITE 22768 fe:00:5366268 0 EOF";
        assert!(holds(line, 22768, 5366268));
        assert!(!holds(line, 22769, 5366268));
        assert!(!holds(line, 22768, 5366267));
        assert!(!holds(
            "2: FLOCK  ADVISORY  READ 22768 fe:00:5366268 0 EOF",
            22768,
            5366268
        ));
        assert!(!holds(
            "3: POSIX  ADVISORY  WRITE 22768 fe:00:5366268 0 EOF",
            22768,
            5366268
        ));
    }
}
