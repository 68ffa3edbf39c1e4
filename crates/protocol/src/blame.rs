//! Whose fault a failed update is: the bundle's, or the machine's.
//!
//! A rollout halts on failures that implicate the bundle (the new version did not
//! become healthy, exited, its workload failed, what the agent got does not verify):
//! enough of them mean the release is bad. A failure of the machine (a full disk, a
//! download cut or refused, an updater killed before the switch, memory exhausted)
//! says nothing about the release: it must never halt a fleet, and the agent tries
//! again once the machine recovers. Agents and the updater say which when they report
//! (`INSTALL_FAILED` or `RETRYING`); the server also reads the words of agents from
//! before that rule, which reported every failure as `INSTALL_FAILED`.

/// Who a failure implicates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blame {
    /// Counts toward `max-failures`.
    Bundle,
    /// Retried by the agent; counts only if its deadline passes.
    Machine,
}

/// How the updater names a full disk at the start of a reason.
pub const DISK_FULL: &str = "the disk is full";

/// The words the OS uses for a full disk or an exhausted quota (ENOSPC, EDQUOT).
pub fn mentions_full_disk(text: &str) -> bool {
    [
        "No space left on device",
        "os error 28",
        "Disk quota exceeded",
        "os error 122",
    ]
    .iter()
    .any(|w| text.contains(w))
        || text.starts_with(DISK_FULL)
}

/// The words for exhausted memory (ENOMEM) or a process the kernel's OOM killer ended.
fn mentions_out_of_memory(text: &str) -> bool {
    [
        "Cannot allocate memory",
        "os error 12",
        "out of memory",
        "memory allocation of",
    ]
    .iter()
    .any(|w| text.contains(w))
}

/// Words of the agent and updater for faults of the machine or the network, from
/// before they reported `RETRYING` themselves.
const MACHINE_FAULTS: &[&str] = &[
    "not enough disk space",
    "abandoned before the switch",
    "stopped before the switch",
    "an earlier updater stopped at phase",
    "download failed",
    "cannot hand over to the updater",
    "cannot learn the server's bundle",
    "cannot fetch the signature",
    "is already under way",
];

/// Whose fault the failure `error` (a report's words) is.
pub fn of_failure(error: &str) -> Blame {
    if mentions_full_disk(error)
        || mentions_out_of_memory(error)
        || MACHINE_FAULTS.iter().any(|w| error.contains(w))
    {
        Blame::Machine
    } else {
        Blame::Bundle
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every reason the agent and the updater give today, with the blame it must get.
    #[test]
    fn each_reason_of_today_is_blamed_right() {
        let machine = [
            "the disk is full (/a/agent/versions/.staging-2.0.0+2/LICENSE: No space left on device (os error 28))",
            "/x/data/update/agent-bundle-2.0.0: No space left on device (os error 28)",
            "x: Disk quota exceeded (os error 122)",
            "the disk is full (4096 bytes free) while the new version was judged: 2.0.0+2 did not become healthy within 20s",
            "not enough disk space in /x/data/update: need 400 bytes, 12 free; free some space",
            "cannot spawn the updater: Cannot allocate memory (os error 12)",
            "memory allocation of 1048576 bytes failed: out of memory",
            "an earlier updater stopped at phase Unpacked and 1.0.0+1 runs again",
            "last 1.0.0+1 -> 2.0.0+2 abandoned before the switch",
            "the update to 2.0.0+2 stopped before the switch: the updater exited",
            "download failed 5 times, last: connection reset",
            "cannot hand over to the updater: permission denied",
        ];
        for reason in machine {
            assert_eq!(of_failure(reason), Blame::Machine, "{reason}");
        }
        let bundle = [
            "2.0.0+2 did not become healthy within 20s",
            "the new agent (pid 42) exited with code 1 0.1s after start",
            "the new version did not commit after 3 starts (it crashes or the updater died each time)",
            "its workload did not become healthy within 5s; last lines of logs/workload.log:\nboom",
            "refusing the server's bundle: signature check failed: the signature does not verify",
            "refusing the server's bundle: mix-and-match: the server names 2.0.0+2 (sha256 aa) but the signature vouches for 2.0.0+3 (sha256 bb)",
            "refusing the server's bundle: a bundle for another platform: it is for aarch64-unknown-linux-gnu, this agent runs on x86_64-unknown-linux-gnu",
            "refusing the server's bundle: key_retired: key 1234 is retired",
            "the server serves no signature for its bundle (404): the release is missing its .minisig",
            "sha256 mismatch: the server named aa, the bytes are bb",
        ];
        for reason in bundle {
            assert_eq!(of_failure(reason), Blame::Bundle, "{reason}");
        }
    }
}
