//! The workload: the operator's program that the agent exists to run. The supervisor
//! starts it in its own process group at once (whatever any server says), sends its
//! output to `logs/workload.log`, restarts it with backoff when it exits, checks its
//! health, records it in `run/workload.pid`, and stops the whole group (TERM,
//! `stop-timeout`, KILL) before the agent exits. A workload left by an agent that died
//! is found by that record and stopped before a new one starts: never two, never an
//! orphan.
//!
//! An agent handing over to the updater leaves its workload serving instead
//! ([`Supervisor::leave`]): the next agent to start (the new version's, or this one again
//! after a rollback) finds it by the same record and stops it just before starting its
//! own, so an update costs the workload no more downtime than a restart.
//!
//! [`policy`] decides (pure); this module and [`group`], [`check`] and [`logfile`] act.
//! [`config`] is `[workload]` as written, [`spec`] the same resolved for one version, and
//! [`health`] the agent's health board the supervisor publishes the workload's state on.
//!
//! This crate owns the workload's process group, `logs/workload.log` and
//! `run/workload.pid`; it must not contact a server, touch `versions/` or `current`, or
//! decide anything about an update: the agent (its only user) does.

pub mod check;
pub mod config;
pub mod group;
pub mod health;
pub mod logfile;
pub mod policy;
pub mod spec;
mod stop_command;

use std::future::Future;
use std::pin::Pin;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use agent_protocol::journal::WorkloadReport;
use agent_protocol::layout::AgentHome;
use agent_updater::state::now_secs;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::watch;

use crate::health::HealthBoard;
use logfile::LogFile;
use policy::{Action, Exit, Supervision};
use spec::{Check, Spec};

/// `logs/workload.log`.
pub fn log_path(home: &AgentHome) -> std::path::PathBuf {
    home.logs().join("workload.log")
}

/// The running supervisor; [`Supervisor::stop`] stops the workload and waits for it.
pub struct Supervisor {
    stop: watch::Sender<Ending>,
    task: tokio::task::JoinHandle<()>,
}

/// How the supervisor is asked to end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    Not,
    Stop,
    Leave,
}

impl Supervisor {
    pub fn start(spec: Spec, home: AgentHome, board: Arc<HealthBoard>) -> Self {
        let (stop, stop_rx) = watch::channel(Ending::Not);
        let task = tokio::spawn(supervise(spec, home, board, stop_rx));
        Self { stop, task }
    }

    /// Stops the workload (TERM to its group, `stop-timeout`, KILL) and returns once it
    /// is gone.
    pub async fn stop(self) {
        self.end(Ending::Stop).await;
    }

    /// Ends supervision but leaves a running workload serving, recorded in
    /// `run/workload.pid`, for the next agent to stop just before it starts its own (a
    /// hand-off to the updater). Its output keeps reaching `logs/workload.log` after
    /// this process exits. Where that cannot be arranged it is stopped as by
    /// [`Supervisor::stop`].
    pub async fn leave(self) {
        self.end(Ending::Leave).await;
    }

    async fn end(self, how: Ending) {
        let _ = self.stop.send(how);
        if let Err(e) = self.task.await {
            tracing::error!("the workload supervisor failed: {e}");
        }
    }
}

type Shared = Arc<Mutex<LogFile>>;

/// The workload process of this run.
struct Running {
    child: tokio::process::Child,
    pid: u32,
    since_unix: u64,
    /// The tasks copying its stdout and stderr into the log.
    pumps: Vec<tokio::task::JoinHandle<()>>,
    /// A second read end of each output pipe, for whoever drains them after a
    /// hand-over (a pipe without a reader would kill the workload at its next line).
    outputs: Vec<group::Output>,
}

impl Running {
    /// Lets the output it wrote before it exited reach the log before its exit line
    /// (bounded: a child of it may hold the pipes open).
    async fn drain(&mut self) {
        for pump in self.pumps.drain(..) {
            let _ = tokio::time::timeout(std::time::Duration::from_millis(500), pump).await;
        }
    }
}

type CheckFuture = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

fn note(log: &Shared, text: &str) {
    let mut log = log.lock().unwrap_or_else(|p| p.into_inner());
    if let Err(e) = log.note(text) {
        tracing::warn!("cannot write logs/workload.log: {e}");
    }
}

