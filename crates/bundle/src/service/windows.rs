use std::path::Path;
use std::process::Command;

use agent_extract::{atomic, current};
use agent_protocol::layout;

use super::ServiceRequest;
use crate::error::{BundleError, Result};

/// `--install` with no value: where Windows programs go.
pub const DEFAULT_PREFIX: &str = r"C:\Program Files";

pub fn check(_request: &ServiceRequest<'_>) -> Result<()> {
    Ok(())
}

/// Copies the version's `agent-service.exe` to `<home>\bin\` (the stable program the
/// service runs, replaced later only by itself) and, unless `--no-service`, registers
/// the service and starts it; says what was done.
pub fn after_install(home: &Path, request: &ServiceRequest<'_>) -> Result<String> {
    let version_dir = current::read_dir(&home.join("current"))?;
    let carried = version_dir.join("bin").join(layout::SERVICE_EXE);
    let installed = home.join("bin").join(layout::SERVICE_EXE);
    std::fs::create_dir_all(home.join("bin")).map_err(|e| io(home, e))?;
    atomic::copy_file(&carried, &installed)?;
    // `<home>\bin\agent.exe`: the stable path of the agent's command line (a version
    // without a launcher installs none).
    let launcher = version_dir
        .join("bin")
        .join(agent_updater::launcher::LAUNCHER_EXE);
    if launcher.is_file() {
        atomic::copy_file(&launcher, &home.join("bin").join(layout::AGENT_EXE_WINDOWS))?;
    }
    let mut said = String::new();
    if request.add_to_path {
        let bin = home.join("bin");
        match agent_updater::launcher::add_to_path(&bin) {
            Ok(true) => {
                said = format!(
                    "{} is on the system Path: type agent status anywhere (in a new window).\n",
                    bin.display()
                )
            }
            Ok(false) => {}
            Err(e) => {
                said = format!(
                    "{} is not on the system Path ({e}); run it by its full path.\n",
                    bin.display()
                )
            }
        }
    }
    if request.none {
        return Ok(format!(
            "{said}The service is not registered (--no-service). Register and start it with: {} install",
            installed.display()
        ));
    }
    let name = request.name.unwrap_or("agent");
    let out = Command::new(&installed)
        .args(["install", "--service-name", name, "--home"])
        .arg(home)
        .output()
        .map_err(|e| io(&installed, e))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        return Err(BundleError::Invalid(format!(
            "the agent is installed but its service did not start: {}; fix it, then run {} start",
            text.trim(),
            installed.display()
        )));
    }
    Ok(format!(
        "{said}{}\nManage it with: {} start|stop|restart|status (or net start|stop {name}, sc query {name}).\nThe agent's commands: {} status|lock|uninstall",
        text.trim(),
        installed.display(),
        home.join("bin").join(layout::AGENT_EXE_WINDOWS).display()
    ))
}

/// The command that stops the agent installed at `home`.
pub fn stop_command(home: &Path) -> String {
    format!(
        "{} stop",
        home.join("bin").join(layout::SERVICE_EXE).display()
    )
}

fn io(path: &Path, e: std::io::Error) -> BundleError {
    BundleError::Invalid(format!("{}: {e}", path.display()))
}

/// Keeps the installing bundle beside its version (the base of the next delta): a copy,
/// never a hard link. The MSI's bundle (`agent-setup\agent-bundle.exe`) runs the agent's
/// uninstall, and Windows refuses to delete any name of a running program: a link in
/// `versions\` would keep `versions\` from going. It would also change with the MSI's
/// file when a repair or an upgrade rewrites it.
pub fn keep_bundle(bundle: &Path, kept: &Path) -> agent_extract::Result<()> {
    atomic::copy_file(bundle, kept).map(|_| ())
}
