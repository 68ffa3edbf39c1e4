//! Serving: the home lock, the listener, the accept loop with its grace period, and the
//! signals that end or reload it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::transport::{conn, tls};
use crate::{ConfigSource, app};

use crate::background::{release_scan, spawn_pacer, spawn_rollout_loop};
use crate::build_state;
use crate::{Config, ServerError, maintenance, panics, reload, routes, signals, web};

/// Serves until `shutdown` resolves, then lets running downloads finish for the grace
/// period. `config` was read from `source`, which a reload signal reads again.
pub async fn serve(
    config: Config,
    source: ConfigSource,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let as_read = config.clone();
    let addr = config.listen_addr().map_err(ServerError::Config)?;
    panics::install_hook();
    // Connections are capped below the file limit, so that a flood of them never leaves
    // the server without a descriptor for its bundle or its database.
    let fd_limit = conn::raise_fd_limit(
        u64::try_from(config.max_connections())
            .unwrap_or(u64::MAX)
            .saturating_add(conn::FD_RESERVE),
    );
    let (max_connections, lowered) = conn::fit_connections(config.max_connections(), fd_limit);
    if let Some(why) = lowered {
        // Only an operator's own number deserves a warning; the default simply takes
        // what the machine allows.
        if config.server.max_connections.is_some() {
            tracing::warn!("{why}");
        } else {
            tracing::info!(
                "server.max-connections (unset) is {max_connections}: what the file limit of {fd_limit} allows, less {} kept for the server's own files",
                conn::FD_RESERVE
            );
        }
    }
    // Nothing under home changes, and no socket is taken, unless both are free: a second
    // server started by mistake must not touch the first one's bundle.
    let mut home_lock = HomeLock::acquire(&config.server.home)?;
    // A certificate that cannot serve is an error before anything listens.
    let tls = match config.tls_files() {
        Some((cert, key)) => {
            let opened = tls::Certificates::open(&cert, &key)
                .and_then(|c| c.server_config().map(|config| (c, config)));
            match opened {
                Ok((certificates, server_config)) => {
                    tls::watch(certificates);
                    Some(server_config)
                }
                Err(e) => {
                    home_lock.abandon();
                    return Err(e.into());
                }
            }
        }
        None => None,
    };
    let listener = match listen(addr) {
        Ok(listener) => listener,
        Err(e) => {
            home_lock.abandon();
            return Err(ServerError::Io(format!(
                "cannot listen on {addr}: {e}; is another server running there? Nothing was changed"
            )));
        }
    };
    let local = listener
        .local_addr()
        .map_err(|e| ServerError::Io(e.to_string()))?;
    home_lock.describe(&format!("pid {} listening on {local}", std::process::id()));
    // URLs handed to agents name the port really bound (`:0` in tests).
    let mut config = config;
    if config.server.public_url.trim().is_empty() {
        let mut bound = config.clone();
        bound.server.listen = local.to_string();
        config.server.public_url = bound.admin_url();
    }
    let state = build_state(&config).await?;
    let conns = Arc::clone(&state.inner.metrics.conns);
    let news = Arc::clone(state.inner.fleet.rollouts.news());
    let fleet = Arc::clone(&state.inner.fleet);
    tracing::info!(
        "update-server listening on {}://{local} (home {})",
        if config.tls_files().is_some() {
            "https"
        } else {
            "http"
        },
        config.server.home.display()
    );
    if let Some(source) = &state.inner.download_source {
        tracing::info!(
            "agents fetch bundle bytes from {source}/<bundle file name> (downloads.public-url), from this server when that fails"
        );
    }
    // Tests and scripts read this line to learn the port.
    println!("listening on {local}");

    spawn_rollout_loop(&state);
    maintenance::spawn_waker(
        state.inner.fleet.deployments.every_window(),
        Arc::clone(state.inner.fleet.deployments.news()),
    );
    reload::spawn(reload::Reloader::new(
        source,
        as_read,
        Arc::clone(&state.inner.fleet),
    ));
    spawn_pacer(&state);
    crate::background::spawn_rotations(&state);
    crate::background::spawn_governance(&state);
    state.inner.deltas.spawn(Arc::clone(&state.inner.store));
    state.inner.fleet.spawn_drain();
    state.inner.fleet.spawn_contact_flush();
    state.inner.fleet.spawn_settings_poll();
    let store = Arc::clone(&state.inner.store);
    let publisher = Arc::clone(&state.inner.releases);
    let audit = state.inner.fleet.audit();
    let server_name = state.inner.server_name.clone();
    let scan_news = Arc::clone(&news);
    panics::spawn_restarting("release scan", move || {
        release_scan(
            Arc::clone(&store),
            Arc::clone(&publisher),
            audit.clone(),
            server_name.clone(),
            Arc::clone(&scan_news),
        )
    });

    // The page signs people in with admin.token or a named operator token: with
    // neither, its sign-in refuses every token.
    let router = app(state.clone())
        .merge(web::router(state.clone(), page_options(&config)))
        // Outside every route's own layers: it sees their refusals too (a body over the
        // limit, a request past its clock).
        .layer(axum::middleware::from_fn_with_state(
            state,
            routes::refusals::audit,
        ));
    let router = router.layer(
        // 503 (limit) and 409 (directive) are answers the server means to give; a
        // fleet produces thousands, so they are not logged as errors.
        tower_http::trace::TraceLayer::new_for_http()
            .on_failure(tower_http::trace::DefaultOnFailure::new().level(tracing::Level::DEBUG)),
    );
    let grace = Duration::from_secs(config.server.shutdown_grace);
    let announced = async move {
        shutdown.await;
        // Held connects are answered now, so their agents go elsewhere or come back.
        news.close();
        tracing::info!(
            "stopping: no new connections; running downloads get {}s to finish",
            grace.as_secs()
        );
    };
    let listener = conn::Listener {
        listener,
        max_connections,
        timeouts: config.timeouts(),
        tls,
    };
    conn::serve(listener, router, conns, announced, grace).await;
    // The last contacts heard are written before the server goes.
    fleet.flush_contacts().await;
    Ok(())
}

