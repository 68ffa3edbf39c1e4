//! `agent uninstall [--purge] [--yes]`: the machine leaves the fleet.
//!
//! In order: say what will go (and ask, unless `--yes`); tell the server
//! (`POST /agent/leave`, which revokes this agent's credentials; done without a server,
//! and said so); stop the agent and its workload (through the systemd unit the install
//! script made, which is then disabled and removed, or through the wrapper); move the
//! agent's identity aside (an agent installed here again enrolls as a new one); remove
//! `current`, `versions/` and `run/`. `conf/`, `data/` and `logs/` stay, unless
//! `--purge`, which removes the whole home. A second run finds nothing to do.
//!
//! On Windows the Windows service `--install` registered takes the systemd unit's
//! place: `bin\agent-service.exe uninstall` stops it (the agent and its workload end
//! with its job) and removes it, and `bin\` goes with `versions\`.

#[cfg(unix)]
mod unix;
#[cfg(unix)]
use unix as os;
#[cfg(windows)]
mod windows;
#[cfg(windows)]
use windows as os;

use std::fmt::Write as _;
use std::io::{BufRead, IsTerminal};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use agent_protocol::layout::AgentHome;
use anyhow::Context;

use crate::config::Config;
use crate::contact::client::{Client, Trust};

/// What registered this home with the system's service manager, removed with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Registration {
    /// The systemd unit the install script made (Linux).
    Unit(PathBuf),
    /// The Windows service `--install` registered, by name.
    Service(String),
}

/// What an uninstall removes and keeps, decided from what is on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub remove: Vec<PathBuf>,
    pub keep: Vec<PathBuf>,
    /// The systemd unit or Windows service that runs this home, to stop and remove.
    pub service: Option<Registration>,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.remove.is_empty() && self.service.is_none()
    }

    pub fn describe(&self) -> String {
        let mut out = String::new();
        match &self.service {
            Some(Registration::Unit(unit)) => {
                let _ = writeln!(
                    out,
                    "  stop, disable and remove the systemd unit {}",
                    unit.display()
                );
            }
            Some(Registration::Service(name)) => {
                let _ = writeln!(out, "  stop and remove the Windows service {name}");
            }
            None => {}
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

/// The plan for `home`: `exists` says whether a path is there, `service` what runs
/// this home (if anything registered it).
pub fn plan(
    home: &AgentHome,
    purge: bool,
    exists: impl Fn(&Path) -> bool,
    service: Option<Registration>,
) -> Plan {
    // `bin/` holds Windows' agent-service.exe (the service's program); a Linux home has
    // none.
    let installed = [
        home.current(),
        home.versions(),
        home.run(),
        home.root().join("bin"),
    ];
    let owned = [home.conf(), home.data(), home.logs()];
    let mut remove: Vec<PathBuf> = installed.into_iter().filter(|p| exists(p)).collect();
    let mut keep: Vec<PathBuf> = owned.into_iter().filter(|p| exists(p)).collect();
    if purge && (!remove.is_empty() || !keep.is_empty() || service.is_some()) {
        remove = vec![home.root().to_path_buf()];
        keep.clear();
    }
    Plan {
        remove,
        keep,
        service,
    }
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
        os::registration(&home),
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
    stop(&home, plan.service.as_ref())?;
    if !purge {
        set_identity_aside(&home)?;
    }
    os::let_go_of_own_program(&home)?;
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
    let hello = crate::contact::identity::hello(&id, config);
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

/// Stops the agent and its workload: through the system's service manager when a unit
/// or service runs it (then it goes, so nothing starts it again, not even a reboot),
/// and through the wrapper for whatever still runs.
fn stop(home: &AgentHome, service: Option<&Registration>) -> anyhow::Result<()> {
    if let Some(service) = service {
        os::unregister(home, service)?;
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
    // A program that has just ended may hold its file a moment longer (Windows: the
    // service's process after it says it stopped).
    let mut tries = 20;
    let done = loop {
        let done = match path.symlink_metadata() {
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
            Ok(_) => std::fs::remove_file(path),
            Err(_) => return Ok(()),
        };
        tries -= 1;
        if done.is_ok() || tries == 0 {
            break done;
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
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
        let unit = Some(Registration::Unit(PathBuf::from(
            "/etc/systemd/system/agent.service",
        )));
        let p = plan(&home, true, with(&all), unit.clone());
        assert_eq!(p.remove, vec![PathBuf::from("/opt/agent")]);
        assert!(p.keep.is_empty());
        assert_eq!(p.service, unit);
        assert!(p.describe().contains("systemd unit"));
    }

    #[test]
    fn on_windows_the_service_and_its_program_go_too() {
        let home = AgentHome::new("/c/agent");
        let bin = home.root().join("bin");
        let all = [home.current(), home.versions(), bin.clone(), home.conf()];
        let service = Some(Registration::Service("agent".into()));
        let p = plan(&home, false, with(&all), service.clone());
        assert_eq!(p.remove, vec![home.current(), home.versions(), bin]);
        assert_eq!(p.keep, vec![home.conf()]);
        assert_eq!(p.service, service);
        let text = p.describe();
        assert!(
            text.contains("stop and remove the Windows service agent"),
            "{text}"
        );
        // Nothing left but the service: there is still something to do.
        assert!(!plan(&home, false, with(&[]), service).is_empty());
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
