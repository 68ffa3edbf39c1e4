//! Webhook delivery: every half second this server feeds the fleet's new records into
//! the outbox and leases what is due, then POSTs each leased event in a task of its own
//! (at most [`PARALLEL`] at once), 10 s a try. Nothing an operator or an agent waits
//! for runs here: a receiver that hangs holds a task, never a request.

use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_fleet::db::now_ms;
use agent_fleet::webhooks::{Due, Tried, sign};

use crate::state::Shared;

/// How long one try may take, connecting included.
pub const TRY_TIMEOUT: Duration = Duration::from_secs(10);

/// A leased event is this server's for this long: longer than a try, so no other server
/// POSTs it meanwhile.
const LEASE: Duration = Duration::from_secs(30);

/// How often the fleet's records are looked at for new events.
const FEED_EVERY: Duration = Duration::from_millis(500);

/// Tries in flight at once on this server.
pub const PARALLEL: usize = 32;

pub(crate) async fn run(s: Arc<Shared>) {
    let client = match client() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("webhooks are not delivered from this server: {e}");
            return;
        }
    };
    let slots = Arc::new(tokio::sync::Semaphore::new(PARALLEL));
    let mut tick = tokio::time::interval(FEED_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut said = String::new();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = s.governance.wake.notified() => {}
        }
        if s.fleet.outage.is_down() {
            continue;
        }
        let hooks = &s.governance.webhooks;
        let result = async {
            let now = now_ms();
            hooks.feed(now).await?;
            let free = i64::try_from(slots.available_permits()).unwrap_or(0);
            hooks.claim(now, free, LEASE).await
        }
        .await;
        let due = match result {
            Ok(due) => {
                said.clear();
                due
            }
            Err(e) if e.is_unavailable() => {
                s.fleet.outage.went_down(&e);
                continue;
            }
            Err(e) => {
                let e = e.to_string();
                if e != said {
                    tracing::error!("webhooks: {e}; trying again every {FEED_EVERY:?}");
                    said = e;
                }
                continue;
            }
        };
        for due in due {
            let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
                return;
            };
            let s = Arc::clone(&s);
            let client = client.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                let tried = post(&client, &due).await;
                let millis = i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX);
                if let Tried::Failed { error, .. } = &tried {
                    tracing::warn!(
                        webhook = due.webhook,
                        event = %due.event,
                        id = %due.event_id,
                        "webhook delivery failed (try {}): {error}; tried again with backoff for webhooks.retry-for",
                        due.attempts + 1
                    );
                }
                let g = &s.governance;
                if let Err(e) = g
                    .webhooks
                    .finish(&due, &tried, millis, now_ms(), g.retry_for)
                    .await
                {
                    // The lease runs out and the event is tried again.
                    tracing::error!(
                        webhook = due.webhook,
                        "cannot record a webhook delivery: {e}"
                    );
                }
                drop(slot);
                // A delivery may have brought the webhook's waiting events forward.
                if matches!(tried, Tried::Delivered { .. }) {
                    g.wake.notify_one();
                }
            });
        }
    }
}

fn client() -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .timeout(TRY_TIMEOUT)
        .connect_timeout(TRY_TIMEOUT)
        // A receiver answers; a redirect is a failed try, not a new address to sign for.
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("update-server/", env!("CARGO_PKG_VERSION")))
        .build()
}

/// One try: the body POSTed with its signature and id; 2xx is delivered.
async fn post(client: &reqwest::Client, due: &Due) -> Tried {
    let answer = client
        .post(&due.url)
        .header("Content-Type", "application/json")
        .header(
            "X-Signature-256",
            sign(due.secret.as_bytes(), due.body.as_bytes()),
        )
        .header("X-Event-Id", &due.event_id)
        .header("X-Event", &due.event)
        .body(due.body.clone())
        .send()
        .await;
    match answer {
        Ok(r) if r.status().is_success() => Tried::Delivered {
            status: r.status().as_u16(),
        },
        Ok(r) => Tried::Failed {
            status: r.status().as_u16(),
            error: format!("the receiver answered {}", r.status()),
        },
        Err(e) if e.is_timeout() => Tried::Failed {
            status: 0,
            error: format!("no answer within {} s", TRY_TIMEOUT.as_secs()),
        },
        Err(e) => Tried::Failed {
            status: 0,
            error: format!("cannot reach the receiver: {}", chain(&e)),
        },
    }
}

/// An error with its causes, as one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}