/// What the fleet page takes from the configuration.
pub fn page_options(config: &Config) -> web::Options {
    web::Options {
        admin_token: config.admin.token.clone(),
        heartbeat: Duration::from_secs(config.agents.heartbeat),
        secure: config.tls_files().is_some(),
    }
}

/// The kernel's queue of connections not yet accepted. Large, so that a burst of
/// connections (a fleet waking up, or a flood the server sheds) waits there instead of
/// having its handshakes dropped and retried a second later. The kernel caps it at
/// `net.core.somaxconn`.
pub const LISTEN_BACKLOG: u32 = 8192;

fn listen(addr: std::net::SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// `<home>/update-server.lock`: one server per home, held while it runs (the kernel
/// drops it if the process dies). It names the holder for whoever finds it taken.
pub struct HomeLock {
    file: nix::fcntl::Flock<std::fs::File>,
    /// The lock file, when this server made it: a server that gives up before it
    /// serves (its port taken, say) leaves the home as it found it.
    made: Option<std::path::PathBuf>,
}

pub const HOME_LOCK: &str = "update-server.lock";

impl HomeLock {
    pub fn acquire(home: &std::path::Path) -> Result<Self, ServerError> {
        use std::io::{Read, Seek};
        std::fs::create_dir_all(home)
            .map_err(|e| ServerError::Io(format!("{}: {e}", home.display())))?;
        let path = home.join(HOME_LOCK);
        let made = (!path.exists()).then(|| path.clone());
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| ServerError::Io(format!("{}: {e}", path.display())))?;
        // A server killed a moment ago may still hold the lock while the kernel ends its
        // threads (one in the middle of a disk write, say): its pid is then gone or a
        // zombie, and the lock is free within moments. A live holder is refused at once.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut file = file;
        loop {
            match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
                Ok(file) => return Ok(Self { file, made }),
                Err((mut held, _)) => {
                    let mut holder = String::new();
                    let _ = held
                        .rewind()
                        .and_then(|()| held.read_to_string(&mut holder));
                    if holder_is_exiting(&holder) && std::time::Instant::now() < deadline {
                        std::thread::sleep(std::time::Duration::from_millis(50));
                        file = held;
                        continue;
                    }
                    return Err(ServerError::Io(format!(
                        "another update-server ({}) uses the home {}; stop it, or give this one another --home",
                        holder.trim(),
                        home.display()
                    )));
                }
            }
        }
    }

    /// Gives the lock up without having served: a lock file this server made is
    /// removed (the server said it changed nothing).
    pub fn abandon(self) {
        if let Some(path) = &self.made {
            let _ = std::fs::remove_file(path);
        }
    }

    fn describe(&mut self, holder: &str) {
        use std::io::{Seek, Write};
        let _ = self.file.set_len(0);
        let _ = self.file.rewind();
        let _ = writeln!(self.file, "{holder}");
    }
}

