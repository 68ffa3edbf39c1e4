//! The operator's traps (issue 59), each as a new user met it: a restart with a typo in
//! agent.toml stopped the running agent and started none.

use std::fs;
use std::process::Command;

use e2e::{TestContext, read_file, run, run_ok};

use crate::update::{agents_running, serve_to, start};

#[test]
fn a_restart_with_a_bad_configuration_keeps_the_running_agent() {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let home = ctx.install(&b1, "p");
    let _server = serve_to(&ctx, &home, &b1);
    start(&home);
    let before = agents_running(&home);
    assert_eq!(before.len(), 1, "{before:?}");
    let agent = home.join("current/bin/agent");
    let good = run_ok(Command::new(&agent).args(["config", "check"]));
    assert!(String::from_utf8_lossy(&good.stdout).contains("is good"));

    // The typo of the report: `heartbeet`.
    let conf = home.join("conf/agent.toml");
    let text = read_file(&conf).replace("heartbeat", "heartbeet");
    fs::write(&conf, text).unwrap();
    let checked = run(Command::new(&agent).args(["config", "check"]));
    assert_eq!(checked.status.code(), Some(78));
    let said = String::from_utf8_lossy(&checked.stderr);
    assert!(
        said.contains("agent.toml") && said.contains("heartbeet") && said.contains("line"),
        "file, line and key: {said}"
    );

    let restarted = run(Command::new(home.join("current/bin/agent-wrapper.sh")).arg("restart"));
    assert_eq!(restarted.status.code(), Some(78));
    let said = String::from_utf8_lossy(&restarted.stderr);
    assert!(
        said.contains("heartbeet") && said.contains("running agent keeps"),
        "{said}"
    );
    assert_eq!(
        agents_running(&home),
        before,
        "the running agent was kept, untouched"
    );
    run_ok(Command::new(home.join("current/bin/agent-wrapper.sh")).arg("stop"));
}
