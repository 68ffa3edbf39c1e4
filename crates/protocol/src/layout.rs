//! Names fixed by the design: entries inside a bundle and paths inside an installed agent.
//! Pure path arithmetic; nothing here touches the disk.

use std::path::{Path, PathBuf};

use crate::version::AgentVersion;

/// Entry of the bundle's zip payload that describes it.
pub const PROPERTIES_ENTRY: &str = "agent-update-version.properties";
pub const README_ENTRY: &str = "README.txt";
pub const LICENSE_ENTRY: &str = "LICENSE";
/// Directory of the bundle's zip payload holding the key rotation chain.
pub const ROTATIONS_DIR: &str = "rotations/";
/// Top directory of the distribution tarball.
pub const DIST_ROOT: &str = "agent";

pub const PROP_LATEST_VERSION: &str = "agent.latest.version";
pub const PROP_LATEST_BUILD: &str = "agent.latest.build-number";
pub const PROP_LATEST_PLATFORM: &str = "agent.latest.platform";

/// `agent-version.properties` inside a version directory: what the agent believes it is.
pub const AGENT_VERSION_FILE: &str = "agent-version.properties";
pub const PROP_AGENT_VERSION: &str = "agent.version";
pub const PROP_AGENT_BUILD: &str = "agent.build-number";

/// The signature of the bundle a version came from, kept beside it so the agent knows the
/// `signed-at` of what it runs (replay protection) after restarts and rollbacks.
pub const VERSION_SIGNATURE_FILE: &str = "bundle.minisig";
/// The bundle a version was installed from, kept beside its signature: the base an agent
/// asks the server's deltas from. Removed with its version.
pub const KEPT_BUNDLE_FILE: &str = "bundle";
/// Written last into an unpacked version: a version directory without it is debris.
pub const COMPLETE_MARKER: &str = ".complete";

/// `run/agent.exit`: `<pid> <exit code> <unix seconds>` of the agent's last exit, written
/// by the wrapper's supervisor; the updater reads it to tell a crash from a slow start.
pub const AGENT_EXIT_FILE: &str = "agent.exit";
/// `run/stop-requested`: `<unix seconds> <who asked>`, written by whatever stops the agent
/// on purpose (`agent-wrapper.sh stop`, and so systemd's stop and a shutdown; the Windows
/// service when it is stopped, `net stop` or a shutdown) before it stops it, and removed
/// by every start. The updater reads it to tell a stop that was asked for from a crash:
/// a new version stopped on request during its judgement is not a failed version.
pub const STOP_REQUEST_FILE: &str = "stop-requested";
/// Exit code of `agent run` for a configuration it refuses (sysexits' `EX_CONFIG`): the
/// wrapper does not restart it, since restarting cannot fix a typo.
pub const EXIT_CONFIG: u8 = 78;
/// Exit code of `agent run` when the server refuses its version and updates are disabled.
pub const EXIT_REFUSED: u8 = 3;
/// `data/agent-token.candidate`: see [`AgentHome::agent_token_candidate`].
pub const AGENT_TOKEN_CANDIDATE_FILE: &str = "agent-token.candidate";
/// Exit code of `agent run` asked to restart (an operator's `agent restart`): its
/// supervisor starts it again at once, without counting it as a crash (sysexits'
/// `EX_TEMPFAIL`).
pub const EXIT_RESTART: u8 = 75;

/// `bin/agent-wrapper.sh` in each Unix version: the supported way to run the agent
/// (`start|stop|restart|status|kill`); it reads `conf/agent-env.sh` and hands the
/// command to [`SERVICE_BIN`] beside it.
pub const WRAPPER_SCRIPT: &str = "agent-wrapper.sh";
/// `bin/agent-service` in each Unix version: the supervisor and the commands behind the
/// wrapper (the Unix half of what [`SERVICE_EXE`] is on Windows).
pub const SERVICE_BIN: &str = "agent-service";
/// The hidden command of [`SERVICE_BIN`] (and of the wrapper before it) that is the
/// supervisor: what a process's command line is checked for before it is signalled.
pub const SUPERVISE_COMMAND: &str = "__supervise";
/// The agent's program on Unix (`bin/agent`).
pub const AGENT_BIN: &str = "agent";

/// The Windows service's program: `bin\agent-service.exe` in each version, and the
/// installed copy in `<home>\bin\` that the service runs (its binPath).
pub const SERVICE_EXE: &str = "agent-service.exe";
/// The agent's program on Windows (`bin\agent.exe`).
pub const AGENT_EXE_WINDOWS: &str = "agent.exe";

