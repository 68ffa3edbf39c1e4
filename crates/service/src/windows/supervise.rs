//! The service's work: run the agent of `current` in the job, restart it with backoff,
//! start none while an updater runs (unless the updater asks), run recovery when an
//! update was interrupted, and stop it gracefully: its stop event, then the job.

use std::os::windows::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use agent_protocol::layout::{self, AgentHome};
use agent_updater::{lock, process};
use windows_sys::Win32::System::Threading::{
    CREATE_BREAKAWAY_FROM_JOB, CREATE_NEW_PROCESS_GROUP, CREATE_NO_WINDOW, DETACHED_PROCESS,
};

use super::home::{self, Request, log};
use super::job::Job;
use agent_service::policy::{self, AfterExit, Backoff, Idle};

/// How often the service looks at its agent, its requests and the updater.
const TICK: Duration = Duration::from_millis(50);

/// Why the supervision ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Ended {
    /// Asked to stop: the agent was stopped.
    Stopped,
    /// The new version carries another agent-service.exe: it replaced this program's
    /// file, and a helper from the new file starts the service again once this ends.
    Replaced,
}

struct Running {
    child: Child,
    pid: u32,
    started: Instant,
}

pub(crate) struct Supervisor {
    home: AgentHome,
    service_name: String,
    job: Job,
    agent: Option<Running>,
    /// Start nothing until asked, and why.
    idle: Option<String>,
    backoff: Backoff,
    next_start: Instant,
    recovery: Option<Child>,
    recovery_tried: bool,
    stop_timeout: Duration,
}

impl Supervisor {
    pub(crate) fn new(home: AgentHome, service_name: String) -> anyhow::Result<Self> {
        Ok(Self {
            home,
            service_name,
            job: Job::new()?,
            agent: None,
            idle: None,
            backoff: Backoff::with_max(agent_service::knobs::backoff_max()),
            next_start: Instant::now(),
            recovery: None,
            recovery_tried: false,
            stop_timeout: agent_service::knobs::stop_timeout(),
        })
    }

    /// Supervises until `stop` says so, naming who asked (or its sender is gone).
    pub(crate) fn run(&mut self, stop: &Receiver<&'static str>) -> Ended {
        remove_relocated(&self.home);
        let _ = std::fs::create_dir_all(self.home.run());
        // The service runs again: whatever stop was asked for before is over.
        home::clear_stop_request(&self.home);
        let _ = std::fs::write(
            self.home.run().join("service.pid"),
            format!("{}\n", std::process::id()),
        );
        log(
            &self.home,
            &format!("service {} started", self.service_name),
        );
        let by = loop {
            match stop.recv_timeout(TICK) {
                Ok(by) => break by,
                Err(RecvTimeoutError::Disconnected) => break "the service manager",
                Err(RecvTimeoutError::Timeout) => {}
            }
            if self.turn() == Some(Ended::Replaced) {
                return Ended::Replaced;
            }
        };
        // Said before the agent is stopped: an updater judging a new version sees that
        // this stop was asked for, puts its verdict off to the next start, and starts
        // nothing (the service stays stopped).
        home::request_stop(&self.home, by);
        self.stop_agent("the service is stopping");
        log(
            &self.home,
            &format!("service {} stopped", self.service_name),
        );
        Ended::Stopped
    }

