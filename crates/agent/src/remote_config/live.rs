//! The running workload as the apply drives it: the supervisor the daemon owns,
//! restarted or signalled, and the health board watched for the verdict.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_extract::atomic;
use agent_protocol::layout::AgentHome;

use super::decide::{self, Took};
use crate::config::Reload;
use crate::state::health::HealthBoard;
use crate::workload::spec::{Spec, fill};
use crate::workload::{self, Supervisor, group};

/// The workload and its supervisor; the daemon owns it for the agent's whole run.
pub struct LiveWorkload {
    spec: Spec,
    home: AgentHome,
    board: Arc<HealthBoard>,
    supervisor: Option<Supervisor>,
    reload: Reload,
    /// `workload.check-command` as written (its `{config_dir}` is the new directory).
    check: Vec<String>,
    /// The run whose health says nothing of the new set (the one before a restart).
    stale_pid: Option<u32>,
}

impl LiveWorkload {
    /// Starts the workload at once.
    pub fn start(
        spec: Spec,
        home: AgentHome,
        board: Arc<HealthBoard>,
        reload: Reload,
        check: Vec<String>,
    ) -> Self {
        let supervisor = Some(Supervisor::start(
            spec.clone(),
            home.clone(),
            Arc::clone(&board),
        ));
        Self {
            spec,
            home,
            board,
            supervisor,
            reload,
            check,
            stale_pid: None,
        }
    }

    /// Stops the workload and waits for it to be gone.
    pub async fn stop(&mut self) {
        if let Some(s) = self.supervisor.take() {
            s.stop().await;
        }
    }

    /// Leaves the workload serving for the next agent (a hand-off to the updater).
    pub async fn leave(&mut self) {
        if let Some(s) = self.supervisor.take() {
            s.leave().await;
        }
    }

    /// An operator's restart of the workload alone: restarted, and healthy on its new
    /// run within `start-timeout`; else why not.
    pub async fn restart_now(&mut self) -> Result<(), String> {
        use super::Workload as _;
        if !self.spec.enabled() {
            return Err("this agent runs no workload (workload.command is empty)".into());
        }
        self.restart().await;
        self.wait_healthy().await
    }

    fn current_pid(&self) -> Option<u32> {
        self.board.snapshot().workload.and_then(|w| w.pid)
    }
}

impl super::Workload for LiveWorkload {
    fn check_argv(&self, dir: &Path) -> Vec<String> {
        self.check
            .iter()
            .map(|w| fill(w, &self.spec.home, &self.spec.version_dir, dir))
            .collect()
    }

    async fn reload(&mut self) -> Result<(), String> {
        if !self.spec.enabled() {
            return Ok(());
        }
        match self.reload {
            Reload::Restart => {
                self.restart().await;
                Ok(())
            }
            Reload::Signal(number) => {
                // The same run reads the new set: its health after the signal counts.
                self.stale_pid = None;
                match group::leftover(&self.home) {
                    Some((pgid, _)) => {
                        let name = group::signal_group(pgid, number)?;
                        tracing::info!("sent {name} to the workload (pid {pgid}) to reload");
                        Ok(())
                    }
                    None => {
                        // Not running now (in backoff): its next start reads the new set.
                        Ok(())
                    }
                }
            }
        }
    }

    async fn wait_healthy(&mut self) -> Result<(), String> {
        let mut changed = self.board.subscribe();
        let began = Instant::now();
        // A signalled workload is given a moment to act on the signal before its
        // health is believed.
        if self.reload != Reload::Restart {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        loop {
            let report = self.board.snapshot().workload;
            let tail = atomic::tail_lines(&workload::log_path(&self.home), 10);
            match decide::took(
                report.as_ref(),
                self.stale_pid,
                began.elapsed(),
                self.spec.start_timeout,
                &tail,
            ) {
                Took::Yes => return Ok(()),
                Took::No(why) => return Err(why),
                Took::Wait => {}
            }
            let _ = tokio::time::timeout(Duration::from_millis(250), changed.changed()).await;
        }
    }

    async fn restart(&mut self) {
        self.stale_pid = self.current_pid();
        self.stop().await;
        self.supervisor = Some(Supervisor::start(
            self.spec.clone(),
            self.home.clone(),
            Arc::clone(&self.board),
        ));
    }
}
