//! The concurrent-download limit. A slot is held from the first byte of a body until the
//! body ends or its client goes away (the body, and with it the slot, is dropped then).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

#[derive(Debug, Default)]
pub struct DownloadLimiter {
    in_flight: AtomicUsize,
    peak: AtomicUsize,
}

impl DownloadLimiter {
    /// A slot if fewer than `limit` downloads are in flight.
    pub fn try_acquire(self: &Arc<Self>, limit: usize) -> Option<Slot> {
        let mut current = self.in_flight.load(Ordering::Acquire);
        loop {
            if current >= limit {
                return None;
            }
            match self.in_flight.compare_exchange_weak(
                current,
                current + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    self.peak.fetch_max(current + 1, Ordering::Relaxed);
                    return Some(Slot {
                        limiter: Arc::clone(self),
                        released: Arc::new(AtomicBool::new(false)),
                    });
                }
                Err(actual) => current = actual,
            }
        }
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }
}

/// A download's place in the limit. Given back once: by whoever calls
/// [`Slot::release`] first (a stall watchdog), or when it is dropped.
#[derive(Debug)]
pub struct Slot {
    limiter: Arc<DownloadLimiter>,
    released: Arc<AtomicBool>,
}

impl Slot {
    /// Gives the place back now; true if this call did (not an earlier one).
    pub fn release(&self) -> bool {
        self.release_after(|| ())
    }

    /// Gives the place back now, running `first` before the place is seen free, only if
    /// this call is the one that gives it back: a count of why slots were freed is then
    /// never behind the number in flight.
    pub fn release_after(&self, first: impl FnOnce()) -> bool {
        let mine = !self.released.swap(true, Ordering::AcqRel);
        if mine {
            first();
            self.limiter.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
        mine
    }

    /// A handle that can release this slot from elsewhere (a watchdog task).
    pub fn remote(&self) -> Slot {
        Slot {
            limiter: Arc::clone(&self.limiter),
            released: Arc::clone(&self.released),
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_more_than_limit_and_released_on_drop() {
        let l = Arc::new(DownloadLimiter::default());
        let a = l.try_acquire(2).unwrap();
        let _b = l.try_acquire(2).unwrap();
        assert!(l.try_acquire(2).is_none());
        drop(a);
        assert!(l.try_acquire(2).is_some());
        assert_eq!(l.peak(), 2);
        assert!(l.try_acquire(0).is_none());
    }

    #[test]
    fn a_slot_is_given_back_once_whoever_releases_it() {
        let l = Arc::new(DownloadLimiter::default());
        let slot = l.try_acquire(1).unwrap();
        let watchdog = slot.remote();
        assert!(watchdog.release());
        assert_eq!(l.in_flight(), 0);
        assert!(!slot.release());
        drop(watchdog);
        drop(slot);
        assert_eq!(l.in_flight(), 0);
        assert!(l.try_acquire(1).is_some());
    }
}
