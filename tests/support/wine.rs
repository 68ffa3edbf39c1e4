//! Windows machines under Wine (docs/install.md, "Windows machines"): one Wine prefix
//! made once under `target/` and shared by every test (each test installs under its own
//! directory and registers its own service name), kept up by `wineserver -p`, with the
//! `ProcessPrng` shim that Rust's std needs under Wine 8. The shim is test equipment,
//! never shipped.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::{TestContext, describe, in_target_dir, run_ok, signal, wait_until};

pub const WINDOWS: &str = "x86_64-pc-windows-gnu";

/// Wine 8's `bcryptprimitives.dll` lacks `ProcessPrng`, which Rust's std imports for its
/// random numbers: this one answers it with `RtlGenRandom` (`SystemFunction036`). The
/// Windows benchmark (scripts/bench/windows.sh) builds its prefix with the same file.
const SHIM: &str = include_str!("wine/bcryptprimitives.c");

/// A workload for Windows tests: runs while `app.conf` in the directory it is given does
/// not say "bad", saying what it read, until `app.exe --stop DIR` (its stop command)
/// asks it to end.
const APP: &str = r#"#include <windows.h>
#include <stdio.h>
#include <string.h>
int main(int argc, char **argv) {
    char path[4096], stop[4096], line[256] = {0};
    if (argc == 3 && strcmp(argv[1], "--stop") == 0) {
        snprintf(stop, sizeof stop, "%s\\app.stop", argv[2]);
        FILE *s = fopen(stop, "w");
        if (!s) return 1;
        fclose(s);
        return 0;
    }
    if (argc < 2) return 2;
    snprintf(path, sizeof path, "%s\\app.conf", argv[1]);
    snprintf(stop, sizeof stop, "%s\\app.stop", argv[1]);
    FILE *f = fopen(path, "r");
    if (f) { fgets(line, sizeof line, f); fclose(f); }
    if (strstr(line, "bad")) {
        fprintf(stderr, "app: app.conf says bad, refusing to run\n");
        return 1;
    }
    printf("app: running with %s", line);
    fflush(stdout);
    for (;;) {
        if (DeleteFileA(stop)) {
            printf("app: asked to stop by its stop command\n");
            fflush(stdout);
            return 0;
        }
        Sleep(100);
    }
}
"#;

/// The test workload [`APP`] built with mingw (once, under the prefix's lock): test
/// equipment, like the shim.
pub fn windows_app() -> PathBuf {
    prefix();
    let dir = in_target_dir("wine");
    let exe = dir.join("app.exe");
    let src = dir.join("app.c");
    if fs::read_to_string(&src).ok().as_deref() != Some(APP) || !exe.exists() {
        let tmp = dir.join(format!("app-{}.exe", std::process::id()));
        let c = dir.join(format!("app-{}.c", std::process::id()));
        fs::write(&c, APP).unwrap();
        run_ok(
            Command::new("x86_64-w64-mingw32-gcc")
                .args(["-O2", "-o"])
                .arg(&tmp)
                .arg(&c),
        );
        fs::rename(&tmp, &exe).unwrap();
        fs::rename(&c, &src).unwrap();
    }
    exe
}

/// `target/cross/x86_64-pc-windows-gnu/debug/<name>.exe`, or a panic that says how to
/// build it.
pub fn windows_bin(name: &str) -> PathBuf {
    built(
        &format!("cross/{WINDOWS}/debug/{name}.exe"),
        "--target-dir target/cross -p agent -p agent-bundle -p agent-service",
    )
}

/// The Windows `agent-bundle.exe` with the updater's fault points (`scripts/test.sh`
/// builds it beside the Linux one).
pub fn windows_failpoints_stub() -> PathBuf {
    built(
        &format!("failpoints/{WINDOWS}/debug/agent-bundle.exe"),
        "-p agent-bundle --features failpoints --target-dir target/failpoints",
    )
}

