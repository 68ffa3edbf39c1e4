//! One health check of the workload: a GET that must answer 2xx, or a command that must
//! exit 0, each bounded in time. The verdict's consequences are the policy's.

use std::process::Stdio;
use std::time::Duration;

use super::spec::Check;

/// A check that takes longer than this failed.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(2);
/// A health command gets longer: it may start a runtime.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs `check` once: `Err` says what failed, in words for an operator.
pub async fn run(
    check: &Check,
    http: &reqwest::Client,
    home: &std::path::Path,
) -> Result<(), String> {
    match check {
        Check::None => Ok(()),
        Check::Url(url) => get(http, url).await,
        Check::Command(argv) => command(argv, home).await,
    }
}

async fn get(http: &reqwest::Client, url: &str) -> Result<(), String> {
    let answer = http
        .get(url)
        .timeout(CHECK_TIMEOUT)
        .send()
        .await
        .map_err(|e| format!("GET {url}: {}", agent_protocol::shown::error_chain(&e)))?;
    let status = answer.status();
    // The body is read (and dropped), up to a cap: hanging up in the middle of it
    // makes some programs log a broken pipe at every check.
    let mut answer = answer;
    let mut read = 0usize;
    while read < MAX_BODY {
        match answer.chunk().await {
            Ok(Some(chunk)) => read += chunk.len(),
            Ok(None) | Err(_) => break,
        }
    }
    if status.is_success() {
        Ok(())
    } else {
        Err(format!("GET {url} answered {status}"))
    }
}

/// How much of a health answer is read before the connection is dropped.
const MAX_BODY: usize = 8 * 1024 * 1024;

async fn command(argv: &[String], home: &std::path::Path) -> Result<(), String> {
    let Some((program, args)) = argv.split_first() else {
        return Ok(());
    };
    let shown = argv.join(" ");
    let child = tokio::process::Command::new(program)
        .args(args)
        .current_dir(home)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("health-command {shown}: cannot run it: {e}"))?;
    match tokio::time::timeout(COMMAND_TIMEOUT, child.wait_with_output()).await {
        Err(_) => Err(format!(
            "health-command {shown} did not finish within {COMMAND_TIMEOUT:?}"
        )),
        Ok(Err(e)) => Err(format!("health-command {shown}: {e}")),
        Ok(Ok(out)) if out.status.success() => Ok(()),
        Ok(Ok(out)) => {
            let said = String::from_utf8_lossy(&out.stderr);
            let said = said.trim();
            let last = said.lines().last().unwrap_or_default();
            Err(format!(
                "health-command {shown} failed ({}){}",
                out.status,
                if last.is_empty() {
                    String::new()
                } else {
                    format!(": {last}")
                }
            ))
        }
    }
}
