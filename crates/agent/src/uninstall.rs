//! `agent uninstall [--purge] [--yes]`: the machine leaves the fleet.
//!
//! In order: say what will go (and ask, unless `--yes`); tell the server
//! (`POST /agent/leave`, which revokes this agent's credentials; done without a server,
//! and said so); stop the agent and its workload (through the systemd unit the install
//! script made, which is then disabled and removed, or through the wrapper); move the
//! agent's identity aside (an agent installed here again enrolls as a new one); remove
//! `current`, `versions/` and `run/`. `conf/`, `data/` and `logs/` stay, unless
//! `--purge`, which removes the whole home. A second run finds nothing to do.

use std::fmt::Write as _;
use std::io::{BufRead, IsTerminal};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use agent_protocol::layout::AgentHome;
use anyhow::Context;

use crate::client::{Client, Trust};
use crate::config::Config;

/// Where the install script puts the unit (installer/agent.service).
const UNIT_FILE: &str = "/etc/systemd/system/agent.service";
const UNIT_NAME: &str = "agent.service";

/// What an uninstall removes and keeps, decided from what is on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub remove: Vec<PathBuf>,
    pub keep: Vec<PathBuf>,
    /// The systemd unit that runs this home, to disable and remove.
    pub unit: Option<PathBuf>,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.remove.is_empty() && self.unit.is_none()
    }

    pub fn describe(&self) -> String {
        let mut out = String::new();
        if let Some(unit) = &self.unit {
            let _ = writeln!(
                out,
                "  stop, disable and remove the systemd unit {}",
                unit.display()
            );
        }
        for path in &self.remove {
            let _ = writeln!(out, "  remove {}", path.display());
        }
        for path in &self.keep {
            let _ = writeln!(out, "  keep   {}", path.display());
        }
        out
    }
}

/// The plan for `home`: `exists` says whether a path is there, `unit_runs_home`
/// whether the systemd unit (if any) runs this home.
pub fn plan(
    home: &AgentHome,
    purge: bool,
    exists: impl Fn(&Path) -> bool,
    unit: Option<PathBuf>,
) -> Plan {
    let installed = [home.current(), home.versions(), home.run()];
    let owned = [home.conf(), home.data(), home.logs()];
    let mut remove: Vec<PathBuf> = installed.into_iter().filter(|p| exists(p)).collect();
    let mut keep: Vec<PathBuf> = owned.into_iter().filter(|p| exists(p)).collect();
    if purge && (!remove.is_empty() || !keep.is_empty() || unit.is_some()) {
        remove = vec![home.root().to_path_buf()];
        keep.clear();
    }
    Plan { remove, keep, unit }
}

/// `agent uninstall`, for the home at `root` (which may hold no version any more).
pub async fn run(
    root: &Path,
    installed: Option<(&Config, &agent_protocol::AgentVersion)>,
    purge: bool,
    yes: bool,
) -> anyhow::Result<ExitCode> {
    let home = AgentHome::new(root);
    let plan = plan(
        &home,
        purge,
        |p| p.symlink_metadata().is_ok(),
        unit_of(&home),
    );
    if plan.is_empty() {
        println!(
            "nothing to uninstall at {}: no agent is installed there (no current, versions/ or run/)",
            root.display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "agent uninstall{} will, at {}:",
        if purge { " --purge" } else { "" },
        root.display()
    );
    print!("{}", plan.describe());
    if !yes && !confirmed()? {
        println!("nothing changed");
        return Ok(ExitCode::from(1));
    }

    tell_the_server(&home, installed).await;
    stop(&home, plan.unit.as_deref())?;
    if !purge {
        set_identity_aside(&home)?;
    }
    for path in &plan.remove {
        remove(path)?;
    }
    println!(
        "uninstalled{}",
        if purge {
            String::new()
        } else {
            format!(
                "; conf/, data/ and logs/ are kept under {} (agent uninstall --purge removes them)",
                root.display()
            )
        }
    );
    Ok(ExitCode::SUCCESS)
}

/// Asks on the terminal; refuses to guess when nobody can answer.
fn confirmed() -> anyhow::Result<bool> {
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        anyhow::bail!("no terminal to confirm on: run `agent uninstall --yes` to uninstall");
    }
    print!("Proceed? [y/N] ");
    std::io::Write::flush(&mut std::io::stdout())?;
    let mut answer = String::new();
    stdin.lock().read_line(&mut answer)?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes"))
}

/// Tells the server this agent leaves; an uninstall goes on without it, and says so.
async fn tell_the_server(
    home: &AgentHome,
    installed: Option<(&Config, &agent_protocol::AgentVersion)>,
) {
    let id = agent_extract::atomic::read_text(&home.identity(), 1024)
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    if id.is_empty() {
        println!("the server was not told: this agent never registered (no data/agent-id)");
        return;
    }
    let Some((config, version)) = installed else {
        println!(
            "the server was not told: no configuration to find it with; an operator removes the agent there with `update-server agents remove {id}`"
        );
        return;
    };
    let hello = crate::identity::hello(&id, config);
    let client = match Client::new(
        config.server.urls.clone(),
        version.clone(),
        hello,
        Trust::of(config, home),
    ) {
        Ok(c) => c,
        Err(e) => {
            println!(
                "the server was not told ({e}); remove it there with `update-server agents remove {id}`"
            );
            return;
        }
    };
    match client.leave(&id).await {
        Ok(server) => {
            println!("told {server}: agent {id} left the fleet and its credentials are revoked")
        }
        Err(e) => println!(
            "the server was not told ({}); an operator removes it there with `update-server agents remove {id}`",
            e.why()
        ),
    }
}

