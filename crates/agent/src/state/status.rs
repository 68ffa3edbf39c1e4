//! `agent status`: what an operator needs to know about this installation, in one screen.

use std::fmt::Write as _;

use agent_extract::atomic;
use agent_protocol::journal::Health;
use agent_updater::state;

use crate::config::Config;
use crate::state::home::Installation;

pub fn render(install: &Installation, config: &Config) -> String {
    let home = &install.home;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "agent {} ({})",
        install.version,
        agent_protocol::layout::PLATFORM
    );
    let _ = writeln!(out, "home:     {}", home.root().display());
    let id = atomic::read_text(&home.identity(), 1024)
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "(none yet: made on first start)".into());
    let _ = writeln!(out, "id:       {id}");
    let _ = writeln!(out, "servers:  {}", config.server.urls.join(", "));
    if let Some(line) =
        crate::contact::proxy::status_line(&config.proxy(), &|name| std::env::var(name).ok())
    {
        let _ = writeln!(out, "proxy:    {line}");
    }
    let _ = writeln!(
        out,
        "updates:  {}",
        if config.update.enabled {
            "enabled"
        } else {
            "disabled (update.enabled = false)"
        }
    );
    let health = atomic::read_text(&home.health_file(), 64 * 1024)
        .ok()
        .and_then(|t| serde_json::from_str::<Health>(&t).ok());
    match health {
        Some(h) => {
            let alive = agent_updater::process::is_alive(h.pid);
            let _ = writeln!(
                out,
                "process:  pid {} ({}), version {}",
                h.pid,
                if alive { "running" } else { "not running" },
                h.version
            );
            let contact = h
                .last_contact
                .map(|t| format!("{}s ago", state::now_secs().saturating_sub(t)))
                .unwrap_or_else(|| "never".into());
            let _ = writeln!(out, "contact:  last successful {contact}");
            if let Some(deployment) = &h.deployment {
                let _ = writeln!(out, "deployment: {deployment}");
            }
            if let Some(expected) = &h.refused_by_server {
                let _ = writeln!(out, "directive: refused; the server expects {expected}");
            }
            if let Some(window) = &h.waiting_window {
                let _ = writeln!(out, "window:   {}", window.describe(state::now_secs()));
            }
            let (held, _) = crate::update::locks::held(home, state::now_secs());
            if !held.is_empty() {
                let _ = writeln!(
                    out,
                    "locks:    updates held off by {}",
                    crate::update::locks::describe_all(&held)
                );
            }
            if let Some((at, told)) = crate::state::last_errors::last_told(home) {
                let line = crate::state::last_errors::describe_told(at, &told, state::now_secs());
                let _ = writeln!(
                    out,
                    "{:<9} {line}",
                    crate::state::last_errors::told_label(&told)
                );
            }
            out.push_str(&crate::workload::describe(h.workload.as_ref(), alive));
        }
        None => {
            let _ = writeln!(out, "process:  no run/health.json (not started yet?)");
        }
    }
    out.push_str(&errors_and_configuration(home));
    match state::read_journal(home) {
        Ok(Some(j)) => {
            // When and why it ended (a full disk named as such), or who is finishing it.
            let updater = agent_updater::lock::holder(&home.update_lock()).is_some();
            let line = agent_updater::outcome::describe(&j, state::now_secs(), updater);
            let _ = writeln!(out, "update:   {line}");
        }
        Ok(None) => {}
        Err(e) => {
            let _ = writeln!(out, "update:   journal unreadable: {e}");
        }
    }
    if let Ok(bad) = state::bad_versions(home)
        && !bad.is_empty()
    {
        let _ = writeln!(
            out,
            "bad bundles (not retried; `agent update --clear-bad` forgets):"
        );
        for sha in bad {
            let _ = writeln!(out, "  {sha}");
        }
    }
    if let Ok(pending) = state::pending_reports(home)
        && !pending.is_empty()
    {
        let _ = writeln!(
            out,
            "outbox:   {} report(s) waiting for a server",
            pending.len()
        );
    }
    out
}

/// The last error of each kind with its time, and the configuration set applied.
fn errors_and_configuration(home: &agent_protocol::layout::AgentHome) -> String {
    let mut out = String::new();
    let errors = crate::state::last_errors::read(home);
    let now = state::now_secs();
    for kind in crate::state::last_errors::Kind::ALL {
        let label = format!("last {} error:", kind.name());
        let _ = writeln!(
            out,
            "{label:<26}{}",
            crate::state::last_errors::describe(errors.get(&kind), now)
        );
    }
    let applied = crate::remote_config::running_hash(home);
    let _ = writeln!(
        out,
        "configuration: {}",
        if applied.is_empty() {
            "no set applied (the workload's files are the installed ones)".to_owned()
        } else {
            format!("set {applied} applied")
        }
    );
    if let Some(failed) = crate::remote_config::failed_hash(home) {
        let _ = writeln!(
            out,
            "               set {failed} failed here; waiting for the server to offer another"
        );
    }
    out
}
