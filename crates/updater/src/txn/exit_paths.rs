//! Every way out of the updater, on a disk that refuses every state write: the old
//! agent is started in each, and before the writes are tried.

use std::cell::{Cell, RefCell};
use std::fs;
use std::io;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::Duration;

use agent_protocol::journal::{Journal, Phase};
use agent_protocol::layout::AgentHome;
use agent_protocol::wire::Report;

use super::{Transaction, Verdict};
use crate::effects::Effects;
use crate::error::{Result, UpdateError};
use crate::log::UpdateLog;
use crate::settings::Settings;
use crate::state;

const OLD: &str = "1.0.0+1";
const NEW: &str = "2.0.0+2";

/// A disk that is full (`full`: every state write fails with ENOSPC) and processes that
/// are only recorded: `start:<version dir>` makes an agent "run".
struct Fake {
    full: bool,
    events: RefCell<Vec<String>>,
    running: Cell<Option<u32>>,
    /// What starting the new version does (the commit test makes it look healthy).
    on_start_new: Option<Box<dyn Fn()>>,
}

impl Fake {
    fn new(full: bool) -> Self {
        Self {
            full,
            events: RefCell::new(Vec::new()),
            running: Cell::new(None),
            on_start_new: None,
        }
    }

    fn write(&self, what: String, real: impl FnOnce() -> Result<()>) -> Result<()> {
        self.events.borrow_mut().push(what);
        if self.full {
            return Err(UpdateError::Extract(agent_extract::Error::Io {
                path: "/home/agent/data/.tmp-x".into(),
                source: io::Error::from_raw_os_error(28),
            }));
        }
        real()
    }

    fn events(&self) -> Vec<String> {
        self.events.borrow().clone()
    }

    fn position(&self, event: &str) -> Option<usize> {
        self.events().iter().position(|e| e == event)
    }
}

impl Effects for Fake {
    fn write_journal(&self, home: &AgentHome, journal: &Journal) -> Result<()> {
        self.write(format!("journal:{:?}", journal.phase), || {
            state::write_journal(home, journal)
        })
    }

    fn enqueue_report(&self, home: &AgentHome, report: &Report) -> Result<()> {
        self.write(format!("report:{}", report.status.as_str()), || {
            state::enqueue_report(home, report).map(|_| ())
        })
    }

    fn add_bad(&self, home: &AgentHome, sha256: &str, version: &str, reason: &str) -> Result<()> {
        self.write("bad".into(), || {
            state::add_bad(home, sha256, version, reason)
        })
    }

    fn running_agent(&self, _: &AgentHome) -> Option<u32> {
        self.running.get()
    }

    fn supervisor_running(&self, _: &AgentHome) -> bool {
        false
    }

    fn start_agent(
        &self,
        _: &AgentHome,
        dir: &Path,
        _: Option<Duration>,
    ) -> Result<String, String> {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        self.events.borrow_mut().push(format!("start:{name}"));
        if name == NEW
            && let Some(f) = &self.on_start_new
        {
            f();
        }
        self.running.set(Some(std::process::id()));
        Ok("agent started".into())
    }

    fn free_bytes(&self, _: &AgentHome) -> Option<u64> {
        Some(if self.full { 0 } else { 1 << 30 })
    }
}

/// An installation of 1.0.0+1 (current), 2.0.0+2 unpacked beside it when `new_unpacked`,
/// the updater's link in data/update/, and the operator's files.
fn installation(new_unpacked: bool) -> (tempfile::TempDir, AgentHome) {
    let dir = tempfile::tempdir().unwrap();
    let home = AgentHome::new(dir.path());
    let mut versions = vec![OLD];
    if new_unpacked {
        versions.push(NEW);
    }
    for v in versions {
        let (version, build) = v.split_once('+').unwrap();
        let vdir = home.versions().join(v);
        fs::create_dir_all(vdir.join("conf.default")).unwrap();
        fs::write(
            vdir.join("agent-version.properties"),
            format!("agent.version={version}\nagent.build-number={build}\n"),
        )
        .unwrap();
        fs::write(vdir.join(".complete"), "").unwrap();
    }
    symlink(format!("versions/{OLD}"), home.current()).unwrap();
    fs::create_dir_all(home.conf()).unwrap();
    fs::write(home.agent_toml(), "[agent]\nheartbeat = \"7s\"\n").unwrap();
    fs::create_dir_all(home.update_dir()).unwrap();
    fs::write(home.update_dir().join("agent-bundle-2.0.0"), "not a bundle").unwrap();
    symlink("agent-bundle-2.0.0", home.update_dir().join("updater")).unwrap();
    fs::create_dir_all(home.data()).unwrap();
    fs::write(home.data().join("keep.txt"), "operator data").unwrap();
    (dir, home)
}

