//! Helpers for the end-to-end tests: a temp dir per test, the built binaries, commands
//! whose failures show their command line and output, children killed on drop.

#![allow(
    clippy::unwrap_used,
    reason = "test support: a failed setup step should fail the test loudly"
)]

pub mod fake;
pub mod machine;
pub mod networks;
pub mod proxy;
pub mod webdriver;
pub mod wine;

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
        cross_env(&mut c);
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

    /// A reference distribution in `dir`: the real agent binary, the wrapper and the
    /// supervisor it runs (agent-service), defaults.
    pub fn dist(&self, dir: &str) -> PathBuf {
        let root = self.path(dir);
        fs::create_dir_all(root.join("bin")).unwrap();
        fs::create_dir_all(root.join("conf.default")).unwrap();
        fs::copy(bin_path("agent"), root.join("bin/agent")).unwrap();
        fs::copy(bin_path("agent-service"), root.join("bin/agent-service")).unwrap();
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
        self.pack_with(dist, version, build, key, out, &[])
    }

    /// Like [`TestContext::pack`], with more `agent-bundle pack` arguments.
    pub fn pack_with(
        &self,
        dist: &Path,
        version: &str,
        build: &str,
        key: &Path,
        out: &str,
        extra: &[&str],
    ) -> PathBuf {
        run_ok(
            self.cmd("agent-bundle")
                .args(["pack", "--dist"])
                .arg(dist)
                .args(["--version", version, "--build", build, "--key"])
                .arg(key)
                .args(["--out", out])
                .args(extra),
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
        // Agents, wrappers and updaters detach on purpose; end whatever runs from here.
        for pid in pids_mentioning(self.dir.path()) {
            signal(pid, "KILL");
        }
    }
}

/// Processes whose command line names a path under `dir`.
pub fn pids_mentioning(dir: &Path) -> Vec<u32> {
    let needle = dir.display().to_string();
    let me = std::process::id();
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| {
                    String::from_utf8_lossy(&c)
                        .replace('\0', " ")
                        .contains(&needle)
                })
                .unwrap_or(false)
        })
        .collect()
}

impl TestContext {
    /// `bundle --install=<prefix>`; returns AGENT_HOME.
    pub fn install(&self, bundle: &Path, prefix: &str) -> PathBuf {
        run_ok(
            cross_env(&mut Command::new(bundle))
                .arg(format!("--install={}", self.path(prefix).display())),
        );
        fs::canonicalize(self.path(prefix).join("agent")).unwrap()
    }

    /// Packs with an explicit `signed-at`.
    pub fn pack_signed_at(
        &self,
        dist: &Path,
        version: &str,
        build: &str,
        key: &Path,
        out: &str,
        signed_at: u64,
    ) -> PathBuf {
        let at = signed_at.to_string();
        self.pack_with(dist, version, build, key, out, &["--signed-at", &at])
    }

    /// Two releases for publishing in order: 1.0.0+1 in `b1` (signed a minute ago) and
    /// 2.0.0+2 in `b2` (signed now, a README of its own); the first's bundle.
    pub fn two_releases(&self, key: &Path) -> PathBuf {
        let now = now_secs();
        let b1 = self.pack_signed_at(&self.dist("d1"), "1.0.0", "1", key, "b1", now - 60);
        let d2 = self.dist("d2");
        fs::write(d2.join("README.txt"), "Release 2.\n").unwrap();
        self.pack_signed_at(&d2, "2.0.0", "2", key, "b2", now);
        b1
    }
}

/// Starts each installed agent through its wrapper, all at once, and waits until every
/// wrapper says its agent is up.
pub fn start_wrappers(homes: &[PathBuf]) {
    let starters: Vec<_> = homes
        .iter()
        .map(|home| {
            let wrapper = home.join("current/bin/agent-wrapper.sh");
            std::thread::spawn(move || run_ok(cross_env(&mut Command::new(wrapper)).arg("start")))
        })
        .collect();
    for s in starters {
        s.join().unwrap();
    }
}

/// Lets `cmd` (and what it starts: the agent, its updater, the new version) run a glibc
/// aarch64 binary under qemu: `QEMU_LD_PREFIX` names the aarch64 glibc, since this
/// machine's `/lib` has only its own. qemu alone reads it; native programs ignore it.
pub fn cross_env(cmd: &mut Command) -> &mut Command {
    cmd.env("QEMU_LD_PREFIX", machine::AARCH64_SYSROOT)
}