async fn supervise(
    spec: Spec,
    home: AgentHome,
    board: Arc<HealthBoard>,
    mut stop: watch::Receiver<Ending>,
) {
    let log: Shared = Arc::new(Mutex::new(LogFile::new(
        log_path(&home),
        logfile::MAX_BYTES,
    )));
    let mut sup = Supervision::new(
        spec.enabled(),
        spec.start_timeout,
        spec.health != Check::None,
    );
    // Built before a predecessor's workload is stopped: between that stop and the start
    // below, the workload is down.
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(check::CHECK_TIMEOUT)
        .build()
        .unwrap_or_default();
    stop_leftover(&home, &spec, &log).await;
    let mut running: Option<Running> = None;
    let mut check_due: Option<Instant> = None;
    let mut check_run: Option<CheckFuture> = None;
    loop {
        let now = Instant::now();
        let mut wake = match sup.tick(now) {
            Action::Start => {
                start(&spec, &home, &log, &mut sup, &mut running);
                check_due = Some(Instant::now());
                check_run = None;
                continue;
            }
            Action::StopFailedStart(why) => {
                check_run = None;
                if let Some(r) = &running {
                    tracing::error!("{why}; stopping it (pid {})", r.pid);
                    note(&log, &format!("{why}; stopping it (pid {})", r.pid));
                    group::stop(r.pid, spec.stop_timeout).await;
                }
                continue;
            }
            Action::Wait(until) => until,
        };
        publish(&board, &sup, running.as_ref(), &spec);
        if check_run.is_none()
            && sup.check_interval().is_some()
            && let Some(due) = check_due
        {
            if due <= Instant::now() {
                let (check, http, dir) = (spec.health.clone(), http.clone(), spec.home.clone());
                check_run = Some(Box::pin(
                    async move { check::run(&check, &http, &dir).await },
                ));
            } else {
                wake = Some(wake.map_or(due, |w| w.min(due)));
            }
        }
        let sleep = async {
            match wake {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = stop.changed() => break,
            status = wait_child(&mut running) => {
                check_run = None;
                check_due = None;
                if let Some(mut r) = running.take() {
                    r.drain().await;
                    let exit = match (status.code(), group::exit_signal(&status)) {
                        (Some(code), _) => Exit::Code(code),
                        (None, Some(sig)) => Exit::Signal(sig),
                        (None, None) => Exit::Code(-1),
                    };
                    let delay = sup.exited(exit, Instant::now());
                    let text = format!(
                        "workload (pid {}) {}; restarting in {:.0}s (restart {})",
                        r.pid,
                        sup.last_exit().unwrap_or_default(),
                        delay.as_secs_f64(),
                        sup.health().restarts + 1
                    );
                    tracing::warn!("{text}");
                    note(&log, &text);
                    // Its children may live on in the group; a new run starts clean.
                    group::stop(r.pid, spec.stop_timeout).await;
                    group::forget(&home);
                }
            }
            result = poll_check(&mut check_run) => {
                check_run = None;
                let was_healthy = sup.health().healthy;
                if let Err(e) = &result
                    && sup.state() == agent_protocol::wire::WorkloadState::Running
                    && was_healthy
                {
                    tracing::warn!("workload health check failing: {e}");
                    note(&log, &format!("health check failing: {e}"));
                }
                sup.checked(result, Instant::now());
                if !was_healthy && sup.health().healthy {
                    tracing::info!("workload healthy");
                }
                check_due = sup.check_interval().map(|i| Instant::now() + i);
            }
            _ = sleep => {}
        }
    }
    sup.stopped();
    if *stop.borrow() == Ending::Leave
        && let Some(r) = running.take()
    {
        match hand_over(r, &home).await {
            Ok(pid) => {
                let text = format!(
                    "left the workload (pid {pid}) serving for the next agent, which stops it just before it starts its own"
                );
                tracing::info!("{text}");
                note(&log, &text);
                publish(&board, &sup, None, &spec);
                return;
            }
            Err((r, why)) => {
                tracing::warn!("cannot leave the workload serving ({why}); stopping it");
                running = Some(r);
            }
        }
    }
    if let Some(mut r) = running.take() {
        let left = stop_command::ask(&spec, r.pid, &mut r.child, &|t| note(&log, t)).await;
        let how = group::stop(r.pid, left).await;
        let status = r.child.wait().await.ok();
        r.drain().await;
        let ended = status
            .map(|s| match (s.code(), group::exit_signal(&s)) {
                (Some(code), _) => Exit::Code(code).to_string(),
                (None, Some(sig)) => Exit::Signal(sig).to_string(),
                (None, None) => "ended".to_owned(),
            })
            .unwrap_or_else(|| "ended".into());
        let text = match how {
            group::Stopped::Killed => format!(
                "workload (pid {}) ignored TERM for {:?} (workload.stop-timeout); killed its process group ({ended})",
                r.pid, spec.stop_timeout
            ),
            _ => format!("workload (pid {}) stopped: {ended}", r.pid),
        };
        tracing::info!("{text}");
        note(&log, &text);
    }
    group::forget(&home);
    publish(&board, &sup, None, &spec);
}

/// Hands the workload's output to a `cat` per pipe appending to the log, which ends
/// when the workload's last process closes the pipe, and leaves the workload running.
/// Gives it back, with why, when a drainer cannot be started.
async fn hand_over(mut r: Running, home: &AgentHome) -> Result<u32, (Running, String)> {
    for pump in r.pumps.drain(..) {
        pump.abort();
        let _ = pump.await;
    }
    let mut failed = None;
    for fd in std::mem::take(&mut r.outputs) {
        if let Err(e) = group::hand_over_output(fd, &log_path(home)) {
            failed.get_or_insert(e);
        }
    }
    match failed {
        None => Ok(r.pid),
        Some(e) => Err((r, e)),
    }
}

/// Stops a workload that an agent before this one left running (it handed over to the
/// updater, or died without stopping it), so that no two run.
async fn stop_leftover(home: &AgentHome, spec: &Spec, log: &Shared) {
    if let Some((pgid, members)) = group::leftover(home) {
        let text = format!(
            "found the workload (pid {pgid}, {} process(es)) of the agent before this one still running; stopping its process group before starting this one's",
            members.len()
        );
        tracing::warn!("{text}");
        note(log, &text);
        let how = group::stop(pgid, spec.stop_timeout).await;
        note(log, &format!("left-over workload (pid {pgid}) {how:?}"));
    }
    group::forget(home);
}

fn start(
    spec: &Spec,
    home: &AgentHome,
    log: &Shared,
    sup: &mut Supervision,
    running: &mut Option<Running>,
) {
    let program = match spec.program() {
        Ok(p) => p,
        Err(e) => {
            let delay = sup.spawn_failed(e.clone(), Instant::now());
            tracing::error!("cannot start the workload: {e}; trying again in {delay:?}");
            note(log, &format!("cannot start the workload: {e}"));
            return;
        }
    };
    // Noted before the start: a kill before the pid is recorded must not leave a
    // workload the next agent cannot find (it would hold the port of the next one).
    let instance = uuid::Uuid::now_v7().simple().to_string();
    if let Err(e) = group::about_to_start(home, &instance) {
        tracing::warn!("cannot note the workload's start in run/: {e}");
    }
    let mut cmd = tokio::process::Command::new(&program);
    cmd.args(spec.argv.iter().skip(1))
        .envs(&spec.env)
        .env(group::INSTANCE_ENV, &instance)
        .env_remove("AGENT_UPDATER_ACTIVE")
        .current_dir(&spec.home)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(false);
    group::prepare(&mut cmd);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let why = format!(
                "workload.command: cannot run {}: {e}; check that it is a program for this machine",
                program.display()
            );
            let delay = sup.spawn_failed(why.clone(), Instant::now());
            tracing::error!("{why}; trying again in {delay:?}");
            note(log, &why);
            return;
        }
    };
    let Some(pid) = child.id() else {
        return;
    };
    if let Err(e) = group::adopt(pid) {
        tracing::warn!("cannot put the workload (pid {pid}) in its own group: {e}");
    }
    match group::start_ticks(pid) {
        Some(ticks) => {
            if let Err(e) = group::record(home, pid, ticks) {
                tracing::warn!("cannot record the workload in run/workload.pid: {e}");
            }
        }
        None => tracing::warn!("workload (pid {pid}) ended before it could be recorded"),
    }
    let mut pumps = Vec::new();
    let mut outputs = Vec::new();
    if let Some(out) = child.stdout.take() {
        outputs.extend(group::output_of(&out));
        pumps.push(tokio::spawn(pump(out, Arc::clone(log))));
    }
    if let Some(err) = child.stderr.take() {
        outputs.extend(group::output_of(&err));
        pumps.push(tokio::spawn(pump(err, Arc::clone(log))));
    }
    sup.started(Instant::now());
    let text = format!(
        "started the workload (pid {pid}): {} {}",
        program.display(),
        spec.argv[1..].join(" ")
    );
    tracing::info!("{}", text.trim_end());
    note(log, text.trim_end());
    *running = Some(Running {
        child,
        pid,
        since_unix: now_secs(),
        pumps,
        outputs,
    });
}

