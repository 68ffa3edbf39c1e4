//! When a failed update round is tried again, and what that means for the next contact.
//!
//! A round fails for one of three kinds of reason, and each is retried differently:
//!
//! - **transient** (a full disk, a download cut or stalled, an updater that did not
//!   start or stopped before the switch, facts that did not match): tried again on a
//!   short backoff, because the cause may pass by itself;
//! - **needs a change** (downloads refused, no trusted key, a signature that does not
//!   verify): tried again on a slow backoff, because someone must change something;
//! - **bad bundle** (it failed to come up healthy here: `data/bad-versions`): never tried
//!   again; only a different bundle from the server is (a server whose `409` does not
//!   name its bundle is asked what it serves on the slow backoff).
//!
//! A retry that is due must not wait for the server: a held connect (a long poll) is
//! only answered when something changes for the agent, and nothing does while its disk
//! fills and empties. So the hold, and the pause between heartbeats, end when the retry
//! is due ([`bounded`]).
//!
//! Everything here is a function of what was observed and the time: no I/O.

use std::time::{Duration, Instant};

use rand::Rng;

use crate::contact::backoff::Backoff;

/// Why an update round ended without handing over to the updater.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// May pass by itself.
    Transient,
    /// Needs the server or the operator to change something.
    NeedsChange,
    /// What the agent got does not verify (no signature, a signature that fails, an
    /// untrusted or retired key, hashes or a platform other than the server named):
    /// the bundle's fault, reported `INSTALL_FAILED` at once; tried again slowly.
    Rejected,
    /// The bundle failed to come up healthy here before.
    BadBundle,
}

/// What a `409` offered: the version it names and, from servers that say so, the sha256
/// of the bundle behind it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offer {
    pub expected: String,
    pub sha256: Option<String>,
}

/// When the offer that failed is tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextRound {
    /// At this instant, whether or not the server has anything new to say.
    At(Instant),
    /// Only once the server offers a different bundle.
    OnNewOffer,
}

/// Whether to start an update round now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// No round failed, or its wait is over.
    Go,
    /// The last round failed and its wait is not over.
    Wait,
    /// The last round failed, but the server now offers something else: a fixed bundle
    /// is tried at once (after a little jitter), not after the failure's backoff.
    Changed,
}

/// The failed round's offer and when it is tried again.
#[derive(Debug, Clone, Default)]
pub struct RetryGate {
    failed: Option<(Offer, NextRound)>,
}

impl RetryGate {
    pub fn decide(&self, offer: &Offer, now: Instant) -> Gate {
        match &self.failed {
            None => Gate::Go,
            Some((failed, _)) if failed != offer => Gate::Changed,
            Some((_, NextRound::At(when))) if now >= *when => Gate::Go,
            Some(_) => Gate::Wait,
        }
    }

    pub fn failed(&mut self, offer: &Offer, next: NextRound) {
        self.failed = Some((offer.clone(), next));
    }

    /// The instant a failed round is due again, if it is due at all without news.
    pub fn due(&self) -> Option<Instant> {
        match self.failed {
            Some((_, NextRound::At(when))) => Some(when),
            _ => None,
        }
    }

    pub fn reset(&mut self) {
        *self = Self::default();
    }
}

/// The longest a transient failure keeps an agent away, in heartbeats: a disk full for
/// an hour must not leave a fleet an hour behind once it has room again.
const TRANSIENT_CAP_HEARTBEATS: u32 = 8;
/// ... and in any case.
const TRANSIENT_CAP: Duration = Duration::from_secs(15 * 60);
/// The slow backoff starts at this many heartbeats.
const NEEDS_CHANGE_FIRST_HEARTBEATS: u32 = 4;

/// The pace of what may pass by itself: from a heartbeat, doubling, capped.
fn transient_backoff(heartbeat: Duration) -> Backoff {
    Backoff::new(
        heartbeat,
        (heartbeat * TRANSIENT_CAP_HEARTBEATS).min(TRANSIENT_CAP),
    )
}

