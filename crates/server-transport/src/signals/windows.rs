//! Windows: Ctrl-C, Ctrl-Break and the console's close or the system's shutdown stop;
//! there is no HUP, so no reload ever comes (a restart reads the configuration).

pub(super) async fn shutdown() {
    use tokio::signal::windows;
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let other = async {
        match (
            windows::ctrl_break(),
            windows::ctrl_close(),
            windows::ctrl_shutdown(),
        ) {
            (Ok(mut brk), Ok(mut close), Ok(mut shutdown)) => {
                tokio::select! {
                    _ = brk.recv() => {},
                    _ = close.recv() => {},
                    _ = shutdown.recv() => {},
                }
            }
            _ => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        () = ctrl_c => {},
        () = other => {},
    }
}

pub(super) struct Reloads;

impl Reloads {
    pub(super) fn listen() -> std::io::Result<Self> {
        Ok(Self)
    }

    pub(super) async fn next(&mut self) {
        std::future::pending::<()>().await;
    }
}
