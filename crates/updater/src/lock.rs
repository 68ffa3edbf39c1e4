//! `run/update.lock`: one updater per installation.

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
}
