//! The workload as `[workload]` describes it, with its placeholders filled in and its
//! program found: what the supervisor runs, checks and waits for.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::WorkloadSection;

/// Everything the supervisor needs, resolved for one installation and version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// argv with placeholders replaced; the first word as written (resolved at start).
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub health: Check,
    pub start_timeout: Duration,
    pub stop_timeout: Duration,
    /// `workload.stop-command` with placeholders replaced; empty: none.
    pub stop_command: Vec<String>,
    /// Where the program is looked up when its first word is relative.
    pub version_dir: PathBuf,
    /// The workload's working directory (AGENT_HOME).
    pub home: PathBuf,
}

/// How the workload's health is checked beyond "it runs".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    None,
    Url(String),
    Command(Vec<String>),
}

impl Spec {
    pub fn new(section: &WorkloadSection, home: &Path, version_dir: &Path) -> Self {
        let config_dir = home.join(section.config_dir.trim());
        let fill = |word: &str| fill(word, home, version_dir, &config_dir);
        let health = if !section.health_url.trim().is_empty() {
            Check::Url(fill(section.health_url.trim()))
        } else if !section.health_command.is_empty() {
            Check::Command(section.health_command.iter().map(|w| fill(w)).collect())
        } else {
            Check::None
        };
        Self {
            argv: section.command.iter().map(|w| fill(w)).collect(),
            env: section
                .env
                .iter()
                .map(|(k, v)| (k.clone(), fill(v)))
                .collect(),
            health,
            start_timeout: section.start_timeout,
            stop_timeout: section.stop_timeout,
            stop_command: section.stop_command.iter().map(|w| fill(w)).collect(),
            version_dir: version_dir.to_path_buf(),
            home: home.to_path_buf(),
        }
    }

    pub fn enabled(&self) -> bool {
        !self.argv.is_empty()
    }

    /// The program to execute, or why it cannot be, in words that say what to do.
    pub fn program(&self) -> Result<PathBuf, String> {
        let first = self
            .argv
            .first()
            .ok_or_else(|| "no workload.command".to_owned())?;
        resolve_program(
            first,
            &self.version_dir,
            std::env::var_os("PATH").as_deref(),
        )
    }
}

/// `{home}`, `{version_dir}` and `{config_dir}` replaced in one word.
pub fn fill(word: &str, home: &Path, version_dir: &Path, config_dir: &Path) -> String {
    word.replace("{home}", &home.display().to_string())
        .replace("{version_dir}", &version_dir.display().to_string())
        .replace("{config_dir}", &config_dir.display().to_string())
}

/// Absolute: as is. Relative: against the version directory (so it changes with each
/// update); a bare name that is not there is looked up in `PATH`, as a shell would.
pub fn resolve_program(
    first: &str,
    version_dir: &Path,
    path_var: Option<&std::ffi::OsStr>,
) -> Result<PathBuf, String> {
    let written = Path::new(first);
    let candidate = if written.is_absolute() {
        written.to_path_buf()
    } else {
        version_dir.join(written)
    };
    if candidate.exists() || written.is_absolute() || first.contains('/') {
        return check_executable(&candidate, first);
    }
    if let Some(path_var) = path_var {
        for dir in std::env::split_paths(path_var) {
            let found = dir.join(written);
            if found.is_file() {
                return check_executable(&found, first);
            }
        }
    }
    Err(format!(
        "workload.command: {first:?} is neither in {} nor on PATH; ship it in the distribution (e.g. bin/{first}) or give its absolute path",
        version_dir.display()
    ))
}

fn check_executable(path: &Path, written: &str) -> Result<PathBuf, String> {
    let meta = std::fs::metadata(path).map_err(|e| {
        format!(
            "workload.command: {} ({written:?}) cannot be run: {e}; ship it in the distribution or fix workload.command in conf/agent.toml",
            path.display()
        )
    })?;
    if !meta.is_file() {
        return Err(format!(
            "workload.command: {} is not a file; name the program itself",
            path.display()
        ));
    }
    if !agent_extract::os::is_executable(&meta) {
        return Err(format!(
            "workload.command: {} is not executable; chmod +x it in the distribution",
            path.display()
        ));
    }
    Ok(path.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_replaced_in_every_word() {
        let section = WorkloadSection {
            command: vec![
                "bin/x".into(),
                "--conf={config_dir}/x.yml".into(),
                "--data={home}/data/x".into(),
            ],
            health_command: vec!["{version_dir}/bin/check".into()],
            ..WorkloadSection::default()
        };
        let spec = Spec::new(&section, Path::new("/h"), Path::new("/h/versions/1"));
        assert_eq!(
            spec.argv,
            ["bin/x", "--conf=/h/conf/workload/x.yml", "--data=/h/data/x"]
        );
        assert_eq!(
            spec.health,
            Check::Command(vec!["/h/versions/1/bin/check".into()])
        );
    }

    /// Unix: "executable" is a mode bit (on Windows, the name's extension).
    #[cfg(unix)]
    #[test]
    fn the_program_is_found_or_named_with_what_to_do() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(bin.join("run"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(bin.join("run"), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(bin.join("plain"), "").unwrap();
        assert_eq!(
            resolve_program("bin/run", dir.path(), None).unwrap(),
            bin.join("run")
        );
        let err = resolve_program("bin/plain", dir.path(), None).unwrap_err();
        assert!(
            err.contains("not executable") && err.contains("chmod"),
            "{err}"
        );
        let err = resolve_program("bin/missing", dir.path(), None).unwrap_err();
        assert!(err.contains("bin/missing") && err.contains("fix"), "{err}");
        let err = resolve_program("/nonexistent/prog", dir.path(), None).unwrap_err();
        assert!(err.contains("/nonexistent/prog"), "{err}");
        let path = std::ffi::OsString::from(bin.as_os_str());
        assert_eq!(
            resolve_program("run", Path::new("/nowhere"), Some(&path)).unwrap(),
            bin.join("run")
        );
        let err = resolve_program("nope", dir.path(), Some(&path)).unwrap_err();
        assert!(err.contains("nor on PATH"), "{err}");
    }
}