fn journal(home: &AgentHome, phase: Phase) -> Journal {
    Journal {
        from: OLD.parse().unwrap(),
        to: NEW.parse().unwrap(),
        bundle_sha256: "ab".repeat(32),
        bundle_path: home
            .update_dir()
            .join("agent-bundle-2.0.0")
            .display()
            .to_string(),
        phase,
        started_at: 1,
        boot_count: 0,
        reason: None,
        from_dir: Some(OLD.into()),
        trust: None,
        ended_at: None,
        abandoned: false,
        planned_stop: None,
    }
}

fn settings() -> Settings {
    Settings {
        health_timeout: Duration::from_secs(5),
        stability_window: Duration::from_millis(50),
        stop_patience: Duration::ZERO,
        max_boots: 3,
    }
}

fn run(home: &AgentHome, fx: &Fake, journal: Journal, recovering: bool, s: Settings) -> Verdict {
    let mut log = UpdateLog::open(&home.update_log());
    let mut txn = Transaction {
        home,
        journal,
        settings: s,
        log: &mut log,
        wait_pid: None,
        recovering,
        fx,
    };
    txn.run()
}

/// [`run`] as the agent's hand-off does it (`--wait-pid`), with [`settings`].
fn run_handed_over(home: &AgentHome, fx: &Fake, journal: Journal) -> Verdict {
    let mut log = UpdateLog::open(&home.update_log());
    let mut txn = Transaction {
        home,
        journal,
        settings: settings(),
        log: &mut log,
        wait_pid: Some(dead_pid()),
        recovering: false,
        fx,
    };
    txn.run()
}

fn current(home: &AgentHome) -> String {
    fs::read_link(home.current()).unwrap().display().to_string()
}

/// The old agent was started, first; every state write was tried after it, failed, and
/// changed nothing the operator owns; the journal's phase is left for the next start.
/// `report`: the status reported, `INSTALL_FAILED` when the bundle is at fault and
/// `RETRYING` when the machine is.
fn assert_old_started_before_the_writes(
    home: &AgentHome,
    fx: &Fake,
    verdict: &Verdict,
    report: &str,
) {
    let events = fx.events();
    let start = fx
        .position(&format!("start:{OLD}"))
        .unwrap_or_else(|| panic!("the old agent was not started: {events:?}"));
    for write in [format!("report:{report}").as_str(), "journal:RolledBack"] {
        let at = fx
            .position(write)
            .unwrap_or_else(|| panic!("{write} was not tried: {events:?}"));
        assert!(start < at, "{write} was tried before the start: {events:?}");
    }
    assert_eq!(
        events.iter().filter(|e| e.starts_with("start:")).count(),
        1,
        "{events:?}"
    );
    let Verdict::RolledBack(reason) = verdict else {
        panic!("{verdict:?}")
    };
    assert!(!reason.is_empty());
    assert_eq!(current(home), format!("versions/{OLD}"));
    assert!(!home.version_dir(&NEW.parse().unwrap()).exists());
    assert_eq!(
        fs::read_to_string(home.agent_toml()).unwrap(),
        "[agent]\nheartbeat = \"7s\"\n"
    );
    assert_eq!(
        fs::read_to_string(home.data().join("keep.txt")).unwrap(),
        "operator data"
    );
    // The journal could not close: the updater's link stays for the recovery.
    assert!(fs::symlink_metadata(home.update_dir().join("updater")).is_ok());
}

