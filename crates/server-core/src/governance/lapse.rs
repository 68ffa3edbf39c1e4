//! Changes that waited for approval longer than `approval.expires` lapse: a change is
//! refused approval from its expiry on whatever this loop does (the fleet model judges
//! it at the time of asking); this loop records the lapse, once for the fleet (each row
//! is claimed by one server's statement), as `approval.expire` by `server:<name>`, with
//! the name of the operator who asked.

use std::sync::Arc;
use std::time::Duration;

use agent_fleet::audit::{Change, Outcome};
use agent_fleet::db::now_ms;

use crate::state::Shared;

/// How often a server looks for lapsed changes.
const EVERY: Duration = Duration::from_secs(2);

pub(crate) async fn run(s: Arc<Shared>) {
    let who = format!("server:{}", s.server_name);
    let mut said = String::new();
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if s.fleet.outage.is_down() {
            continue;
        }
        match s.fleet.approvals().expire_due(now_ms()).await {
            Ok(lapsed) => {
                said.clear();
                for a in lapsed {
                    tracing::warn!(
                        approval = a.id,
                        requested_by = %a.requested_by,
                        "approval {}: {} by {} waited past approval.expires and lapsed; nothing changed",
                        a.id,
                        a.action,
                        a.requested_by
                    );
                    let change = Change {
                        who: &who,
                        address: "",
                        action: "approval.expire",
                        outcome: Outcome::Done,
                        details: serde_json::json!({
                            "approval": a.id,
                            "action": a.action,
                            "requested_by": a.requested_by,
                            "subject": a.subject,
                            "expires_at": a.expires_at,
                        }),
                    };
                    crate::actions::audit(&s, &change).await;
                }
            }
            Err(e) if e.is_unavailable() => s.fleet.outage.went_down(&e),
            Err(e) => {
                let e = e.to_string();
                if e != said {
                    tracing::error!("approvals: cannot record lapsed changes: {e}");
                    said = e;
                }
            }
        }
    }
}
