//! The release and bundle model of update-server: what the server serves ([`store`]:
//! the download directory watched, settled changes handed over, bundles read and
//! checked), publishing a release and its checks ([`publish`], with the history kept in
//! the fleet database), the deltas between served bundles ([`deltas`], made off the
//! request path) and the server's words for a refused bundle ([`refusal`]).
//!
//! It knows no HTTP: the routes of `update-server` answer from it, its metrics count
//! what it reports. It never writes outside the server's home.

pub mod catalog;
pub mod deltas;
pub mod publish;
pub mod refusal;
pub mod store;

use std::time::Duration;

use agent_fleet::rollout;

/// How often the download directory is looked at.
pub const SCAN_INTERVAL: Duration = Duration::from_secs(1);

/// `releases.max-unpacked` by default, in MiB: a published bundle's distribution may
/// inflate to this much. Agents' own distributions are tens of MiB.
pub const DEFAULT_MAX_UNPACKED_MIB: u64 = 512;

/// The model's error: a publish or rollback refused, or a file or the database that
/// failed.
pub use publish::ReleaseError;

/// The served release as its rollout knows it: its identity ([`store::Release::identity`])
/// and signing time (the latest of its bundles' signatures).
pub fn served(release: &store::Release) -> rollout::Served {
    let signed_at = release
        .bundles()
        .iter()
        .map(|bundle| {
            bundle
                .signature
                .as_deref()
                .and_then(|text| agent_protocol::minisign::Signature::parse(text).ok())
                .and_then(|sig| {
                    agent_protocol::minisign::BundleClaim::parse(sig.trusted_comment()).ok()
                })
                .map_or(0, |claim| {
                    i64::try_from(claim.signed_at).unwrap_or(i64::MAX)
                })
        })
        .max()
        .unwrap_or(0);
    rollout::Served {
        sha256: release.identity(),
        signed_at,
        version: release.version().clone(),
        platforms: release.platforms().into_iter().map(str::to_owned).collect(),
    }
}
