//! Machines for the install tests: a minimal Debian booted with its own systemd as PID 1
//! (`systemd-nspawn --boot`, sharing the host's network), and a root that holds nothing
//! but a static busybox (no glibc, no curl). Both run the commands a person would type.
//!
//! The Debian root is made once (`scripts/test.sh`, by `debootstrap`) and cached as
//! `target/debian-systemd-root`; each machine boots a copy of its own, so tests do not
//! leak into each other. The static musl agent is built by `scripts/test.sh` too, in the
//! target directory of the cross builds (`target/cross`), and so is the aarch64 one the
//! platform tests run under qemu.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::{describe, run, run_ok, wait_until};

/// The cached Debian root, or a panic that says how to make it.
pub fn debian_root() -> PathBuf {
    let root = crate::in_target_dir("debian-systemd-root");
    assert!(
        root.join("usr/lib/systemd/systemd").exists() || root.join("lib/systemd/systemd").exists(),
        "{} is missing: run scripts/test.sh (it makes it with debootstrap)",
        root.display()
    );
    root
}

/// `target/cross/x86_64-unknown-linux-musl/debug/<name>`, or a panic that says how to
/// build it.
pub fn musl_bin(name: &str) -> PathBuf {
    let path = crate::in_target_dir(&format!("cross/x86_64-unknown-linux-musl/debug/{name}"));
    assert!(
        path.exists(),
        "{} is missing: run scripts/test.sh, or CC_x86_64_unknown_linux_musl=musl-gcc cargo build --target-dir target/cross --target x86_64-unknown-linux-musl -p agent -p agent-bundle -p agent-service",
        path.display()
    );
    path
}

/// Where Debian's `libc6-arm64-cross` puts aarch64 glibc: qemu loads a glibc aarch64
/// binary's interpreter and libraries from under it (`QEMU_LD_PREFIX`).
pub const AARCH64_SYSROOT: &str = "/usr/aarch64-linux-gnu";

/// `target/cross/aarch64-unknown-linux-gnu/debug/<name>`, once it is sure this machine runs
/// it (qemu registered with binfmt_misc, the aarch64 glibc there); else a panic that
/// says what to do.
pub fn aarch64_bin(name: &str) -> PathBuf {
    let path = crate::in_target_dir(&format!("cross/aarch64-unknown-linux-gnu/debug/{name}"));
    assert!(
        path.exists(),
        "{} is missing: run scripts/test.sh, or CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc cargo build --target-dir target/cross --target aarch64-unknown-linux-gnu -p agent -p agent-bundle -p agent-service",
        path.display()
    );
    let binfmt = Path::new("/proc/sys/fs/binfmt_misc/qemu-aarch64");
    assert!(
        fs::read_to_string(binfmt).is_ok_and(|s| s.lines().next() == Some("enabled")),
        "{} is not enabled: this machine cannot run aarch64 binaries; run scripts/binfmt-aarch64.sh as root (scripts/test.sh does)",
        binfmt.display()
    );
    assert!(
        Path::new(AARCH64_SYSROOT)
            .join("lib/ld-linux-aarch64.so.1")
            .exists(),
        "{AARCH64_SYSROOT} has no aarch64 glibc: apt-get install libc6-arm64-cross (scripts/test.sh does)"
    );
    path
}

/// A booted Debian with systemd as its PID 1. Killed (its whole PID namespace) on drop.
pub struct Machine {
    pub root: PathBuf,
    nspawn: Option<Child>,
    /// The machine's PID 1, as the host sees it.
    pub init: u32,
    log: PathBuf,
    boots: u32,
}

impl Machine {
    /// Copies the cached root to `root` and boots it.
    pub fn boot_copy(root: &Path) -> Self {
        run_ok(Command::new("cp").arg("-a").arg(debian_root()).arg(root));
        let mut machine = Self {
            root: root.to_path_buf(),
            nspawn: None,
            init: 0,
            log: root.with_extension("nspawn.log"),
            boots: 0,
        };
        machine.boot();
        machine
    }

