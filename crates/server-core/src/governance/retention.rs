//! The audit log kept for `audit.keep`: one server of the fleet at a time deletes what
//! is older (a claimed chore), and the deletion is itself an entry of the log,
//! `audit.prune` by `server:<name>`. Webhook events and attempts older than
//! `webhooks.retry-for` plus a week go at the same time.

use std::sync::Arc;
use std::time::Duration;

use agent_fleet::audit::PRUNE_CHORE;
use agent_fleet::chores;
use agent_fleet::db::now_ms;

use crate::state::Shared;

/// How long a webhook's delivered events and attempts stay listed after their
/// `retry-for`.
const WEBHOOK_HISTORY: Duration = Duration::from_secs(7 * 86_400);

pub(crate) async fn run(s: Arc<Shared>) {
    let keep = s.governance.audit_keep;
    if keep.is_zero() {
        tracing::info!("audit.keep is 0: the audit log is kept for ever");
        return;
    }
    let every = chores::retention_every(keep);
    let keep_text = agent_protocol::settings::format_duration(keep);
    let who = format!("server:{}", s.server_name);
    let mut said = String::new();
    // The first look soon after start, then one each period (the chore's row says
    // which server's look does it).
    let mut tick =
        tokio::time::interval_at(tokio::time::Instant::now() + Duration::from_secs(1), every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if s.fleet.outage.is_down() {
            continue;
        }
        let result = async {
            let now = now_ms();
            if !chores::claim(&s.fleet.db, PRUNE_CHORE, &s.server_name, every, now).await? {
                return Ok(());
            }
            let before = now.saturating_sub(millis(keep));
            let deleted = s.fleet.audit().prune(before, &who, &keep_text).await?;
            if deleted > 0 {
                tracing::info!(
                    "audit log: deleted {deleted} entries older than audit.keep ({keep_text}); the deletion is in the log as audit.prune"
                );
            }
            let history = millis(s.governance.retry_for).saturating_add(millis(WEBHOOK_HISTORY));
            s.governance
                .webhooks
                .prune(now.saturating_sub(history))
                .await?;
            Ok::<(), agent_fleet::FleetError>(())
        }
        .await;
        match result {
            Ok(()) => said.clear(),
            Err(e) if e.is_unavailable() => s.fleet.outage.went_down(&e),
            Err(e) => {
                let e = e.to_string();
                if e != said {
                    tracing::error!("audit retention: {e}; trying again in {every:?}");
                    said = e;
                }
            }
        }
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