    /// One look at everything; `Some` when the service must end now.
    fn turn(&mut self) -> Option<Ended> {
        let request = home::take_request(&self.home);
        if self.agent.is_some() {
            self.watch_agent(request);
            return None;
        }
        if let Some(rec) = &mut self.recovery
            && !matches!(rec.try_wait(), Ok(None))
        {
            self.recovery = None;
        }
        match request {
            Some(Request::Start) => {
                self.idle = None;
                return self.start_agent(true);
            }
            Some(Request::Stop) => {
                self.idle = Some("stopped on the updater's request".into());
                return None;
            }
            None => {}
        }
        if self.idle.is_some()
            || self.recovery.is_some()
            || Instant::now() < self.next_start
            || lock::holder(&self.home.update_lock()).is_some()
        {
            return None;
        }
        if let Some(pid) = process::running_agent(&self.home) {
            // Not ours (started by hand): never two agents.
            self.idle = Some(format!(
                "an agent this service did not start runs (pid {pid})"
            ));
            log(&self.home, self.idle.as_deref().unwrap_or_default());
            return None;
        }
        if !self.recovery_tried && self.home.journal().is_file() {
            self.recovery_tried = true;
            self.spawn_recovery();
            return None;
        }
        self.start_agent(false)
    }

    fn watch_agent(&mut self, request: Option<Request>) {
        let Some(agent) = &mut self.agent else {
            return;
        };
        match agent.child.try_wait() {
            Ok(None) => {
                if request == Some(Request::Stop) {
                    self.stop_agent("asked by the updater");
                    self.idle = Some("stopped on the updater's request".into());
                } else if request == Some(Request::Start) {
                    // Already running: the asker sees it in run\agent.pid.
                }
            }
            Ok(Some(status)) => {
                let code = status.code();
                let (pid, ran) = (agent.pid, agent.started.elapsed());
                self.agent = None;
                record_exit(&self.home, pid, code);
                let updater = lock::holder(&self.home.update_lock()).is_some();
                match policy::after_exit(code, ran, updater, &mut self.backoff) {
                    AfterExit::HandedOver => log(
                        &self.home,
                        "agent exited normally; the updater takes over and starts the next one through this service",
                    ),
                    AfterExit::Idle(idle) => {
                        let why = idle_words(idle);
                        log(&self.home, &why);
                        self.idle = Some(why);
                    }
                    AfterExit::Restart(pause) => {
                        log(
                            &self.home,
                            &format!(
                                "agent exited with code {} after {}s; restarting in {}s",
                                code.map_or("?".into(), |c| c.to_string()),
                                ran.as_secs(),
                                pause.as_secs()
                            ),
                        );
                        self.next_start = Instant::now() + pause;
                        self.recovery_tried = false;
                    }
                }
            }
            Err(e) => log(&self.home, &format!("cannot wait for the agent: {e}")),
        }
    }

    /// Starts `current`'s agent. `asked`: on the updater's request (an updater may run).
    fn start_agent(&mut self, asked: bool) -> Option<Ended> {
        let version_dir = match agent_extract::current::read_dir(&self.home.current()) {
            Ok(dir) => dir,
            Err(e) => {
                let why = format!("no version to run: {e}; install the agent again");
                log(&self.home, &why);
                self.next_start = Instant::now() + Duration::from_secs(5);
                return None;
            }
        };
        if self.replace_self(&version_dir, asked) {
            return Some(Ended::Replaced);
        }
        self.refresh_launcher(&version_dir);
        let exe = version_dir.join("bin").join(layout::AGENT_EXE_WINDOWS);
        match self.spawn_agent(&exe) {
            Ok(running) => {
                log(
                    &self.home,
                    &format!("started agent (pid {}) {}", running.pid, exe.display()),
                );
                self.agent = Some(running);
            }
            Err(e) => {
                let pause = Duration::from_secs(5);
                log(
                    &self.home,
                    &format!(
                        "cannot start {}: {e}; trying again in {}s",
                        exe.display(),
                        pause.as_secs()
                    ),
                );
                self.next_start = Instant::now() + pause;
            }
        }
        None
    }

