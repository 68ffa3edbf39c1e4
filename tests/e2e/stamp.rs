//! `stamp` in both modes, and each refusal (which must change nothing).

use std::fs;
use std::path::Path;
use std::process::Command;

use e2e::{TestContext, run_fails, run_ok, sha256_file, stdout};

fn tree_digest(dir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            let meta = fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(dir).unwrap().display().to_string();
            if meta.is_dir() {
                stack.push(p);
                out.push((rel, "dir".into()));
            } else if meta.file_type().is_symlink() {
                out.push((rel, fs::read_link(&p).unwrap().display().to_string()));
            } else {
                out.push((rel, sha256_file(&p)));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn stamp_agent_rewrites_the_version_and_show_prints_it() {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let b = ctx.pack(&ctx.dist("d"), "1.0.0", "1", &key, "b");
    let home = ctx.install(&b, "p");
    let show = || {
        stdout(&run_ok(
            ctx.cmd("stamp")
                .args(["agent", "--show", "--home"])
                .arg(&home),
        ))
    };
    assert_eq!(show().trim(), "1.0.0+1");
    let out = run_ok(ctx.cmd("stamp").args(["agent", "--home"]).arg(&home).args([
        "--version",
        "0.9.0",
        "--build",
        "7",
    ]));
    assert!(stdout(&out).contains("as 0.9.0+7 (was 1.0.0+1)"));
    assert_eq!(show().trim(), "0.9.0+7");
    assert_eq!(
        fs::read_link(home.join("current")).unwrap(),
        Path::new("versions/0.9.0+7")
    );
    assert!(
        !home.join("versions/1.0.0+1").exists(),
        "old directory left behind"
    );
    let v = run_ok(Command::new(home.join("current/bin/agent")).arg("--version"));
    assert!(stdout(&v).contains("0.9.0+7"), "{}", stdout(&v));
    // Stamping the same name again rewrites in place.
    run_ok(ctx.cmd("stamp").args(["agent", "--home"]).arg(&home).args([
        "--version",
        "0.9.0",
        "--build",
        "7",
    ]));
    assert_eq!(show().trim(), "0.9.0+7");
}

#[test]
fn stamp_agent_refusals_change_nothing() {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let b = ctx.pack(&ctx.dist("d"), "1.0.0", "1", &key, "b");
    let home = ctx.install(&b, "p");
    let before = tree_digest(&home);
    let err = run_fails(
        ctx.cmd("stamp").args(["agent", "--home"]).arg(&home).args([
            "--version",
            "one",
            "--build",
            "1",
        ]),
        1,
    );
    assert!(err.contains("is not a version"), "{err}");
    let err = run_fails(
        ctx.cmd("stamp").args([
            "agent",
            "--home",
            "nowhere",
            "--version",
            "1.0.0",
            "--build",
            "2",
        ]),
        1,
    );
    assert!(err.contains("no installed agent at nowhere"), "{err}");
    run_fails(ctx.cmd("stamp").args(["agent", "--home"]).arg(&home), 2);
    assert_eq!(tree_digest(&home), before);
}

#[test]
fn stamp_server_resigns_the_bundle_under_the_new_version() {
    let ctx = TestContext::new();
    let (key, public) = ctx.keygen("keys");
    let b = ctx.pack(&ctx.dist("d"), "1.0.0", "1", &key, "srv");
    fs::write(ctx.path("srv/server-agent-versions.properties"), "stale\n").unwrap();
    let out = run_ok(
        ctx.cmd("stamp")
            .args([
                "server",
                "--bundle-dir",
                "srv",
                "--version",
                "3.1.0",
                "--build",
                "9",
                "--key",
            ])
            .arg(&key),
    );
    assert!(
        stdout(&out).contains("as 3.1.0+9 (was 1.0.0+1)"),
        "{}",
        stdout(&out)
    );
    let new = ctx.path("srv/agent-bundle-3.1.0");
    assert!(!b.exists() && !ctx.path("srv/agent-bundle-1.0.0.minisig").exists());
    assert!(!ctx.path("srv/server-agent-versions.properties").exists());
    let names: Vec<_> = fs::read_dir(ctx.path("srv"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    let verified = run_ok(
        ctx.cmd("agent-bundle")
            .arg("verify")
            .arg(&new)
            .arg("--pub")
            .arg(&public),
    );
    assert!(stdout(&verified).contains("3.1.0"), "{}", stdout(&verified));
    // The distribution inside says 3.1.0+9 too: install it and ask.
    let home = ctx.install(&new, "p");
    let v = run_ok(Command::new(home.join("current/bin/agent")).arg("--version"));
    assert!(stdout(&v).contains("3.1.0+9"));
}

#[test]
fn stamp_server_refusals_change_nothing() {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let (other, _) = ctx.keygen("other");
    ctx.pack(&ctx.dist("d"), "1.0.0", "1", &key, "srv");
    let before = tree_digest(&ctx.path("srv"));
    let stamp = |dir: &str, version: &str, key: &Path| {
        let mut c = ctx.cmd("stamp");
        c.args([
            "server",
            "--bundle-dir",
            dir,
            "--version",
            version,
            "--build",
            "2",
            "--key",
        ])
        .arg(key);
        c
    };
    let err = run_fails(&mut stamp("srv", "2.0", &key), 1);
    assert!(err.contains("is not a version"), "{err}");
    let err = run_fails(&mut stamp("srv", "2.0.0", &other), 1);
    assert!(err.contains("does not verify"), "{err}");
    let err = run_fails(&mut stamp("missing", "2.0.0", &key), 1);
    assert!(err.contains("cannot read the bundle directory"), "{err}");
    // A tampered bundle is refused.
    let bundle = ctx.path("srv/agent-bundle-1.0.0");
    let mut bytes = fs::read(&bundle).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 1;
    fs::write(&bundle, &bytes).unwrap();
    let tampered = tree_digest(&ctx.path("srv"));
    let err = run_fails(&mut stamp("srv", "2.0.0", &key), 1);
    assert!(err.contains("does not verify"), "{err}");
    assert_eq!(tree_digest(&ctx.path("srv")), tampered);
    assert_ne!(tampered, before);
}
