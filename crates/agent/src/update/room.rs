//! Room on disk for an update. The agent asks for what this update needs (the bundle
//! file, downloaded or rebuilt from a delta, and its unpacked copy, sized after the
//! running version's, which the new one resembles), and when the disk is short it frees
//! what it can lose before it gives up: first the kept bundles of versions it does not
//! run, then those versions themselves, oldest first. Never the running version: it is
//! what an update that fails rolls back to.
//!
//! The choice is [`plan`], pure; [`make_room`] looks at the disk and deletes.

use std::path::{Path, PathBuf};

use agent_protocol::layout::{self, AgentHome};

/// The unpacked copy of the new version is taken as this much larger than the running
/// one's (a release grows a little), in percent.
const GROWTH_PERCENT: u64 = 125;

/// What this update needs on disk: the bundle's file and its unpacked distribution.
pub fn needed(bundle_size: u64, running_unpacked: u64) -> u64 {
    bundle_size.saturating_add(running_unpacked.saturating_mul(GROWTH_PERCENT) / 100)
}

/// Something on disk the agent may delete for room, and what it frees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Freeable {
    pub path: PathBuf,
    pub bytes: u64,
}

/// The candidates to delete, in the order given, until `free` reaches `need`; `None` if
/// even all of them would not make room (then nothing is deleted).
pub fn plan(free: u64, need: u64, candidates: &[Freeable]) -> Option<Vec<Freeable>> {
    let mut would_be_free = free;
    let mut chosen = Vec::new();
    for c in candidates {
        if would_be_free >= need {
            break;
        }
        would_be_free = would_be_free.saturating_add(c.bytes);
        chosen.push(c.clone());
    }
    (would_be_free >= need).then_some(chosen)
}

/// What was short, when no room could be made (deleting every version the agent does
/// not run would not have been enough, so none was deleted).
#[derive(Debug)]
pub struct NoRoom {
    pub need: u64,
    pub free: u64,
}

/// Makes room in `home` for an update whose bundle is `bundle_size` bytes, the agent
/// running `running` (a version directory). What it deleted, each with its size.
pub fn make_room(
    home: &AgentHome,
    running: &Path,
    bundle_size: u64,
) -> Result<Vec<Freeable>, NoRoom> {
    let running_unpacked =
        tree_size(running).saturating_sub(file_size(&running.join(layout::KEPT_BUNDLE_FILE)));
    let need = needed(bundle_size, running_unpacked);
    let free = agent_extract::os::free_bytes(home.data().as_path())
        .or_else(|_| agent_extract::os::free_bytes(home.root()))
        .unwrap_or(u64::MAX);
    if free >= need {
        return Ok(Vec::new());
    }
    let candidates = candidates(home, running);
    let Some(chosen) = plan(free, need, &candidates) else {
        return Err(NoRoom { need, free });
    };
    let mut freed = Vec::new();
    for c in chosen {
        let removed = if c.path.is_dir() {
            std::fs::remove_dir_all(&c.path)
        } else {
            std::fs::remove_file(&c.path)
        };
        match removed {
            Ok(()) => freed.push(c),
            Err(e) => tracing::warn!("cannot delete {} for room: {e}", c.path.display()),
        }
    }
    Ok(freed)
}

/// The kept bundles of the versions not running, then those versions, oldest first.
fn candidates(home: &AgentHome, running: &Path) -> Vec<Freeable> {
    let running = std::fs::canonicalize(running).unwrap_or_else(|_| running.to_path_buf());
    let Ok(entries) = std::fs::read_dir(home.versions()) else {
        return Vec::new();
    };
    let mut others: Vec<(std::time::SystemTime, PathBuf)> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        // Staging and half-swapped directories belong to an update under way.
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| e.path())
        .filter(|p| std::fs::canonicalize(p).map_or(true, |c| c != running))
        .map(|p| {
            let modified = std::fs::metadata(&p)
                .and_then(|m| m.modified())
                .unwrap_or(std::time::UNIX_EPOCH);
            (modified, p)
        })
        .collect();
    others.sort();
    let bundles = others.iter().filter_map(|(_, dir)| {
        let bundle = dir.join(layout::KEPT_BUNDLE_FILE);
        let bytes = file_size(&bundle);
        (bytes > 0).then_some(Freeable {
            path: bundle,
            bytes,
        })
    });
    let dirs = others.iter().map(|(_, dir)| Freeable {
        path: dir.clone(),
        bytes: tree_size(dir).saturating_sub(file_size(&dir.join(layout::KEPT_BUNDLE_FILE))),
    });
    bundles.chain(dirs).collect()
}

