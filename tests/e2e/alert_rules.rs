//! The Prometheus alerting rules shipped in `deploy/prometheus`: promtool checks them
//! and runs their unit tests, and every metric they name is one a real server exports.

use std::collections::BTreeSet;
use std::process::Command;

use e2e::{TestContext, http, repo_root, require_tool, run_ok, stdout};

fn rules_dir() -> std::path::PathBuf {
    repo_root().join("deploy/prometheus")
}

#[test]
fn promtool_checks_the_rules_and_passes_their_tests() {
    require_tool("promtool");
    let dir = rules_dir();
    let checked = run_ok(
        Command::new("promtool")
            .args(["check", "rules", "alerts.yml"])
            .current_dir(&dir),
    );
    assert!(
        stdout(&checked).contains("SUCCESS"),
        "promtool check rules: {}",
        stdout(&checked)
    );
    let tested = run_ok(
        Command::new("promtool")
            .args(["test", "rules", "alerts.test.yml"])
            .current_dir(&dir),
    );
    assert!(
        stdout(&tested).contains("SUCCESS"),
        "promtool test rules: {}",
        stdout(&tested)
    );
}

/// A rule over a metric the server no longer exports (renamed, dropped) never fires and
/// no tool says so: the names in the rules' expressions against a real scrape.
#[test]
fn every_metric_the_rules_name_is_exported() {
    let rules = std::fs::read_to_string(rules_dir().join("alerts.yml")).unwrap();
    let named: BTreeSet<String> = rules
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|word| word.starts_with("agentupdate_"))
        .map(str::to_owned)
        .collect();
    assert!(named.len() >= 10, "the rules name {named:?}");

    let ctx = TestContext::new();
    let server = ctx.server("srv", &[]);
    let scrape = http(server.port, "GET", "/metrics", &[]).unwrap();
    assert_eq!(scrape.status, 200, "{}", scrape.text());
    let exported: BTreeSet<String> = scrape
        .text()
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    let missing: Vec<&String> = named.difference(&exported).collect();
    assert!(
        missing.is_empty(),
        "alerts.yml names metrics the server does not export: {missing:?}\nexported: {exported:?}"
    );
}
