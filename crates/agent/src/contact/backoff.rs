//! How long to wait before asking a server again.
//!
//! Waits are jittered upwards only: an agent never comes back earlier than a server's
//! `Retry-After`, and a fleet told the same number spreads over a window instead of
//! returning in the same second.

use std::time::{Duration, SystemTime};

use rand::Rng;

/// The wait a `503` names in `Retry-After`, or `otherwise` when it names none.
pub(crate) fn retry_after_of(resp: &reqwest::Response, otherwise: Duration) -> Duration {
    resp.headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| parse_retry_after(v, SystemTime::now()))
        .unwrap_or(otherwise)
}

/// Parses `Retry-After`: delta-seconds or an HTTP date. `None` for anything else.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let when = httpdate::parse_http_date(value).ok()?;
    Some(when.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The wait after a `Retry-After` of `told`: at least `told` (capped by `cap`), plus a
/// random share of up to half of it (at least one second), so a fleet spreads out.
pub fn retry_after_wait(told: Duration, cap: Duration, rng: &mut impl Rng) -> Duration {
    let base = told.min(cap);
    let window = (base / 2).max(Duration::from_secs(1));
    base + window.mul_f64(rng.random::<f64>())
}

/// Exponential backoff with jitter for failures that carry no advice: attempt 0 waits
/// about `min`, each further attempt doubles, never more than `max`.
#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    attempt: u32,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max: max.max(min),
            attempt: 0,
        }
    }

    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    pub fn attempts(&self) -> u32 {
        self.attempt
    }

    /// The next wait: half fixed, half random ("equal jitter"), so waits still grow.
    pub fn next_wait(&mut self, rng: &mut impl Rng) -> Duration {
        let exp = self
            .min
            .saturating_mul(1u32 << self.attempt.min(20))
            .min(self.max);
        self.attempt = self.attempt.saturating_add(1);
        exp / 2 + (exp / 2).mul_f64(rng.random::<f64>())
    }
}

/// The short random wait before acting on a changed offer, so that a fleet which sees
/// the same new bundle at its next heartbeats does not download it in the same second.
pub fn change_jitter(heartbeat: Duration, rng: &mut impl Rng) -> Duration {
    heartbeat
        .min(Duration::from_secs(5))
        .mul_f64(rng.random::<f64>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    #[test]
    fn retry_after_forms() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        assert_eq!(parse_retry_after("30", now), Some(Duration::from_secs(30)));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(90));
        assert_eq!(
            parse_retry_after(&later, now),
            Some(Duration::from_secs(90))
        );
        let earlier = httpdate::fmt_http_date(now - Duration::from_secs(90));
        assert_eq!(parse_retry_after(&earlier, now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-5", now), None);
    }

    #[test]
    fn retry_after_is_a_floor_and_is_capped() {
        let mut rng = StdRng::seed_from_u64(7);
        for _ in 0..1000 {
            let w = retry_after_wait(Duration::from_secs(10), Duration::from_secs(3600), &mut rng);
            assert!(
                w >= Duration::from_secs(10) && w <= Duration::from_secs(15),
                "{w:?}"
            );
        }
        let w = retry_after_wait(
            Duration::from_secs(86_400),
            Duration::from_secs(60),
            &mut rng,
        );
        assert!(
            w >= Duration::from_secs(60) && w <= Duration::from_secs(90),
            "{w:?}"
        );
    }

    /// 50 agents told `Retry-After: 10` come back spread over the window, not together.
    #[test]
    fn fifty_agents_spread_over_the_window() {
        let mut rng = rand::rng();
        let mut seconds = std::collections::BTreeSet::new();
        let mut waits = Vec::new();
        for _ in 0..50 {
            let w = retry_after_wait(Duration::from_secs(10), Duration::from_secs(3600), &mut rng);
            seconds.insert(w.as_secs());
            waits.push(w);
        }
        let min = waits.iter().min().unwrap();
        let max = waits.iter().max().unwrap();
        assert!(*min >= Duration::from_secs(10));
        assert!(
            *max - *min >= Duration::from_secs(2),
            "spread {min:?}..{max:?}"
        );
        assert!(seconds.len() >= 3, "all in {seconds:?}");
    }

    #[test]
    fn change_jitter_is_short() {
        let mut rng = StdRng::seed_from_u64(3);
        for _ in 0..100 {
            assert!(change_jitter(Duration::from_secs(30), &mut rng) <= Duration::from_secs(5));
            assert!(change_jitter(Duration::from_secs(1), &mut rng) <= Duration::from_secs(1));
        }
    }

    #[test]
    fn backoff_grows_to_its_cap() {
        let mut rng = StdRng::seed_from_u64(1);
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(8));
        let waits: Vec<_> = (0..6).map(|_| b.next_wait(&mut rng)).collect();
        assert!(waits[0] >= Duration::from_millis(500) && waits[0] <= Duration::from_secs(1));
        assert!(waits[3] >= Duration::from_secs(4));
        assert!(waits.iter().all(|w| *w <= Duration::from_secs(8)));
        b.reset();
        assert!(b.next_wait(&mut rng) <= Duration::from_secs(1));
    }
}
