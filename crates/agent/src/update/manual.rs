//! `agent update [--check]`: the update on an operator's request.

use std::process::ExitCode;

use agent_protocol::layout::AgentHome;
use agent_updater::state;
use tokio::sync::watch;

use crate::config::Config;
use crate::contact::client::{Client, Trust};
use crate::state::home::Installation;
use crate::update::{self, Outcome, UpdateContext};

pub async fn update(
    install: &Installation,
    config: &Config,
    check: bool,
) -> anyhow::Result<ExitCode> {
    let id = crate::contact::identity::load_or_create(&install.home)?;
    let hello = crate::contact::identity::hello(&id, config);
    let client = Client::new(
        config.server.urls.clone(),
        install.version.clone(),
        hello,
        Trust::of(config, &install.home),
    )?;
    if check {
        let info = client.version_info(None).await?;
        println!("this agent runs {}", install.version);
        println!(
            "{} offers {} ({} bytes, sha256 {})",
            client.base(),
            info.agent,
            info.size,
            info.sha256
        );
        // What the running agent last heard: a window the fleet holds this update for,
        // and the locks on this machine, as the server has them.
        let health = agent_extract::atomic::read_text(&install.home.health_file(), 64 * 1024)
            .ok()
            .and_then(|t| serde_json::from_str::<agent_protocol::journal::Health>(&t).ok());
        if let Some(window) = health.and_then(|h| h.waiting_window) {
            println!("{}", window.describe(state::now_secs()));
            println!(
                "the fleet installs it when that window opens; `agent update` would install it now, outside the window"
            );
        }
        let (held, _) = crate::update::locks::held(&install.home, state::now_secs());
        if !held.is_empty() {
            println!(
                "update locks held here: {}; the fleet's update waits for them (`agent update` does not)",
                crate::update::locks::describe_all(&held)
            );
        }
        if info.agent == install.version {
            println!("up to date");
        } else if state::is_bad(&install.home, &info.sha256)? {
            println!(
                "that bundle failed here before (data/bad-versions); it is not retried. `agent update --clear-bad` forgets it"
            );
        } else if let Err(Outcome::Degraded { reason, .. }) =
            update::check_offer(&client, config, install, &info).await
        {
            // The same checks an update makes before it downloads a byte.
            println!("this agent would refuse it: {reason}");
            return Ok(ExitCode::FAILURE);
        } else {
            println!(
                "its signature and signed claim check out here; `agent update` would download, verify and install it"
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    let (_stop_tx, stop_rx) = watch::channel(false);
    let mut ctx = UpdateContext {
        install,
        config,
        client: &client,
        agent_id: &id,
        shutdown: stop_rx,
    };
    let ready = match update::fetch_verified(&mut ctx, None).await {
        Ok(r) => r,
        Err(Outcome::Degraded { reason, .. }) => anyhow::bail!("{reason}"),
        Err(other) => anyhow::bail!("update did not start: {other:?}"),
    };
    // The wrapper runs the agent under the canonical home; match it the same way.
    let canonical = agent_extract::os::canonical(install.home.root())
        .map(AgentHome::new)
        .unwrap_or_else(|_| install.home.clone());
    let daemon = agent_updater::process::running_agent(&canonical);
    let pid = update::hand_off(&ctx, &ready)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    // Keep the running agent up while the new version unpacks, then ask it to stop
    // rather than let the updater time out waiting for it.
    let to = &ready.info.agent;
    let patience = std::time::Duration::from_secs(300);
    if let update::HandOff::Stay(why) =
        update::wait_for_unpack(&install.home, to, pid, patience).await
    {
        anyhow::bail!(
            "the update to {to} stopped before the switch: {why}; {} keeps running. See logs/update.log",
            install.version
        );
    }
    if let Some(daemon) = daemon {
        agent_updater::process::terminate(daemon);
    }
    println!(
        "updater started (pid {pid}): {} -> {}; follow logs/update.log",
        install.version, ready.info.agent
    );
    Ok(ExitCode::SUCCESS)
}