/// Writes the operator's conf/agent.toml: these servers, a 1 s heartbeat, and `extra`.
pub fn configure_agent(home: &Path, urls: &[String], extra: &str) {
    let urls: Vec<String> = urls.iter().map(|u| format!("{u:?}")).collect();
    fs::write(
        home.join("conf/agent.toml"),
        format!(
            "[server]\nurls = [{}]\n\n[agent]\nheartbeat = \"1s\"\n{extra}",
            urls.join(", ")
        ),
    )
    .unwrap();
}

/// The last `lines` lines of a text file, for failure messages.
pub fn tail(path: &Path, lines: usize) -> String {
    let text = read_file(path);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

pub fn read_file(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_default()
}

/// The sha256 `/agentupdate/version` names; `None` while the server serves nothing.
pub fn served_sha256(server: &ServerProc) -> Option<String> {
    let answer = http(server.port, "GET", "/agentupdate/version", &[]).ok()?;
    (answer.status == 200)
        .then(|| property(&answer.text(), "agent.latest.sha256"))
        .flatten()
}

/// `GET /admin/releases` with `token`: what is served and the history.
pub fn admin_releases(server: &ServerProc, token: &str) -> serde_json::Value {
    let (status, list) = admin_call(server, token, "GET", "/admin/releases", "");
    assert_eq!(status, 200, "{list}");
    list
}

/// The kept release `id` (`<version>+<build>`) exported from `server` into `dir` (which
/// it returns): what a rollback signs again.
pub fn export_kept(
    ctx: &TestContext,
    server: &ServerProc,
    token: &str,
    id: &str,
    dir: &Path,
) -> PathBuf {
    run_ok(release_cmd(ctx, server, token, &["export", "--release", id, "--out"]).arg(dir));
    dir.to_owned()
}

/// Fresh signatures (signed-at now) over every bundle in `dir`, with `key`.
pub fn sign_again(ctx: &TestContext, key: &Path, dir: &Path) {
    let bundles: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("agent-bundle-"))
                && p.extension().is_none_or(|e| e != "minisig")
        })
        .collect();
    assert!(!bundles.is_empty(), "no bundle in {}", dir.display());
    run_ok(
        ctx.cmd("agent-bundle")
            .args(["sign", "--key"])
            .arg(key)
            .args(&bundles),
    );
}

/// `update-server ARGS… --server URL --token TOKEN`: the admin command line against a
/// test's server.
pub fn admin_cmd(ctx: &TestContext, server: &ServerProc, token: &str, args: &[&str]) -> Command {
    let mut cmd = ctx.cmd("update-server");
    cmd.args(args)
        .arg("--server")
        .arg(server.url(""))
        .arg("--token")
        .arg(token);
    cmd
}

/// `update-server release ARGS… --server URL --token TOKEN`.
pub fn release_cmd(ctx: &TestContext, server: &ServerProc, token: &str, args: &[&str]) -> Command {
    let mut cmd = ctx.cmd("update-server");
    cmd.args(["release", "--token", token, "--server"])
        .arg(server.url(""))
        .args(args);
    cmd
}

