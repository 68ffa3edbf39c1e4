//! Downloading ahead of a maintenance window (`update.download-ahead`): an agent told of
//! a release behind its window downloads (or rebuilds from a delta) and verifies it into
//! `data/update/` now, without handing it to the updater. When the window opens the
//! server refuses the old version as usual, and the update finds the verified bundle
//! there (a complete download of the same bundle is reused), so it installs at once.

use agent_protocol::AgentVersion;
use agent_protocol::journal::opening;
use agent_protocol::wire::WindowOffer;
use tokio::sync::watch;

use crate::config::Config;
use crate::contact::client::Client;
use crate::state::home::Installation;
use crate::update::{self, Outcome, UpdateContext};

/// What the agent did about maintenance windows so far.
#[derive(Debug, Default)]
pub struct Ahead {
    /// The release (sha256) it last acted on: downloaded, or found it could not.
    acted: Option<String>,
}

impl Ahead {
    /// The `ahead` of a held connect: `None` when the agent does not download ahead (a
    /// window is no news to it before it opens).
    pub fn query(&self, config: &Config) -> Option<String> {
        (config.update.download_ahead && config.update.enabled)
            .then(|| self.acted.clone().unwrap_or_else(|| "1".to_owned()))
    }

    /// The server accepted this agent until `window` opens: fetches and verifies its
    /// release now, once per release. What fails is said and left to the update at the
    /// window's opening, which tries (and reports) as always.
    pub async fn told(
        &mut self,
        install: &Installation,
        config: &Config,
        client: &Client,
        id: &str,
        window: &WindowOffer,
        stop: &watch::Receiver<bool>,
    ) {
        let opens = opening(window.opens_at);
        if !config.update.download_ahead || !config.update.enabled {
            if self.acted.as_deref() != Some(window.sha256.as_str()) {
                tracing::info!(
                    "{} waits for its maintenance window (opens {opens}); update.download-ahead is off, so it downloads then",
                    window.expected
                );
                self.acted = Some(window.sha256.clone());
            }
            return;
        }
        if self.acted.as_deref() == Some(window.sha256.as_str()) {
            return;
        }
        self.acted = Some(window.sha256.clone());
        let Ok(expected) = window.expected.parse::<AgentVersion>() else {
            tracing::warn!(
                "the server names {:?} for the maintenance window, which is not VERSION+BUILD; nothing downloaded ahead",
                window.expected
            );
            return;
        };
        if expected == install.version {
            return;
        }
        tracing::info!(
            "{expected} waits for its maintenance window (opens {opens}); downloading it ahead"
        );
        let mut ctx = UpdateContext {
            install,
            config,
            client,
            agent_id: id,
            shutdown: stop.clone(),
        };
        match update::fetch_verified(&mut ctx, Some(&expected)).await {
            Ok(ready) => tracing::info!(
                "downloaded and verified {} ahead of its maintenance window ({} in {:.2}s); it installs when the window opens ({opens})",
                ready.info.agent,
                ready.path.display(),
                ready.timings.download.as_secs_f64()
            ),
            Err(Outcome::ShuttingDown) => {}
            Err(Outcome::Degraded { reason, .. }) => tracing::warn!(
                "could not download {expected} ahead of its maintenance window: {reason}; the update tries again when the window opens ({opens})"
            ),
        }
    }
}