/// Copies the workload's output into its log until the pipe closes.
async fn pump(mut from: impl AsyncRead + Unpin, log: Shared) {
    let mut buf = vec![0u8; 16 * 1024];
    let mut said = false;
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let result = log
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .append(&buf[..n]);
                if let Err(e) = result
                    && !said
                {
                    said = true;
                    tracing::warn!("cannot write logs/workload.log: {e}");
                }
            }
        }
    }
}

async fn wait_child(running: &mut Option<Running>) -> std::process::ExitStatus {
    match running {
        Some(r) => match r.child.wait().await {
            Ok(status) => status,
            Err(_) => group::unknown_exit(),
        },
        None => std::future::pending().await,
    }
}

async fn poll_check(run: &mut Option<CheckFuture>) -> Result<(), String> {
    match run {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

/// The workload as reported before the supervisor has started it: the first
/// `run/health.json` already says there is one, and that it is not healthy yet.
pub fn initial_report(spec: &Spec) -> WorkloadReport {
    let sup = Supervision::new(
        spec.enabled(),
        spec.start_timeout,
        spec.health != Check::None,
    );
    report(&sup, None, spec)
}

fn publish(board: &HealthBoard, sup: &Supervision, running: Option<&Running>, spec: &Spec) {
    let report = report(sup, running, spec);
    board.update(|h| h.workload = Some(report));
}

fn report(sup: &Supervision, running: Option<&Running>, spec: &Spec) -> WorkloadReport {
    WorkloadReport {
        health: sup.health(),
        pid: running.map(|r| r.pid),
        since: running.map(|r| r.since_unix),
        last_exit: sup.last_exit().map(str::to_owned),
        start_timeout_ms: u64::try_from(spec.start_timeout.as_millis()).unwrap_or(u64::MAX),
    }
}

/// The workload's lines of `agent status`; `agent_alive` says whether the report is
/// current (a dead agent's last report is shown as such).
pub fn describe(report: Option<&WorkloadReport>, agent_alive: bool) -> String {
    use agent_protocol::wire::WorkloadState;
    use std::fmt::Write as _;
    let mut out = String::new();
    let Some(w) = report else {
        return "workload: not reported (an agent from before workloads?)\n".into();
    };
    let stale = if agent_alive {
        ""
    } else {
        " (as last reported; the agent is not running)"
    };
    let _ = match (w.health.workload, w.pid) {
        (WorkloadState::None, _) => {
            writeln!(out, "workload: none configured (workload.command){stale}")
        }
        (state, Some(pid)) => {
            let up = w
                .since
                .map(|t| {
                    format!(
                        ", up since {} ({}s)",
                        logfile::utc(t),
                        now_secs().saturating_sub(t)
                    )
                })
                .unwrap_or_default();
            writeln!(
                out,
                "workload: {} (pid {pid}{up}), {}{stale}",
                state.as_str(),
                if w.health.healthy {
                    "healthy"
                } else {
                    "not healthy"
                }
            )
        }
        (state, None) => writeln!(out, "workload: {}, not healthy{stale}", state.as_str()),
    };
    if w.health.workload != WorkloadState::None {
        let _ = writeln!(
            out,
            "          restarts {}; last exit: {}",
            w.health.restarts,
            w.last_exit.as_deref().unwrap_or("none")
        );
    }
    if let Some(e) = &w.health.last_error {
        let _ = writeln!(out, "          last error: {e}");
    }
    out
}