/// The last lines of every log an installed agent writes (agent, updater, supervisor,
/// workload), each under its name: what a failing test shows of the machine.
pub fn agent_logs(home: &Path) -> String {
    const FILES: [&str; 6] = [
        "agent.log",
        "agent.out",
        "update.log",
        "update.out",
        "wrapper.log",
        "workload.log",
    ];
    let mut out = String::new();
    for file in FILES {
        let text = read_file(&home.join("logs").join(file));
        if text.is_empty() {
            continue;
        }
        let lines: Vec<&str> = text.lines().collect();
        let tail = &lines[lines.len().saturating_sub(60)..];
        out.push_str(&format!("--- {file} (last {} lines)\n", tail.len()));
        for line in tail {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Waits until `home/logs/<file>` contains `needle`; on timeout shows the log.
pub fn wait_log(home: &Path, file: &str, needle: &str, timeout: Duration) -> String {
    let path = home.join("logs").join(file);
    let start = Instant::now();
    loop {
        let text = read_file(&path);
        if text.contains(needle) {
            return text;
        }
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {needle:?} in {}:\n{text}\n--- update.log:\n{}\n--- agent.out:\n{}",
            path.display(),
            read_file(&home.join("logs/update.log")),
            read_file(&home.join("logs/agent.out")),
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `GET /admin/agents` with the bearer token.
pub fn admin_agents(port: u16, token: &str) -> Vec<serde_json::Value> {
    let auth = format!("Bearer {token}");
    let answer = http(port, "GET", "/admin/agents", &[("Authorization", &auth)]).unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
    serde_json::from_slice(&answer.body).unwrap()
}

/// `GET /admin/agents`, or `None` while the server says it is too busy to list them in
/// time (`408`, `503`: a fleet registering by the thousand on a loaded machine): for a
/// `wait_until`.
pub fn admin_agents_answered(port: u16, token: &str) -> Option<Vec<serde_json::Value>> {
    let auth = format!("Bearer {token}");
    let answer = http(port, "GET", "/admin/agents", &[("Authorization", &auth)]).unwrap();
    if matches!(answer.status, 408 | 503) {
        return None;
    }
    assert_eq!(answer.status, 200, "{}", answer.text());
    Some(serde_json::from_slice(&answer.body).unwrap())
}

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repo root")
        .to_path_buf()
}

/// `rel` under the target directory the tests were built in (which `CARGO_TARGET_DIR`
/// may put anywhere), else under the repository's `target/`.
pub fn in_target_dir(rel: &str) -> PathBuf {
    let beside_tests = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.parent()?.join(rel)));
    match beside_tests {
        Some(path) if path.exists() => path,
        _ => repo_root().join("target").join(rel),
    }
}

/// `target/<profile>/<name>`, built by `cargo build --bins` before the tests run.
/// `agent-bundle` built with the updater's fault points (`scripts/test.sh` builds it).
pub fn failpoints_stub() -> PathBuf {
    let path = in_target_dir("failpoints/debug/agent-bundle");
    assert!(
        path.exists(),
        "{} is missing: run scripts/test.sh, or `cargo build -p agent-bundle --features failpoints --target-dir target/failpoints`",
        path.display()
    );
    path
}

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

/// A running update-server with its home in the test's directory.
pub struct ServerProc {
    pub port: u16,
    pub home: PathBuf,
    pub pid: u32,
}

impl ServerProc {
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub fn https_url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.port)
    }

    pub fn download_dir(&self) -> PathBuf {
        self.home.join("downloads/agent")
    }
}

/// A throw-away private CA made with openssl, and a server certificate it issued for
/// 127.0.0.1 and localhost.
pub struct Pki {
    pub dir: PathBuf,
    pub ca: PathBuf,
    pub ca_key: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Pki {
    pub fn new(dir: &Path) -> Self {
        require_tool("openssl");
        fs::create_dir_all(dir).unwrap();
        let ca = dir.join("ca.pem");
        let ca_key = dir.join("ca.key");
        run_ok(
            Command::new("openssl")
                .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
                .args(["ec_paramgen_curve:P-256", "-nodes", "-days", "2"])
                .args(["-subj", "/CN=e2e test CA"])
                .args(["-addext", "basicConstraints=critical,CA:TRUE"])
                .args(["-addext", "keyUsage=critical,keyCertSign,cRLSign"])
                .arg("-keyout")
                .arg(&ca_key)
                .arg("-out")
                .arg(&ca),
        );
        let mut pki = Self {
            dir: dir.to_path_buf(),
            ca,
            ca_key,
            cert: PathBuf::new(),
            key: PathBuf::new(),
        };
        let (cert, key) = pki.issue("server", 1);
        pki.cert = cert;
        pki.key = key;
        pki
    }

    /// A certificate for 127.0.0.1 valid for `days` (negative: already expired).
    pub fn issue(&self, name: &str, days: i32) -> (PathBuf, PathBuf) {
        let key = self.dir.join(format!("{name}.key"));
        let csr = self.dir.join(format!("{name}.csr"));
        let cert = self.dir.join(format!("{name}.pem"));
        let ext = self.dir.join("ext.cnf");
        fs::write(
            &ext,
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
        )
        .unwrap();
        run_ok(
            Command::new("openssl")
                .args([
                    "req",
                    "-newkey",
                    "ec",
                    "-pkeyopt",
                    "ec_paramgen_curve:P-256",
                ])
                .args(["-nodes", "-subj"])
                .arg(format!("/CN={name}"))
                .arg("-keyout")
                .arg(&key)
                .arg("-out")
                .arg(&csr),
        );
        run_ok(
            Command::new("openssl")
                .args(["x509", "-req", "-in"])
                .arg(&csr)
                .arg("-CA")
                .arg(&self.ca)
                .arg("-CAkey")
                .arg(&self.ca_key)
                .args(["-CAcreateserial", "-days", &days.to_string(), "-extfile"])
                .arg(&ext)
                .arg("-out")
                .arg(&cert),
        );
        (cert, key)
    }

    /// `curl` that trusts this CA only, silent, failing on HTTP errors.
    pub fn curl(&self) -> Command {
        let mut c = Command::new("curl");
        c.args(["-sS", "--fail", "--max-time", "10", "--cacert"])
            .arg(&self.ca);
        c
    }

    /// The subject of the certificate a server presents, as openssl prints it.
    pub fn presented_subject(&self, port: u16) -> String {
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "openssl s_client -connect 127.0.0.1:{port} -CAfile '{}' </dev/null 2>/dev/null | openssl x509 -noout -subject",
                self.ca.display()
            ))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }
}

