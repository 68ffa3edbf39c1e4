//! What to do after a failure, decided from what was observed: pure functions, so that
//! every way out of the updater is unit tested without processes or disks.
//!
//! The rule they serve (docs/design.md, "The update, and what is kept", step 7):
//! whatever fails, an agent runs again within seconds, and a state file that cannot be
//! written is never the reason it does not.

use std::time::{Duration, UNIX_EPOCH};

use agent_protocol::journal::{Journal, Phase};

/// Less free space than this on the installation's filesystem counts as a full disk: no
/// version can be judged fairly when it cannot write its own state files.
pub const FULL_BELOW: u64 = 1024 * 1024;

use agent_protocol::blame::DISK_FULL;
pub use agent_protocol::blame::mentions_full_disk;

/// A failure in an operator's words: a full disk is named as such, first.
pub fn explain(reason: &str) -> String {
    if reason.starts_with(DISK_FULL) || !mentions_full_disk(reason) {
        reason.to_owned()
    } else {
        format!("{DISK_FULL} ({reason})")
    }
}

/// Whose fault a failed start of the new version is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Blame {
    /// The new version itself: remembered in `data/bad-versions`, never retried.
    Bundle,
    /// The disk was full while the new version was judged: not the bundle's fault, so it
    /// is tried again once there is room. The reason names the disk.
    Disk(String),
}

/// `reason` is the judge's; `free` the bytes free on the installation's filesystem when
/// the judge gave up (`None`: unknown).
pub fn blame(reason: &str, free: Option<u64>) -> Blame {
    if mentions_full_disk(reason) {
        return Blame::Disk(explain(reason));
    }
    match free {
        Some(free) if free < FULL_BELOW => Blame::Disk(format!(
            "{DISK_FULL} ({free} bytes free) while the new version was judged: {reason}"
        )),
        _ => Blame::Bundle,
    }
}

/// How a recovery takes up a transaction that an updater left before the switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resume {
    /// Go on from the journal's phase: nothing runs, so the update may as well finish.
    Forward,
    /// The old agent runs again (an earlier updater started it but could not close the
    /// journal): close the transaction around it; the agent tries the update again.
    Abandon,
}

pub fn resume(phase: Phase, recovering: bool, agent_running: bool) -> Resume {
    if recovering && phase < Phase::Switched && agent_running {
        Resume::Abandon
    } else {
        Resume::Forward
    }
}

/// Whether an updater leaving with an error of its own must make sure an agent runs: it
/// must when an agent handed the installation to it (`--wait-pid`), when it recovers
/// (the wrapper or the agent asked it to), and once it took up a transaction. An update
/// started by hand that fails before it began changed nothing, and starts nothing.
pub fn must_leave_an_agent(handed_off: bool, recovering: bool, began: bool) -> bool {
    handed_off || recovering || began
}

/// One line for `agent status` about the last update, as of `now` (unix seconds);
/// `updater_running`: an updater holds `run/update.lock`.
pub fn describe(journal: &Journal, now: u64, updater_running: bool) -> String {
    let (from, to) = (&journal.from, &journal.to);
    let when = journal
        .ended_at
        .map(|t| format!(" {}", when(t, now)))
        .unwrap_or_default();
    let reason = journal.reason.as_deref().map(explain).unwrap_or_default();
    match journal.phase {
        Phase::Committed => format!("last {from} -> {to} committed{when}"),
        Phase::RolledBack if journal.abandoned => format!(
            "last {from} -> {to} abandoned before the switch{when}: {reason}; {from} kept running and the update is tried again"
        ),
        Phase::RolledBack => format!("last {from} -> {to} rolled back{when}: {reason}"),
        phase if updater_running => format!("{from} -> {to} under way (phase {phase:?})"),
        _ if journal.planned_stop.is_some() => format!(
            "{from} -> {to} waits for a verdict: {}; {to} is installed, and its next start judges it",
            journal.planned_stop.as_deref().unwrap_or_default()
        ),
        phase => format!(
            "{from} -> {to} interrupted at phase {phase:?} (no updater runs): the agent, or the next start through the wrapper, finishes it or rolls it back{}",
            if reason.is_empty() {
                String::new()
            } else {
                format!("; last reason: {reason}")
            }
        ),
    }
}

/// `at Mon, 23 Nov 2026 17:40:02 GMT (3 min ago)`.
fn when(at: u64, now: u64) -> String {
    let date = httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(at));
    let ago = now.saturating_sub(at);
    let ago = match ago {
        0..120 => format!("{ago} s"),
        120..7200 => format!("{} min", ago / 60),
        7200..172_800 => format!("{} h", ago / 3600),
        _ => format!("{} days", ago / 86_400),
    };
    format!("at {date} ({ago} ago)")
}

