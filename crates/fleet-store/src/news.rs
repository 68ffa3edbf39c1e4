//! News for held connects: a revision number that moves whenever something that can
//! change an agent's answer changes (the rollout moved, the served bundle or a
//! configuration set changed, the fleet switch flipped, a halt or a resume), and a
//! closing flag raised when the server stops.
//!
//! A held connect never asks the database whether anything changed: it waits for the
//! revision to move, then works out its answer again from what this server already
//! holds in memory, and answers if that differs from what the agent knows. The places
//! that change the state publish; nothing here polls. Changes made by another server of
//! the fleet reach this one through the reads it already does every second or two
//! (the rollout loop, the settings poll), which publish what they find.

use tokio::sync::watch;

pub struct News {
    revision: watch::Sender<u64>,
    closing: watch::Sender<bool>,
}

impl Default for News {
    fn default() -> Self {
        Self {
            revision: watch::Sender::new(0),
            closing: watch::Sender::new(false),
        }
    }
}

impl News {
    /// Something that may change an agent's answer changed: every held connect looks
    /// again.
    pub fn publish(&self, what: &str) {
        self.revision.send_modify(|r| *r = r.wrapping_add(1));
        tracing::debug!("news for held connects: {what}");
    }

    /// A receiver that sees the next publish; take it before working out the answer,
    /// so that a change made meanwhile is not missed.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.revision.subscribe()
    }

    /// The server is stopping: held connects are answered at once, so their agents
    /// reconnect (to another server of the fleet, or to this one when it is back).
    pub fn close(&self) {
        self.closing.send_replace(true);
    }

    pub fn closing(&self) -> watch::Receiver<bool> {
        self.closing.subscribe()
    }

    /// How many held connects wait for news now.
    pub fn holders(&self) -> usize {
        self.revision.receiver_count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_subscriber_sees_a_publish_made_after_it_subscribed() {
        let news = News::default();
        let mut rx = news.subscribe();
        assert!(!rx.has_changed().unwrap());
        news.publish("test");
        assert!(rx.has_changed().unwrap());
        rx.changed().await.unwrap();
        assert!(!rx.has_changed().unwrap());
    }

    #[tokio::test]
    async fn closing_is_seen_by_every_holder() {
        let news = News::default();
        let mut a = news.closing();
        let mut b = news.closing();
        news.close();
        a.wait_for(|c| *c).await.unwrap();
        b.wait_for(|c| *c).await.unwrap();
    }

    #[test]
    fn holders_are_counted() {
        let news = News::default();
        let a = news.subscribe();
        let b = news.subscribe();
        assert_eq!(news.holders(), 2);
        drop((a, b));
        assert_eq!(news.holders(), 0);
    }
}