impl TestContext {
    /// Starts update-server with `env` settings, its home `home`, and waits until it answers.
    pub fn server(&self, home: &str, env: &[(&str, &str)]) -> ServerProc {
        self.server_on(home, free_port(), env)
    }

    /// Like [`TestContext::server`], on `port` (to restart a server where it was).
    pub fn server_on(&self, home: &str, port: u16, env: &[(&str, &str)]) -> ServerProc {
        self.server_with(home, port, &[], env)
    }

    /// Like [`TestContext::server_on`], with more arguments (`--config FILE`).
    pub fn server_with(
        &self,
        home: &str,
        port: u16,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> ServerProc {
        let mut server = self.spawn_server_with(home, port, args, env);
        // Generous: a loaded machine (a whole suite in parallel) can take a while to
        // bring a server up after a SIGKILL; the tests time behaviour, not startup.
        let start = Instant::now();
        while !http(port, "GET", "/healthz", &[]).is_ok_and(|r| r.status == 200) {
            let gone = pid_gone(server.pid);
            let log = fs::read_to_string(server.home.join("server.log")).unwrap_or_default();
            // A port given back (a server restarted on it) can be taken for a moment as
            // the local port of another test's connection: try it again.
            if gone
                && start.elapsed() < Duration::from_secs(60)
                && log
                    .lines()
                    .last()
                    .is_some_and(|l| l.contains("cannot listen on"))
            {
                std::thread::sleep(Duration::from_millis(200));
                server = self.spawn_server_with(home, port, args, env);
                continue;
            }
            if gone || start.elapsed() > Duration::from_secs(60) {
                let tail: Vec<&str> = log.lines().rev().take(30).collect();
                panic!(
                    "update-server on port {port} {} /healthz; the end of its log:\n{}",
                    if gone {
                        "exited without answering"
                    } else {
                        "did not answer within 60s on"
                    },
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    /// An HTTPS update-server with the certificate `pki` issued; waits until it answers.
    pub fn server_tls(&self, home: &str, pki: &Pki, env: &[(&str, &str)]) -> ServerProc {
        let cert = pki.cert.display().to_string();
        let key = pki.key.display().to_string();
        let mut all = vec![
            ("UPDATE_SERVER_TLS_CERT", cert.as_str()),
            ("UPDATE_SERVER_TLS_KEY", key.as_str()),
        ];
        all.extend_from_slice(env);
        let server = self.spawn_server(home, free_port(), &all);
        wait_until(
            Duration::from_secs(20),
            "update-server to answer /healthz over HTTPS",
            || {
                pki.curl()
                    .arg(server.https_url("/healthz"))
                    .output()
                    .is_ok_and(|o| o.status.success())
            },
        );
        server
    }

    /// Starts update-server without waiting for it.
    pub fn spawn_server(&self, home: &str, port: u16, env: &[(&str, &str)]) -> ServerProc {
        self.spawn_server_with(home, port, &[], env)
    }

    /// [`TestContext::spawn_server`] with more arguments.
    pub fn spawn_server_with(
        &self,
        home: &str,
        port: u16,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> ServerProc {
        let home = self.path(home);
        fs::create_dir_all(home.join("downloads/agent")).unwrap();
        let mut cmd = self.cmd("update-server");
        cmd.arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--home")
            .arg(&home)
            .args(args);
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(home.join("server.log"))
            .unwrap();
        cmd.stdout(Stdio::null()).stderr(log);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let pid = self.spawn(cmd);
        ServerProc { port, home, pid }
    }

    /// Copies a bundle and its signature into the server's download directory.
    pub fn publish(&self, server: &ServerProc, bundle: &Path) {
        let name = bundle.file_name().unwrap();
        let sig = PathBuf::from(format!("{}.minisig", bundle.display()));
        fs::copy(&sig, server.download_dir().join(sig.file_name().unwrap())).unwrap();
        fs::copy(bundle, server.download_dir().join(name)).unwrap();
    }

    /// Replaces whatever the server serves with `bundle`, as an operator would (remove
    /// the old files, copy the new ones), and waits until it is served.
    pub fn republish(&self, server: &ServerProc, bundle: &Path) {
        server.clear_bundles();
        self.publish_served(server, bundle);
    }

    /// [`TestContext::publish`], then waits until the server serves that very bundle.
    pub fn publish_served(&self, server: &ServerProc, bundle: &Path) {
        self.publish(server, bundle);
        server.wait_serving(&sha256_file(bundle));
    }
}

impl ServerProc {
    /// Removes every bundle and signature from the download directory.
    pub fn clear_bundles(&self) {
        for entry in fs::read_dir(self.download_dir()).unwrap().flatten() {
            if entry
                .file_name()
                .to_string_lossy()
                .starts_with("agent-bundle-")
            {
                // A server of the fleet may replace the same file at this moment (a
                // release published on another server): gone is gone.
                match fs::remove_file(entry.path()) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => panic!("cannot remove {}: {e}", entry.path().display()),
                }
            }
        }
    }

    /// Waits until `/agentupdate/version` describes the bundle with this sha256.
    pub fn wait_serving(&self, sha256: &str) {
        let start = Instant::now();
        loop {
            let answer = http(self.port, "GET", "/agentupdate/version", &[]);
            if answer.as_ref().is_ok_and(|a| {
                property(&a.text(), "agent.latest.sha256").as_deref() == Some(sha256)
            }) {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the server did not serve {sha256} within 30 s; last answer {:?}\n--- server.log:\n{}",
                answer.map(|a| a.text()),
                read_file(&self.home.join("server.log"))
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A whole HTTP/1.1 answer.
#[derive(Debug)]
pub struct HttpAnswer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl HttpAnswer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends one request with `Connection: close` and reads the whole answer.
pub fn http(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> std::io::Result<HttpAnswer> {
    http_with_body(port, method, path, headers, b"")
}

/// POSTs a JSON `body` to an agent route (`/agent/register`, `/agent/connect`) as an
/// agent of `version` would, with `Authorization: Bearer` when `bearer` is given.
pub fn agent_post(
    server: &ServerProc,
    path: &str,
    version: &str,
    bearer: Option<&str>,
    body: &str,
) -> HttpAnswer {
    let auth = bearer.map(|t| format!("Bearer {t}"));
    let mut headers = vec![
        ("Agent-Version", version),
        ("Content-Type", "application/json"),
    ];
    if let Some(auth) = &auth {
        headers.push(("Authorization", auth));
    }
    http_with_body(server.port, "POST", path, &headers, body.as_bytes())
        .unwrap_or_else(|e| panic!("POST {path} to the server on {}: {e}", server.port))
}

pub fn http_with_body(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<HttpAnswer> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    stream.write_all(req.as_bytes())?;
    stream.write_all(body)?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    parse_answer(&raw, method == "HEAD")
}

/// Sends a GET and returns the stream positioned after the headers, for tests that
/// read a body slowly or hang up in the middle.
pub fn http_open(
    port: u16,
    path: &str,
) -> std::io::Result<(HttpAnswer, std::io::BufReader<std::net::TcpStream>)> {
    use std::io::{BufRead, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    stream.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").as_bytes(),
    )?;
    let mut reader = std::io::BufReader::new(stream);
    let mut head = Vec::new();
    loop {
        let mut line = Vec::new();
        if reader.read_until(b'\n', &mut line)? == 0 {
            break;
        }
        head.extend_from_slice(&line);
        if line == b"\r\n" {
            break;
        }
    }
    let answer = parse_answer(&head, true)?;
    Ok((answer, reader))
}

fn parse_answer(raw: &[u8], head_only: bool) -> std::io::Result<HttpAnswer> {
    let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_owned());
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad("no header end"))?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("no status line"))?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let body = if head_only {
        Vec::new()
    } else {
        raw[split + 4..].to_vec()
    };
    Ok(HttpAnswer {
        status,
        headers,
        body,
    })
}

/// Adds `bytes` of incompressible data to a distribution, to make a bundle of a given size.
pub fn pad_dist(dist: &Path, bytes: usize) {
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut data = Vec::with_capacity(bytes);
    while data.len() < bytes {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        data.extend_from_slice(&state.to_le_bytes());
    }
    data.truncate(bytes);
    fs::create_dir_all(dist.join("lib")).unwrap();
    fs::write(dist.join("lib/payload.bin"), data).unwrap();
}

pub fn sha256_file(path: &Path) -> String {
    agent_protocol::digest::Digests::of_reader(fs::File::open(path).unwrap())
        .unwrap()
        .sha256_hex()
}

pub fn sha256_bytes(data: &[u8]) -> String {
    agent_protocol::digest::Digests::of_reader(data)
        .unwrap()
        .sha256_hex()
}

/// Reads one value of a `name=value` text.
pub fn property(text: &str, name: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}=")).map(str::to_owned))
}

/// A gauge or counter from /metrics.
pub fn metric(server: &ServerProc, name: &str) -> f64 {
    let answer = http(server.port, "GET", "/metrics", &[]).unwrap();
    answer
        .text()
        .lines()
        .find_map(|l| {
            l.strip_prefix(name)
                .and_then(|rest| rest.trim().parse().ok())
        })
        .unwrap_or_else(|| panic!("metric {name} not found"))
}

/// True once `pid` has exited (gone, or a zombie waiting to be reaped).
pub fn pid_gone(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.trim_start().starts_with('Z'))
            .unwrap_or(true),
        Err(_) => true,
    }
}

/// Sends `signal` (e.g. "TERM", "KILL") to `pid` with kill(1).
pub fn signal(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status();
}

/// Seconds since the epoch of a tracing timestamp `2026-11-21T23:29:20.123456Z`.
pub fn log_time(line: &str) -> Option<f64> {
    let stamp = line.split_whitespace().next()?;
    let (date, time) = stamp.trim_end_matches('Z').split_once('T')?;
    let mut d = date.split('-').map(|x| x.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    // Days from civil (H. Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let mut t = time.split(':');
    let (h, min, s) = (
        t.next()?.parse::<f64>().ok()?,
        t.next()?.parse::<f64>().ok()?,
        t.next()?.parse::<f64>().ok()?,
    );
    Some(days as f64 * 86_400.0 + h * 3600.0 + min * 60.0 + s)
}

/// One entry of a hand-made bundle payload: its name in the zip and where its bytes are.
pub struct Part<'a> {
    pub name: &'a str,
    pub file: &'a Path,
}

/// A bundle made by hand, as `agent-bundle pack` would make it (the stub, then a zip whose
/// offsets count from the file's start), from arbitrary parts, so that a test can put in
/// it what pack never would. Signed with `key` (claiming `version` on this platform), so
/// that everything that checks signatures lets it through to what is under test.
pub fn hand_made_bundle(
    out: &Path,
    version: &str,
    build: &str,
    key: &Path,
    parts: &[Part<'_>],
) -> PathBuf {
    use std::io::Write;
    fs::create_dir_all(out).unwrap();
    let bundle = out.join(format!("agent-bundle-{version}"));
    let mut file = fs::File::create(&bundle).unwrap();
    let stub = fs::read(bin_path("agent-bundle")).unwrap();
    file.write_all(&stub).unwrap();
    {
        let mut zip = zip::ZipWriter::new(std::io::BufWriter::new(&mut file));
        let stored = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored)
            .unix_permissions(0o644);
        for part in parts {
            zip.start_file(part.name, stored).unwrap();
            let mut input = fs::File::open(part.file).unwrap();
            std::io::copy(&mut input, &mut zip).unwrap();
        }
        zip.finish().unwrap().flush().unwrap();
    }
    file.flush().unwrap();
    drop(file);
    run_ok(Command::new("chmod").arg("755").arg(&bundle));
    sign_bundle(&bundle, version, build, key);
    bundle
}

/// Writes `<bundle>.minisig` as `agent-bundle pack` would, with a claim of `version+build`.
pub fn sign_bundle(bundle: &Path, version: &str, build: &str, key: &Path) {
    use agent_protocol::minisign::{BundleClaim, SecretKey};
    let key = SecretKey::parse(&fs::read_to_string(key).unwrap()).unwrap();
    let digests =
        agent_protocol::digest::Digests::of_reader(fs::File::open(bundle).unwrap()).unwrap();
    let claim = BundleClaim {
        version: agent_protocol::AgentVersion::new(version, build).unwrap(),
        platform: agent_protocol::layout::PLATFORM.to_owned(),
        sha256: digests.sha256_hex(),
        signed_at: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs(),
    };
    let signature = key
        .sign_prehashed(&digests.blake2b, &claim.to_comment())
        .unwrap();
    fs::write(
        format!("{}.minisig", bundle.display()),
        signature.to_file_string(),
    )
    .unwrap();
}

/// Replaces every occurrence of `from` with `to` (same length) in a file, in place.
pub fn patch_bytes(path: &Path, from: &[u8], to: &[u8]) -> usize {
    assert_eq!(from.len(), to.len());
    let mut data = fs::read(path).unwrap();
    let mut count = 0;
    let mut i = 0;
    while i + from.len() <= data.len() {
        if &data[i..i + from.len()] == from {
            data[i..i + from.len()].copy_from_slice(to);
            count += 1;
            i += from.len();
        } else {
            i += 1;
        }
    }
    fs::write(path, data).unwrap();
    count
}

/// Seconds since the epoch, as the agent writes them.
pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A throw-away PostgreSQL cluster: `initdb` as the `postgres` user in a directory of
/// its own, listening on a loopback port with a password, stopped and removed on drop.
pub struct Postgres {
    pub dir: PathBuf,
    pub port: u16,
    bin: PathBuf,
}

/// The admin token of the servers tests start (`UPDATE_SERVER_ADMIN_TOKEN`).
pub const TOKEN: &str = "e2e-admin-token";

/// The password of the `postgres` user in the clusters tests make.
pub const PG_PASSWORD: &str = "e2e-secret";

impl Postgres {
    /// Makes and starts a cluster; fails the test (saying what to install) where
    /// PostgreSQL is missing: tests that need it never pass without it.
    pub fn start() -> Self {
        let bin = fs::read_dir("/usr/lib/postgresql")
            .ok()
            .and_then(|versions| {
                versions
                    .flatten()
                    .map(|v| v.path().join("bin"))
                    .filter(|b| b.join("initdb").is_file())
                    .max()
            })
            .unwrap_or_else(|| {
                panic!(
                    "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb); apt-get install postgresql"
                )
            });
        let dir = tempfile::Builder::new()
            .prefix("e2e-pg-")
            .tempdir()
            .unwrap()
            .keep();
        let pwfile = dir.join("pw");
        fs::write(&pwfile, format!("{PG_PASSWORD}\n")).unwrap();
        run_ok(
            Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&dir),
        );
        let pg = Self {
            dir,
            port: free_port(),
            bin,
        };
        pg.as_postgres(
            Command::new(pg.bin.join("initdb"))
                .arg("-D")
                .arg(pg.data())
                .args(["-U", "postgres", "-E", "UTF8", "--auth-local=trust"])
                .args(["--auth-host=scram-sha-256", "--pwfile"])
                .arg(&pwfile),
        );
        pg.start_server();
        pg.psql("postgres", "CREATE DATABASE fleet");
        pg
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn as_postgres(&self, cmd: &mut Command) -> Output {
        let mut full = Command::new("runuser");
        full.args(["-u", "postgres", "--"]).arg(cmd.get_program());
        full.args(cmd.get_args());
        run_ok(&mut full)
    }

    /// Starts the server (again, after [`Postgres::stop`]) and waits until it answers.
    pub fn start_server(&self) {
        self.as_postgres(
            Command::new(self.bin.join("pg_ctl"))
                .arg("-D")
                .arg(self.data())
                .arg("-o")
                .arg(format!(
                    "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=off",
                    self.port,
                    self.dir.display()
                ))
                .arg("-l")
                .arg(self.dir.join("log"))
                .args(["-w", "start"]),
        );
    }

    /// Stops the server at once (`-m fast`: sessions are cut, as in a crash or failover).
    pub fn stop(&self) {
        self.as_postgres(
            Command::new(self.bin.join("pg_ctl"))
                .arg("-D")
                .arg(self.data())
                .args(["-m", "fast", "-w", "stop"]),
        );
    }

    /// `postgres://postgres:…@127.0.0.1:PORT/fleet`.
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres:{PG_PASSWORD}@127.0.0.1:{}/fleet",
            self.port
        )
    }

    /// Runs SQL in `database`; returns psql's unaligned, tuples-only output.
    pub fn psql(&self, database: &str, sql: &str) -> String {
        let out = run_ok(
            Command::new("psql")
                .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
                .args(["-U", "postgres", "-d", database, "-X", "-A", "-t", "-v"])
                .arg("ON_ERROR_STOP=1")
                .arg("-c")
                .arg(sql)
                .env("PGPASSWORD", PG_PASSWORD),
        );
        stdout(&out).trim().to_owned()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(self.data())
            .args(["-m", "immediate", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Raises this test process's file limit to its hard limit, for the sockets of a flood.
pub fn raise_fd_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
}

/// A KiB figure of `/proc/<pid>/status` (`VmRSS`, `RssAnon`, …); 0 when unreadable.
pub fn status_kib(pid: u32, field: &str) -> u64 {
    let prefix = format!("{field}:");
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Two servers, `a` and `b`, sharing the fleet database `pg`, both with admin token
/// `token` and both publishing `bundle`.
pub fn two_servers_on(
    ctx: &TestContext,
    pg: &Postgres,
    token: &str,
    bundle: &Path,
) -> (ServerProc, ServerProc) {
    let url = pg.url();
    let env = |name| {
        [
            ("UPDATE_SERVER_DATABASE_URL", url.as_str()),
            ("UPDATE_SERVER_SERVER_NAME", name),
            ("UPDATE_SERVER_ADMIN_TOKEN", token),
        ]
    };
    let a = ctx.server("srv-a", &env("a"));
    let b = ctx.server("srv-b", &env("b"));
    ctx.publish_served(&a, bundle);
    ctx.publish_served(&b, bundle);
    (a, b)
}

/// `GET /admin/rollout` with the admin `token`: the fleet's rollout, when the server
/// answers one.
pub fn admin_rollout(server: &ServerProc, token: &str) -> Option<serde_json::Value> {
    let auth = format!("Bearer {token}");
    let answer = http(
        server.port,
        "GET",
        "/admin/rollout",
        &[("Authorization", &auth)],
    )
    .ok()?;
    (answer.status == 200).then(|| serde_json::from_slice(&answer.body).ok())?
}

/// Waits up to `timeout` until the fleet's rollout (as [`admin_rollout`] reads it)
/// satisfies `cond`, and returns it; past the timeout, fails with the rollout last seen
/// and the end of the server's log.
pub fn wait_rollout(
    server: &ServerProc,
    token: &str,
    timeout: Duration,
    what: &str,
    mut cond: impl FnMut(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let start = Instant::now();
    loop {
        let r = admin_rollout(server, token);
        if let Some(r) = &r
            && cond(r)
        {
            return r.clone();
        }
        if start.elapsed() > timeout {
            let log = fs::read_to_string(server.home.join("server.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            panic!(
                "timed out waiting for {what}; rollout:\n{}\n--- the end of the server log:\n{}",
                r.map(|r| serde_json::to_string_pretty(&r).unwrap())
                    .unwrap_or_default(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// An admin API call with the bearer `token`: the status and the JSON answered (its text
/// as a JSON string when it is not JSON).
pub fn admin_call(
    server: &ServerProc,
    token: &str,
    method: &str,
    path: &str,
    body: impl AsRef<[u8]>,
) -> (u16, serde_json::Value) {
    let auth = format!("Bearer {token}");
    let answer = http_with_body(
        server.port,
        method,
        path,
        &[
            ("Authorization", &auth),
            ("Content-Type", "application/json"),
        ],
        body.as_ref(),
    )
    .unwrap();
    let json = serde_json::from_slice(&answer.body)
        .unwrap_or_else(|_| serde_json::Value::String(answer.text()));
    (answer.status, json)
}
