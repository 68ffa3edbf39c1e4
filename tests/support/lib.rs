//! Helpers for the end-to-end tests: a temp dir per test, the built binaries, commands
//! whose failures show their command line and output, children killed on drop.

#![allow(
    clippy::unwrap_used,
    reason = "test support: a failed setup step should fail the test loudly"
)]

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A test's private world.
pub struct TestContext {
    pub dir: tempfile::TempDir,
    children: Mutex<Vec<Child>>,
}

impl Default for TestContext {
    fn default() -> Self {
        Self::new()
    }
}

impl TestContext {
    pub fn new() -> Self {
        Self {
            dir: tempfile::Builder::new()
                .prefix("e2e-")
                .tempdir()
                .expect("temp dir"),
            children: Mutex::new(Vec::new()),
        }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// A command for one of the workspace's binaries, run in the test's directory.
    pub fn cmd(&self, bin: &str) -> Command {
        let mut c = Command::new(bin_path(bin));
        c.current_dir(self.dir.path());
        c.env_remove("RUST_LOG");
        c
    }

    /// Starts a child that is killed when the context drops.
    pub fn spawn(&self, mut cmd: Command) -> u32 {
        let child = cmd
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
        let pid = child.id();
        self.children.lock().unwrap().push(child);
        pid
    }

    /// Makes a signing key pair in `dir`.
    pub fn keygen(&self, dir: &str) -> (PathBuf, PathBuf) {
        run_ok(self.cmd("agent-bundle").args(["keygen", "--out", dir]));
        (
            self.path(dir).join("update.key"),
            self.path(dir).join("update.pub"),
        )
    }

    /// A reference distribution in `dir`: the real agent binary, the wrapper, defaults.
    pub fn dist(&self, dir: &str) -> PathBuf {
        let root = self.path(dir);
        fs::create_dir_all(root.join("bin")).unwrap();
        fs::create_dir_all(root.join("conf.default")).unwrap();
        fs::copy(bin_path("agent"), root.join("bin/agent")).unwrap();
        fs::copy(
            repo_root().join("installer/agent-wrapper.sh"),
            root.join("bin/agent-wrapper.sh"),
        )
        .unwrap();
        fs::copy(
            repo_root().join("installer/agent.toml"),
            root.join("conf.default/agent.toml"),
        )
        .unwrap();
        fs::write(root.join("README.txt"), "The test agent.\n").unwrap();
        fs::write(root.join("LICENSE"), "Apache-2.0\n").unwrap();
        root
    }

    /// Packs `dist` as `version+build` into `out`; returns the bundle path.
    pub fn pack(&self, dist: &Path, version: &str, build: &str, key: &Path, out: &str) -> PathBuf {
        run_ok(
            self.cmd("agent-bundle")
                .args(["pack", "--dist"])
                .arg(dist)
                .args(["--version", version, "--build", build, "--key"])
                .arg(key)
                .args(["--out", out]),
        );
        self.path(out).join(format!("agent-bundle-{version}"))
    }
}

impl Drop for TestContext {
    fn drop(&mut self) {
        if let Ok(children) = self.children.get_mut() {
            for child in children.iter_mut() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repo root")
        .to_path_buf()
}

/// `target/<profile>/<name>`, built by `cargo build --bins` before the tests run.
pub fn bin_path(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test exe");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: build the binaries first (`cargo build --workspace --bins`, as scripts/test.sh does)",
        path.display()
    );
    path
}

pub fn describe(cmd: &Command, out: &Output) -> String {
    format!(
        "command: {cmd:?}\nstatus: {}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

pub fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {cmd:?}: {e}"))
}

pub fn run_ok(cmd: &mut Command) -> Output {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "command failed\n{}",
        describe(cmd, &out)
    );
    out
}

/// Runs a command that must fail with `code`, printing exactly one line on failure.
pub fn run_fails(cmd: &mut Command, code: i32) -> String {
    let out = run(cmd);
    assert_eq!(
        out.status.code(),
        Some(code),
        "wrong exit code\n{}",
        describe(cmd, &out)
    );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !text.contains("panicked"),
        "panic reached the user\n{}",
        describe(cmd, &out)
    );
    text
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Polls `cond` every 50 ms until it holds or `timeout` passes.
pub fn wait_until(timeout: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A free loopback port (bound and released; the race is acceptable for tests).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Asserts that an external tool the interface promises is installed.
pub fn require_tool(tool: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        found,
        "{tool} is not installed; scripts/test.sh installs the test tools (apt-get install {tool})"
    );
}