#[cfg(test)]
mod tests {
    use super::*;

    const ENOSPC: &str =
        "/a/agent/versions/.staging-2.0.0+2/LICENSE: No space left on device (os error 28)";

    #[test]
    fn a_full_disk_is_named_once() {
        let said = explain(ENOSPC);
        assert_eq!(said, format!("the disk is full ({ENOSPC})"));
        assert_eq!(explain(&said), said);
        assert_eq!(explain("bundle changed"), "bundle changed");
        assert!(explain("x: Disk quota exceeded (os error 122)").starts_with("the disk is full"));
    }

    #[test]
    fn the_bundle_is_blamed_only_when_the_disk_had_room() {
        let judged = "2.0.0+2 did not become healthy within 20s";
        assert_eq!(blame(judged, Some(100 << 20)), Blame::Bundle);
        assert_eq!(blame(judged, None), Blame::Bundle);
        let Blame::Disk(reason) = blame(judged, Some(4096)) else {
            panic!("a full disk blamed the bundle")
        };
        assert!(
            reason.starts_with("the disk is full (4096 bytes free)"),
            "{reason}"
        );
        assert!(reason.ends_with(judged), "{reason}");
        assert!(matches!(blame(ENOSPC, Some(100 << 20)), Blame::Disk(_)));
    }

    #[test]
    fn recovery_closes_around_a_running_old_agent_and_finishes_otherwise() {
        for phase in [Phase::Prepared, Phase::Stopping, Phase::Unpacked] {
            assert_eq!(resume(phase, true, true), Resume::Abandon, "{phase:?}");
            assert_eq!(resume(phase, true, false), Resume::Forward, "{phase:?}");
            // The agent's own hand-off: it runs on purpose until the unpack is done.
            assert_eq!(resume(phase, false, true), Resume::Forward, "{phase:?}");
        }
        // After the switch the agent that runs is the new one, being judged.
        assert_eq!(resume(Phase::Switched, true, true), Resume::Forward);
        assert_eq!(resume(Phase::RollingBack, true, true), Resume::Forward);
    }

    #[test]
    fn only_a_hand_run_update_that_never_began_starts_nothing() {
        assert!(!must_leave_an_agent(false, false, false));
        assert!(must_leave_an_agent(true, false, false));
        assert!(must_leave_an_agent(false, true, false));
        assert!(must_leave_an_agent(false, false, true));
    }

    fn journal(phase: Phase) -> Journal {
        Journal {
            from: "1.0.0+1".parse().unwrap(),
            to: "2.0.0+2".parse().unwrap(),
            bundle_sha256: "ab".repeat(32),
            bundle_path: "/x".into(),
            phase,
            started_at: 1_000,
            boot_count: 0,
            reason: Some(ENOSPC.into()),
            from_dir: None,
            trust: None,
            ended_at: Some(1_000),
            abandoned: phase == Phase::RolledBack,
            planned_stop: None,
        }
    }

    #[test]
    fn status_says_when_and_why_an_update_was_abandoned() {
        let line = describe(&journal(Phase::RolledBack), 1_000 + 180, false);
        assert!(
            line.starts_with("last 1.0.0+1 -> 2.0.0+2 abandoned before the switch at "),
            "{line}"
        );
        assert!(
            line.contains("GMT (3 min ago): the disk is full (/a/agent"),
            "{line}"
        );
        assert!(line.contains("1.0.0+1 kept running"), "{line}");
        let rolled = Journal {
            abandoned: false,
            reason: Some("it crashed".into()),
            ..journal(Phase::RolledBack)
        };
        assert!(describe(&rolled, 1_010, false).ends_with("(10 s ago): it crashed"));
        assert!(describe(&journal(Phase::Unpacked), 0, true).contains("under way"));
        let stale = describe(&journal(Phase::Unpacked), 0, false);
        assert!(
            stale.contains("interrupted at phase Unpacked (no updater runs)"),
            "{stale}"
        );
        assert!(stale.contains("last reason: the disk is full"), "{stale}");
        let put_off = Journal {
            planned_stop: Some(
                "the new agent was stopped on request (agent-wrapper.sh stop)".into(),
            ),
            reason: None,
            ..journal(Phase::Switched)
        };
        let line = describe(&put_off, 0, false);
        assert!(
            line.starts_with(
                "1.0.0+1 -> 2.0.0+2 waits for a verdict: the new agent was stopped on request"
            ) && line.ends_with("its next start judges it"),
            "{line}"
        );
    }
}
