// The stop event is a Win32 named event: no safe wrapper exists in std or tokio.
#![allow(unsafe_code)]

use std::os::windows::io::{AsRawHandle, FromRawHandle, OwnedHandle};
use std::os::windows::process::CommandExt;
use std::path::Path;
use std::process::Command;

use windows_sys::Win32::Foundation::WAIT_OBJECT_0;
use windows_sys::Win32::System::Threading::{
    CREATE_BREAKAWAY_FROM_JOB, CREATE_NEW_PROCESS_GROUP, CreateEventW, DETACHED_PROCESS, INFINITE,
    WaitForSingleObject,
};

/// The stop event, closed when dropped.
struct Event(OwnedHandle);

impl Event {
    /// Blocks until the event is set.
    fn wait(&self) -> bool {
        // SAFETY: a live event handle, owned by self.
        unsafe { WaitForSingleObject(self.0.as_raw_handle(), INFINITE) == WAIT_OBJECT_0 }
    }
}

/// Creates the named event `Global\agent-stop-<pid>` now (the service and the updater
/// set it to stop this agent gracefully), and listens for Ctrl-C on a console; the
/// future resolves when either comes.
pub fn stop_signal() -> impl std::future::Future<Output = ()> {
    let name: Vec<u16> = agent_protocol::layout::stop_event_name(std::process::id())
        .encode_utf16()
        .chain(Some(0))
        .collect();
    // SAFETY: a NUL-terminated name; manual reset, not signalled; null is checked.
    let handle = unsafe { CreateEventW(std::ptr::null(), 1, 0, name.as_ptr()) };
    // SAFETY: a handle just created here, owned by nothing else.
    let event = (!handle.is_null()).then(|| Event(unsafe { OwnedHandle::from_raw_handle(handle) }));
    if event.is_none() {
        tracing::warn!(
            "cannot create the stop event {}: {}; the service will end this agent with its job",
            agent_protocol::layout::stop_event_name(std::process::id()),
            std::io::Error::last_os_error()
        );
    }
    async move {
        let waited = async move {
            match event {
                Some(event) => {
                    // A thread of its own, not tokio's blocking pool: the runtime waits
                    // for its blocking tasks when it ends, and this wait may never end
                    // (an agent that exits for a hand-over is never signalled).
                    let (tx, rx) = tokio::sync::oneshot::channel();
                    std::thread::spawn(move || {
                        let _ = tx.send(event.wait());
                    });
                    if rx.await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = waited => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }
}

/// The updater must outlive this agent and the service's job (a service restarting
/// itself closes that job, ending all in it): no console, a group of its own, out of
/// the job.
pub fn detach(cmd: &mut Command) {
    cmd.creation_flags(DETACHED_PROCESS | CREATE_NEW_PROCESS_GROUP | CREATE_BREAKAWAY_FROM_JOB);
}

/// Windows cannot exchange two names in one step: `b` goes aside, `a` takes its name,
/// and the old `b` takes `a`'s. Between the steps `b` is missing; the recovery of
/// `conf/workload` at the next start puts back what a crash left (the previous set).
pub fn exchange(a: &Path, b: &Path) -> Result<(), String> {
    let aside = aside_of(b);
    let fail = |e: std::io::Error, what: &str| {
        format!(
            "cannot swap {} and {} ({what}): {e}",
            a.display(),
            b.display()
        )
    };
    std::fs::rename(b, &aside).map_err(|e| fail(e, "moving the old one aside"))?;
    if let Err(e) = std::fs::rename(a, b) {
        let _ = std::fs::rename(&aside, b);
        return Err(fail(e, "putting the new one in"));
    }
    std::fs::rename(&aside, a).map_err(|e| fail(e, "keeping the old one"))
}

/// Where [`exchange`] keeps `b` between its steps.
fn aside_of(b: &Path) -> std::path::PathBuf {
    b.with_extension("exchange")
}

/// Completes an [`exchange`] into `b` that a crash cut short: `b` missing, it is put back
/// (the first step undone); `b` in place, the set kept aside goes where the exchange
/// would have put it, `prev` (as a finished swap leaves it).
pub fn finish_exchange(b: &Path, prev: &Path) {
    let aside = aside_of(b);
    if std::fs::symlink_metadata(&aside).is_err() {
        return;
    }
    let (to, what) = if std::fs::symlink_metadata(b).is_err() {
        (b, "put back")
    } else if std::fs::symlink_metadata(prev).is_err() {
        (prev, "kept as the previous set")
    } else {
        return;
    };
    match std::fs::rename(&aside, to) {
        Ok(()) => tracing::warn!(
            "a configuration swap was cut short: {} {what} ({})",
            aside.display(),
            to.display()
        ),
        Err(e) => tracing::error!(
            "a configuration swap was cut short and {} cannot be moved to {}: {e}",
            aside.display(),
            to.display()
        ),
    }
}

/// How many names a file has: Windows' link count is not in stable std, so a lock file
/// here is read as having one.
pub fn link_count(_meta: &std::fs::Metadata) -> u64 {
    1
}

/// The program to run an installed agent's command line with, in this system's words.
pub const RUN_AS: &str = r"<home>\bin\agent.exe";
