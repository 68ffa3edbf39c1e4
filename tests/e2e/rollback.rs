//! A fleet rollback in seconds from the version each machine kept (issue 43): the old
//! release's very bytes signed again (`agent-bundle sign`), served, and the downgrade
//! resumed; every agent switches back with no bundle or delta byte on the wire.

use std::fs;
use std::time::Instant;

use e2e::{TOKEN, metric, read_file, run_ok, stdout};

use crate::rollout::{FLEET_AGENT_ENV, LONG, NEW, OLD, fleet_with};

#[test]
fn a_rollback_to_the_kept_version_downloads_nothing() {
    let f = fleet_with(2, &[], &[], FLEET_AGENT_ENV, |_| {});
    f.ctx.republish(&f.server, &f.b2);
    e2e::wait_rollout(&f.server, TOKEN, LONG, "2.0.0 to complete", |r| {
        r["version"] == NEW && r["state"] == "completed"
    });
    for home in &f.homes {
        assert!(
            home.join(format!("versions/{OLD}/bundle")).is_file(),
            "{OLD} is not kept in {}",
            home.display()
        );
    }

    // The release of 1.0.0, its bytes unchanged, signed again today.
    let again = f.ctx.path("rollback");
    fs::create_dir_all(&again).unwrap();
    let b1 = f.ctx.path("b1/agent-bundle-1.0.0");
    let bundle = again.join("agent-bundle-1.0.0");
    fs::copy(&b1, &bundle).unwrap();
    let said = stdout(&run_ok(
        f.ctx
            .cmd("agent-bundle")
            .arg("sign")
            .arg("--key")
            .arg(&f.key)
            .arg(&bundle),
    ));
    assert!(
        said.contains("Signed") && said.contains("1.0.0+1"),
        "{said}"
    );
    assert_eq!(e2e::sha256_file(&bundle), e2e::sha256_file(&b1));

    let sent = |kind: &str| {
        metric(
            &f.server,
            &format!("agentupdate_bytes_sent_total{{kind=\"{kind}\"}}"),
        )
    };
    let (bundle_bytes, delta_bytes) = (sent("bundle"), sent("delta"));
    let started = Instant::now();
    f.ctx.republish(&f.server, &bundle);
    // A downgrade waits for an operator.
    e2e::wait_rollout(
        &f.server,
        TOKEN,
        LONG,
        "the rollback to start halted",
        |r| r["version"] == OLD && r["state"] == "halted",
    );
    run_ok(
        f.ctx
            .cmd("update-server")
            .args(["rollout", "resume", "--token", TOKEN, "--server"])
            .arg(f.server.url("")),
    );
    e2e::wait_rollout(&f.server, TOKEN, LONG, "the rollback to complete", |r| {
        r["version"] == OLD && r["state"] == "completed"
    });
    eprintln!(
        "rollback of 2 agents from their kept version: {:.1}s from publish to completed",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(
        sent("bundle"),
        bundle_bytes,
        "bundle bytes crossed the wire"
    );
    assert_eq!(sent("delta"), delta_bytes, "delta bytes crossed the wire");
    for home in &f.homes {
        let log = read_file(&home.join("logs/agent.log"));
        assert!(log.contains("without a download"), "{log}");
    }
}