/// The rounds' memory: the gate, and a backoff per kind of failure that has one.
#[derive(Debug, Clone)]
pub struct Retry {
    pub gate: RetryGate,
    transient: Backoff,
    needs_change: Backoff,
    /// The bad bundle last said to be skipped, so that it is said once, not every heartbeat.
    pub quiet_bad: Option<String>,
    /// Asking the updater to close an update it left open: on the transient backoff's
    /// pace, and not before this.
    recover: Backoff,
    recover_not_before: Option<Instant>,
    /// The last failure told to the server, so a round that fails again the same way
    /// is not told again.
    told: Option<agent_protocol::wire::Report>,
    /// The offer update locks hold off, since when, and the last words said of it.
    deferral: Option<(Offer, Instant, String)>,
    /// When a deferral runs out (`update.max-defer`), so a wait ends then.
    max_defer: Duration,
}

impl Retry {
    /// Backoffs for an agent that contacts its server at least every `heartbeat`;
    /// `max_retry_after` caps the slow one.
    pub fn new(heartbeat: Duration, max_retry_after: Duration) -> Self {
        Self {
            gate: RetryGate::default(),
            transient: transient_backoff(heartbeat),
            needs_change: Backoff::new(heartbeat * NEEDS_CHANGE_FIRST_HEARTBEATS, max_retry_after),
            quiet_bad: None,
            recover: transient_backoff(heartbeat),
            recover_not_before: None,
            told: None,
            deferral: None,
            max_defer: Duration::from_secs(24 * 3600),
        }
    }

    /// `update.max-defer`: a deferral that runs out ends a wait.
    pub fn with_max_defer(mut self, max_defer: Duration) -> Self {
        self.max_defer = max_defer;
        self
    }

    /// How long update locks have held `offer` off, counting from now if they held off
    /// nothing (or another offer) before.
    pub fn deferred_for(&mut self, offer: &Offer, now: Instant) -> Duration {
        match &self.deferral {
            Some((o, since, _)) if o == offer => now.saturating_duration_since(*since),
            _ => {
                self.deferral = Some((offer.clone(), now, String::new()));
                Duration::ZERO
            }
        }
    }

    /// Whether update locks hold an update off now.
    pub fn deferring(&self) -> bool {
        self.deferral.is_some()
    }

    pub fn end_deferral(&mut self) {
        self.deferral = None;
    }

    /// Whether `words` are new for this deferral (said once, not every heartbeat).
    pub fn first_deferral_said(&mut self, words: &str) -> bool {
        // Words without the countdown: it changes every time.
        let key = words.split("; the update to").next().unwrap_or(words);
        match &mut self.deferral {
            Some((_, _, said)) if said == key => false,
            Some((_, _, said)) => {
                *said = key.to_owned();
                true
            }
            None => true,
        }
    }

    /// Whether `report` is news to the server (not the last failure told); remembers it.
    pub fn first_telling(&mut self, report: &agent_protocol::wire::Report) -> bool {
        if self.told.as_ref() == Some(report) {
            return false;
        }
        self.told = Some(report.clone());
        true
    }

    /// The next instant the agent acts on its own, without news from the server: a
    /// failed round due again, or another request to close an update left open. Only
    /// what is still ahead counts: a retry that fell due and was not made (the update
    /// is still open, an updater is at work) must not cut every wait to nothing.
    pub fn next_due(&self, now: Instant) -> Option<Instant> {
        let deferral_ends = self
            .deferral
            .as_ref()
            .map(|(_, since, _)| *since + self.max_defer);
        [self.gate.due(), self.recover_not_before, deferral_ends]
            .into_iter()
            .flatten()
            .filter(|t| *t > now)
            .min()
    }

    /// Whether an update left open should be closed now: the failed round is due (or
    /// none failed), and the last request to close it was long enough ago.
    pub fn recover_due(&self, now: Instant) -> bool {
        self.gate.due().is_none_or(|due| now >= due)
            && self.recover_not_before.is_none_or(|t| now >= t)
    }

    /// The updater was asked to close an open update at `now`: when to ask again.
    pub fn recovering(&mut self, now: Instant, rng: &mut impl Rng) -> Instant {
        let next = now + self.recover.next_wait(rng);
        self.recover_not_before = Some(next);
        next
    }

