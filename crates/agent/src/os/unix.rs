use std::path::Path;
use std::process::Command;

/// Registers TERM and INT now; the future resolves when one arrives.
pub fn stop_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    wait_for_stop_signal(term, int)
}

async fn wait_for_stop_signal(
    term: std::io::Result<tokio::signal::unix::Signal>,
    int: std::io::Result<tokio::signal::unix::Signal>,
) {
    match (term, int) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => std::future::pending().await,
    }
}

/// The updater leaves the agent's session itself (setsid at its start).
pub fn detach(_cmd: &mut Command) {}

/// renameat2(RENAME_EXCHANGE) through rustix: nix offers it only on glibc, and the
/// agent is also built for musl (the static bundle that runs on any Linux).
pub fn exchange(a: &Path, b: &Path) -> Result<(), String> {
    use rustix::fs::{CWD, RenameFlags, renameat_with};
    renameat_with(CWD, a, CWD, b, RenameFlags::EXCHANGE)
        .map_err(|e| format!("cannot swap {} and {}: {e}", a.display(), b.display()))
}

/// [`exchange`] is one step here: nothing is ever left half done.
pub fn finish_exchange(_b: &Path, _prev: &Path) {}

/// How many names a file has (a lock file is read only with one).
pub fn link_count(meta: &std::fs::Metadata) -> u64 {
    std::os::unix::fs::MetadataExt::nlink(meta)
}

/// The program to run an installed agent's command line with, in this system's words.
pub const RUN_AS: &str = "<home>/current/bin/agent";
