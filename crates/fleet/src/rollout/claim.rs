//! Whether the bundle a server serves may start a rollout of its own, given the fleet's
//! latest rollout: a pure function, so that every server of a cloud answers the same.
//!
//! The rules, in order:
//! - a bundle signed before the fleet's latest rollout never starts one (agents that run
//!   the newer signature would refuse it as a replay anyway); a deliberate downgrade is
//!   the old version signed again;
//! - several servers on one database start no second rollout while the fleet's is under
//!   way: a server that got a newer bundle first waits until that rollout completes or an
//!   operator halts it. One server alone replaces its own rollout at once.

use crate::rollout::Served;
use crate::rollout::step::State;
use crate::rollout::store::RolloutRow;

/// What a served bundle may do about the fleet's latest rollout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// The fleet's latest rollout is of this bundle.
    Ours,
    /// It may start its rollout now.
    Start,
    /// Signed before the fleet's latest rollout: it never starts one.
    Stale,
    /// Newer, but the fleet's rollout is under way on a shared database: it waits.
    Busy,
}

pub fn claim(latest: Option<&RolloutRow>, served: &Served, shared: bool) -> Claim {
    let Some(fleet) = latest else {
        return Claim::Start;
    };
    let bundle = &fleet.subject;
    if bundle.sha256 == served.sha256 && bundle.signed_at == served.signed_at {
        return Claim::Ours;
    }
    // 0 is "no signature": nothing to order by.
    if served.signed_at != 0 && bundle.signed_at != 0 && served.signed_at < bundle.signed_at {
        return Claim::Stale;
    }
    if shared && !matches!(fleet.state, State::Halted | State::Completed) {
        return Claim::Busy;
    }
    Claim::Start
}

/// What an operator is told (in `/healthz`, the log and `/admin/rollout`) when this
/// server's bundle is not the fleet's rollout; `None` when it is, or when there is none.
pub fn mismatch(latest: Option<&RolloutRow>, served: &Served, shared: bool) -> Option<String> {
    let fleet = latest?;
    let ours = format!(
        "this server serves {} (sha256 {})",
        served.version, served.sha256
    );
    let theirs = format!(
        "the fleet's rollout of {} (sha256 {})",
        fleet.subject.version, fleet.subject.sha256
    );
    match claim(latest, served, shared) {
        Claim::Ours => None,
        // Most often an older release put back by hand: its old signature is what agents
        // refuse as a replay, and the way back is a fresh one through a rollback.
        Claim::Stale => Some(format!(
            "{ours}, signed before {theirs}; it starts no rollout of an older signature (agents would refuse it as a replay): give it the fleet's bundle, or to go back to {v}, sign its bundles again (`agent-bundle sign --key K FILE…`, fresh signatures over the same bytes) and make it the target with `update-server release rollback --to {v} --signatures DIR`",
            v = served.version
        )),
        Claim::Busy => Some(format!(
            "{ours}, but {theirs} is under way; it starts no second rollout until that one completes or is halted (`update-server rollout halt`): give it the fleet's bundle, or halt the fleet's rollout"
        )),
        Claim::Start => Some(format!(
            "{ours}, but {theirs}; it starts no rollout of its own: give it the fleet's bundle"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::plan::Plan;
    use crate::rollout::store::Bundle;

    fn fleet(sha: &str, signed_at: i64, state: State) -> RolloutRow {
        RolloutRow {
            id: 1,
            subject: Bundle {
                sha256: sha.into(),
                signed_at,
                version: "2.0.0+1".parse().unwrap(),
                previous: None,
            },
            state,
            reason: None,
            halt_cause: None,
            plan: Plan::default(),
            opened: 1,
            forgiven: 0,
            started_at: 0,
            completed_at: None,
        }
    }

    fn served(sha: &str, signed_at: i64) -> Served {
        Served {
            sha256: sha.into(),
            signed_at,
            version: "1.0.0+1".parse().unwrap(),
            platforms: Vec::new(),
        }
    }

    #[test]
    fn the_first_bundle_starts_and_the_fleets_own_is_ours() {
        assert_eq!(claim(None, &served("a", 10), true), Claim::Start);
        let f = fleet("a", 10, State::Running);
        assert_eq!(claim(Some(&f), &served("a", 10), true), Claim::Ours);
        assert_eq!(mismatch(Some(&f), &served("a", 10), true), None);
        assert_eq!(mismatch(None, &served("a", 10), true), None);
        // The same content signed again is another bundle.
        assert_eq!(claim(Some(&f), &served("a", 11), false), Claim::Start);
    }

    #[test]
    fn an_older_signature_never_starts_a_rollout() {
        for state in State::ALL {
            for shared in [false, true] {
                let f = fleet("b", 20, state);
                assert_eq!(claim(Some(&f), &served("a", 19), shared), Claim::Stale);
                let text = mismatch(Some(&f), &served("a", 19), shared).unwrap();
                assert!(text.contains("signed before"), "{text}");
                assert!(
                    text.contains("give it the fleet's bundle")
                        && text.contains("agent-bundle sign")
                        && text.contains("update-server release rollback --to"),
                    "{text}"
                );
            }
        }
        // The same second is not older: two bundles packed at once stay in drop order.
        let f = fleet("b", 20, State::Completed);
        assert_eq!(claim(Some(&f), &served("a", 20), true), Claim::Start);
        // Without a signature there is no order.
        assert_eq!(claim(Some(&f), &served("a", 0), true), Claim::Start);
        let unsigned = fleet("b", 0, State::Completed);
        assert_eq!(claim(Some(&unsigned), &served("a", 5), true), Claim::Start);
    }

    #[test]
    fn a_shared_fleet_waits_for_its_rollout_to_end() {
        for state in [State::Running, State::Soaking] {
            let f = fleet("b", 20, state);
            assert_eq!(claim(Some(&f), &served("a", 30), true), Claim::Busy);
            let text = mismatch(Some(&f), &served("a", 30), true).unwrap();
            assert!(text.contains("under way"), "{text}");
            // One server alone replaces its own rollout.
            assert_eq!(claim(Some(&f), &served("a", 30), false), Claim::Start);
        }
        for state in [State::Halted, State::Completed] {
            let f = fleet("b", 20, state);
            assert_eq!(claim(Some(&f), &served("a", 30), true), Claim::Start);
        }
    }
}