#[test]
fn abandon_during_the_unpack_on_a_full_disk_starts_the_old_agent() {
    let (_dir, home) = installation(false);
    let fx = Fake::new(true);
    // The bundle is not what was verified: the unpack never begins.
    let verdict = run(
        &home,
        &fx,
        journal(&home, Phase::Prepared),
        false,
        settings(),
    );
    assert_old_started_before_the_writes(&home, &fx, &verdict, "RETRYING");
    assert!(
        fx.position("bad").is_none(),
        "abandon marked the bundle bad"
    );
}

#[test]
fn abandon_after_the_switch_could_not_be_recorded_points_current_back_and_starts_it() {
    let (_dir, home) = installation(true);
    let fx = Fake::new(true);
    // The old agent is stopped (Unpacked); the merge works, the flip works, the record of
    // Switched fails: everything is undone and the old agent started.
    let verdict = run(
        &home,
        &fx,
        journal(&home, Phase::Unpacked),
        false,
        settings(),
    );
    assert!(
        fx.position("journal:Switched").unwrap() < fx.position(&format!("start:{OLD}")).unwrap()
    );
    assert_old_started_before_the_writes(&home, &fx, &verdict, "RETRYING");
}

#[test]
fn rollback_past_the_boot_budget_on_a_full_disk_starts_the_old_agent() {
    let (_dir, home) = installation(true);
    symlink(format!("versions/{NEW}"), home.root().join("current.new")).unwrap();
    fs::rename(home.root().join("current.new"), home.current()).unwrap();
    let fx = Fake::new(true);
    let s = Settings {
        max_boots: 0,
        ..settings()
    };
    let verdict = run(&home, &fx, journal(&home, Phase::Switched), true, s);
    assert_old_started_before_the_writes(&home, &fx, &verdict, "INSTALL_FAILED");
    assert!(fx.position(&format!("start:{OLD}")).unwrap() < fx.position("bad").unwrap());
}

#[test]
fn an_interrupted_rollback_on_a_full_disk_starts_the_old_agent() {
    let (_dir, home) = installation(true);
    let fx = Fake::new(true);
    let mut j = journal(&home, Phase::RollingBack);
    j.reason = Some("it crashed".into());
    let verdict = run(&home, &fx, j, true, settings());
    assert_old_started_before_the_writes(&home, &fx, &verdict, "INSTALL_FAILED");
}

#[test]
fn a_recovery_that_finds_the_old_agent_running_closes_the_journal_and_starts_nothing() {
    let (_dir, home) = installation(true);
    let fx = Fake::new(false);
    fx.running.set(Some(std::process::id()));
    let verdict = run(
        &home,
        &fx,
        journal(&home, Phase::Unpacked),
        true,
        settings(),
    );
    assert!(matches!(verdict, Verdict::RolledBack(_)), "{verdict:?}");
    assert!(
        fx.events().iter().all(|e| !e.starts_with("start:")),
        "{:?}",
        fx.events()
    );
    let closed = state::read_journal(&home).unwrap().unwrap();
    assert_eq!(closed.phase, Phase::RolledBack);
    assert!(closed.abandoned && closed.ended_at.is_some(), "{closed:?}");
    assert!(!home.version_dir(&NEW.parse().unwrap()).exists());
    // Closed, so the update's files go and the agent may try again.
    assert!(fs::symlink_metadata(home.update_dir().join("updater")).is_err());
}