/// `rel` under the target directory, or a panic naming the cross build (`args`) that
/// makes it.
fn built(rel: &str, args: &str) -> PathBuf {
    let path = in_target_dir(rel);
    assert!(
        path.exists(),
        "{} is missing: run scripts/test.sh, or CC_x86_64_pc_windows_gnu=x86_64-w64-mingw32-gcc CARGO_TARGET_X86_64_PC_WINDOWS_GNU_LINKER=x86_64-w64-mingw32-gcc cargo build --target {WINDOWS} {args}",
        path.display()
    );
    path
}

/// Debian's 64-bit Wine loader (the `wine` script asks for a 32-bit one first).
const WINE64: &str = "/usr/lib/wine/wine64";
const WINESERVER: &str = "/usr/lib/wine/wineserver";

/// The shared prefix: made once (under a lock, as tests run in parallel processes), with
/// its server kept up.
pub fn prefix() -> PathBuf {
    assert!(
        Path::new(WINE64).exists(),
        "{WINE64} is missing: apt-get install wine64 (scripts/test.sh does)"
    );
    let dir = in_target_dir("wine");
    fs::create_dir_all(&dir).unwrap();
    let prefix = dir.join("prefix");
    let lock = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(".lock"))
        .unwrap();
    let _held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| e)
        .unwrap();
    // Renamed when what a prefix is made with changes, so an older one is made again.
    let ready = prefix.join(".ready-3");
    if !ready.exists() {
        if prefix.exists() {
            // The session of the prefix being replaced goes with it.
            stop_server(&prefix);
        }
        let _ = fs::remove_dir_all(&prefix);
        fs::create_dir_all(&prefix).unwrap();
        start_server(&prefix);
        run_quiet(env(&mut Command::new(WINE64), &prefix).args(["wineboot", "-i"]));
        let src = dir.join("bcryptprimitives.c");
        fs::write(&src, SHIM).unwrap();
        run_ok(
            Command::new("x86_64-w64-mingw32-gcc")
                .args(["-shared", "-O2", "-o"])
                .arg(prefix.join("drive_c/windows/system32/bcryptprimitives.dll"))
                .arg(&src)
                .arg("-ladvapi32"),
        );
        // `wineboot -i` in a new prefix boots it twice (the loader's own first boot, then
        // the one asked for) and each boot starts a service manager: two managers, each
        // with services of its own, answer the same pipe, so a service registered with
        // one is "not found" (1060) by the other, at random. The next session boots once.
        stop_server(&prefix);
        fs::write(&ready, "").unwrap();
    }
    start_server(&prefix);
    let managers = service_managers(&prefix);
    assert!(
        managers <= 1,
        "{managers} Wine service managers run for {}: end its session with WINEPREFIX={} {WINESERVER} -k",
        prefix.display(),
        prefix.display()
    );
    prefix
}

