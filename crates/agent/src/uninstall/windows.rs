//! The Windows service `--install` registered (docs/install.md, "Windows machines"),
//! removed by its own program, `bin\agent-service.exe uninstall`.

use std::process::{Command, Stdio};

use agent_protocol::layout::{self, AgentHome};

use super::Registration;

/// The service registered for this home: `data\service-name` names it (written when
/// it was registered; `--no-service` writes none) and `bin\agent-service.exe` runs it.
pub(super) fn registration(home: &AgentHome) -> Option<Registration> {
    if !home.root().join("bin").join(layout::SERVICE_EXE).is_file() {
        return None;
    }
    let name = std::fs::read_to_string(home.data().join("service-name")).ok()?;
    let name = name.trim();
    (!name.is_empty()).then(|| Registration::Service(name.to_owned()))
}

/// Stops the service (it stops the agent, then ends its job: the workload and every
/// child go with it) and removes it.
pub(super) fn unregister(home: &AgentHome, service: &Registration) -> anyhow::Result<()> {
    let Registration::Service(name) = service else {
        return Ok(());
    };
    let program = home.root().join("bin").join(layout::SERVICE_EXE);
    let out = Command::new(&program)
        .args(["uninstall", "--service-name", name, "--home"])
        .arg(home.root())
        .env_remove("AGENT_UPDATER_ACTIVE")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            anyhow::anyhow!("cannot run {}: {e}; nothing was removed", program.display())
        })?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout).trim(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    if !out.status.success() {
        anyhow::bail!(
            "cannot remove the Windows service {name}: {said}; nothing was removed (remove it with `sc delete {name}` and run agent uninstall again)"
        );
    }
    println!("stopped and removed the Windows service {name}");
    // An install that put <home>\bin on the system Path (the MSI's) leaves none of it.
    let bin = home.root().join("bin");
    match agent_updater::launcher::remove_from_path(&bin) {
        Ok(true) => println!("took {} off the system Path", bin.display()),
        Ok(false) => {}
        Err(e) => println!(
            "{} may still be on the system Path ({e}); take it off in System Properties",
            bin.display()
        ),
    }
    Ok(())
}

/// Windows refuses to delete a running program: when this agent.exe is one of
/// `versions\`, it moves out of there now and is deleted once it has ended
/// (self-replace's self-deletion), so `versions\` can go.
pub(super) fn let_go_of_own_program(home: &AgentHome) -> anyhow::Result<()> {
    let_go_of_launcher(home)?;
    let Ok(exe) = std::env::current_exe() else {
        return Ok(());
    };
    let inside = |dir: &std::path::Path| {
        let dir = agent_extract::os::canonical(dir).unwrap_or_else(|_| dir.to_path_buf());
        let exe = agent_extract::os::canonical(&exe).unwrap_or_else(|_| exe.clone());
        let lower =
            |p: &std::path::Path| std::path::PathBuf::from(p.display().to_string().to_lowercase());
        lower(&exe).starts_with(lower(&dir))
    };
    if !inside(&home.versions()) {
        return Ok(());
    }
    self_replace::self_delete_outside_path(home.versions()).map_err(|e| {
        anyhow::anyhow!(
            "cannot move this program ({}) out of {}: {e}; run agent uninstall from a copy outside it",
            exe.display(),
            home.versions().display()
        )
    })
}

/// `bin\agent.exe`, the launcher, runs this command when it was typed as `agent
/// uninstall`: Windows refuses to delete it, so it moves to the temporary directory
/// under a name the launcher finds once this agent has ended, and deletes itself.
fn let_go_of_launcher(home: &AgentHome) -> anyhow::Result<()> {
    let launcher = home.root().join("bin").join(layout::AGENT_EXE_WINDOWS);
    if !launcher.is_file() || std::fs::remove_file(&launcher).is_ok() {
        return Ok(());
    }
    let aside = agent_updater::launcher::set_aside(std::process::id());
    std::fs::rename(&launcher, &aside).map_err(|e| {
        anyhow::anyhow!(
            "cannot move the running launcher {} out of the way ({e}); run the uninstall as {}\\versions\\<version>\\bin\\agent.exe uninstall",
            launcher.display(),
            home.root().display()
        )
    })?;
    Ok(())
}
