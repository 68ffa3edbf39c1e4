//! `run/health.json`, written by the running agent whenever what it says changes: its
//! version and pid, its last contact with a server, and its workload. The updater judges
//! a new version by it; `agent status` shows it; `connect` carries its `"health"`.

use std::sync::Mutex;

use agent_extract::atomic;
use agent_protocol::journal::Health;
use agent_protocol::layout::AgentHome;
use agent_protocol::wire::AgentHealth;
use tokio::sync::watch;

pub struct HealthBoard {
    home: AgentHome,
    health: Mutex<Health>,
    changed: watch::Sender<AgentHealth>,
}

impl HealthBoard {
    pub fn new(home: AgentHome, health: Health) -> Self {
        let (changed, _) = watch::channel(agent_health(&health));
        let board = Self {
            home,
            health: Mutex::new(health.clone()),
            changed,
        };
        write(&board.home, &health);
        board
    }

    /// Changes the health and rewrites the file if anything changed.
    pub fn update(&self, change: impl FnOnce(&mut Health)) {
        let mut guard = self.health.lock().unwrap_or_else(|p| p.into_inner());
        let before = guard.clone();
        change(&mut guard);
        if *guard != before {
            write(&self.home, &guard);
            let now = agent_health(&guard);
            self.changed.send_if_modified(|old| {
                // A new error text alone is not worth an early connect; a verdict is.
                let differs = old.healthy != now.healthy || old.workload != now.workload;
                *old = now;
                differs
            });
        }
    }

    pub fn snapshot(&self) -> Health {
        self.health
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The `"health"` object of `connect`.
    pub fn agent_health(&self) -> AgentHealth {
        agent_health(&self.snapshot())
    }

    /// Wakes when the health verdict or the workload's state changes.
    pub fn subscribe(&self) -> watch::Receiver<AgentHealth> {
        self.changed.subscribe()
    }
}

fn agent_health(health: &Health) -> AgentHealth {
    health
        .workload
        .as_ref()
        .map(|w| w.health.clone())
        .unwrap_or_else(AgentHealth::no_workload)
}

fn write(home: &AgentHome, health: &Health) {
    let json = serde_json::to_vec_pretty(health).unwrap_or_default();
    if let Err(e) = std::fs::create_dir_all(home.run())
        .map_err(|e| e.to_string())
        .and_then(|()| atomic::write(&home.health_file(), &json).map_err(|e| e.to_string()))
    {
        tracing::warn!("cannot write {}: {e}", home.health_file().display());
    }
}