/// How many `services.exe` run in the prefix's session.
fn service_managers(prefix: &Path) -> usize {
    let Ok(entries) = fs::read_dir("/proc") else {
        return 0;
    };
    let wanted = format!("WINEPREFIX={}", prefix.display());
    entries
        .flatten()
        .filter(|e| {
            let dir = e.path();
            fs::read(dir.join("cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains("\\system32\\services.exe"))
                && fs::read(dir.join("environ"))
                    .is_ok_and(|env| env.split(|&b| b == 0).any(|var| var == wanted.as_bytes()))
        })
        .count()
}

/// Ends the prefix's session (its server, service manager and every program in it) and
/// waits until it has ended.
fn stop_server(prefix: &Path) {
    for arg in ["-k", "-w"] {
        let _ = env(&mut Command::new(WINESERVER), prefix)
            .arg(arg)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// One persistent server (and its service manager) per prefix; a second start finds
/// it running and leaves. Its output goes nowhere: a daemon holding a captured pipe
/// would keep the capture from ever ending.
fn start_server(prefix: &Path) {
    let _ = env(&mut Command::new(WINESERVER), prefix)
        .arg("-p")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Runs a Wine command that may start Wine's daemons, which inherit its output: its
/// output goes to a file, and only its exit status is waited for.
fn run_quiet(cmd: &mut Command) {
    let status = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(status.success(), "{cmd:?}: {status}");
}

fn env<'a>(cmd: &'a mut Command, prefix: &Path) -> &'a mut Command {
    cmd.env("WINEPREFIX", prefix)
        .env("WINEDEBUG", "-all")
        // No Mono or Gecko installers popping up at first boot.
        .env("WINEDLLOVERRIDES", "mscoree,mshtml=")
        .env_remove("DISPLAY")
        .env_remove("RUST_LOG")
}

/// Runs a Windows program and returns its output, read from files: Wine hands a console
/// program's pipes to a `conhost.exe` that outlives it, so a captured pipe would never
/// end.
pub fn output(cmd: &mut Command) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let (out, err) = (dir.path().join("stdout"), dir.path().join("stderr"));
    let status = cmd
        .stdin(Stdio::null())
        .stdout(fs::File::create(&out).unwrap())
        .stderr(fs::File::create(&err).unwrap())
        .status()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    Output {
        status,
        stdout: fs::read(&out).unwrap_or_default(),
        stderr: fs::read(&err).unwrap_or_default(),
    }
}

/// [`output`], failing the test with the command and its output unless it succeeded.
pub fn run_ok_wine(cmd: &mut Command) -> Output {
    let out = output(cmd);
    assert!(out.status.success(), "{}", describe(cmd, &out));
    out
}

/// `Z:\…`: how Windows programs under Wine name a Linux path.
pub fn win_path(path: &Path) -> String {
    format!("Z:{}", path.display()).replace('/', "\\")
}

/// A Windows machine: the shared prefix, an install directory of this test's own and a
/// service name of its own. Dropping it ends its processes and removes its service.
pub struct WinMachine {
    pub prefix: PathBuf,
    /// `<test dir>/<name>`: the `--install` prefix; the agent's home is `agent` in it.
    pub root: PathBuf,
    pub service: String,
}

impl WinMachine {
    pub fn new(ctx: &TestContext, name: &str) -> Self {
        let root = ctx.path(name);
        fs::create_dir_all(&root).unwrap();
        let unique = ctx
            .dir
            .path()
            .file_name()
            .map(|n| n.to_string_lossy().replace(['.', '-'], ""))
            .unwrap_or_default();
        Self {
            prefix: prefix(),
            root,
            service: format!("agent-{unique}-{name}"),
        }
    }

    /// The agent's home, as Linux sees it.
    pub fn home(&self) -> PathBuf {
        self.root.join("agent")
    }

    /// A Windows program run under Wine.
    pub fn cmd(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new(WINE64);
        env(&mut cmd, &self.prefix).arg(program);
        cmd
    }

    /// `bin\agent-service.exe` of the installed home.
    pub fn service_cmd(&self, action: &str) -> Command {
        let mut cmd = self.cmd(self.home().join("bin/agent-service.exe"));
        cmd.arg(action);
        cmd
    }

    /// `agent.exe` of the version `current` names.
    pub fn agent_cmd(&self) -> Command {
        let name = fs::read_to_string(self.home().join("current")).unwrap();
        self.cmd(
            self.home()
                .join("versions")
                .join(name.trim())
                .join("bin/agent.exe"),
        )
    }

    /// `bundle --install=<root> --service-name <service>` plus `extra`.
    pub fn install(&self, bundle: &Path, extra: &[&str]) -> Output {
        let mut cmd = self.cmd(bundle);
        cmd.arg(format!("--install={}", win_path(&self.root)))
            .args(["--service-name", &self.service])
            .args(extra);
        run_ok_wine(&mut cmd)
    }

    /// Linux pids of the Windows processes running from this machine's directory (the
    /// service, the agent, its workload and helpers: Wine shows their Windows command
    /// lines).
    pub fn processes(&self) -> Vec<u32> {
        let needle = win_path(&self.root);
        let Ok(entries) = fs::read_dir("/proc") else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                    String::from_utf8_lossy(&c)
                        .replace('\0', " ")
                        .contains(&needle)
                })
            })
            .collect()
    }

    /// The agent's Windows pid as `run\agent.pid` names it.
    pub fn agent_pid(&self) -> Option<u32> {
        fs::read_to_string(self.home().join("run/agent.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// A power cut and a boot: every process of this machine is killed where it stands,
    /// the Wine session (its service manager with it) ends, and a new one boots, whose
    /// service manager starts the automatic services, this machine's among them.
    pub fn power_cut_and_boot(&self) {
        for pid in self.processes() {
            signal(pid, "KILL");
        }
        stop_server(&self.prefix);
        prefix();
        // The first program of a session boots it (wineboot starts the service manager).
        let _ = output(self.cmd("sc").args(["query", &self.service]));
    }

    /// `agent-service.exe status` says the agent runs.
    pub fn agent_running(&self) -> bool {
        output(&mut self.service_cmd("status")).status.success()
    }

    pub fn wait_agent_running(&self, timeout: Duration) {
        wait_until(timeout, "the agent to run under its service", || {
            self.agent_running()
        });
    }
}

impl Drop for WinMachine {
    fn drop(&mut self) {
        for pid in self.processes() {
            signal(pid, "KILL");
        }
        let _ = output(self.cmd("sc").args(["delete", &self.service]));
    }
}

/// The MSI of `installer/windows/agent.wxs` around `bundle` (its `.minisig` beside it),
/// built with wixl as `out`, as scripts/build-dist.sh builds it, with `upgrade_code`
/// (the tests' own, so that their products stay apart in the shared prefix).
pub fn wixl(bundle: &Path, version: &str, upgrade_code: &str, out: &Path) -> PathBuf {
    if let Some(dir) = out.parent() {
        fs::create_dir_all(dir).unwrap();
    }
    // wixl takes a file's Source relative to where it runs, never absolute: the custom
    // action's DLL is built beside the bundle, as build-dist.sh does.
    let (dir, name) = (bundle.parent().unwrap(), bundle.file_name().unwrap());
    run_ok(
        Command::new("x86_64-w64-mingw32-gcc")
            .args(["-shared", "-O2", "-static-libgcc", "-o"])
            .arg(dir.join("msi-action.dll"))
            .arg(crate::repo_root().join("installer/windows/msi-action.c"))
            .arg("-lmsi"),
    );
    run_ok(
        Command::new("wixl")
            .current_dir(dir)
            .args(["-a", "x64", "-D"])
            .arg(format!("Version={version}"))
            .arg("-D")
            .arg(format!("UpgradeCode={upgrade_code}"))
            .arg("-D")
            .arg(format!("Bundle={}", name.to_string_lossy()))
            .arg("-o")
            .arg(out)
            .arg(crate::repo_root().join("installer/windows/agent.wxs")),
    );
    out.to_path_buf()
}

/// A GUID of the test's own (from its directory's name and the time): an MSI's
/// UpgradeCode.
pub fn test_guid(ctx: &TestContext) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    ctx.dir.path().hash(&mut h);
    std::time::SystemTime::now().hash(&mut h);
    let a = h.finish();
    std::process::id().hash(&mut h);
    let b = h.finish();
    format!(
        "{:08X}-{:04X}-{:04X}-{:04X}-{:012X}",
        a >> 32,
        (a >> 16) & 0xFFFF,
        a & 0xFFFF,
        b >> 48,
        b & 0xFFFF_FFFF_FFFF
    )
}

/// A log Windows Installer wrote: UTF-16 on Windows, whatever Wine chose here.
pub fn msi_log(path: &Path) -> String {
    let bytes = fs::read(path).unwrap_or_default();
    if bytes.len() >= 2 && bytes.iter().skip(1).step_by(2).take(64).all(|&b| b == 0) {
        let wide: Vec<u16> = bytes
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        String::from_utf16_lossy(&wide)
    } else {
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

impl WinMachine {
    /// `msiexec ARGS /qn /l*v LOG` under Wine, waited for: its output and its log.
    pub fn msiexec(&self, args: &[&str]) -> (Output, String) {
        let log = tempfile::NamedTempFile::new().unwrap();
        let out = output(
            self.cmd("msiexec")
                .args(args)
                .args(["/qn", "/l*v"])
                .arg(win_path(log.path())),
        );
        (out, msi_log(log.path()))
    }

    /// The MSI properties that install into this machine's directory under its service
    /// name.
    pub fn msi_properties(&self) -> Vec<String> {
        vec![
            format!("INSTALLDIR={}\\", win_path(&self.root)),
            format!("SERVICE_NAME={}", self.service),
        ]
    }
}
