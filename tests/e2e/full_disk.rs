//! A full disk at every moment of an update (issue 19). The agent's home lives on a small
//! tmpfs of its own, and "something else on the machine" fills it at one moment of the
//! update: before the download, during it, right after it completes, during the unpack,
//! during the configuration merge, right after the switch. Several runs per moment; after
//! each: an agent runs again within 10 s on a version that was healthy before, the
//! operator's files are intact, and once the space returns the update goes through by
//! itself. Real processes throughout (wrapper, agent, updater), against a scripted server.
//!
//! The updater's moments are held open by its fault points (`sleep(…)`, in the stub built
//! with `--features failpoints`) while the test fills the disk from outside.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use e2e::fake::{FakeServer, Handler, Request, respond};
use e2e::{TestContext, failpoints_stub, pids_mentioning, read_file, run, run_ok, signal};

use crate::agent::{update_routes, version_text};
use crate::update::{NEW, OLD, QUICK, agents_running, current, make_old_defaults, operator_conf};

/// Runs per moment: each is a fresh installation on a fresh tmpfs.
const RUNS: usize = 3;
/// The longest an installation may be without an agent.
const NO_AGENT_LIMIT: Duration = Duration::from_secs(10);
const WAIT: Duration = Duration::from_secs(90);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Moment {
    BeforeDownload,
    DuringDownload,
    AfterDownload,
    DuringUnpack,
    DuringMerge,
    AfterSwitch,
}

impl Moment {
    /// The updater's fault point that holds the moment open (FAILPOINTS syntax).
    fn fault_point(self) -> Option<&'static str> {
        match self {
            Moment::DuringUnpack => Some("updater-unpacking=sleep(2000)"),
            Moment::DuringMerge => Some("updater-merging=sleep(2000)"),
            Moment::AfterSwitch => Some("updater-switched=sleep(2000)"),
            _ => None,
        }
    }

    /// True once the update has reached this moment (the disk is filled then).
    fn reached(self, home: &Path, bundle_sha256: &str) -> bool {
        let update = home.join("data/update");
        match self {
            Moment::BeforeDownload => true,
            Moment::DuringDownload => {
                fs::metadata(update.join(format!("bundle-{bundle_sha256}.part")))
                    .is_ok_and(|m| m.len() > 0)
            }
            Moment::AfterDownload => update.join("agent-bundle-2.0.0").exists(),
            // Logged right before the unpack, where the fault point holds it.
            Moment::DuringUnpack => {
                read_file(&home.join("logs/update.log")).contains("checked (sha256")
            }
            Moment::DuringMerge => update.join("agent.toml.before").exists(),
            Moment::AfterSwitch => {
                fs::read_link(home.join("current")).is_ok_and(|l| l.ends_with(NEW))
            }
        }
    }
}

/// A tmpfs mounted for one run, unmounted (after its processes are ended) on drop.
pub(crate) struct Tmpfs {
    dir: PathBuf,
}

