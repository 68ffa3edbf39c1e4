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
        self.run_ticking(free, || tokio::time::sleep(TICK)).await
    }

    /// [`Pacer::run`] with its clock given: `tick()` is the wait between two hand-outs
    /// (the tests tick by hand, so no test needs a paused runtime clock, which would
    /// put a lock in every clock reading of the server's own build).
    async fn run_ticking<F: std::future::Future<Output = ()>>(
        &self,
        free: impl Fn() -> usize,
        mut tick: impl FnMut() -> F,
    ) {
        loop {
            self.wake.notified().await;
            while self.waiting() > 0 {
                self.release(free());
                if self.waiting() == 0 {
                    break;
                }
                tick().await;
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

    /// Polls `cond` until it holds (the agents' tasks run on the runtime's threads).
    async fn until(what: &str, cond: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(std::time::Instant::now() < deadline, "never: {what}");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Runs `pacer` with ticks given by hand: each permit added to the semaphore is one
    /// tick, and the counter says how many ticks the pacer waited out.
    fn run_by_hand(
        pacer: &Arc<Pacer>,
        in_flight: &Arc<AtomicUsize>,
    ) -> (
        tokio::task::JoinHandle<()>,
        Arc<tokio::sync::Semaphore>,
        Arc<AtomicUsize>,
    ) {
        let ticks = Arc::new(tokio::sync::Semaphore::new(0));
        let ticks_taken = Arc::new(AtomicUsize::new(0));
        let runner = {
            let (pacer, in_flight) = (Arc::clone(pacer), Arc::clone(in_flight));
            let (ticks, ticks_taken) = (Arc::clone(&ticks), Arc::clone(&ticks_taken));
            tokio::spawn(async move {
                pacer
                    .run_ticking(
                        || free_slots(10, in_flight.load(Ordering::SeqCst), true),
                        || {
                            let (ticks, ticks_taken) =
                                (Arc::clone(&ticks), Arc::clone(&ticks_taken));
                            async move {
                                if let Ok(permit) = ticks.acquire().await {
                                    permit.forget();
                                }
                                ticks_taken.fetch_add(1, Ordering::SeqCst);
                            }
                        },
                    )
                    .await
            })
        };
        (runner, ticks, ticks_taken)
    }

    #[tokio::test]
    async fn a_lone_agent_goes_at_once() {
        let pacer = Arc::new(Pacer::default());
        let (runner, _ticks, ticks_taken) = run_by_hand(&pacer, &Arc::default());
        pacer.turn().await;
        assert_eq!(ticks_taken.load(Ordering::SeqCst), 0);
        runner.abort();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_crowd_goes_a_free_slot_count_per_tick() {
        let pacer = Arc::new(Pacer::default());
        let went = Arc::new(AtomicUsize::new(0));
        let crowd: Vec<_> = (0..35)
            .map(|_| {
                let (pacer, went) = (Arc::clone(&pacer), Arc::clone(&went));
                tokio::spawn(async move {
                    pacer.turn().await;
                    went.fetch_add(1, Ordering::SeqCst);
                })
            })
            .collect();
        // The whole crowd waits before the pacer starts handing out turns.
        until("the crowd waits", || pacer.waiting() == 35).await;
        let in_flight = Arc::new(AtomicUsize::new(0));
        let (runner, ticks, ticks_taken) = run_by_hand(&pacer, &in_flight);
        until("ten went", || went.load(Ordering::SeqCst) == 10).await;
        assert_eq!(pacer.waiting(), 25, "the rest wait for a tick");
        assert_eq!(ticks_taken.load(Ordering::SeqCst), 0);
        // Slots taken by downloads are not handed out again.
        in_flight.store(7, Ordering::SeqCst);
        ticks.add_permits(1);
        until("three more went", || went.load(Ordering::SeqCst) == 13).await;
        assert_eq!(pacer.waiting(), 22);
        // Ten a tick: the 22 left go in three more ticks (10, 10, 2), and no tick after.
        in_flight.store(0, Ordering::SeqCst);
        ticks.add_permits(3);
        for task in crowd {
            task.await.unwrap();
        }
        assert_eq!(went.load(Ordering::SeqCst), 35);
        until("the last tick taken", || {
            ticks_taken.load(Ordering::SeqCst) == 4
        })
        .await;
        assert_eq!(pacer.waiting(), 0);
        runner.abort();
    }

    #[tokio::test]
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
