//! The names the Windows launcher, `<home>\bin\agent.exe`, shares with the programs
//! around it: the bundle installs it, the service keeps it current, and `agent
//! uninstall` lets go of it while it runs the uninstall.

use std::path::PathBuf;

/// What a version carries in its `bin\`: copied to `<home>\bin\agent.exe`.
pub const LAUNCHER_EXE: &str = "agent-launcher.exe";

/// Where `agent uninstall`, run through the launcher, moves the launcher's program
/// (Windows refuses to delete a running program, but lets it be renamed): a name in the
/// temporary directory made of the uninstalling agent's pid, which the launcher knows as
/// its child's, and deletes once it has ended.
pub fn set_aside(agent_pid: u32) -> PathBuf {
    std::env::temp_dir().join(format!("agent-launcher-{agent_pid}.exe.old"))
}

#[cfg(windows)]
mod windows;
#[cfg(windows)]
pub use windows::{add_to_path, remove_from_path};

/// `path` (the system `Path` value, `;`-separated) with `dir` added at its end, or `None`
/// when it names `dir` already (Windows compares without case).
pub fn path_with(path: &str, dir: &str) -> Option<String> {
    let named = path.split(';').any(|entry| {
        entry
            .trim()
            .trim_end_matches('\\')
            .eq_ignore_ascii_case(dir.trim_end_matches('\\'))
    });
    if named {
        return None;
    }
    let path = path.trim_end_matches(';');
    Some(if path.is_empty() {
        dir.to_owned()
    } else {
        format!("{path};{dir}")
    })
}

/// `path` without `dir`, or `None` when it does not name it.
pub fn path_without(path: &str, dir: &str) -> Option<String> {
    let same = |entry: &str| {
        entry
            .trim()
            .trim_end_matches('\\')
            .eq_ignore_ascii_case(dir.trim_end_matches('\\'))
    };
    if !path.split(';').any(same) {
        return None;
    }
    Some(
        path.split(';')
            .filter(|entry| !same(entry))
            .collect::<Vec<_>>()
            .join(";"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_home_bin_is_added_to_the_path_once_and_removed_alone() {
        let dir = r"C:\Program Files\agent\bin";
        let path = r"%SystemRoot%\system32;%SystemRoot%";
        let added = path_with(path, dir).unwrap();
        assert_eq!(added, format!("{path};{dir}"));
        assert_eq!(path_with(&added, r"c:\program files\AGENT\bin\"), None);
        assert_eq!(path_without(&added, dir).as_deref(), Some(path));
        assert_eq!(path_without(path, dir), None);
        assert_eq!(path_with("", dir).as_deref(), Some(dir));
    }
}