impl Tmpfs {
    pub(crate) fn mount(dir: &Path, bytes: u64) -> Self {
        let uid = String::from_utf8_lossy(&run(Command::new("id").arg("-u")).stdout)
            .trim()
            .to_owned();
        assert_eq!(
            uid, "0",
            "the full-disk tests mount a tmpfs of their own: run them as root (CI does)"
        );
        fs::create_dir_all(dir).unwrap();
        run_ok(
            Command::new("mount")
                .args(["-t", "tmpfs", "-o"])
                .arg(format!("size={bytes},mode=0755"))
                .arg("tmpfs")
                .arg(dir),
        );
        Self {
            dir: dir.to_path_buf(),
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // A supervisor may start an agent between two kills: end them until none is left.
        for _ in 0..5 {
            let pids = pids_mentioning(&self.dir);
            if pids.is_empty() {
                break;
            }
            for pid in pids {
                signal(pid, "KILL");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        for _ in 0..20 {
            if run(Command::new("umount").arg(&self.dir)).status.success() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        // Something still has it open (a `sleep` of a killed supervisor, say).
        let _ = run(Command::new("umount").arg("-l").arg(&self.dir));
    }
}

/// "Something else on the machine": files that take every free byte of the filesystem.
pub(crate) struct Filler {
    pub(crate) dir: PathBuf,
}

impl Filler {
    pub(crate) fn fill(&self) -> u64 {
        let path = self.dir.join("filler");
        let mut file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap();
        let mut total = 0;
        for chunk in [1 << 20, 4096] {
            let buf = vec![0xA5u8; chunk];
            while let Ok(n @ 1..) = file.write(&buf) {
                total += n as u64;
            }
        }
        total
    }

    pub(crate) fn free(&self) {
        fs::remove_file(self.dir.join("filler")).unwrap();
    }
}

/// What the scripted server and the test share.
struct Shared {
    /// The new bundle is published: every version but NEW is refused from then on.
    published: AtomicBool,
    /// The disk was filled (the download that paused halfway goes on).
    filled: AtomicBool,
}

/// Accepts everyone until the bundle is published; then refuses all but NEW.
fn directive(shared: Arc<Shared>) -> Handler {
    Box::new(move |req: &Request, _, s| {
        if shared.published.load(Ordering::SeqCst) && req.header("Agent-Version") != Some(NEW) {
            let body = format!(
                r#"{{"error":"agent_not_supported","expected":"{NEW}","download":"/agentupdate/download"}}"#
            );
            respond(
                s,
                409,
                &[("Content-Type", "application/json")],
                body.as_bytes(),
            );
        } else {
            respond(s, 200, &[], b"{}");
        }
    })
}

/// The bundle, resumable with `Range`; with `pause`, the first download stops halfway
/// until the disk is full.
fn download(bundle: &Path, pause: bool, shared: Arc<Shared>) -> Handler {
    let bytes = fs::read(bundle).unwrap();
    Box::new(move |req: &Request, n, s| {
        let from: usize = req
            .header("Range")
            .and_then(|r| r.strip_prefix("bytes="))
            .and_then(|r| r.trim_end_matches('-').parse().ok())
            .unwrap_or(0);
        if n == 0 && pause {
            let half = bytes.len() / 2;
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
                bytes.len()
            );
            let _ = s.write_all(&bytes[..half]);
            let _ = s.flush();
            let end = Instant::now() + WAIT;
            while !shared.filled.load(Ordering::SeqCst) && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(5));
            }
            let _ = s.write_all(&bytes[half..]);
        } else if from > 0 && from < bytes.len() {
            let range = format!("bytes {from}-{}/{}", bytes.len() - 1, bytes.len());
            respond(s, 206, &[("Content-Range", &range)], &bytes[from..]);
        } else {
            respond(s, 200, &[], &bytes);
        }
    })
}

/// Keys, 1.0.0+1, and 2.0.0+2 on the updater stub with fault points: made once per moment.
struct Bundles {
    ctx: TestContext,
    b1: PathBuf,
    b2: PathBuf,
    sha2: String,
}

fn bundles() -> Bundles {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let d1 = ctx.dist("d1");
    make_old_defaults(&d1);
    let b1 = ctx.pack(&d1, "1.0.0", "1", &key, "b1");
    let d2 = ctx.dist("d2");
    let mut bin = fs::read(d2.join("bin/agent")).unwrap();
    bin.extend_from_slice(b"agent 2.0.0 marker");
    fs::write(d2.join("bin/agent"), bin).unwrap();
    let stub = failpoints_stub().display().to_string();
    let b2 = ctx.pack_with(&d2, "2.0.0", "2", &key, "b2", &["--stub", &stub]);
    let sha2 = e2e::sha256_file(&b2);
    Bundles { ctx, b1, b2, sha2 }
}

/// The version directory a process runs from (`/proc/<pid>/exe`, resolved at exec).
pub(crate) fn version_of(pid: u32) -> Option<String> {
    let exe = fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    let dir = exe.parent()?.parent()?;
    Some(dir.file_name()?.to_string_lossy().into_owned())
}

fn updater_running(home: &Path) -> bool {
    pids_mentioning(home).into_iter().any(|pid| {
        fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|c| String::from_utf8_lossy(&c).contains("--update="))
    })
}
/// The operator's files, whatever moment it is: their value, their data, the identity.
fn assert_operator_files(home: &Path) {
    let conf = read_file(&home.join("conf/agent.toml"));
    assert!(
        conf.contains("max-retry-after = \"5m\""),
        "operator value lost:\n{conf}\n{}",
        e2e::agent_logs(home)
    );
    assert_eq!(read_file(&home.join("data/keep.txt")), "operator data");
    assert!(!read_file(&home.join("data/agent-id")).trim().is_empty());
}

