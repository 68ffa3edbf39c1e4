//! The crash campaign on Windows: the updater dies at one of its fault points, as by
//! `kill -9`; then the power is cut (every process of the machine killed where it stands,
//! the Wine session and its service manager ended) and the machine boots. Its service
//! starts by itself, and the interrupted update is finished or rolled back: whatever the
//! step, the machine runs an agent again, on the version the journal says.
//!
//! Each test walks one machine through a chain of releases, one crash each, to spare a
//! Wine install per fault point.

use std::fs;

use e2e::read_file;
use e2e::wine::{windows_bin, windows_failpoints_stub};

use super::{Fleet, WAIT, dist, installed, pack_with_stub, wait_row};

/// One update of the chain: to `version` (build `build`), the updater dying at `point`.
struct Crash {
    point: &'static str,
    version: &'static str,
    build: &'static str,
    /// The new agent.exe exits at once, so the update rolls back (and dies doing so).
    broken: bool,
}

impl Crash {
    fn id(&self) -> String {
        format!("{}+{}", self.version, self.build)
    }
}

/// Runs `chain` on a machine that installed 1.0.0+1, checking after each crash that the
/// boot brought the machine to the version it should run.
fn campaign(chain: &[Crash]) {
    let fleet = installed();
    let mut running = "1.0.0+1".to_owned();
    wait_row(&fleet, "the agent to register", |r| {
        r["version"] == "1.0.0+1"
    });
    let recoveries = || {
        read_file(&fleet.machine.home().join("logs/service.log"))
            .matches("an update was interrupted; running recovery")
            .count()
    };
    for crash in chain {
        let before = recoveries();
        crash_once(&fleet, crash);
        let expected = if crash.broken {
            running.clone()
        } else {
            crash.id()
        };
        recovered(&fleet, crash, &expected);
        // Nobody started it: the booted service manager did, and the service found the
        // journal of the interrupted update and ran its recovery.
        assert!(recoveries() > before, "no recovery after {}", crash.point);
        running = expected;
    }
}

fn crash_once(fleet: &Fleet, crash: &Crash) {
    let home = fleet.machine.home();
    fs::write(
        home.join("conf/failpoints"),
        format!("{}=return\n", crash.point),
    )
    .unwrap();
    // The same programs in every release, one file changed: the server makes the delta
    // at once (a debug agent.exe is too large to diff in a test's time).
    let d = dist(
        &fleet.ctx,
        &format!("d-{}", crash.version),
        "agent 1.0.0",
        &fleet.key_pub,
    );
    fs::write(
        d.join("README.txt"),
        format!("The test agent for Windows, {}.\n", crash.version),
    )
    .unwrap();
    if crash.broken {
        // The stub without a payload: it exits at once with an error.
        fs::copy(windows_bin("agent-bundle"), d.join("bin/agent.exe")).unwrap();
    }
    let bundle = pack_with_stub(
        &fleet.ctx,
        &d,
        crash.version,
        crash.build,
        &fleet.key,
        &windows_failpoints_stub(),
    );
    fleet.ctx.republish(&fleet.server, &bundle);
    let said = format!("fault point {} reached", crash.point);
    let start = std::time::Instant::now();
    while !read_file(&home.join("logs/update.out")).contains(&said) {
        assert!(
            start.elapsed() < WAIT,
            "the updater did not die at {} within {WAIT:?}\n--- update.out:\n{}\n--- update.log:\n{}\n--- service.log:\n{}\n--- agent.log:\n{}",
            crash.point,
            e2e::tail(&home.join("logs/update.out"), 20),
            e2e::tail(&home.join("logs/update.log"), 30),
            e2e::tail(&home.join("logs/service.log"), 30),
            e2e::tail(&home.join("logs/agent.log"), 40)
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    fleet.machine.power_cut_and_boot();
}

fn recovered(fleet: &Fleet, crash: &Crash, expected: &str) {
    let home = fleet.machine.home();
    let status = if crash.broken {
        "INSTALL_FAILED"
    } else {
        "INSTALLED"
    };
    let row = wait_row(
        fleet,
        &format!("{expected} {status} after a crash at {}", crash.point),
        |r| r["version"] == expected && r["update_status"] == status,
    );
    if crash.broken {
        let error = row["update_error"].as_str().unwrap_or_default();
        assert!(!error.is_empty(), "{row}");
        assert!(!home.join(format!("versions/{}", crash.id())).exists());
    }
    assert_eq!(read_file(&home.join("current")).trim(), expected);
    fleet.machine.wait_agent_running(WAIT);
    let journal = read_file(&home.join("data/update-journal.json"));
    let end = if crash.broken {
        "rolled-back"
    } else {
        "committed"
    };
    assert!(journal.contains(&format!("\"{end}\"")), "{journal}");
    // The operator's configuration came through every crash.
    assert!(home.join("conf/agent.toml").is_file());
    // The fault points were taken once: the recovery ran without them.
    assert!(!home.join("conf/failpoints").exists());
}

#[test]
fn crashes_before_unpacking_and_while_stopping_are_recovered() {
    campaign(&[
        Crash {
            point: "updater-unpacking",
            version: "2.0.0",
            build: "2",
            broken: false,
        },
        Crash {
            point: "updater-stopping",
            version: "3.0.0",
            build: "3",
            broken: false,
        },
    ]);
}

#[test]
fn crashes_after_unpacking_merging_and_switching_are_recovered() {
    campaign(&[
        Crash {
            point: "updater-unpacked",
            version: "2.0.0",
            build: "2",
            broken: false,
        },
        Crash {
            point: "updater-merging",
            version: "3.0.0",
            build: "3",
            broken: false,
        },
        Crash {
            point: "updater-switched",
            version: "4.0.0",
            build: "4",
            broken: false,
        },
    ]);
}

#[test]
fn crashes_after_committing_and_while_rolling_back_are_recovered() {
    campaign(&[
        Crash {
            point: "updater-committed",
            version: "2.0.0",
            build: "2",
            broken: false,
        },
        Crash {
            point: "updater-rolling-back",
            version: "3.0.0",
            build: "3",
            broken: true,
        },
    ]);
}