/// `data/update/updater`: the bundle being installed, under the name the wrapper (or the
/// service) runs recovery with; `updater.exe` on Windows, which runs programs by name.
pub fn updater_file_name() -> String {
    format!("updater{}", std::env::consts::EXE_SUFFIX)
}

/// The named event an agent on Windows waits on (created by the agent, set by the
/// service or the updater to stop it gracefully).
pub fn stop_event_name(pid: u32) -> String {
    format!("Global\\agent-stop-{pid}")
}

/// The platform this code was built for, as a Rust target triple.
pub const PLATFORM: &str = env!("AGENT_PLATFORM");

pub fn dist_entry(version: &AgentVersion) -> String {
    format!("agent-{}.tar.gz", version.version_str())
}

/// The zip entries of the `n`th (1-based) rotation statement, to key `to`: the new
/// public key file and its signature by the key before it.
pub fn rotation_entries(n: usize, to: &str) -> (String, String) {
    let stem = format!("{ROTATIONS_DIR}{n:02}-{to}");
    (format!("{stem}.pub"), format!("{stem}.minisig"))
}

/// The files `agent-bundle rotate-key` writes for a rotation to key `to`.
pub fn rotation_file_names(to: &str) -> (String, String) {
    (
        format!("rotation-{to}.pub"),
        format!("rotation-{to}.minisig"),
    )
}

pub fn bundle_file_name(version: &AgentVersion) -> String {
    format!("agent-bundle-{}", version.version_str())
}

pub fn signature_file_name(bundle_file_name: &str) -> String {
    format!("{bundle_file_name}.minisig")
}

/// A release's Windows installer, `agent-<version>-<target>.msi`, as
/// `scripts/build-dist.sh` names it.
pub fn msi_file_name(version: &AgentVersion, platform: &str) -> String {
    format!("agent-{}-{platform}.msi", version.version_str())
}

/// Whether `name` is named as a release's MSI is (`agent-….msi`, not a bundle's name):
/// what it holds is checked from its signature, not from its name.
pub fn is_msi_file_name(name: &str) -> bool {
    name.starts_with("agent-") && !name.starts_with("agent-bundle-") && name.ends_with(".msi")
}

/// The bundle an MSI named `agent-<version>-<target>.msi` packs, as `build-dist.sh`
/// names it beside the MSI: `agent-bundle-<version>-<target>.exe`.
pub fn bundle_of_msi(msi_file_name: &str) -> Option<String> {
    let rest = msi_file_name.strip_prefix("agent-")?.strip_suffix(".msi")?;
    is_msi_file_name(msi_file_name).then(|| format!("agent-bundle-{rest}.exe"))
}

/// The directory layout of an installed agent (`AGENT_HOME`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentHome {
    root: PathBuf,
}

impl AgentHome {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn current(&self) -> PathBuf {
        self.root.join("current")
    }

    pub fn versions(&self) -> PathBuf {
        self.root.join("versions")
    }

    pub fn version_dir(&self, version: &AgentVersion) -> PathBuf {
        self.versions().join(version.to_string())
    }

    pub fn conf(&self) -> PathBuf {
        self.root.join("conf")
    }

    pub fn agent_toml(&self) -> PathBuf {
        self.conf().join("agent.toml")
    }

    pub fn data(&self) -> PathBuf {
        self.root.join("data")
    }

    pub fn logs(&self) -> PathBuf {
        self.root.join("logs")
    }

    pub fn run(&self) -> PathBuf {
        self.root.join("run")
    }

    pub fn pid_file(&self) -> PathBuf {
        self.run().join("agent.pid")
    }

    /// `run/wrapper.pid`: the supervisor that runs the agent on Unix (the name is the
    /// wrapper script's, which was the supervisor before `agent-service`).
    pub fn supervisor_pid_file(&self) -> PathBuf {
        self.run().join("wrapper.pid")
    }

    /// `run/workload.pid`: the workload's pid (its process group), one number.
    pub fn workload_pid_file(&self) -> PathBuf {
        self.run().join("workload.pid")
    }

    /// `run/workload.starttime`: `<pid> <start time in clock ticks>` of the process
    /// [`Self::workload_pid_file`] names, so that a pid recycled by another program is
    /// never taken for the workload.
    pub fn workload_start_file(&self) -> PathBuf {
        self.run().join("workload.starttime")
    }