fn hellos_after(fake: &FakeServer, after: Instant) -> usize {
    ["/agent/register", "/agent/connect"]
        .iter()
        .flat_map(|p| fake.requests(p))
        .filter(|r| r.at > after)
        .count()
}

/// Polls `cond` every 50 ms; true if it held within `timeout`.
fn poll(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    while !cond() {
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}

fn one_run(b: &Bundles, moment: Moment, n: usize) {
    let prefix = format!("run-{n}");
    let dir = b.ctx.path(&prefix);
    let agent_bytes = fs::metadata(e2e::bin_path("agent")).unwrap().len();
    let bundle_bytes = fs::metadata(&b.b2).unwrap().len();
    // Room for the installed version and an update (the agent wants four times the
    // bundle free before it downloads), and little more.
    let disk = Tmpfs::mount(&dir, agent_bytes + 5 * bundle_bytes + (48 << 20));
    let filler = Filler { dir: dir.clone() };
    let home = b.ctx.install(&b.b1, &prefix);
    let fault = moment
        .fault_point()
        .map(|f| format!("export FAILPOINTS='{f}'\n"))
        .unwrap_or_default();
    fs::write(home.join("conf/agent-env.sh"), format!("{QUICK}{fault}")).unwrap();
    fs::write(home.join("data/keep.txt"), "operator data").unwrap();

    let shared = Arc::new(Shared {
        published: AtomicBool::new(false),
        filled: AtomicBool::new(false),
    });
    let sig = read_file(&b.ctx.path("b2/agent-bundle-2.0.0.minisig"));
    let mut routes = update_routes(
        version_text(&b.b2, "2.0.0", "2"),
        sig,
        download(&b.b2, moment == Moment::DuringDownload, shared.clone()),
    );
    routes.insert("/agent/register", directive(shared.clone()));
    routes.insert("/agent/connect", directive(shared.clone()));
    let fake = FakeServer::start(routes);
    operator_conf(&home, &fake.url());
    run_ok(Command::new(home.join("current/bin/agent-wrapper.sh")).arg("start"));
    e2e::wait_until(WAIT, "1.0.0+1 to register", || {
        hellos_after(&fake, Instant::now() - WAIT) > 0 && home.join("data/agent-id").exists()
    });

    // The moment: publish, wait for the update to reach it, fill the disk.
    let mut filled = 0;
    if moment == Moment::BeforeDownload {
        filled = filler.fill();
    }
    shared.published.store(true, Ordering::SeqCst);
    let end = Instant::now() + WAIT;
    while !moment.reached(&home, &b.sha2) {
        assert!(
            Instant::now() < end,
            "{moment:?} run {n}: the update never reached the moment\n{}",
            e2e::agent_logs(&home)
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let filled_at = Instant::now();
    if moment != Moment::BeforeDownload {
        filled = filler.fill();
    }
    shared.filled.store(true, Ordering::SeqCst);

    // Until the updater (if any) is done and the agent is back at its heartbeats, the
    // installation is never without an agent for long.
    let mut busy_until = filled_at;
    let mut absent_since: Option<Instant> = None;
    let mut longest_absence = Duration::ZERO;
    loop {
        let now = Instant::now();
        let updater = updater_running(&home);
        if updater {
            busy_until = now;
        }
        let agents = agents_running(&home);
        if agents.is_empty() {
            let since = *absent_since.get_or_insert(now);
            longest_absence = longest_absence.max(now - since);
            assert!(
                now - since < NO_AGENT_LIMIT,
                "{moment:?} run {n}: no agent has run for {NO_AGENT_LIMIT:?} (updater running: {updater})\n{}",
                e2e::agent_logs(&home)
            );
        } else {
            absent_since = None;
        }
        if !updater && agents.len() == 1 && hellos_after(&fake, busy_until) >= 2 {
            break;
        }
        assert!(
            now < filled_at + WAIT,
            "{moment:?} run {n}: the agent did not settle (agents {agents:?}, updater running: {updater})\n{}",
            e2e::agent_logs(&home)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let agents = agents_running(&home);
    let running = version_of(agents[0]).unwrap_or_default();
    let journal = read_file(&home.join("data/update-journal.json"));
    let judged_healthy = journal.contains("\"switched\"") || journal.contains("\"committed\"");
    assert!(
        running == OLD || (running == NEW && judged_healthy),
        "{moment:?} run {n}: the agent runs {running:?}, not a version that was healthy\n{}",
        e2e::agent_logs(&home)
    );
    assert!(
        current(&home).ends_with(&running),
        "{moment:?} run {n}: current is {} but {running} runs\n{}",
        current(&home),
        e2e::agent_logs(&home)
    );
    assert_operator_files(&home);
    if running == OLD {
        // The old version's configuration carries no key of the new one's.
        let conf = read_file(&home.join("conf/agent.toml"));
        assert!(
            !conf.contains("stability-window"),
            "merge not undone:\n{conf}"
        );
    }
    // `agent status` says when and why the update was abandoned, naming the disk. The
    // merge moment always can: abandoning it frees the new version's room first.
    let journal = read_file(&home.join("data/update-journal.json"));
    if moment == Moment::DuringMerge
        || (journal.contains("\"rolled-back\"") && journal.contains("\"abandoned\": true"))
    {
        let status = e2e::stdout(&run_ok(
            Command::new(home.join("current/bin/agent")).arg("status"),
        ));
        assert!(
            status.contains("abandoned before the switch at ")
                && status.contains("ago): the disk is full (")
                && status.contains("1.0.0+1 kept running"),
            "{moment:?} run {n}: agent status does not say the update was abandoned on a full disk:\n{status}\n{}",
            e2e::agent_logs(&home)
        );
    }
    eprintln!(
        "{moment:?} run {n}: filled {filled} bytes; {running} runs; longest time without an agent {:.1}s",
        longest_absence.as_secs_f64()
    );

    // The space returns: the update goes through by itself.
    filler.free();
    let done = poll(WAIT, || {
        let installed = fake
            .requests("/agentupdate/report")
            .iter()
            .any(|r| String::from_utf8_lossy(&r.body).contains("\"INSTALLED\""));
        let agents = agents_running(&home);
        installed
            && current(&home) == format!("versions/{NEW}")
            && agents.len() == 1
            && version_of(agents[0]).as_deref() == Some(NEW)
            && read_file(&home.join("data/update-journal.json")).contains("\"committed\"")
    });
    assert!(
        done,
        "{moment:?} run {n}: the update did not go through once the disk had room\n{}",
        e2e::agent_logs(&home)
    );
    assert_operator_files(&home);
    assert!(read_file(&home.join("conf/agent.toml")).contains("stability-window"));
    drop(disk);
}

fn moment(moment: Moment) {
    let b = bundles();
    for n in 0..RUNS {
        one_run(&b, moment, n);
    }
}

#[test]
fn disk_full_before_the_download() {
    moment(Moment::BeforeDownload);
}

#[test]
fn disk_full_during_the_download() {
    moment(Moment::DuringDownload);
}

#[test]
fn disk_full_right_after_the_download() {
    moment(Moment::AfterDownload);
}

#[test]
fn disk_full_during_the_unpack() {
    moment(Moment::DuringUnpack);
}

#[test]
fn disk_full_during_the_configuration_merge() {
    moment(Moment::DuringMerge);
}

#[test]
fn disk_full_right_after_the_switch() {
    moment(Moment::AfterSwitch);
}

/// The wrapper hands off only to an updater: an agent that exits 0 while no updater holds
/// `run/update.lock` is started again; while one holds it, it is not.
#[test]
fn an_agent_that_exits_0_is_restarted_unless_an_updater_holds_the_lock() {
    use std::os::unix::fs::OpenOptionsExt;
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let home = ctx.install(&b1, "p");
    e2e::configure_agent(&home, &["http://127.0.0.1:1".to_owned()], "");
    run_ok(Command::new(home.join("current/bin/agent-wrapper.sh")).arg("start"));
    let agent_pid =
        || -> Option<u32> { read_file(&home.join("run/agent.pid")).trim().parse().ok() };
    let first = agent_pid().unwrap();
    // TERM before its signal handling is up would be a crash (143), which the wrapper
    // restarts for another reason: wait until this agent reports itself.
    e2e::wait_until(NO_AGENT_LIMIT, "the agent to be up", || {
        serde_json::from_str::<serde_json::Value>(&read_file(&home.join("run/health.json")))
            .is_ok_and(|h| h["pid"].as_u64() == Some(u64::from(first)))
    });
    // TERM to the agent alone: it exits 0, and nobody else would start it.
    signal(first, "TERM");
    e2e::wait_until(
        NO_AGENT_LIMIT,
        "the wrapper to start the agent again",
        || agent_pid().is_some_and(|p| p != first) && agents_running(&home).len() == 1,
    );
    let log = read_file(&home.join("logs/wrapper.log"));
    assert!(
        log.contains("no updater holds run/update.lock; starting it again"),
        "{log}"
    );

    // Now an updater (this test) holds the lock, as during a hand-off.
    let lock = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(home.join("run/update.lock"))
        .unwrap();
    let mut lock = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusiveNonblock)
        .map_err(|(_, e)| e)
        .unwrap();
    writeln!(lock, "{}", std::process::id()).unwrap();
    let second = agent_pid().unwrap();
    // TERM before its signal handling is up would be a crash, which the wrapper restarts
    // whatever the lock says: wait until this agent reports itself.
    e2e::wait_until(NO_AGENT_LIMIT, "the new agent to be up", || {
        serde_json::from_str::<serde_json::Value>(&read_file(&home.join("run/health.json")))
            .is_ok_and(|h| h["pid"].as_u64() == Some(u64::from(second)))
    });
    signal(second, "TERM");
    e2e::wait_until(NO_AGENT_LIMIT, "the agent to exit", || {
        e2e::pid_gone(second)
    });
    // Nothing starts it while the lock is held (the updater would): watch for a while.
    let end = Instant::now() + Duration::from_secs(3);
    while Instant::now() < end {
        assert!(
            agents_running(&home).is_empty(),
            "restarted under an updater's lock"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = read_file(&home.join("logs/wrapper.log"));
    assert!(
        log.contains(&format!(
            "the updater (pid {}) takes over",
            std::process::id()
        )),
        "{log}"
    );
    drop(lock);
}

/// Issue 59: on a small disk, a kept previous version (its bundle and its files) stopped
/// every later update ("not enough disk space … need 4 × the bundle"). The agent now
/// frees what it may lose (versions it does not run, their kept bundles first) and
/// updates; the running version is never touched.
#[test]
fn a_small_disk_frees_a_version_the_agent_does_not_run_and_updates() {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let d2 = ctx.dist("d2");
    let mut bin = fs::read(d2.join("bin/agent")).unwrap();
    bin.extend_from_slice(b"agent 2.0.0 marker");
    fs::write(d2.join("bin/agent"), bin).unwrap();
    let b2 = ctx.pack(&d2, "2.0.0", "2", &key, "b2");
    let dir = ctx.path("small");
    let bundle_bytes = fs::metadata(&b2).unwrap().len();
    let _disk = Tmpfs::mount(&dir, 400 << 20);
    let home = ctx.install(&b1, "small");
    fs::write(home.join("conf/agent-env.sh"), QUICK).unwrap();
    // A version kept from before, as an update leaves it: its files and its bundle.
    let kept = home.join("versions/0.9.0+1");
    fs::create_dir_all(kept.join("bin")).unwrap();
    fs::write(kept.join("bin/agent"), vec![7u8; 40 << 20]).unwrap();
    fs::write(kept.join("bundle"), vec![7u8; 40 << 20]).unwrap();
    // The rest of the disk is taken, but for the bundle's size: enough to download, not
    // to unpack as well, unless the kept version goes.
    let filler = Filler { dir: dir.clone() };
    filler.fill();
    let path = dir.join("filler");
    let len = fs::metadata(&path).unwrap().len();
    fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len.saturating_sub(bundle_bytes + (1 << 20)))
        .unwrap();

    let server = crate::update::serve_to(&ctx, &home, &b1);
    crate::update::start(&home);
    e2e::wait_until(WAIT, "1.0.0+1 to register", || {
        crate::update::agent_record(&server).is_some_and(|a| a["version"] == "1.0.0+1")
    });
    ctx.republish(&server, &b2);
    crate::update::wait_server_status(&server, "2.0.0+2", "INSTALLED", &home);
    assert!(current(&home).ends_with("2.0.0+2"), "{}", current(&home));
    assert!(!kept.join("bundle").exists(), "the kept bundle went first");
    let log = read_file(&home.join("logs/agent.log"));
    assert!(
        log.contains("the disk was short for the update to 2.0.0+2: deleted"),
        "{log}"
    );
    assert!(
        !log.contains("running degraded: not enough disk space"),
        "{log}"
    );
    // 1.0.0 ran while the room was made: it is kept (the version to roll back to).
    assert!(home.join("versions/1.0.0+1/bin/agent").exists());
    run_ok(Command::new(home.join("current/bin/agent-wrapper.sh")).arg("stop"));
}
