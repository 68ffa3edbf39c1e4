//! Telling a wave's held agents in step with the download slots.
//!
//! A wave that opens wakes every held agent of it at once, and each goes straight for
//! the bundle: past `downloads.limit` they get `503` with `Retry-After` and come back
//! only after it (30 s by default), so a wave of thousands waits out a Retry-After that
//! heartbeats used to spread. Instead, a held agent about to be told that its wave
//! opened takes a turn here first. Turns are handed out in order, every [`TICK`], as
//! many as there are free download slots then (a tick is shorter than a download, so a
//! slot freed is soon handed on): the agents told start downloads the server can
//! serve, and the others stay held a moment longer instead of being refused.
//! An agent alone (a small wave, a degraded agent) goes at once; a wave of thousands
//! spreads over a few seconds. Plain connects (heartbeats) are never paced, and nothing
//! here changes what an agent is told, only when.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::{Notify, oneshot};

/// How often turns are handed out while agents wait.
pub const TICK: Duration = Duration::from_millis(5);

#[derive(Debug, Default)]
pub struct Pacer {
    waiting: Mutex<VecDeque<oneshot::Sender<()>>>,
    wake: Notify,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Pacer {
    /// Resolves when this agent may be told. Dropped before (its connect ended), it
    /// gives its place up.
    pub async fn turn(&self) {
        let (tx, rx) = oneshot::channel();
        lock(&self.waiting).push_back(tx);
        self.wake.notify_one();
        let _ = rx.await;
    }

    /// Agents waiting for their turn.
    pub fn waiting(&self) -> usize {
        lock(&self.waiting).len()
    }

    /// Lets up to `n` waiting agents go, oldest first (those gone meanwhile take no
    /// turn); how many went.
    fn release(&self, n: usize) -> usize {
        let mut waiting = lock(&self.waiting);
        let mut went = 0;
        while went < n {
            let Some(tx) = waiting.pop_front() else {
                break;
            };
            if tx.send(()).is_ok() {
                went += 1;
            }
        }
        went
    }

    /// Hands out turns while agents wait, `free()` at a time every [`TICK`]. Run by the
    /// server for as long as it serves.
    pub async fn run(&self, free: impl Fn() -> usize) {
        loop {
            self.wake.notified().await;
            while self.waiting() > 0 {
                self.release(free());
                if self.waiting() == 0 {
                    break;
                }
                tokio::time::sleep(TICK).await;
            }
        }
    }
}

/// How many agents may be told now: as many as there are free download slots; all of
/// them when downloads are refused anyway (`downloads.limit = 0`, auto-update off: a
/// `403` is no reason to wait).
pub fn free_slots(limit: usize, in_flight: usize, downloads_on: bool) -> usize {
    if limit == 0 || !downloads_on {
        return usize::MAX;
    }
    limit.saturating_sub(in_flight)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn turns_follow_the_free_download_slots() {
        assert_eq!(free_slots(45, 0, true), 45);
        assert_eq!(free_slots(45, 40, true), 5);
        assert_eq!(free_slots(45, 50, true), 0);
        assert_eq!(free_slots(0, 0, true), usize::MAX);
        assert_eq!(free_slots(45, 45, false), usize::MAX);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_agent_goes_at_once_and_a_crowd_goes_a_slot_count_per_tick() {
        let pacer = Arc::new(Pacer::default());
        let in_flight = Arc::new(AtomicUsize::new(0));
        let runner = {
            let pacer = Arc::clone(&pacer);
            let in_flight = Arc::clone(&in_flight);
            tokio::spawn(async move {
                pacer
                    .run(|| free_slots(10, in_flight.load(Ordering::Relaxed), true))
                    .await
            })
        };
        let start = tokio::time::Instant::now();
        pacer.turn().await;
        assert_eq!(start.elapsed(), Duration::ZERO);

        let went = Arc::new(AtomicUsize::new(0));
        let crowd: Vec<_> = (0..35)
            .map(|_| {
                let pacer = Arc::clone(&pacer);
                let went = Arc::clone(&went);
                tokio::spawn(async move {
                    pacer.turn().await;
                    went.fetch_add(1, Ordering::Relaxed);
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(went.load(Ordering::Relaxed), 10);
        // Slots taken by downloads are not handed out again.
        in_flight.store(7, Ordering::Relaxed);
        tokio::time::sleep(TICK).await;
        assert_eq!(went.load(Ordering::Relaxed), 13);
        in_flight.store(0, Ordering::Relaxed);
        for task in crowd {
            task.await.unwrap();
        }
        assert_eq!(went.load(Ordering::Relaxed), 35);
        assert!(start.elapsed() <= TICK * 4, "{:?}", start.elapsed());
        runner.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn an_agent_gone_before_its_turn_takes_none() {
        let pacer = Arc::new(Pacer::default());
        let gone = tokio::time::timeout(Duration::from_millis(1), pacer.turn()).await;
        assert!(gone.is_err());
        let (tx, rx) = oneshot::channel();
        lock(&pacer.waiting).push_back(tx);
        assert_eq!(pacer.release(1), 1);
        assert!(rx.await.is_ok());
        assert_eq!(pacer.waiting(), 0);
    }
}