    /// The server accepts this agent: whatever failed before is over.
    pub fn reset(&mut self) {
        self.gate.reset();
        self.transient.reset();
        self.needs_change.reset();
        self.quiet_bad = None;
        self.recover.reset();
        self.recover_not_before = None;
        self.told = None;
        self.deferral = None;
    }

    /// A round for `offer` failed with `failure` at `now`: when it is tried again.
    pub fn failed(
        &mut self,
        offer: &Offer,
        failure: Failure,
        now: Instant,
        rng: &mut impl Rng,
    ) -> NextRound {
        let next = match failure {
            Failure::Transient => NextRound::At(now + self.transient.next_wait(rng)),
            Failure::NeedsChange | Failure::Rejected => {
                NextRound::At(now + self.needs_change.next_wait(rng))
            }
            // A server that names its bundle says when it changes; of one that does not,
            // `/agentupdate/version` is asked again on the slow backoff.
            Failure::BadBundle if offer.sha256.is_some() => NextRound::OnNewOffer,
            Failure::BadBundle => NextRound::At(now + self.needs_change.next_wait(rng)),
        };
        self.gate.failed(offer, next);
        next
    }
}

/// What a failed round tells the server: the bundle's fault counts against the rollout,
/// the machine's is a retry; a bundle already in `data/bad-versions` was reported by the
/// updater that rolled it back.
pub fn report_status(failure: Failure) -> Option<agent_protocol::wire::UpdateStatus> {
    use agent_protocol::wire::UpdateStatus;
    match failure {
        Failure::Rejected => Some(UpdateStatus::InstallFailed),
        Failure::Transient | Failure::NeedsChange => Some(UpdateStatus::Retrying),
        Failure::BadBundle => None,
    }
}

/// `wait` (a hold, or the pause before the next contact), ended early enough that a
/// retry due at `due` is made on time.
pub fn bounded(wait: Duration, due: Option<Instant>, now: Instant) -> Duration {
    match due {
        Some(due) => wait.min(due.saturating_duration_since(now)),
        None => wait,
    }
}

