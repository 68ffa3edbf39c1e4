//! Wave membership: a stable order of the agents, cut into cumulative waves.
//!
//! The order is a hash of the agent id and the bundle's sha256, so every server of a
//! fleet computes the same order for the same rollout, and each rollout starts with a
//! different first wave (no machine is always the canary). Agents of a `group:` wave
//! come first, in the order of the plan.

use sha2::{Digest, Sha256};

use crate::rollout::plan::{Plan, WaveSpec};

/// An agent as the plan sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub id: String,
    pub group: String,
}

/// The agent's place in this rollout's order.
pub fn rank(agent_id: &str, bundle_sha256: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(agent_id.as_bytes());
    h.update(b"\n");
    h.update(bundle_sha256.as_bytes());
    h.finalize().into()
}

/// Assigns every member a wave (1-based), in input order. Waves are cumulative: a count or
/// a share says how many agents have been reached once that wave is open; shares are
/// rounded up, so the first wave of a fleet that is not empty is never empty.
pub fn assign(plan: &Plan, bundle_sha256: &str, members: &[Member]) -> Vec<u32> {
    let total = members.len() as u64;
    let mut by_rank: Vec<usize> = (0..members.len()).collect();
    by_rank.sort_by_cached_key(|&i| (rank(&members[i].id, bundle_sha256), members[i].id.clone()));

    let mut waves = vec![0u32; members.len()];
    let mut placed = vec![false; members.len()];
    let mut reached: u64 = 0;
    let last = plan.wave_count();
    for (index, spec) in plan.waves.iter().enumerate() {
        let wave = index as u32 + 1;
        match spec {
            WaveSpec::Group(name) => {
                for &i in &by_rank {
                    if !placed[i] && members[i].group == *name {
                        (waves[i], placed[i]) = (wave, true);
                        reached += 1;
                    }
                }
            }
            WaveSpec::Count(_) | WaveSpec::Share(_) => {
                let target = if wave == last {
                    total
                } else {
                    cumulative(spec, total).min(total)
                };
                for &i in &by_rank {
                    if reached >= target {
                        break;
                    }
                    if !placed[i] {
                        (waves[i], placed[i]) = (wave, true);
                        reached += 1;
                    }
                }
            }
        }
    }
    // A plan always ends with everyone, but an agent must never be left without a wave.
    for (i, wave) in waves.iter_mut().enumerate() {
        if !placed[i] {
            *wave = last.max(1);
        }
    }
    waves
}

/// How many agents a count or share wave reaches in a fleet of `total`.
fn cumulative(spec: &WaveSpec, total: u64) -> u64 {
    match spec {
        WaveSpec::Count(n) => *n,
        WaveSpec::Share(bp) => (total * u64::from(*bp)).div_ceil(10_000),
        WaveSpec::Group(_) => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(waves: &[&str]) -> Plan {
        let waves: Vec<String> = waves.iter().map(|s| (*s).to_owned()).collect();
        Plan::new(&waves, 0, "10%", 1800).unwrap()
    }

    fn fleet(n: usize) -> Vec<Member> {
        (0..n)
            .map(|i| Member {
                id: format!("agent-{i:04}"),
                group: String::new(),
            })
            .collect()
    }

    fn sizes(waves: &[u32], count: u32) -> Vec<usize> {
        (1..=count)
            .map(|w| waves.iter().filter(|&&x| x == w).count())
            .collect()
    }

    #[test]
    fn cumulative_waves_of_ten() {
        let p = plan(&["2", "50%", "100%"]);
        let waves = assign(&p, &"a".repeat(64), &fleet(10));
        assert_eq!(sizes(&waves, 3), vec![2, 3, 5]);
    }

    #[test]
    fn shares_round_up_so_the_first_wave_is_never_empty() {
        let p = plan(&["1%", "10%", "100%"]);
        for n in [1, 3, 99, 101, 10_000] {
            let waves = assign(&p, &"b".repeat(64), &fleet(n));
            let s = sizes(&waves, 3);
            assert!(s[0] >= 1, "fleet of {n}: {s:?}");
            assert_eq!(s.iter().sum::<usize>(), n);
        }
        let s = sizes(&assign(&p, &"b".repeat(64), &fleet(10_000)), 3);
        assert_eq!(s, vec![100, 900, 9000]);
        assert!(assign(&p, "x", &[]).is_empty());
    }

    /// Another server computes the same waves from the same agents, in any order; another
    /// bundle gets another first wave.
    #[test]
    fn membership_is_stable_across_calls_and_servers_and_differs_between_rollouts() {
        let p = plan(&["2", "50%", "100%"]);
        let agents = fleet(50);
        let sha = "c".repeat(64);
        let first = assign(&p, &sha, &agents);
        let mut reversed = agents.clone();
        reversed.reverse();
        let mut second = assign(&p, &sha, &reversed);
        second.reverse();
        assert_eq!(first, second);
        let canaries = |waves: &[u32]| -> Vec<String> {
            agents
                .iter()
                .zip(waves)
                .filter(|(_, w)| **w == 1)
                .map(|(a, _)| a.id.clone())
                .collect()
        };
        let other = assign(&p, &"d".repeat(64), &agents);
        assert_ne!(canaries(&first), canaries(&other));
    }

    #[test]
    fn group_waves_take_their_group_first() {
        let p = plan(&["group:canary", "50%", "100%"]);
        let mut agents = fleet(10);
        agents[7].group = "canary".into();
        agents[3].group = "canary".into();
        let waves = assign(&p, &"e".repeat(64), &agents);
        assert_eq!(waves[7], 1);
        assert_eq!(waves[3], 1);
        assert_eq!(sizes(&waves, 3), vec![2, 3, 5]);
        // A group with no members makes an empty wave, not a gap in the order.
        let p = plan(&["group:none", "2", "100%"]);
        assert_eq!(sizes(&assign(&p, "f", &fleet(4)), 3), vec![0, 2, 2]);
    }
}