    fn spawn_agent(&self, exe: &Path) -> std::io::Result<Running> {
        std::fs::create_dir_all(self.home.logs())?;
        std::fs::create_dir_all(self.home.run())?;
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.home.agent_out())?;
        let err = out.try_clone()?;
        let child = Command::new(exe)
            .arg("run")
            .current_dir(self.home.root())
            .env("AGENT_HOME", self.home.root())
            .env_remove(agent_protocol::env_vars::AGENT_UPDATER_ACTIVE)
            .env(agent_protocol::env_vars::AGENT_SUPERVISED, "1")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .creation_flags(CREATE_NO_WINDOW)
            .spawn()?;
        let pid = child.id();
        if let Err(e) = self.job.assign(&child) {
            log(
                &self.home,
                &format!("cannot put the agent (pid {pid}) in the service's job: {e}"),
            );
        }
        agent_extract::atomic::write(&self.home.pid_file(), format!("{pid}\n").as_bytes())
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok(Running {
            child,
            pid,
            started: Instant::now(),
        })
    }

    /// The agent's stop event, up to `stop-timeout` for it to end, then the whole job.
    fn stop_agent(&mut self, why: &str) {
        let Some(mut agent) = self.agent.take() else {
            self.job.terminate();
            return;
        };
        log(
            &self.home,
            &format!("stopping agent (pid {}): {why}", agent.pid),
        );
        process::terminate(agent.pid);
        let end = Instant::now() + self.stop_timeout;
        let mut status = None;
        while Instant::now() < end {
            if let Ok(Some(s)) = agent.child.try_wait() {
                status = Some(s);
                break;
            }
            std::thread::sleep(TICK);
        }
        if status.is_none() {
            log(
                &self.home,
                &format!(
                    "agent (pid {}) did not stop within {}s; ending its job",
                    agent.pid,
                    self.stop_timeout.as_secs()
                ),
            );
        }
        // The workload and any child the agent left go with the job in every case.
        self.job.terminate();
        let status = status.or_else(|| agent.child.wait().ok());
        record_exit(&self.home, agent.pid, status.and_then(|s| s.code()));
        let _ = std::fs::remove_file(self.home.pid_file());
        log(&self.home, &format!("stopped agent (pid {})", agent.pid));
    }

    /// `data\update\updater.exe --update=<home> --recover`, out of the job: it finishes
    /// or rolls back the interrupted update and starts an agent through this service.
    fn spawn_recovery(&mut self) {
        let updater = self.home.update_dir().join(layout::updater_file_name());
        if !updater.is_file() {
            return;
        }
        log(&self.home, "an update was interrupted; running recovery");
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.home.logs().join("service.log"));
        let (o, e) = match out.and_then(|f| Ok((f.try_clone()?, f))) {
            Ok((a, b)) => (Stdio::from(a), Stdio::from(b)),
            Err(_) => (Stdio::null(), Stdio::null()),
        };
        match Command::new(&updater)
            .arg(format!("--update={}", self.home.root().display()))
            .arg("--recover")
            .current_dir(self.home.root())
            .stdin(Stdio::null())
            .stdout(o)
            .stderr(e)
            .creation_flags(DETACHED_PROCESS | CREATE_NEW_PROCESS_GROUP | CREATE_BREAKAWAY_FROM_JOB)
            .spawn()
        {
            Ok(child) => self.recovery = Some(child),
            Err(e) => log(
                &self.home,
                &format!("cannot run recovery {}: {e}", updater.display()),
            ),
        }
    }

    /// `<home>\bin\agent.exe`, the launcher, becomes the one the version about to run
    /// carries when they differ (a launcher runs any version's agent, so an older one only
    /// misses what a newer one fixed). One running at this moment (someone's `agent
    /// status`) cannot be replaced: it is tried again at the next start.
    fn refresh_launcher(&self, version_dir: &Path) {
        let carried = version_dir
            .join("bin")
            .join(agent_updater::launcher::LAUNCHER_EXE);
        let installed = self.home.root().join("bin").join(layout::AGENT_EXE_WINDOWS);
        if !carried.is_file() || same_bytes(&installed, &carried) {
            return;
        }
        match agent_extract::atomic::copy_file(&carried, &installed) {
            Ok(_) => log(
                &self.home,
                &format!(
                    "{} is the launcher of {}",
                    installed.display(),
                    version_dir.display()
                ),
            ),
            Err(e) => log(
                &self.home,
                &format!(
                    "cannot replace the launcher {} ({e}); it is tried again at the next start",
                    installed.display()
                ),
            ),
        }
    }

    /// When the version about to run carries an agent-service.exe other than the
    /// installed one this service runs, the installed file is replaced (self-replace
    /// renames the running one aside), and a helper run from the new file starts the
    /// service again once this one has ended. A pending start request is kept for it.
    fn replace_self(&self, version_dir: &Path, asked: bool) -> bool {
        let installed = home::installed_exe(&self.home);
        let carried = version_dir.join("bin").join(layout::SERVICE_EXE);
        let running = std::env::current_exe().ok();
        let runs_installed = running.as_deref().is_some_and(|r| same_path(r, &installed));
        if !runs_installed || !carried.is_file() || same_bytes(&installed, &carried) {
            return false;
        }
        if let Err(e) = self_replace::self_replace(&carried) {
            log(
                &self.home,
                &format!(
                    "cannot replace {} with {}: {e}; running on",
                    installed.display(),
                    carried.display()
                ),
            );
            return false;
        }
        if asked {
            let _ = home::write_request(&self.home, Request::Start);
        }
        let spawned = Command::new(&installed)
            .args(["__restart-service", "--service-name", &self.service_name])
            .arg("--after")
            .arg(std::process::id().to_string())
            .arg("--home")
            .arg(self.home.root())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .creation_flags(DETACHED_PROCESS | CREATE_NEW_PROCESS_GROUP | CREATE_BREAKAWAY_FROM_JOB)
            .spawn();
        match spawned {
            Ok(_) => {
                log(
                    &self.home,
                    &format!(
                        "replaced {} with the one of {}; the service restarts itself",
                        installed.display(),
                        version_dir.display()
                    ),
                );
                true
            }
            Err(e) => {
                log(
                    &self.home,
                    &format!(
                        "replaced {} but cannot start the helper that restarts the service ({e}); running on with the old program until the next restart",
                        installed.display()
                    ),
                );
                false
            }
        }
    }
}

