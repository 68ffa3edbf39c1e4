//! server.toml read again while the server runs (SIGHUP, `systemctl reload`), so that
//! changing a maintenance window needs no restart.
//!
//! Taken at once: the `[[maintenance]]` windows (held connects look again, agents waiting
//! for a window are told their new one at their next contact) and `[rollout]` (the plan
//! new rollouts start under; a rollout under way keeps the plan it started with, as its
//! row holds it). Both are fleet policy, kept in the fleet database as deployment
//! `default`'s (see [`agent_fleet::policy`]): an edit of the file read again is written
//! there, audited, and every server of the fleet follows it. Everything else is read at
//! start only: a change to it is logged as waiting for a restart, and the server goes on
//! as it started. A file that does not parse or validate changes nothing; the error
//! names the file and the line.
//!
//! What changed is [`changes`], a pure comparison; [`Reloader`] reads the file and
//! applies it; [`spawn`] waits for the signal.

use std::sync::{Arc, Mutex};

use agent_fleet::Fleet;
use agent_fleet::audit::{Change, Outcome};
use agent_fleet::deployments::DEFAULT;
use agent_fleet::policy::{self, NewWindow};
use agent_fleet::rollout::plan::Plan;
use agent_protocol::settings::{Environment, ProcessEnv};

use crate::config::{Config, ConfigSource, RolloutSection};
use crate::error::ServerError;
use crate::signals::Reloads;

/// What a new reading of the configuration changes, for the log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// The windows before and after, described.
    pub windows: Option<(String, String)>,
    /// `[rollout]` before and after, described.
    pub plan: Option<(String, String)>,
    /// Sections that changed but are read at start only (`[agents]`, …).
    pub at_restart: Vec<&'static str>,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.windows.is_none() && self.plan.is_none() && self.at_restart.is_empty()
    }
}

/// `[rollout]` in one line: `waves 1, 50%, 100%; wave-wait 600s; max-failures 10%;
/// agent-deadline 1800s`.
fn describe_plan(r: &RolloutSection) -> String {
    format!(
        "waves {}; wave-wait {}s; max-failures {}; agent-deadline {}s",
        r.waves.join(", "),
        r.wave_wait,
        r.max_failures,
        r.agent_deadline
    )
}