fn file_size(path: &Path) -> u64 {
    std::fs::symlink_metadata(path).map_or(0, |m| if m.is_file() { m.len() } else { 0 })
}

/// The bytes of the regular files under `dir` (links not followed).
fn tree_size(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => tree_size(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(path: &str, bytes: u64) -> Freeable {
        Freeable {
            path: PathBuf::from(path),
            bytes,
        }
    }

    #[test]
    fn an_update_needs_its_bundle_and_an_unpacked_copy_not_four_bundles() {
        // A 6 MiB bundle of a 17 MiB version: 6 + 21.25, where four bundles were 24.
        assert_eq!(
            needed(6 << 20, 17 << 20),
            (6 << 20) + (17 << 20) * 125 / 100
        );
        assert_eq!(needed(u64::MAX, 10), u64::MAX);
    }

    #[test]
    fn a_disk_that_would_stay_short_loses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let home = AgentHome::new(dir.path());
        let running = home.versions().join("1.0.0+1");
        std::fs::create_dir_all(&running).unwrap();
        std::fs::create_dir_all(home.data()).unwrap();
        let short = make_room(&home, &running, u64::MAX / 2).unwrap_err();
        assert!(short.need > short.free);
        assert!(running.exists());
    }

    #[test]
    fn room_is_made_from_the_first_candidates_that_suffice() {
        let all = [f("v1/bundle", 6), f("v1", 17), f("v0", 17)];
        assert_eq!(plan(100, 50, &all), Some(vec![]));
        assert_eq!(plan(10, 15, &all), Some(vec![f("v1/bundle", 6)]));
        assert_eq!(
            plan(10, 20, &all),
            Some(vec![f("v1/bundle", 6), f("v1", 17)])
        );
        assert_eq!(
            plan(0, 1000, &all),
            None,
            "nothing is deleted when it would not help"
        );
    }

    #[test]
    fn the_running_version_is_never_a_candidate_and_bundles_go_first() {
        let dir = tempfile::tempdir().unwrap();
        let home = AgentHome::new(dir.path());
        for v in ["1.0.0+1", "2.0.0+2", "3.0.0+3"] {
            let d = home.versions().join(v);
            std::fs::create_dir_all(d.join("bin")).unwrap();
            std::fs::write(d.join("bin/agent"), vec![0u8; 100]).unwrap();
            std::fs::write(d.join(layout::KEPT_BUNDLE_FILE), vec![0u8; 40]).unwrap();
        }
        std::fs::create_dir_all(home.versions().join(".4.0.0+4.new")).unwrap();
        let running = home.versions().join("3.0.0+3");
        let found = candidates(&home, &running);
        let names: Vec<String> = found
            .iter()
            .map(|c| {
                c.path
                    .strip_prefix(home.versions())
                    .unwrap()
                    .display()
                    .to_string()
            })
            .collect();
        assert_eq!(names.len(), 4, "{names:?}");
        assert!(
            names[..2].iter().all(|n| n.ends_with("/bundle")),
            "{names:?}"
        );
        assert!(
            !names
                .iter()
                .any(|n| n.starts_with("3.0.0+3") || n.starts_with('.')),
            "{names:?}"
        );
        assert_eq!(
            found[2].bytes, 100,
            "a version counts without its kept bundle"
        );
    }
}