/// The systemd unit the install script made for this home, if there is one.
fn unit_of(home: &AgentHome) -> Option<PathBuf> {
    let unit = PathBuf::from(UNIT_FILE);
    let text = std::fs::read_to_string(&unit).ok()?;
    let root = home.root().display().to_string();
    text.contains(&format!("{root}/")).then_some(unit)
}

/// Stops the agent and its workload: through systemd when a unit runs it (then the unit
/// goes, so nothing starts it again, not even a reboot), else through the wrapper.
fn stop(home: &AgentHome, unit: Option<&Path>) -> anyhow::Result<()> {
    if let Some(unit) = unit {
        let disabled = Command::new("systemctl")
            .args(["disable", "--now", UNIT_NAME])
            .stdin(Stdio::null())
            .status();
        if !disabled.is_ok_and(|s| s.success()) {
            println!("systemctl disable --now {UNIT_NAME} failed; stopping through the wrapper");
        }
        std::fs::remove_file(unit).with_context(|| format!("cannot remove {}", unit.display()))?;
        let _ = Command::new("systemctl")
            .arg("daemon-reload")
            .stdin(Stdio::null())
            .status();
        println!("removed the systemd unit {}", unit.display());
    }
    let Ok(version_dir) = agent_extract::current::read_dir(&home.current()) else {
        return Ok(());
    };
    match agent_updater::process::wrapper(home, &version_dir, "stop") {
        Ok(said) => println!(
            "stopped the agent and its workload{}",
            if said.is_empty() {
                String::new()
            } else {
                format!(": {said}")
            }
        ),
        Err(e) => anyhow::bail!("cannot stop the agent: {e}; nothing was removed"),
    }
    Ok(())
}

/// The identity and credentials move to `data/left-<unix seconds>/`: kept, as everything
/// in `data/`, but an agent installed here again is a new agent to the fleet (this one's
/// credentials are revoked).
fn set_identity_aside(home: &AgentHome) -> anyhow::Result<()> {
    let files = [home.identity(), home.agent_token()];
    if !files.iter().any(|f| f.exists()) {
        return Ok(());
    }
    let aside = home
        .data()
        .join(format!("left-{}", agent_updater::state::now_secs()));
    std::fs::create_dir_all(&aside).with_context(|| format!("cannot make {}", aside.display()))?;
    for file in files.iter().filter(|f| f.exists()) {
        let to = aside.join(file.file_name().unwrap_or_default());
        std::fs::rename(file, &to)
            .with_context(|| format!("cannot move {} to {}", file.display(), to.display()))?;
    }
    Ok(())
}

fn remove(path: &Path) -> anyhow::Result<()> {
    let meta = path.symlink_metadata();
    let done = match meta {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(_) => return Ok(()),
    };
    done.with_context(|| format!("cannot remove {}", path.display()))?;
    println!("removed {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(paths: &[PathBuf]) -> impl Fn(&Path) -> bool + '_ {
        move |p| paths.iter().any(|q| q == p)
    }

    #[test]
    fn an_uninstall_removes_the_versions_and_keeps_what_the_operator_owns() {
        let home = AgentHome::new("/opt/agent");
        let all = [
            home.current(),
            home.versions(),
            home.run(),
            home.conf(),
            home.data(),
            home.logs(),
        ];
        let p = plan(&home, false, with(&all), None);
        assert_eq!(p.remove, vec![home.current(), home.versions(), home.run()]);
        assert_eq!(p.keep, vec![home.conf(), home.data(), home.logs()]);
        let text = p.describe();
        assert!(text.contains("remove /opt/agent/versions"), "{text}");
        assert!(text.contains("keep   /opt/agent/conf"), "{text}");
    }

    #[test]
    fn purge_removes_the_whole_home_and_the_unit_goes_too() {
        let home = AgentHome::new("/opt/agent");
        let all = [home.current(), home.versions(), home.data()];
        let unit = Some(PathBuf::from(UNIT_FILE));
        let p = plan(&home, true, with(&all), unit.clone());
        assert_eq!(p.remove, vec![PathBuf::from("/opt/agent")]);
        assert!(p.keep.is_empty());
        assert_eq!(p.unit, unit);
        assert!(p.describe().contains("systemd unit"));
    }

    #[test]
    fn a_second_run_finds_nothing_to_do() {
        let home = AgentHome::new("/opt/agent");
        let left = [home.conf(), home.data(), home.logs()];
        assert!(plan(&home, false, with(&left), None).is_empty());
        assert!(plan(&home, false, with(&[]), None).is_empty());
        // --purge of what an uninstall kept still has something to do.
        assert!(!plan(&home, true, with(&left), None).is_empty());
    }
}