/// How a round's outcome reads in the log: when the agent looks again.
pub fn when_again(next: NextRound, now: Instant) -> String {
    match next {
        NextRound::At(when) => format!(
            "checking again in {:.0}s, or as soon as the server offers another bundle",
            when.saturating_duration_since(now).as_secs_f64().max(1.0)
        ),
        NextRound::OnNewOffer => {
            "waiting for the server to offer another bundle (agent update --clear-bad forgets)"
                .to_owned()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    const HEARTBEAT: Duration = Duration::from_secs(1);

    fn offer(sha: char) -> Offer {
        Offer {
            expected: "2.0.0+2".into(),
            sha256: Some(sha.to_string().repeat(64)),
        }
    }

    #[test]
    fn a_changed_offer_opens_the_gate_before_the_backoff_ends() {
        let now = Instant::now();
        let broken = offer('a');
        let mut gate = RetryGate::default();
        assert_eq!(gate.decide(&broken, now), Gate::Go);
        gate.failed(&broken, NextRound::At(now + Duration::from_secs(197)));
        assert_eq!(
            gate.decide(&broken, now + Duration::from_secs(60)),
            Gate::Wait
        );
        assert_eq!(
            gate.decide(&broken, now + Duration::from_secs(197)),
            Gate::Go
        );
        assert_eq!(
            gate.decide(&offer('b'), now + Duration::from_secs(1)),
            Gate::Changed
        );
        let new_version = Offer {
            expected: "2.0.1+3".into(),
            sha256: None,
        };
        assert_eq!(gate.decide(&new_version, now), Gate::Changed);
        gate.reset();
        assert_eq!(gate.decide(&broken, now), Gate::Go);
    }

    /// A full disk, a cut download, an updater that stopped before the switch: the same
    /// offer is tried again on its own, after a short backoff, with no news from the server.
    #[test]
    fn a_transient_failure_is_retried_on_its_backoff_without_news() {
        let mut rng = StdRng::seed_from_u64(1);
        let now = Instant::now();
        let mut retry = Retry::new(HEARTBEAT, Duration::from_secs(3600));
        let next = retry.failed(&offer('a'), Failure::Transient, now, &mut rng);
        let NextRound::At(when) = next else {
            panic!("a transient failure waits for news: {next:?}");
        };
        assert!(when <= now + HEARTBEAT, "{:?}", when - now);
        assert_eq!(retry.gate.due(), Some(when));
        assert_eq!(retry.gate.decide(&offer('a'), now), Gate::Wait);
        assert_eq!(retry.gate.decide(&offer('a'), when), Gate::Go);
    }

    /// Failing all the while the disk stays full, an agent still comes back within a few
    /// heartbeats of the space returning.
    #[test]
    fn transient_backoff_is_capped_in_heartbeats() {
        let mut rng = StdRng::seed_from_u64(2);
        let mut now = Instant::now();
        let mut retry = Retry::new(HEARTBEAT, Duration::from_secs(3600));
        for _ in 0..30 {
            let NextRound::At(when) = retry.failed(&offer('a'), Failure::Transient, now, &mut rng)
            else {
                panic!("transient failures are retried");
            };
            assert!(when - now <= HEARTBEAT * TRANSIENT_CAP_HEARTBEATS);
            now = when;
        }
        let mut slow_heartbeat = Retry::new(Duration::from_secs(600), Duration::from_secs(3600));
        for _ in 0..30 {
            let NextRound::At(when) =
                slow_heartbeat.failed(&offer('a'), Failure::Transient, now, &mut rng)
            else {
                panic!("transient failures are retried");
            };
            assert!(when - now <= TRANSIENT_CAP);
        }
    }

    #[test]
    fn a_failure_that_needs_a_change_is_retried_slowly() {
        let mut rng = StdRng::seed_from_u64(3);
        let now = Instant::now();
        let mut retry = Retry::new(HEARTBEAT, Duration::from_secs(3600));
        let NextRound::At(when) = retry.failed(&offer('a'), Failure::NeedsChange, now, &mut rng)
        else {
            panic!("downloads refused are asked again");
        };
        assert!(when - now >= HEARTBEAT * 2, "{:?}", when - now);
        assert!(when - now <= HEARTBEAT * 4, "{:?}", when - now);
    }

    /// A bundle that failed to come up healthy is not retried, however long the agent
    /// waits: only another offer opens the gate, and no retry is ever due.
    #[test]
    fn a_bad_bundle_waits_for_a_new_offer() {
        let mut rng = StdRng::seed_from_u64(4);
        let now = Instant::now();
        let mut retry = Retry::new(HEARTBEAT, Duration::from_secs(3600));
        let next = retry.failed(&offer('a'), Failure::BadBundle, now, &mut rng);
        assert_eq!(next, NextRound::OnNewOffer);
        assert_eq!(retry.gate.due(), None);
        let a_day = now + Duration::from_secs(86_400);
        assert_eq!(retry.gate.decide(&offer('a'), a_day), Gate::Wait);
        assert_eq!(retry.gate.decide(&offer('b'), now), Gate::Changed);
        retry.reset();
        assert_eq!(retry.gate.decide(&offer('a'), now), Gate::Go);
        // A server that does not name its bundle is asked again, slowly, what it serves.
        let unnamed = Offer {
            expected: "2.0.0+2".into(),
            sha256: None,
        };
        let NextRound::At(when) = retry.failed(&unnamed, Failure::BadBundle, now, &mut rng) else {
            panic!("an unnamed bad bundle is looked at again");
        };
        assert!(when - now >= HEARTBEAT * 2);
    }

    /// A held connect of a minute ends when the retry is due, not a minute later.
    #[test]
    fn waits_end_when_a_retry_is_due() {
        let now = Instant::now();
        let minute = Duration::from_secs(60);
        assert_eq!(bounded(minute, None, now), minute);
        assert_eq!(
            bounded(minute, Some(now + Duration::from_secs(2)), now),
            Duration::from_secs(2)
        );
        assert_eq!(
            bounded(Duration::from_secs(1), Some(now + minute), now),
            Duration::from_secs(1)
        );
        assert_eq!(
            bounded(minute, Some(now - Duration::from_secs(5)), now),
            Duration::ZERO
        );
    }

    /// An update the updater could not close (the disk was full) is asked to be closed
    /// when the retry is due, then on a backoff of its own while it stays open.
    #[test]
    fn an_update_left_open_is_closed_on_the_retry_pace() {
        let mut rng = StdRng::seed_from_u64(5);
        let now = Instant::now();
        let mut retry = Retry::new(HEARTBEAT, Duration::from_secs(3600));
        assert!(retry.recover_due(now));
        let NextRound::At(due) = retry.failed(&offer('a'), Failure::Transient, now, &mut rng)
        else {
            panic!("transient");
        };
        assert!(!retry.recover_due(now));
        assert!(retry.recover_due(due));
        let again = retry.recovering(due, &mut rng);
        assert!(again > due && again - due <= HEARTBEAT);
        assert!(!retry.recover_due(due));
        assert!(retry.recover_due(again));
        let mut later = again;
        for _ in 0..20 {
            let next = retry.recovering(later, &mut rng);
            assert!(next - later <= HEARTBEAT * TRANSIENT_CAP_HEARTBEATS);
            later = next;
        }
        retry.reset();
        assert!(retry.recover_due(now));
    }

    /// Past its instant, a retry that was not made (the update is still open and an
    /// updater is at work) no longer shortens the waits: the agent does not spin.
    #[test]
    fn only_what_is_ahead_cuts_a_wait_short() {
        let mut rng = StdRng::seed_from_u64(6);
        let now = Instant::now();
        let mut retry = Retry::new(HEARTBEAT, Duration::from_secs(3600));
        assert_eq!(retry.next_due(now), None);
        let NextRound::At(due) = retry.failed(&offer('a'), Failure::Transient, now, &mut rng)
        else {
            panic!("transient");
        };
        assert_eq!(retry.next_due(now), Some(due));
        let later = due + Duration::from_millis(1);
        assert_eq!(retry.next_due(later), None);
        let again = retry.recovering(later, &mut rng);
        assert_eq!(retry.next_due(later), Some(again));
        assert_eq!(
            bounded(Duration::from_secs(30), retry.next_due(again), again),
            Duration::from_secs(30)
        );
    }

    #[test]
    fn the_bundle_is_blamed_for_what_does_not_verify_and_the_machine_for_the_rest() {
        use agent_protocol::wire::UpdateStatus;
        assert_eq!(
            report_status(Failure::Rejected),
            Some(UpdateStatus::InstallFailed)
        );
        assert_eq!(
            report_status(Failure::Transient),
            Some(UpdateStatus::Retrying)
        );
        assert_eq!(
            report_status(Failure::NeedsChange),
            Some(UpdateStatus::Retrying)
        );
        // The updater that rolled it back reported it.
        assert_eq!(report_status(Failure::BadBundle), None);
    }

    #[test]
    fn a_failure_is_told_once_until_it_changes() {
        use agent_protocol::wire::{Report, UpdateStatus};
        let mut retry = Retry::new(HEARTBEAT, Duration::from_secs(60));
        let report = |error: &str| Report {
            id: "a".into(),
            from: "1.0.0+1".into(),
            to: "2.0.0+2".into(),
            status: UpdateStatus::InstallFailed,
            error: Some(error.into()),
        };
        assert!(retry.first_telling(&report("no signature")));
        assert!(!retry.first_telling(&report("no signature")));
        assert!(retry.first_telling(&report("the disk is full")));
        retry.reset();
        assert!(retry.first_telling(&report("the disk is full")));
    }

    #[test]
    fn the_log_keeps_its_promise() {
        let now = Instant::now();
        let at = when_again(NextRound::At(now + Duration::from_secs(2)), now);
        assert!(at.starts_with("checking again in 2s"), "{at}");
        let bad = when_again(NextRound::OnNewOffer, now);
        assert!(!bad.contains("checking again"), "{bad}");
    }
}