/// Why no agent is started again, in Windows' words.
fn idle_words(idle: Idle) -> String {
    match idle {
        Idle::Refused => {
            "the agent was refused by the server and updates are disabled; not restarting".into()
        }
        Idle::BadConfiguration(c) => format!(
            "the agent refused its configuration (exit {c}); not restarting: fix conf\\agent.toml (see logs\\agent.out), then run agent-service.exe start"
        ),
    }
}

fn record_exit(home: &AgentHome, pid: u32, code: Option<i32>) {
    let code = code.map_or("-1".to_owned(), |c| c.to_string());
    let _ = agent_extract::atomic::write(
        &home.run().join(layout::AGENT_EXIT_FILE),
        format!("{pid} {code} {}\n", home::now_secs()).as_bytes(),
    );
}

fn same_path(a: &Path, b: &Path) -> bool {
    let norm = |p: &Path| {
        let full = agent_extract::os::canonical(p).unwrap_or_else(|_| p.to_path_buf());
        full.display().to_string().to_lowercase()
    };
    norm(a) == norm(b)
}

fn same_bytes(a: &Path, b: &Path) -> bool {
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(ma), Ok(mb)) if ma.len() != mb.len() => false,
        _ => matches!((std::fs::read(a), std::fs::read(b)), (Ok(x), Ok(y)) if x == y),
    }
}

/// What self-replace renamed aside, left when its deletion helper could not run: the
/// old file is removed at the next start.
fn remove_relocated(home: &AgentHome) {
    let bin: PathBuf = home.root().join("bin");
    let Ok(entries) = std::fs::read_dir(&bin) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.contains(".__relocated__") || name.contains(".__selfdelete__") {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}