/// What `new` changes of `running` (both read whole and checked).
pub fn changes(running: &Config, new: &Config) -> Changes {
    let windows = (running.maintenance != new.maintenance).then(|| {
        let describe = |c: &Config| {
            c.maintenance_schedule()
                .map(|s| crate::maintenance::describe_all(&s))
                .unwrap_or_else(|e| e)
        };
        (describe(running), describe(new))
    });
    let plan = (running.rollout != new.rollout)
        .then(|| (describe_plan(&running.rollout), describe_plan(&new.rollout)));
    let mut at_restart = Vec::new();
    let sections: [(&'static str, bool); 8] = [
        ("[server]", running.server == new.server),
        ("[downloads]", running.downloads == new.downloads),
        ("[bundle]", running.bundle == new.bundle),
        ("[releases]", running.releases == new.releases),
        ("[agents]", running.agents == new.agents),
        ("[admin]", running.admin == new.admin),
        ("[database]", running.database == new.database),
        ("[tls]", running.tls == new.tls),
    ];
    for (name, same) in sections {
        if !same {
            at_restart.push(name);
        }
    }
    Changes {
        windows,
        plan,
        at_restart,
    }
}

/// Reads the configuration again and applies what can be taken live.
pub struct Reloader {
    source: ConfigSource,
    /// The configuration as the server runs it: as read at start, with the live parts
    /// as last taken.
    running: Mutex<Config>,
    fleet: Arc<Fleet>,
}

/// A file read again: what changed, and the live parts as it says them.
pub struct Reloaded {
    pub changes: Changes,
    plan: Plan,
    windows: Vec<NewWindow>,
    /// The file as read, whose live parts become the running ones once taken.
    new: Config,
}

impl Reloader {
    /// `running` is the configuration as read at start, before the server filled in
    /// anything of its own (the bound port in `server.public-url`).
    pub fn new(source: ConfigSource, running: Config, fleet: Arc<Fleet>) -> Self {
        Self {
            source,
            running: Mutex::new(running),
            fleet,
        }
    }

    /// Where the configuration is read from, for the log.
    pub fn shown(&self) -> String {
        match &self.source.file {
            Some(file) => file.display().to_string(),
            None => "the environment (no --config file)".to_owned(),
        }
    }

    /// Reads the file and the environment again: what changed, when the whole reads and
    /// checks. Nothing is taken yet ([`Reloader::apply`]).
    pub fn reload(&self, env: &dyn Environment) -> Result<Reloaded, ServerError> {
        let new = self.source.load(env)?;
        // Both were checked by `load`; asked again for the values.
        let windows = new.maintenance_windows().map_err(ServerError::Config)?;
        let plan = new.rollout_plan().map_err(ServerError::Config)?;
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        let changes = changes(&running, &new);
        Ok(Reloaded {
            changes,
            plan,
            windows,
            new,
        })
    }

    /// Takes what the file changed: an edited `[[maintenance]]` or `[rollout]` becomes
    /// the fleet's policy for `default` (audited as the file's), and the file is what the
    /// fleet's is compared with from now on.
    pub async fn apply(&self, reloaded: &Reloaded) -> Result<(), ServerError> {
        let fleet = &self.fleet;
        let changes = &reloaded.changes;
        let mut details = serde_json::Map::new();
        if changes.windows.is_some() {
            policy::replace_windows(&fleet.db, DEFAULT, &reloaded.windows).await?;
            details.insert(
                "windows".into(),
                serde_json::json!(changes.windows.as_ref().map(|(_, now)| now)),
            );
        }
        if changes.plan.is_some() {
            policy::set_default_plan(&fleet.db, &reloaded.plan).await?;
            fleet.configs.set_plan(reloaded.plan.clone());
            details.insert(
                "rollout".into(),
                serde_json::json!(changes.plan.as_ref().map(|(_, now)| now)),
            );
        }
        fleet
            .deployments
            .set_file_policy(reloaded.plan.clone(), reloaded.windows.clone());
        {
            // Only the live parts, once taken: the rest runs as it started, and a later
            // reload says again that it waits for a restart.
            let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
            running.maintenance = reloaded.new.maintenance.clone();
            running.rollout = reloaded.new.rollout.clone();
        }
        fleet.deployments.refresh().await?;
        if !details.is_empty() {
            details.insert("deployment".into(), serde_json::json!(DEFAULT));
            details.insert("file".into(), serde_json::json!(self.shown()));
            let change = Change {
                who: "server.toml",
                address: "",
                action: "policy.reload",
                outcome: Outcome::Done,
                details: serde_json::Value::Object(details),
            };
            if let Err(e) = fleet.audit().record(&change).await {
                tracing::error!("cannot write the audit log: {e}");
            }
        }
        Ok(())
    }
}

/// An error in one line of the log: TOML's parse errors show the line of the file under
/// their first line, with a caret; the first line already says where.
fn one_line(e: &str) -> String {
    e.lines()
        .map(str::trim)
        .filter(|l| {
            let gutter = l
                .trim_start_matches(|c: char| c.is_ascii_digit())
                .trim_start();
            !l.is_empty() && !gutter.starts_with('|')
        })
        .collect::<Vec<_>>()
        .join(": ")
}

/// Says what a reload did, in the server's log.
fn log(shown: &str, result: Result<&Changes, ServerError>) {
    let changes = match result {
        Ok(changes) => changes,
        Err(e) => {
            let e = match e {
                ServerError::Config(e) => one_line(&e),
                other => other.to_string(),
            };
            tracing::error!(
                "configuration read again (SIGHUP) and not taken: {e}; the server keeps its maintenance windows and [rollout] as they were; fix the file and send SIGHUP again"
            );
            return;
        }
    };
    if changes.is_empty() {
        tracing::info!(
            "{shown} read again (SIGHUP): nothing changed in [[maintenance]] or [rollout]"
        );
    }
    if let Some((was, now)) = &changes.windows {
        tracing::info!(
            "{shown} read again (SIGHUP): maintenance windows are now {now} (were {was})"
        );
    }
    if let Some((was, now)) = &changes.plan {
        tracing::info!(
            "{shown} read again (SIGHUP): [rollout] is now {now} (was {was}); it applies to rollouts that start from now on, a rollout under way keeps its plan"
        );
    }
    if !changes.at_restart.is_empty() {
        tracing::warn!(
            "{shown} read again (SIGHUP): {} changed, which the server reads at start only; restart it to take them (only [[maintenance]] and [rollout] are taken live)",
            changes.at_restart.join(", ")
        );
    }
}

/// Reads the configuration again at every reload signal, for as long as the server runs.
pub fn spawn(reloader: Reloader) {
    let mut reloads = match Reloads::listen() {
        Ok(reloads) => reloads,
        Err(e) => {
            tracing::warn!(
                "cannot listen for SIGHUP ({e}): changing [[maintenance]] or [rollout] needs a restart"
            );
            return;
        }
    };
    let reloader = Arc::new(reloader);
    tokio::spawn(async move {
        loop {
            reloads.next().await;
            let r = Arc::clone(&reloader);
            // Reads a file: off the runtime's threads.
            let read = match tokio::task::spawn_blocking(move || r.reload(&ProcessEnv)).await {
                Ok(read) => read,
                Err(e) => {
                    tracing::error!("reading the configuration again stopped: {e}");
                    continue;
                }
            };
            let shown = reloader.shown();
            let reloaded = match read {
                Ok(reloaded) => reloaded,
                Err(e) => {
                    log(&shown, Err(e));
                    continue;
                }
            };
            match reloader.apply(&reloaded).await {
                Ok(()) => log(&shown, Ok(&reloaded.changes)),
                Err(e) => tracing::error!(
                    "{shown} read again (SIGHUP) and not taken: the fleet database did not take its [[maintenance]] or [rollout] ({e}); send SIGHUP again when it is back"
                ),
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_protocol::settings::VarMap;

    fn read(text: &str) -> Result<Config, ServerError> {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("server.toml");
        std::fs::write(&file, text).unwrap();
        ConfigSource {
            file: Some(file),
            ..ConfigSource::default()
        }
        .load(&VarMap(Vec::new()))
    }

    const WINDOW: &str =
        "[[maintenance]]\ngroups = [\"db\"]\nstart = \"02:00\"\nduration = \"3h\"\n";

    #[test]
    fn a_new_window_and_plan_are_live_and_the_rest_waits_for_a_restart() {
        let old = read(WINDOW).unwrap();
        assert!(changes(&old, &old).is_empty());
        let new = read(&format!(
            "[agents]\nmax-wait = 30\n[rollout]\nwaves = [\"1\", \"100%\"]\n{}",
            WINDOW.replace("02:00", "03:30")
        ))
        .unwrap();
        let c = changes(&old, &new);
        let (was, now) = c.windows.unwrap();
        assert!(
            was.contains("02:00") && now.contains("03:30"),
            "{was} / {now}"
        );
        let (was, now) = c.plan.unwrap();
        assert!(
            was.contains("waves 100%") && now.contains("waves 1, 100%"),
            "{now}"
        );
        assert_eq!(c.at_restart, ["[agents]"]);
    }

    #[test]
    fn a_bad_window_names_the_file_and_its_line() {
        let e = read(&format!(
            "[agents]\nmax-wait = 30\n\n{}",
            WINDOW.replace("02:00", "25:00")
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("server.toml") && e.contains("at line 4"), "{e}");
        assert!(e.contains("maintenance.start"), "{e}");
        let e = read("[[maintenance]]\nstart = \"02:00\"\nduration = \"1h\"\nstat = 1\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 4") && e.contains("stat"), "{e}");
        let e = read("[[maintenance]\n").unwrap_err().to_string();
        assert!(e.contains("line 1"), "{e}");
        let flat = one_line(&e);
        assert!(!flat.contains('\n') && flat.contains("line 1"), "{flat}");
        assert!(flat.ends_with("expected `]`"), "{flat}");
    }
}
