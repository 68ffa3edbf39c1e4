//! A restart must not cost the running agent: the configuration the new agent would read
//! is checked first, with the agent's own parser (`agent config check`), and a refusal
//! keeps the running agent (exit `layout::EXIT_CONFIG`, as the agent's own for a bad
//! configuration). The same on both systems: `agent-wrapper.sh restart` and
//! `agent-service.exe restart`.

use std::path::Path;
use std::process::{Command, Stdio};

/// `Ok` when `program config check` accepts the home's configuration; otherwise what it
/// said (or why it could not run), to show before saying nothing was stopped.
pub fn check(program: &Path, home: &Path) -> Result<(), String> {
    let checked = Command::new(program)
        .arg("--home")
        .arg(home)
        .args(["config", "check"])
        .stdin(Stdio::null())
        .output();
    match checked {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
        .trim_end()
        .to_owned()),
        Err(e) => Err(format!("cannot run {}: {e}", program.display())),
    }
}

/// What a refused restart says after the checker's own words.
pub fn refused(program: &Path, command: &str) -> String {
    format!(
        "{command}: the configuration is refused (above); nothing was stopped, the running agent keeps its configuration. Fix it, check it with: {} config check",
        program.display()
    )
}

#[cfg(test)]
#[cfg(unix)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn program(dir: &Path, script: &str) -> std::path::PathBuf {
        let path = dir.join("agent");
        std::fs::write(&path, format!("#!/bin/sh\n{script}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[test]
    fn a_refused_configuration_is_said_in_the_checkers_words() {
        let dir = tempfile::tempdir().unwrap();
        let ok = program(
            dir.path(),
            r#"[ "$3 $4" = "config check" ] || exit 9; exit 0"#,
        );
        assert_eq!(check(&ok, dir.path()), Ok(()));
        let bad = program(
            dir.path(),
            "echo 'conf/agent.toml: line 3: unknown key heartbeet' >&2; exit 78",
        );
        let said = check(&bad, dir.path()).unwrap_err();
        assert_eq!(said, "conf/agent.toml: line 3: unknown key heartbeet");
        let missing = check(&dir.path().join("nothing"), dir.path()).unwrap_err();
        assert!(missing.starts_with("cannot run "), "{missing}");
        assert!(refused(&bad, "agent-service").contains("nothing was stopped"));
    }
}