/// True when the lock file names a pid that has exited (gone, or a zombie whose threads
/// the kernel is still ending): a holder that lets go by itself.
fn holder_is_exiting(holder: &str) -> bool {
    let Some(pid) = holder
        .split_whitespace()
        .skip_while(|w| *w != "pid")
        .nth(1)
        .and_then(|p| p.parse::<u32>().ok())
    else {
        return false;
    };
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => true,
    }
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    signals::shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_held_for_a_pid_that_exited_is_waited_for_and_a_live_one_is_not() {
        let me = format!("pid {} listening on 127.0.0.1:7080", std::process::id());
        assert!(!holder_is_exiting(&me));
        // Above the kernel's largest pid_max (2^22): never a live process.
        assert!(holder_is_exiting("pid 4194305 listening on 127.0.0.1:7080"));
        assert!(!holder_is_exiting(""));
        assert!(!holder_is_exiting("written by something else"));
    }

    #[test]
    fn a_home_held_by_a_live_server_is_refused_at_once() {
        let home = tempfile::tempdir().expect("tempdir");
        let mut first = HomeLock::acquire(home.path()).expect("first lock");
        first.describe(&format!(
            "pid {} listening on 127.0.0.1:1",
            std::process::id()
        ));
        let asked = std::time::Instant::now();
        let err = HomeLock::acquire(home.path())
            .err()
            .expect("a second lock on a held home");
        assert!(err.to_string().contains("another update-server"), "{err}");
        // Not the ten seconds an exiting holder is given.
        assert!(asked.elapsed() < std::time::Duration::from_secs(5));
    }

    #[test]
    fn a_server_that_gives_up_before_serving_leaves_no_lock_file_it_made() {
        let home = tempfile::tempdir().expect("tempdir");
        let path = home.path().join(HOME_LOCK);
        HomeLock::acquire(home.path()).expect("lock").abandon();
        assert!(!path.exists(), "the lock file this server made is gone");
        // One a server before it made is the home's own: kept.
        std::fs::write(&path, "pid 1 listening on 127.0.0.1:7080").expect("write");
        HomeLock::acquire(home.path()).expect("lock").abandon();
        assert!(path.exists());
    }

    /// A port already taken: the server says nothing changed, and leaves no lock behind.
    #[tokio::test]
    async fn a_port_clash_leaves_no_lock_file() {
        let home = tempfile::tempdir().expect("tempdir");
        let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = taken.local_addr().expect("addr").port();
        let vars = agent_protocol::settings::VarMap(vec![
            (
                "UPDATE_SERVER_SERVER_HOME".into(),
                home.path().display().to_string(),
            ),
            (
                "UPDATE_SERVER_SERVER_LISTEN".into(),
                format!("127.0.0.1:{port}"),
            ),
        ]);
        let config = Config::load(None, &vars).expect("config");
        let err = serve(config, ConfigSource::default(), std::future::pending())
            .await
            .expect_err("the port is taken");
        assert!(err.to_string().contains("Nothing was changed"), "{err}");
        assert!(!home.path().join(HOME_LOCK).exists());
    }
}