    /// Boots the root (again) and waits until systemd says the system is up.
    pub fn boot(&mut self) {
        self.boots += 1;
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new("systemd-nspawn")
            .args(["--register=no", "--keep-unit", "--quiet", "--boot"])
            .arg("--machine")
            .arg(format!("e2e-{}-{}", std::process::id(), self.boots))
            .arg("-D")
            .arg(&self.root)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("systemd-nspawn: {e}"));
        let nspawn_pid = child.id();
        self.nspawn = Some(child);
        let mut init = 0;
        wait_until(Duration::from_secs(30), "the machine's PID 1", || {
            init = children_of(nspawn_pid)
                .into_iter()
                .find(|pid| comm(*pid).as_deref() == Some("systemd"))
                .unwrap_or(0);
            init != 0
        });
        self.init = init;
        let started = Instant::now();
        loop {
            let out = self.sh_output("systemctl is-system-running");
            let state = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            // "degraded": some unit of the minimal system failed (none the agent needs).
            if state == "running" || state == "degraded" {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "the machine did not come up within 60 s (state {state:?}); nspawn log:\n{}",
                fs::read_to_string(&self.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `sh -c script` inside the machine; its output, whatever its status.
    pub fn sh_output(&self, script: &str) -> Output {
        run(self.nsenter().args(["sh", "-c", script]))
    }

    /// `sh -c script` inside the machine, which must succeed; its stdout.
    pub fn sh(&self, script: &str) -> String {
        let mut cmd = self.nsenter();
        cmd.args(["sh", "-c", script]);
        let out = run(&mut cmd);
        assert!(
            out.status.success(),
            "in the machine: {}",
            describe(&cmd, &out)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn nsenter(&self) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg("-t")
            .arg(self.init.to_string())
            .args(["-m", "-u", "-i", "-p", "--"])
            .env_clear()
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .env("LANG", "C");
        cmd
    }

    /// The agent processes (`bin/agent run`) in this machine, seen from the host.
    pub fn agent_pids(&self) -> Vec<u32> {
        self.pids(|argv| argv.len() >= 2 && argv[0].ends_with(b"/bin/agent") && argv[1] == b"run")
    }

    /// The processes of this machine whose argv `keep` accepts, seen from the host.
    pub fn pids(&self, keep: impl Fn(&[&[u8]]) -> bool) -> Vec<u32> {
        let Ok(ns) = fs::read_link(format!("/proc/{}/ns/pid", self.init)) else {
            return Vec::new();
        };
        let mut pids = Vec::new();
        for entry in fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            if fs::read_link(format!("/proc/{pid}/ns/pid")).ok().as_ref() != Some(&ns) {
                continue;
            }
            let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let argv: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            if keep(&argv) {
                pids.push(pid);
            }
        }
        pids
    }

    /// `systemctl reboot` inside, then boots the same root again (nspawn ends on a reboot
    /// of its machine, as a VM's hypervisor would restart it).
    pub fn reboot(&mut self) {
        let _ = self.sh_output("systemctl reboot");
        let mut child = self.nspawn.take().unwrap();
        let started = Instant::now();
        while child.try_wait().unwrap().is_none() {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "the machine did not go down within 60 s of systemctl reboot"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        self.boot();
    }

    /// The nspawn log (the machine's console).
    pub fn console(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        // Killing a PID namespace's init ends every process in it; nspawn then exits.
        if self.init != 0 {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.init as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        if let Some(mut child) = self.nspawn.take() {
            let started = Instant::now();
            while child.try_wait().ok().flatten().is_none()
                && started.elapsed() < Duration::from_secs(10)
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn children_of(parent: u32) -> Vec<u32> {
    let text =
        fs::read_to_string(format!("/proc/{parent}/task/{parent}/children")).unwrap_or_default();
    text.split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect()
}

fn comm(pid: u32) -> Option<String> {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim().to_owned())
}

/// A root with nothing but busybox: `/bin/busybox` (static) and its applet links, `/etc`,
/// `/tmp`, and empty `/proc` and `/dev` for the mounts [`busybox_command`] makes.
pub fn busybox_root(root: &Path) {
    for dir in ["bin", "etc", "tmp", "proc", "dev", "opt"] {
        fs::create_dir_all(root.join(dir)).unwrap();
    }
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.exists())
        .expect("busybox (apt-get install busybox-static)");
    fs::copy(busybox, root.join("bin/busybox")).unwrap();
    run_ok(
        Command::new("chroot")
            .arg(root)
            .args(["/bin/busybox", "--install", "-s", "/bin"]),
    );
    fs::write(root.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").unwrap();
    fs::write(root.join("etc/group"), "root:x:0:\n").unwrap();
    fs::write(root.join("etc/hostname"), "busybox\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(root.join("tmp"), fs::Permissions::from_mode(0o1777)).unwrap();
}

/// `sh -c script` chrooted into `root`, in a PID and mount namespace of its own (with
/// `/proc` and `/dev` mounted there) that ends, with everything started in it, when this
/// command ends or is killed.
pub fn busybox_command(root: &Path, script: &str) -> Command {
    let root = root.display().to_string();
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--pid", "--kill-child"])
        .arg(format!("--mount-proc={root}/proc"))
        .args(["sh", "-c"])
        .arg(r#"mount --rbind /dev "$1/dev" && exec chroot "$1" /bin/sh -c "$2""#)
        .args(["sh", &root, script])
        .env_clear()
        // The host's chroot and mount first; inside, /bin is all there is.
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("HOME", "/");
    cmd
}
