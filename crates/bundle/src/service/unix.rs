use std::path::Path;

use super::ServiceRequest;
use crate::error::{BundleError, Result};

/// `--install` with no value: the current directory.
pub const DEFAULT_PREFIX: &str = ".";

/// Windows services do not exist here: the flags that name one are refused before
/// anything is installed.
pub fn check(request: &ServiceRequest<'_>) -> Result<()> {
    if request.name.is_some() || request.none || request.add_to_path {
        return Err(BundleError::Invalid(
            "--service-name, --no-service and --add-to-path are for Windows bundles; here start the agent with <home>/current/bin/agent-wrapper.sh start (or the systemd unit installer/agent.service)".into(),
        ));
    }
    Ok(())
}

/// The line telling how to start the agent.
pub fn after_install(home: &Path, _request: &ServiceRequest<'_>) -> Result<String> {
    Ok(format!(
        "Start it with: {}/current/bin/agent-wrapper.sh start",
        home.display()
    ))
}

/// The command that stops the agent installed at `home`.
pub fn stop_command(home: &Path) -> String {
    format!("{}/current/bin/agent-wrapper.sh stop", home.display())
}

/// Keeps the installing bundle beside its version (the base of the next delta): a hard
/// link where it can be, saving the bundle's size.
pub fn keep_bundle(bundle: &Path, kept: &Path) -> agent_extract::Result<()> {
    agent_extract::atomic::link_or_copy(bundle, kept)
}