    /// `logs/agent.out`: the agent's console (its stdout and stderr).
    pub fn agent_out(&self) -> PathBuf {
        self.logs().join("agent.out")
    }

    /// `logs/wrapper.log`: the supervisor's and the wrapper's lines.
    pub fn wrapper_log(&self) -> PathBuf {
        self.logs().join("wrapper.log")
    }

    /// `data/last-errors.json`: the last error of each kind the agent met.
    pub fn last_errors(&self) -> PathBuf {
        self.data().join("last-errors.json")
    }

    /// Update locks: a file here (its text the reason) holds off bundle updates.
    pub fn update_locks(&self) -> PathBuf {
        self.run().join("update-locks")
    }

    pub fn update_lock(&self) -> PathBuf {
        self.run().join("update.lock")
    }

    pub fn health_file(&self) -> PathBuf {
        self.run().join("health.json")
    }

    pub fn exit_file(&self) -> PathBuf {
        self.run().join(AGENT_EXIT_FILE)
    }

    /// `run/stop-requested` ([`STOP_REQUEST_FILE`]).
    pub fn stop_request(&self) -> PathBuf {
        self.run().join(STOP_REQUEST_FILE)
    }

    pub fn journal(&self) -> PathBuf {
        self.data().join("update-journal.json")
    }

    pub fn bad_versions(&self) -> PathBuf {
        self.data().join("bad-versions")
    }

    pub fn outbox(&self) -> PathBuf {
        self.data().join("outbox")
    }

    pub fn update_dir(&self) -> PathBuf {
        self.data().join("update")
    }

    pub fn identity(&self) -> PathBuf {
        self.data().join("agent-id")
    }

    /// The credentials a server issued this agent (mode 0600).
    pub fn agent_token(&self) -> PathBuf {
        self.data().join("agent-token")
    }

    /// A credential a rotation offered, kept (0600) until a server takes it; then it
    /// replaces [`AgentHome::agent_token`].
    pub fn agent_token_candidate(&self) -> PathBuf {
        self.data().join(AGENT_TOKEN_CANDIDATE_FILE)
    }

    /// The last command a server told this agent (a restart, a move) and how it ended,
    /// until the server heard it: what a restarted agent reports, and what keeps a
    /// command carried twice from being done twice.
    pub fn command_file(&self) -> PathBuf {
        self.data().join("command.json")
    }

    /// Where the server told this agent to export its own telemetry (0600: its headers
    /// may be credentials); none when it exports nothing.
    pub fn telemetry_file(&self) -> PathBuf {
        self.data().join("telemetry.json")
    }

    /// Signing keys this agent trusted once and no longer does (one key id a line).
    pub fn retired_keys(&self) -> PathBuf {
        self.data().join("retired-keys")
    }

    pub fn update_log(&self) -> PathBuf {
        self.logs().join("update.log")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_design() {
        let v: AgentVersion = "2.2.0+1234".parse().unwrap();
        assert_eq!(dist_entry(&v), "agent-2.2.0.tar.gz");
        assert_eq!(bundle_file_name(&v), "agent-bundle-2.2.0");
        assert_eq!(
            signature_file_name("agent-bundle-2.2.0"),
            "agent-bundle-2.2.0.minisig"
        );
        let msi = msi_file_name(&v, "x86_64-pc-windows-gnu");
        assert_eq!(msi, "agent-2.2.0-x86_64-pc-windows-gnu.msi");
        assert!(is_msi_file_name(&msi));
        assert_eq!(
            bundle_of_msi(&msi).as_deref(),
            Some("agent-bundle-2.2.0-x86_64-pc-windows-gnu.exe")
        );
        for not_msi in ["agent-bundle-2.2.0.msi", "agent-2.2.0.exe", "setup.msi"] {
            assert!(!is_msi_file_name(not_msi), "{not_msi}");
            assert_eq!(bundle_of_msi(not_msi), None, "{not_msi}");
        }
        let home = AgentHome::new("/opt/agent");
        assert_eq!(
            home.version_dir(&v),
            Path::new("/opt/agent/versions/2.2.0+1234")
        );
        assert_eq!(home.pid_file(), Path::new("/opt/agent/run/agent.pid"));
        assert_eq!(
            home.stop_request(),
            Path::new("/opt/agent/run/stop-requested")
        );
    }
}
