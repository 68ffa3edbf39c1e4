//! No single panic takes the server down. A panic anywhere is logged with its place and
//! backtrace and counted (`update_server_panics_total` in `/metrics`); a request's panic
//! ends that request only (its task); the accept loop catches one in its own work; and
//! a background loop that panics is started again after a pause, so the rollout, the
//! pacer and the release scan keep going.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::FutureExt;

static PANICS: AtomicU64 = AtomicU64::new(0);

/// How long a background loop that panicked waits before it starts again.
const RESTART_AFTER: Duration = Duration::from_secs(1);

/// Panics seen since start.
pub fn count() -> u64 {
    PANICS.load(Ordering::Relaxed)
}

/// Counts and logs every panic (the default hook still prints it on stderr).
pub fn install_hook() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        PANICS.fetch_add(1, Ordering::Relaxed);
        let backtrace = std::backtrace::Backtrace::force_capture();
        tracing::error!(
            "a panic at {}: {}; the server goes on (this piece of work was dropped). Backtrace:\n{backtrace}",
            info.location()
                .map_or_else(|| "an unknown place".to_owned(), ToString::to_string),
            payload_text(info.payload())
        );
        default(info);
    }));
}

fn payload_text(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

/// Runs `work`, catching a panic in it: `None` if it panicked.
pub fn catch<T>(what: &str, work: impl FnOnce() -> T) -> Option<T> {
    match std::panic::catch_unwind(AssertUnwindSafe(work)) {
        Ok(v) => Some(v),
        Err(_) => {
            tracing::error!("{what} panicked; going on without it");
            None
        }
    }
}

/// Spawns a background loop made by `make`; if it panics, it is made and started again
/// after [`RESTART_AFTER`]. A loop that returns is done.
pub fn spawn_restarting<F, Fut>(what: &'static str, make: F)
where
    F: Fn() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    tokio::spawn(async move {
        loop {
            match AssertUnwindSafe(make()).catch_unwind().await {
                Ok(()) => return,
                Err(_) => {
                    tracing::error!(
                        "the {what} panicked; it starts again in {}s",
                        RESTART_AFTER.as_secs()
                    );
                    tokio::time::sleep(RESTART_AFTER).await;
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn a_caught_panic_is_none() {
        assert_eq!(catch("work", || 7), Some(7));
        assert_eq!(catch("work", || -> u8 { panic!("boom") }), None);
    }

    #[tokio::test]
    async fn a_loop_that_panics_starts_again() {
        let runs = Arc::new(AtomicUsize::new(0));
        let (done, finished) = tokio::sync::oneshot::channel::<()>();
        let done = Arc::new(std::sync::Mutex::new(Some(done)));
        let counted = Arc::clone(&runs);
        spawn_restarting("test loop", move || {
            let runs = Arc::clone(&counted);
            let done = Arc::clone(&done);
            async move {
                if runs.fetch_add(1, Ordering::SeqCst) == 0 {
                    panic!("the first run panics");
                }
                if let Some(tx) = done.lock().unwrap().take() {
                    let _ = tx.send(());
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(10), finished)
            .await
            .expect("the loop ran again after its panic")
            .unwrap();
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }
}
