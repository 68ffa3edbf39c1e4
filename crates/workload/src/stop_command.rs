//! `workload.stop-command`: how a workload is asked to stop where no signal can ask it
//! (Windows has no TERM for a program without a console), before it is ended.

use std::process::Stdio;
use std::time::{Duration, Instant};

use super::group;
use super::spec::{Spec, resolve_program};

/// Runs the stop command, when one is set (its first word resolved as the workload's,
/// `AGENT_WORKLOAD_PID` in its environment), and gives the workload up to
/// `stop-timeout` in all to end by itself. Returns the time left for ending it as
/// without one (all of `stop-timeout` when no command is set).
pub(super) async fn ask(
    spec: &Spec,
    pid: u32,
    workload: &mut tokio::process::Child,
    note: &(dyn Fn(&str) + Sync),
) -> Duration {
    let Some(first) = spec.stop_command.first() else {
        return spec.stop_timeout;
    };
    let deadline = Instant::now() + spec.stop_timeout;
    let path = std::env::var_os("PATH");
    let ran = match resolve_program(first, &spec.version_dir, path.as_deref()) {
        Err(e) => Err(e.replacen("workload.command", "workload.stop-command", 1)),
        Ok(program) => {
            let mut cmd = tokio::process::Command::new(&program);
            cmd.args(&spec.stop_command[1..])
                .current_dir(&spec.home)
                .env("AGENT_WORKLOAD_PID", pid.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .kill_on_drop(true);
            group::prepare(&mut cmd);
            match cmd.spawn() {
                Ok(mut child) => {
                    let _ = tokio::time::timeout_at(deadline.into(), child.wait()).await;
                    Ok(())
                }
                Err(e) => Err(format!(
                    "workload.stop-command: cannot run {}: {e}",
                    program.display()
                )),
            }
        }
    };
    let text = match ran {
        Err(e) => format!("{e}; ending the workload (pid {pid})"),
        Ok(()) => match tokio::time::timeout_at(deadline.into(), workload.wait()).await {
            Ok(_) => format!("workload (pid {pid}) ended on its workload.stop-command"),
            Err(_) => format!(
                "workload (pid {pid}) still ran {:?} (workload.stop-timeout) after its workload.stop-command; ending it",
                spec.stop_timeout
            ),
        },
    };
    tracing::info!("{text}");
    note(&text);
    deadline.saturating_duration_since(Instant::now())
}
