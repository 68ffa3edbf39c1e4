//! `run/update.lock`: one updater per installation. It is an flock(2), so the kernel
//! drops it when its holder dies; [`holder`] tells others (the agent, `agent status`)
//! whether an updater holds it, without taking it (a probe that took it, even for an
//! instant, could turn a starting updater away).

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::Path;

use nix::fcntl::{Flock, FlockArg};

use crate::error::{Result, UpdateError};
use crate::state::io_at;

/// Held for the life of the update; the kernel releases it if the updater dies.
pub struct UpdateLock {
    _file: Flock<File>,
}

impl UpdateLock {
    pub fn acquire(path: &Path) -> Result<Self> {
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
                Ok(Self { _file: locked })
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
}

/// The pid of the updater holding the lock at `path`, if one does: the pid it wrote there
/// is listed in /proc/locks as holding an exclusive flock on that very file.
pub fn holder(path: &Path) -> Option<u32> {
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
fn holds(line: &str, pid: u32, inode: u64) -> bool {
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
    use super::*;

    #[test]
    fn second_lock_names_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run/update.lock");
        let held = UpdateLock::acquire(&path).unwrap();
        let err = UpdateLock::acquire(&path).err().unwrap().to_string();
        assert!(err.contains(&std::process::id().to_string()), "{err}");
        drop(held);
        UpdateLock::acquire(&path).unwrap();
    }

    #[test]
    fn the_holder_is_seen_only_while_the_lock_is_held() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run/update.lock");
        let held = UpdateLock::acquire(&path).unwrap();
        assert_eq!(holder(&path), Some(std::process::id()));
        drop(held);
        // The pid is still written in the file; the kernel no longer lists the lock.
        assert_eq!(holder(&path), None);
        assert_eq!(holder(&dir.path().join("none")), None);
    }

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
