//! `run/update.lock`: one updater per installation, released by the system when its
//! holder dies (an flock(2) on Unix, an exclusive open on Windows); [`holder`] tells
//! others (the agent, `agent status`) whether an updater holds it, without taking it (a
//! probe that took it, even for an instant, could turn a starting updater away).

use std::path::Path;

use crate::error::Result;

#[cfg(unix)]
mod unix;
#[cfg(unix)]
use unix as os;
#[cfg(windows)]
mod windows;
#[cfg(windows)]
use windows as os;

/// Held for the life of the update; released when the updater ends, however it ends.
pub struct UpdateLock {
    _held: os::Held,
}

impl UpdateLock {
    pub fn acquire(path: &Path) -> Result<Self> {
        Ok(Self {
            _held: os::acquire(path)?,
        })
    }
}

/// The pid of the updater holding the lock at `path`, if one does.
pub fn holder(path: &Path) -> Option<u32> {
    os::holder(path)
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
}
