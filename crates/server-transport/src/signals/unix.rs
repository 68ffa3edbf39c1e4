//! Unix: SIGTERM and SIGINT (Ctrl-C) stop, SIGHUP reloads, as daemons are expected to
//! (`systemctl reload`, `kill -HUP`).

use tokio::signal::unix::{Signal, SignalKind, signal};

pub(super) async fn shutdown() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match signal(SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            // Without a handler TERM keeps its default and ends the process at once.
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}

pub(super) struct Reloads(Signal);

impl Reloads {
    pub(super) fn listen() -> std::io::Result<Self> {
        signal(SignalKind::hangup()).map(Self)
    }

    pub(super) async fn next(&mut self) {
        if self.0.recv().await.is_none() {
            // The signal driver is gone (the runtime is stopping): no reload comes.
            std::future::pending::<()>().await;
        }
    }
}
