//! Group commit: writes that arrive while another is under way go together in the next.
//!
//! A fleet told at once (a maintenance window opening, a wave of held agents) answers
//! at once: ten thousand reports and `409`s within a second. Written one transaction
//! each, they queued behind each other on the database (SQLite has one writer, and
//! every commit waits for the disk): reports took 5 to 8 s to be answered and the last
//! agent's INSTALLED came 17 s after its install. Here the first caller writes what is
//! waiting; those that came meanwhile wait for it, and the next caller takes them all
//! in one statement. A lone write goes at once, as before.
//!
//! It knows nothing of what it writes: the caller gives the statement for a group.

use std::future::Future;
use std::sync::Mutex;

use tokio::sync::oneshot;

use crate::FleetError;

type Outcome = Result<(), FleetError>;

/// Writes of one kind waiting for the next group.
#[derive(Debug)]
pub struct Group<T> {
    waiting: Mutex<Vec<(T, oneshot::Sender<Outcome>)>>,
    /// Held by the caller writing a group.
    writing: tokio::sync::Mutex<()>,
}

impl<T> Default for Group<T> {
    fn default() -> Self {
        Self {
            waiting: Mutex::new(Vec::new()),
            writing: tokio::sync::Mutex::new(()),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<T: Clone> Group<T> {
    /// Writes `item` with whatever else waits, by `write` (all of them in one go); its
    /// outcome. A group the database refuses is written again one by one, so that only
    /// the write at fault fails; a database gone away fails each of them as
    /// unavailable (each caller then queues its own). A caller whose group's writer
    /// was dropped before it answered (its request ended) writes its own.
    pub async fn write<F, Fut>(&self, item: T, write: F) -> Outcome
    where
        F: Fn(Vec<T>) -> Fut,
        Fut: Future<Output = Outcome>,
    {
        let (tx, rx) = oneshot::channel();
        lock(&self.waiting).push((item.clone(), tx));
        {
            let _writing = self.writing.lock().await;
            let group = std::mem::take(&mut *lock(&self.waiting));
            if !group.is_empty() {
                write_group(group, &write).await;
            }
        }
        match rx.await {
            Ok(outcome) => outcome,
            Err(_) => write(vec![item]).await,
        }
    }
}

async fn write_group<T: Clone, F, Fut>(group: Vec<(T, oneshot::Sender<Outcome>)>, write: &F)
where
    F: Fn(Vec<T>) -> Fut,
    Fut: Future<Output = Outcome>,
{
    let items = group.iter().map(|(item, _)| item.clone()).collect();
    match write(items).await {
        Ok(()) => {
            for (_, tx) in group {
                let _ = tx.send(Ok(()));
            }
        }
        Err(e) if group.len() == 1 || e.is_unavailable() => {
            let why = e.to_string();
            let mut first = Some(e);
            for (_, tx) in group {
                let e = first.take().unwrap_or_else(|| gone(&why));
                let _ = tx.send(Err(e));
            }
        }
        Err(e) => {
            tracing::warn!(
                "writing {} together failed ({e}); writing them one by one",
                group.len()
            );
            for (item, tx) in group {
                let _ = tx.send(write(vec![item]).await);
            }
        }
    }
}

/// The database's absence as each caller of a group sees it.
fn gone(why: &str) -> FleetError {
    FleetError::Database(sqlx::Error::Io(std::io::Error::other(format!(
        "a group write: {why}"
    ))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn writes_arriving_during_a_write_go_together_in_the_next() {
        let group = Arc::new(Group::<u32>::default());
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let (release, held) = tokio::sync::watch::channel(false);
        let write = {
            let sizes = Arc::clone(&sizes);
            move |items: Vec<u32>| {
                let sizes = Arc::clone(&sizes);
                let mut held = held.clone();
                async move {
                    lock(&sizes).push(items.len());
                    // The first write waits until the others have queued behind it.
                    let _ = held.wait_for(|go| *go).await;
                    Ok(())
                }
            }
        };
        let first = tokio::spawn({
            let (group, write) = (Arc::clone(&group), write.clone());
            async move { group.write(0, write).await }
        });
        while lock(&sizes).is_empty() {
            tokio::task::yield_now().await;
        }
        let rest: Vec<_> = (1..=50)
            .map(|i| {
                let (group, write) = (Arc::clone(&group), write.clone());
                tokio::spawn(async move { group.write(i, write).await })
            })
            .collect();
        while lock(&group.waiting).len() < 50 {
            tokio::task::yield_now().await;
        }
        release.send_replace(true);
        first.await.unwrap().unwrap();
        for task in rest {
            task.await.unwrap().unwrap();
        }
        assert_eq!(
            *lock(&sizes),
            vec![1, 50],
            "one write alone, then 50 as one"
        );
    }

    #[tokio::test]
    async fn a_refused_group_is_written_one_by_one_and_only_the_bad_write_fails() {
        let group = Arc::new(Group::<u32>::default());
        let calls = Arc::new(AtomicUsize::new(0));
        let write = {
            let calls = Arc::clone(&calls);
            move |items: Vec<u32>| {
                calls.fetch_add(1, Ordering::Relaxed);
                async move {
                    if items.contains(&13) {
                        Err(FleetError::Invalid(format!("{} refused", items.len())))
                    } else {
                        Ok(())
                    }
                }
            }
        };
        // Queued by hand, so the group is all three.
        let (txs, rxs): (Vec<_>, Vec<_>) = (0..3).map(|_| oneshot::channel()).unzip();
        for (item, tx) in [12, 13, 14].into_iter().zip(txs) {
            lock(&group.waiting).push((item, tx));
        }
        group.write(15, write).await.unwrap();
        let outcomes: Vec<bool> = futures_util::future::join_all(rxs)
            .await
            .into_iter()
            .map(|r| r.unwrap().is_ok())
            .collect();
        assert_eq!(outcomes, vec![true, false, true]);
        assert_eq!(
            calls.load(Ordering::Relaxed),
            5,
            "the group, then four alone"
        );
    }

    #[tokio::test]
    async fn a_database_gone_fails_each_as_unavailable_without_trying_each() {
        let group = Group::<u32>::default();
        let calls = AtomicUsize::new(0);
        let write = |_items: Vec<u32>| {
            calls.fetch_add(1, Ordering::Relaxed);
            async { Err(FleetError::Database(sqlx::Error::PoolTimedOut)) }
        };
        let (tx, rx) = oneshot::channel();
        lock(&group.waiting).push((1, tx));
        let mine = group.write(2, write).await.unwrap_err();
        let theirs = rx.await.unwrap().unwrap_err();
        assert!(mine.is_unavailable() && theirs.is_unavailable(), "{theirs}");
        assert_eq!(calls.load(Ordering::Relaxed), 1);
    }
}
