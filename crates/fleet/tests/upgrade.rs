//! A SQLite fleet database made by the release before one rollout engine (schema 0006,
//! commit d43dc20; see fixtures/make-0006.sh) migrates to one table family: its bundle
//! rollout and its config rollout under way are found where they were, each with its
//! waves, agents and events. The server-level test of both backends is tests/e2e/upgrade.rs.

#![allow(
    clippy::unwrap_used,
    reason = "tests: a failed step should fail the test loudly"
)]

use std::path::Path;

use agent_fleet::db::Db;
use agent_fleet::rollout::step::State;
use agent_fleet::rollout::store::{self, Bundle, ConfigSet, Kind};

const EDGE: &str = "edge";

#[tokio::test]
async fn a_sqlite_fleet_of_schema_0006_keeps_both_rollouts_under_way() {
    let home = tempfile::tempdir().unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fleet-0006.sqlite");
    std::fs::copy(&fixture, home.path().join("fleet.db")).unwrap();
    let db = Db::open("", home.path(), 1).await.unwrap();
    let pool = db.pool();

    let bundle = store::latest::<Bundle>(pool, "").await.unwrap().unwrap();
    assert_eq!(bundle.subject.version.to_string(), "2.0.0+2");
    assert_eq!(
        bundle
            .subject
            .previous
            .as_ref()
            .map(ToString::to_string)
            .as_deref(),
        Some("1.0.0+1")
    );
    assert_eq!((bundle.state, bundle.opened), (State::Running, 1));
    let placed = store::memberships(pool, Kind::Bundle, bundle.id)
        .await
        .unwrap();
    assert_eq!(placed.len(), 4, "{placed:?}");
    assert_eq!(placed.values().filter(|m| m.wave == 1).count(), 1);

    let sets = agent_fleet::config::store::sets(pool).await.unwrap();
    let set = sets.iter().find(|s| s.group == EDGE).unwrap();
    let config = store::find::<ConfigSet>(pool, EDGE, &set.hash, set.created_at)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        config.subject,
        ConfigSet {
            group: EDGE.into(),
            hash: set.hash.clone()
        }
    );
    assert_eq!((config.state, config.opened), (State::Running, 1));
    assert_ne!(
        config.id, bundle.id,
        "the config rollout's id moved past the bundles'"
    );
    let places = store::memberships(pool, Kind::Config, config.id)
        .await
        .unwrap();
    assert_eq!(places.len(), 2, "{places:?}");
    assert_eq!(places.values().filter(|m| m.told).count(), 1, "{places:?}");
    let events = store::events(pool, config.id).await.unwrap();
    let kinds: Vec<&str> = events.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(kinds, ["started", "wave_opened"], "{events:?}");
    // The bundle rollout is still the fleet's latest of its kind.
    let again = store::find::<Bundle>(pool, "", &bundle.subject.sha256, bundle.subject.signed_at)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(again, bundle);
}