#[test]
fn a_commit_that_cannot_be_recorded_leaves_the_healthy_new_version_running() {
    let (_dir, home) = installation(true);
    symlink(format!("versions/{NEW}"), home.root().join("current.new")).unwrap();
    fs::rename(home.root().join("current.new"), home.current()).unwrap();
    let mut fx = Fake::new(true);
    // The new version comes up healthy: this very process plays it.
    let run_dir = home.run();
    fx.on_start_new = Some(Box::new(move || {
        let pid = std::process::id();
        fs::create_dir_all(&run_dir).unwrap();
        fs::write(run_dir.join("agent.pid"), pid.to_string()).unwrap();
        fs::write(
            run_dir.join("health.json"),
            format!(
                r#"{{"version":"{NEW}","pid":{pid},"components_started":true,"last_contact":null}}"#
            ),
        )
        .unwrap();
    }));
    let verdict = run(
        &home,
        &fx,
        journal(&home, Phase::Switched),
        false,
        settings(),
    );
    assert!(
        matches!(verdict, Verdict::Unrecorded(ref r) if r.starts_with("the disk is full")),
        "{verdict:?}"
    );
    assert_eq!(
        fx.events(),
        [format!("start:{NEW}"), "journal:Committed".to_owned()]
    );
    assert_eq!(current(&home), format!("versions/{NEW}"));
    assert!(home.version_dir(&OLD.parse().unwrap()).exists());
}

#[test]
fn an_updater_that_cannot_read_the_journal_starts_the_agent_it_was_handed() {
    let (_dir, home) = installation(false);
    fs::write(home.journal(), "{ half").unwrap();
    for (wait_pid, recover) in [(Some(1), false), (None, true)] {
        let fx = Fake::new(true);
        let bundle = home.update_dir().join("agent-bundle-2.0.0");
        let err = crate::run_update_with(
            &crate::Request {
                bundle: &bundle,
                home: home.root(),
                wait_pid,
                recover,
            },
            &fx,
        )
        .unwrap_err();
        assert!(matches!(err, UpdateError::State(_)), "{err}");
        assert_eq!(fx.events(), [format!("start:{OLD}")]);
    }
}

#[test]
fn a_hand_run_update_that_never_began_starts_nothing() {
    let (_dir, home) = installation(false);
    let fx = Fake::new(true);
    let bundle = home.update_dir().join("agent-bundle-2.0.0");
    let err = crate::run_update_with(
        &crate::Request {
            bundle: &bundle,
            home: home.root(),
            wait_pid: None,
            recover: false,
        },
        &fx,
    )
    .unwrap_err();
    assert!(!err.to_string().is_empty());
    assert!(fx.events().is_empty(), "{:?}", fx.events());
}

