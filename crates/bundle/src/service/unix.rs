use std::path::Path;

use super::ServiceRequest;
use crate::error::{BundleError, Result};

/// `--install` with no value: the current directory.
pub const DEFAULT_PREFIX: &str = ".";

/// Windows services do not exist here: the flags that name one are refused before
/// anything is installed.
pub fn check(request: &ServiceRequest<'_>) -> Result<()> {
    if request.name.is_some() || request.none {
        return Err(BundleError::Invalid(
            "--service-name and --no-service are for Windows bundles; here start the agent with <home>/current/bin/agent-wrapper.sh start (or the systemd unit installer/agent.service)".into(),
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
