//! When to contact the server next: at once, after a held connect (a long poll), or
//! after a heartbeat against a server that answers at once.
//!
//! An agent that long-polls holds its first connect right after its register: an
//! agent just started learns at once too, not a heartbeat later.
//!
//! A held connect that runs its course, or that ends because something changed for
//! this agent, is followed by the next one straight away: the server, not a timer,
//! decides when the agent hears news. A server that lets go early with nothing new
//! (it is shutting down, say) is followed after a short random wait, so a fleet does
//! not reconnect in the same instant; a server that never holds (an older one) is
//! contacted once per heartbeat, as before long polls existed.

use std::time::Duration;

use rand::Rng;

/// Longest random wait before reconnecting to a server that let go early.
pub const MAX_RECONNECT_JITTER: Duration = Duration::from_secs(5);

/// Held connects that ended within this share of their wait, with nothing new,
/// count as let go early.
const EARLY: f64 = 0.9;

/// What the last successful connect looked like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LastContact {
    /// The agent asked the server to hold the answer.
    pub asked_to_hold: bool,
    /// The server said it honours holds (a newer server).
    pub server_holds: bool,
    /// How long the answer took.
    pub took: Duration,
    /// The wait the agent asked for.
    pub wait: Duration,
    /// The answer differs from the one before (a new directive, a new offer).
    pub changed: bool,
    /// It was the register of an agent that long-polls: its first held connect follows
    /// at once (a server that does not hold answers that one at once, and is asked once
    /// per heartbeat from then on).
    pub registered_to_hold: bool,
}

/// How long to wait before the next contact.
pub fn next_contact(heartbeat: Duration, last: &LastContact, rng: &mut impl Rng) -> Duration {
    if last.registered_to_hold {
        return Duration::ZERO;
    }
    if !last.asked_to_hold || !last.server_holds {
        return heartbeat;
    }
    if last.changed || last.took.as_secs_f64() >= last.wait.as_secs_f64() * EARLY {
        return Duration::ZERO;
    }
    reconnect_jitter(heartbeat, rng)
}

/// A random wait of up to [`MAX_RECONNECT_JITTER`] (or the heartbeat, if shorter).
pub fn reconnect_jitter(heartbeat: Duration, rng: &mut impl Rng) -> Duration {
    MAX_RECONNECT_JITTER
        .min(heartbeat)
        .mul_f64(rng.random::<f64>())
}

#[cfg(test)]
mod tests {
    use super::*;

    use rand::SeedableRng;
    use rand::rngs::StdRng;

    const HEARTBEAT: Duration = Duration::from_secs(30);

    fn held(took: u64, changed: bool) -> LastContact {
        LastContact {
            asked_to_hold: true,
            server_holds: true,
            took: Duration::from_secs(took),
            wait: HEARTBEAT,
            changed,
            registered_to_hold: false,
        }
    }

    #[test]
    fn a_hold_that_ran_its_course_is_followed_at_once() {
        let mut rng = StdRng::seed_from_u64(1);
        assert_eq!(
            next_contact(HEARTBEAT, &held(30, false), &mut rng),
            Duration::ZERO
        );
        assert_eq!(
            next_contact(HEARTBEAT, &held(28, false), &mut rng),
            Duration::ZERO
        );
    }

    #[test]
    fn news_is_followed_at_once() {
        let mut rng = StdRng::seed_from_u64(2);
        assert_eq!(
            next_contact(HEARTBEAT, &held(0, true), &mut rng),
            Duration::ZERO
        );
    }

    #[test]
    fn a_server_letting_go_early_with_nothing_new_is_left_alone_a_little_while() {
        let mut seen = Vec::new();
        for seed in 0..50 {
            let mut rng = StdRng::seed_from_u64(seed);
            let wait = next_contact(HEARTBEAT, &held(1, false), &mut rng);
            assert!(wait <= MAX_RECONNECT_JITTER, "{wait:?}");
            seen.push(wait);
        }
        seen.sort();
        seen.dedup();
        assert!(seen.len() > 40, "the waits spread the fleet out: {seen:?}");
    }

    #[test]
    fn a_server_that_does_not_hold_is_asked_once_per_heartbeat() {
        let mut rng = StdRng::seed_from_u64(3);
        let old_server = LastContact {
            server_holds: false,
            ..held(0, false)
        };
        assert_eq!(next_contact(HEARTBEAT, &old_server, &mut rng), HEARTBEAT);
        let not_asked = LastContact {
            asked_to_hold: false,
            ..held(0, true)
        };
        assert_eq!(next_contact(HEARTBEAT, &not_asked, &mut rng), HEARTBEAT);
    }

    #[test]
    fn a_register_of_an_agent_that_long_polls_is_followed_by_a_held_connect_at_once() {
        let mut rng = StdRng::seed_from_u64(5);
        let register = LastContact {
            asked_to_hold: false,
            server_holds: false,
            ..held(0, true)
        };
        assert_eq!(next_contact(HEARTBEAT, &register, &mut rng), HEARTBEAT);
        let to_hold = LastContact {
            registered_to_hold: true,
            ..register
        };
        assert_eq!(next_contact(HEARTBEAT, &to_hold, &mut rng), Duration::ZERO);
    }

    #[test]
    fn jitter_never_exceeds_a_short_heartbeat() {
        let mut rng = StdRng::seed_from_u64(4);
        for _ in 0..100 {
            assert!(
                reconnect_jitter(Duration::from_millis(200), &mut rng)
                    <= Duration::from_millis(200)
            );
        }
    }
}
