//! `agent-bundle-<v> --install`: what the install did, said to the person who ran it.

use std::io::Write;
use std::process::ExitCode;

use crate::error::Result;
use crate::install::{self, InstallRequest, TrustSource};
use crate::service::ServiceRequest;

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