/// A pid that names no process: a child that ran and was reaped.
fn dead_pid() -> u32 {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

/// `run/stop-requested` as the wrapper's `stop` writes it, now.
fn ask_for_a_stop(run_dir: &Path) {
    let asked = agent_protocol::journal::StopRequest {
        at: state::now_secs(),
        by: "agent-wrapper.sh stop".into(),
    };
    fs::create_dir_all(run_dir).unwrap();
    fs::write(run_dir.join("stop-requested"), asked.to_line()).unwrap();
}

#[test]
fn a_stop_asked_for_during_the_judgement_puts_it_off_to_the_next_start() {
    let (_dir, home) = installation(true);
    symlink(format!("versions/{NEW}"), home.root().join("current.new")).unwrap();
    fs::rename(home.root().join("current.new"), home.current()).unwrap();
    let mut fx = Fake::new(false);
    // The new version comes up healthy, and the operator stops it at once: its pid is
    // gone and the wrapper's stop left its request.
    let run_dir = home.run();
    let gone = dead_pid();
    fx.on_start_new = Some(Box::new(move || {
        fs::create_dir_all(&run_dir).unwrap();
        fs::write(run_dir.join("agent.exit"), format!("{gone} 0 1")).unwrap();
        fs::write(
            run_dir.join("health.json"),
            format!(
                r#"{{"version":"{NEW}","pid":{gone},"components_started":true,"last_contact":null}}"#
            ),
        )
        .unwrap();
        ask_for_a_stop(&run_dir);
    }));
    let verdict = run(
        &home,
        &fx,
        journal(&home, Phase::Switched),
        false,
        settings(),
    );
    let Verdict::PutOff(reason) = &verdict else {
        panic!("{verdict:?}: {:?}", fx.events())
    };
    assert!(
        reason.contains("stopped on request (agent-wrapper.sh stop)"),
        "{reason}"
    );
    // Nothing reported, nothing held against the bundle, nothing started after the stop.
    assert_eq!(
        fx.events(),
        [format!("start:{NEW}"), "journal:Switched".to_owned()]
    );
    assert_eq!(current(&home), format!("versions/{NEW}"));
    let kept = state::read_journal(&home).unwrap().unwrap();
    assert_eq!(kept.phase, Phase::Switched);
    assert_eq!(kept.planned_stop.as_deref(), Some(reason.as_str()));
    assert!(fs::symlink_metadata(home.update_dir().join("updater")).is_ok());

    // A start through the wrapper ends the stop request and recovers: nothing runs, and
    // the new version is judged again, not counted, and committed.
    fs::remove_file(home.stop_request()).unwrap();
    let mut fx = Fake::new(false);
    let run_dir = home.run();
    fx.on_start_new = Some(Box::new(move || {
        let pid = std::process::id();
        fs::write(run_dir.join("agent.pid"), pid.to_string()).unwrap();
        fs::write(
            run_dir.join("health.json"),
            format!(
                r#"{{"version":"{NEW}","pid":{pid},"components_started":true,"last_contact":null}}"#
            ),
        )
        .unwrap();
    }));
    let s = Settings {
        max_boots: 0,
        ..settings()
    };
    let verdict = run(&home, &fx, kept, true, s);
    assert_eq!(verdict, Verdict::Committed, "{:?}", fx.events());
    let done = state::read_journal(&home).unwrap().unwrap();
    assert_eq!((done.phase, done.boot_count), (Phase::Committed, 0));
    assert_eq!(done.planned_stop, None);
    assert!(
        fx.position("report:INSTALLED").is_some(),
        "{:?}",
        fx.events()
    );
}

#[test]
fn a_stop_asked_for_before_the_switch_starts_neither_version() {
    // The operator stopped the old agent while the new version was unpacked: the update
    // switches, starts nothing, and leaves the new version to its next start.
    let (_dir, home) = installation(true);
    symlink(format!("versions/{NEW}"), home.root().join("current.new")).unwrap();
    fs::rename(home.root().join("current.new"), home.current()).unwrap();
    ask_for_a_stop(&home.run());
    let fx = Fake::new(false);
    let mut j = journal(&home, Phase::Switched);
    j.started_at = state::now_secs();
    let verdict = run_handed_over(&home, &fx, j);
    assert!(
        matches!(&verdict, Verdict::PutOff(r) if r.contains("before 2.0.0+2 was started")),
        "{verdict:?}"
    );
    assert_eq!(fx.events(), ["journal:Switched"]);
    // An update run by hand on the stopped installation is asked to start it.
    let mut fx = Fake::new(false);
    fx.on_start_new = Some(Box::new(|| {}));
    let mut j = journal(&home, Phase::Switched);
    j.started_at = state::now_secs();
    let s = Settings {
        health_timeout: Duration::from_millis(200),
        ..settings()
    };
    run(&home, &fx, j, false, s);
    assert_eq!(fx.events()[0], format!("start:{NEW}"), "{:?}", fx.events());
    // Nor does a rollback start the old version the operator stopped.
    let fx = Fake::new(false);
    let mut j = journal(&home, Phase::RollingBack);
    j.started_at = state::now_secs();
    j.reason = Some("it crashed".into());
    let verdict = run(&home, &fx, j, true, settings());
    assert!(matches!(verdict, Verdict::RolledBack(_)), "{verdict:?}");
    assert!(
        fx.events().iter().all(|e| !e.starts_with("start:")),
        "{:?}",
        fx.events()
    );
    assert_eq!(current(&home), format!("versions/{OLD}"));
    // A request from before the update is stale: it stops nothing.
    let fx = Fake::new(false);
    let mut j = journal(&home, Phase::RollingBack);
    j.started_at = state::now_secs() + 60;
    j.reason = Some("it crashed".into());
    run(&home, &fx, j, true, settings());
    assert!(
        fx.position(&format!("start:{OLD}")).is_some(),
        "{:?}",
        fx.events()
    );
}
