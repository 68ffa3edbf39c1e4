//! Unix has the wrapper script and systemd: this program has nothing to do there.

use std::process::ExitCode;

pub(crate) fn main() -> ExitCode {
    eprintln!(
        "agent-service: the agent runs as a Windows service only on Windows; here use <AGENT_HOME>/current/bin/agent-wrapper.sh start|stop|restart|status"
    );
    ExitCode::from(2)
}
