//! The systemd unit the install script made (installer/agent.service).

use std::path::PathBuf;
use std::process::{Command, Stdio};

use agent_protocol::layout::AgentHome;
use anyhow::Context;

use super::Registration;

const UNIT_FILE: &str = "/etc/systemd/system/agent.service";
const UNIT_NAME: &str = "agent.service";

/// The systemd unit that runs this home, if the install script made one.
pub(super) fn registration(home: &AgentHome) -> Option<Registration> {
    let unit = PathBuf::from(UNIT_FILE);
    let text = std::fs::read_to_string(&unit).ok()?;
    let root = home.root().display().to_string();
    text.contains(&format!("{root}/"))
        .then_some(Registration::Unit(unit))
}

/// Stops and disables the unit and removes its file, so nothing starts the agent again,
/// not even a reboot.
pub(super) fn unregister(_home: &AgentHome, service: &Registration) -> anyhow::Result<()> {
    let Registration::Unit(unit) = service else {
        return Ok(());
    };
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
    Ok(())
}

/// A running program's file can be removed here: nothing to do.
pub(super) fn let_go_of_own_program(_home: &AgentHome) -> anyhow::Result<()> {
    Ok(())
}
