//! `agent-bundle-<v> --install`: what the install did, said to the person who ran it.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use agent_protocol::AgentVersion;
use agent_protocol::layout::{self, AgentHome};

use crate::error::Result;
use crate::install::{self, InstallRequest, TrustSource};
use crate::service::ServiceRequest;

/// `--install --upgrade` where an agent is installed: `None` when none is (a plain
/// install follows); else the agent is updated to the carried version through the
/// updater, as an update from its server would be, when that version is newer, and left
/// as it is when not.
pub fn upgrade(bundle: &Path, prefix: &Path) -> Result<Option<ExitCode>> {
    let home = home_in(prefix)?;
    let Ok(version_dir) = agent_extract::current::read_dir(&home.current()) else {
        return Ok(None);
    };
    let running = agent_extract::payload::installed_version(&version_dir)?;
    let carried = install::open_payload(bundle)?.facts()?.version;
    if !newer(&carried, &running) {
        println!(
            "Agent {running} is installed in {}; this bundle carries {carried}, which is not newer: nothing changed.",
            home.root().display()
        );
        return Ok(Some(ExitCode::SUCCESS));
    }
    println!(
        "Agent {running} is installed in {}; updating it to {carried}.",
        home.root().display()
    );
    let outcome = agent_updater::run_update(&agent_updater::Request {
        bundle,
        home: home.root(),
        wait_pid: None,
        recover: false,
    })?;
    println!("{outcome}");
    Ok(Some(ExitCode::SUCCESS))
}

/// `--uninstall[=PREFIX]`: the installed version's `agent uninstall --yes`, its words
/// and its exit code; a prefix with no agent in it has nothing to uninstall.
pub fn uninstall(prefix: &Path) -> Result<ExitCode> {
    let home = home_in(prefix)?;
    let Ok(version_dir) = agent_extract::current::read_dir(&home.current()) else {
        println!(
            "No agent is installed in {}: nothing to uninstall.",
            home.root().display()
        );
        return Ok(ExitCode::SUCCESS);
    };
    let agent = version_dir.join("bin").join(format!(
        "agent{}",
        agent_protocol::platform::exe_suffix(layout::PLATFORM)
    ));
    let status = std::process::Command::new(&agent)
        .arg("--home")
        .arg(home.root())
        .args(["uninstall", "--yes"])
        .stdin(std::process::Stdio::null())
        .status()
        .map_err(|e| {
            crate::error::BundleError::Invalid(format!("cannot run {}: {e}", agent.display()))
        })?;
    Ok(if status.success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `PREFIX\agent`, absolute and without `.` (the MSI says `"C:\Program Files\."`: a
/// backslash before the closing quote would escape it): the agent compares its own path
/// with the home's.
fn home_in(prefix: &Path) -> Result<AgentHome> {
    let prefix = std::path::absolute(prefix)
        .map_err(|e| crate::error::BundleError::Invalid(format!("{}: {e}", prefix.display())))?;
    Ok(AgentHome::new(prefix.join(layout::DIST_ROOT)))
}

/// Whether `a` comes after `b`: by version, then by build number.
fn newer(a: &AgentVersion, b: &AgentVersion) -> bool {
    let build = |v: &AgentVersion| v.build().parse::<u64>().ok();
    match a.version().cmp(b.version()) {
        std::cmp::Ordering::Equal => matches!((build(a), build(b)), (Some(x), Some(y)) if x > y),
        order => order.is_gt(),
    }
}

/// Installs, then says what was trusted, joined and started.
pub fn run(service: &ServiceRequest<'_>, request: &InstallRequest<'_>) -> Result<ExitCode> {
    let installed = install::install(request)?;
    let home = installed.home.display();
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "Installed agent {} for {} in {home}.",
        installed.facts.version, installed.facts.platform
    );
    let _ = match &installed.trust {
        TrustSource::Operator { path, key_id } => {
            writeln!(
                out,
                "Trusting update key {key_id} from {} (--trust-key); the bundle's signature verified with it.",
                path.display()
            )
        }
        TrustSource::Bundle {
            key_id,
            signature_checked: true,
        } => writeln!(
            out,
            "Trusting update key {key_id} shipped inside the bundle; its signature verified with it. Pass --trust-key to pin your own."
        ),
        TrustSource::Bundle {
            key_id,
            signature_checked: false,
        } => writeln!(
            out,
            "Trusting update key {key_id} shipped inside the bundle; no .minisig beside the bundle, so its signature was NOT checked. Pass --trust-key with the signature to check it."
        ),
    };
    if let Some(chain) = &installed.chain {
        let _ = writeln!(
            out,
            "The bundle is signed by key {} through the key rotation {chain}; the agent trusts key {} and refuses the older keys.",
            chain.end.key_id(),
            chain.end.key_id()
        );
    }
    if request.ca_file.is_some() {
        let _ = writeln!(
            out,
            "HTTPS servers are verified against the CA in {home}/{} only.",
            install::CA_FILE
        );
    }
    if let Some(group) = request.group {
        let _ = writeln!(out, "It joins the rollout group {group} (agent.group).");
    }
    if !request.labels.is_empty() {
        let _ = writeln!(
            out,
            "Its labels: {} (agent.labels).",
            request.labels.join(", ")
        );
    }
    if let Some(url) = request.server_url {
        let _ = writeln!(out, "It talks to the update server {url} (server.urls).");
    }
    if let Some(proxy) = request.proxy {
        let _ = writeln!(
            out,
            "It reaches the server through the proxy {} (server.proxy).",
            install::shown_proxy(proxy)
        );
    }
    if request.enroll_token.is_some() {
        let _ = writeln!(
            out,
            "The enrollment token is in {home}/conf/agent.toml (server.enrollment-token)."
        );
    }
    let started = crate::service::after_install(&installed.home, service)?;
    let _ = writeln!(out, "{started}");
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundle_is_newer_by_version_then_by_build() {
        let v = |s: &str, b: &str| AgentVersion::new(s, b).unwrap();
        assert!(newer(&v("2.0.0", "1"), &v("1.9.9", "50")));
        assert!(newer(&v("1.0.0", "10"), &v("1.0.0", "9")));
        assert!(!newer(&v("1.0.0", "9"), &v("1.0.0", "9")));
        assert!(!newer(&v("1.0.0", "1"), &v("2.0.0", "1")));
    }
}
