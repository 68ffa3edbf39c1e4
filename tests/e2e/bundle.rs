//! The signed, self-installing bundle: pack, verify (ours and minisign's), install.

use std::fs;
use std::path::Path;
use std::process::Command;

use e2e::{TestContext, require_tool, run, run_fails, run_ok, stdout};

fn packed(
    ctx: &TestContext,
    version: &str,
    build: &str,
) -> (std::path::PathBuf, std::path::PathBuf) {
    let (key, public) = ctx.keygen("keys");
    let dist = ctx.dist("dist");
    (ctx.pack(&dist, version, build, &key, "out"), public)
}

#[test]
fn pack_install_runs_the_packed_version() {
    let ctx = TestContext::new();
    let (bundle, _) = packed(&ctx, "1.4.2", "77");
    let out = run_ok(
        Command::new(&bundle)
            .arg("--install=prefix")
            .current_dir(ctx.dir.path()),
    );
    let text = stdout(&out);
    assert!(
        text.contains("Trusting update key") && text.contains("inside the bundle"),
        "{text}"
    );
    let agent = ctx.path("prefix/agent/current/bin/agent");
    let version = stdout(&run_ok(Command::new(&agent).arg("--version")));
    assert!(
        version.contains("1.4.2+77"),
        "installed agent says {version:?}"
    );
    for dir in [
        "conf",
        "data",
        "logs",
        "run",
        "versions/1.4.2+77/conf.default",
    ] {
        assert!(ctx.path("prefix/agent").join(dir).is_dir(), "{dir} missing");
    }
    assert_eq!(
        fs::read_link(ctx.path("prefix/agent/current")).unwrap(),
        Path::new("versions/1.4.2+77")
    );
    assert_eq!(
        fs::read(ctx.path("prefix/agent/conf/agent.toml")).unwrap(),
        fs::read(ctx.path("prefix/agent/versions/1.4.2+77/conf.default/agent.toml")).unwrap()
    );
    let bundle_version = stdout(&run_ok(Command::new(&bundle).arg("--version")));
    assert!(
        bundle_version.contains("1.4.2") && bundle_version.contains("77"),
        "{bundle_version}"
    );
    let help = stdout(&run_ok(Command::new(&bundle).arg("--help")));
    assert!(
        help.contains("The test agent."),
        "--help does not show README.txt: {help}"
    );
}

#[test]
fn install_refuses_existing_agent_without_force_and_keeps_conf_with_force() {
    let ctx = TestContext::new();
    let (bundle, _) = packed(&ctx, "1.0.0", "1");
    run_ok(
        Command::new(&bundle)
            .arg("--install=p")
            .current_dir(ctx.dir.path()),
    );
    let conf = ctx.path("p/agent/conf/agent.toml");
    fs::write(&conf, "[agent]\nheartbeat = \"5s\"\n").unwrap();
    fs::write(ctx.path("p/agent/data/keep"), "mine").unwrap();
    let msg = run_fails(
        Command::new(&bundle)
            .arg("--install=p")
            .current_dir(ctx.dir.path()),
        1,
    );
    assert!(msg.contains("--force"), "{msg}");
    run_ok(
        Command::new(&bundle)
            .args(["--install=p", "--force"])
            .current_dir(ctx.dir.path()),
    );
    assert_eq!(
        fs::read_to_string(&conf).unwrap(),
        "[agent]\nheartbeat = \"5s\"\n"
    );
    assert_eq!(
        fs::read_to_string(ctx.path("p/agent/data/keep")).unwrap(),
        "mine"
    );
}

#[test]
fn install_with_trust_key_checks_signature_and_failure_leaves_nothing() {
    let ctx = TestContext::new();
    let (bundle, public) = packed(&ctx, "1.0.0", "1");
    let (_, other_public) = ctx.keygen("other");
    fs::create_dir(ctx.path("p")).unwrap();
    let msg = run_fails(
        Command::new(&bundle)
            .arg("--install=p")
            .arg("--trust-key")
            .arg(&other_public)
            .current_dir(ctx.dir.path()),
        1,
    );
    assert!(msg.contains("key"), "{msg}");
    let left: Vec<_> = fs::read_dir(ctx.path("p")).unwrap().collect();
    assert!(left.is_empty(), "failed install left {left:?}");

    let out = run_ok(
        Command::new(&bundle)
            .arg("--install=p")
            .arg("--trust-key")
            .arg(&public)
            .current_dir(ctx.dir.path()),
    );
    assert!(stdout(&out).contains("--trust-key"), "{}", stdout(&out));
    assert_eq!(
        fs::read(ctx.path("p/agent/conf/update.pub")).unwrap(),
        fs::read(&public).unwrap()
    );
}

#[test]
fn unzip_lists_the_four_entries() {
    require_tool("unzip");
    let ctx = TestContext::new();
    let (bundle, _) = packed(&ctx, "2.2.0", "1234");
    let out = run_ok(Command::new("unzip").arg("-l").arg(&bundle));
    let listing = stdout(&out);
    for entry in [
        "agent-update-version.properties",
        "agent-2.2.0.tar.gz",
        "README.txt",
        "LICENSE",
    ] {
        assert!(listing.contains(entry), "{entry} not in\n{listing}");
    }
    assert!(listing.contains("4 files"), "{listing}");
}

#[test]
fn minisign_verifies_our_signature() {
    require_tool("minisign");
    let ctx = TestContext::new();
    let (bundle, public) = packed(&ctx, "2.2.0", "1234");
    let out = run_ok(
        Command::new("minisign")
            .arg("-Vm")
            .arg(&bundle)
            .arg("-p")
            .arg(&public),
    );
    let text = stdout(&out);
    assert!(text.contains("version=2.2.0 build=1234"), "{text}");
}

#[test]
fn we_verify_a_minisign_signature() {
    require_tool("minisign");
    let ctx = TestContext::new();
    let (bundle, _) = packed(&ctx, "2.2.0", "1234");
    run_ok(
        Command::new("minisign")
            .args(["-G", "-W", "-p", "mini.pub", "-s", "mini.key"])
            .current_dir(ctx.dir.path()),
    );
    let sha = e2e_sha256(&bundle);
    let comment = format!(
        "version=2.2.0 build=1234 platform={} sha256={sha} signed-at=1700000000",
        agent_protocol::layout::PLATFORM
    );
    run_ok(
        Command::new("minisign")
            .args(["-S", "-s", "mini.key", "-m"])
            .arg(&bundle)
            .args(["-x", "mini.sig", "-t", &comment])
            .current_dir(ctx.dir.path()),
    );
    let out = run_ok(
        ctx.cmd("agent-bundle")
            .arg("verify")
            .arg(&bundle)
            .args(["--pub", "mini.pub", "--sig", "mini.sig"]),
    );
    assert!(stdout(&out).starts_with("OK "), "{}", stdout(&out));

    // And a bundle packed with minisign's own secret key verifies with minisign -V.
    let dist = ctx.dist("dist2");
    let with_mini = ctx.pack(&dist, "3.0.0", "1", &ctx.path("mini.key"), "out2");
    run_ok(
        Command::new("minisign")
            .arg("-Vm")
            .arg(&with_mini)
            .args(["-p", "mini.pub"])
            .current_dir(ctx.dir.path()),
    );
}

fn e2e_sha256(path: &Path) -> String {
    let d = agent_protocol::digest::Digests::of_reader(fs::File::open(path).unwrap()).unwrap();
    d.sha256_hex()
}

fn verify(ctx: &TestContext, bundle: &Path, public: &Path) -> std::process::Output {
    run(ctx
        .cmd("agent-bundle")
        .arg("verify")
        .arg(bundle)
        .arg("--pub")
        .arg(public))
}

#[test]
fn tampering_of_any_kind_fails_verification() {
    let ctx = TestContext::new();
    let (bundle, public) = packed(&ctx, "2.2.0", "1234");
    assert!(verify(&ctx, &bundle, &public).status.success());
    let original = fs::read(&bundle).unwrap();
    let sig = fs::read_to_string(format!("{}.minisig", bundle.display())).unwrap();
    let len = original.len();
    let payload_start = len - 2000; // inside the zip: entries and central directory
    let mut positions = vec![
        0,
        1,
        4096,
        len / 3,
        len / 2,
        payload_start,
        len - 22,
        len - 1,
    ];
    positions.extend((payload_start..len).step_by(97));
    for pos in positions {
        let mut bytes = original.clone();
        bytes[pos] ^= 0x01;
        fs::write(&bundle, &bytes).unwrap();
        let out = verify(&ctx, &bundle, &public);
        assert_eq!(
            out.status.code(),
            Some(1),
            "flipping byte {pos} was not detected: {}",
            stdout(&out)
        );
        assert!(stdout(&out).starts_with("FAILED"), "{}", stdout(&out));
    }
    fs::write(&bundle, &original[..len - 1]).unwrap();
    assert_eq!(
        verify(&ctx, &bundle, &public).status.code(),
        Some(1),
        "truncation not detected"
    );
    let mut longer = original.clone();
    longer.extend_from_slice(b"extra");
    fs::write(&bundle, &longer).unwrap();
    assert_eq!(
        verify(&ctx, &bundle, &public).status.code(),
        Some(1),
        "append not detected"
    );
    fs::write(&bundle, &original).unwrap();

    let edited = sig.replace("build=1234", "build=1235");
    assert_ne!(edited, sig);
    fs::write(format!("{}.minisig", bundle.display()), edited).unwrap();
    let out = verify(&ctx, &bundle, &public);
    assert_eq!(out.status.code(), Some(1));
    assert!(stdout(&out).contains("trusted comment"), "{}", stdout(&out));
    fs::write(format!("{}.minisig", bundle.display()), &sig).unwrap();
    assert!(verify(&ctx, &bundle, &public).status.success());
}

#[test]
fn signature_from_another_key_names_the_key_ids() {
    let ctx = TestContext::new();
    let (bundle, _) = packed(&ctx, "2.2.0", "1234");
    let (_, other) = ctx.keygen("other");
    let out = verify(&ctx, &bundle, &other);
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    let other_id = fs::read_to_string(&other)
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .rsplit(' ')
        .next()
        .unwrap()
        .to_owned();
    assert!(
        text.contains(&other_id),
        "message does not name the trusted key {other_id}: {text}"
    );
    assert!(text.lines().count() == 1, "verdict is not one line: {text}");
}

#[test]
fn cli_errors_are_one_line_with_the_right_exit_code() {
    let ctx = TestContext::new();
    let (key, public) = ctx.keygen("keys");
    // Usage errors: 2.
    run_fails(ctx.cmd("agent-bundle").arg("--no-such-flag"), 2);
    run_fails(ctx.cmd("agent-bundle").args(["pack", "--dist", "x"]), 2);
    run_fails(&mut ctx.cmd("agent-bundle"), 2);
    // Failures: 1, one line.
    let cases: Vec<Vec<String>> = vec![
        vec!["keygen".into(), "--out".into(), "keys".into()],
        vec![
            "pack".into(),
            "--dist".into(),
            "nope".into(),
            "--version".into(),
            "1.0.0".into(),
            "--build".into(),
            "1".into(),
            "--key".into(),
            key.display().to_string(),
            "--out".into(),
            "o".into(),
        ],
        vec![
            "pack".into(),
            "--dist".into(),
            "nope".into(),
            "--version".into(),
            "one".into(),
            "--build".into(),
            "1".into(),
            "--key".into(),
            key.display().to_string(),
            "--out".into(),
            "o".into(),
        ],
        vec![
            "pack".into(),
            "--dist".into(),
            "nope".into(),
            "--version".into(),
            "1.0.0".into(),
            "--build".into(),
            "1".into(),
            "--key".into(),
            public.display().to_string(),
            "--out".into(),
            "o".into(),
        ],
        vec![
            "verify".into(),
            "missing-bundle".into(),
            "--pub".into(),
            public.display().to_string(),
        ],
        vec![
            "verify".into(),
            public.display().to_string(),
            "--pub".into(),
            key.display().to_string(),
        ],
        vec!["--install=p".into()],
    ];
    for args in cases {
        let msg = run_fails(ctx.cmd("agent-bundle").args(&args), 1);
        assert_eq!(
            msg.trim_end().lines().count(),
            1,
            "{args:?} printed more than one line:\n{msg}"
        );
    }
}

/// Linkers leave holes in binaries; a sparse file must pack as plain bytes the safe
/// unpacker accepts (it refuses GNU sparse entries).
#[test]
fn a_sparse_file_in_the_distribution_installs() {
    use std::io::{Seek, SeekFrom, Write};
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let dist = ctx.dist("d");
    let sparse = dist.join("bin/holes.bin");
    let mut f = fs::File::create(&sparse).unwrap();
    f.seek(SeekFrom::Start(8 << 20)).unwrap();
    f.write_all(b"end").unwrap();
    drop(f);
    let bundle = ctx.pack(&dist, "1.0.0", "1", &key, "b");
    let home = ctx.install(&bundle, "p");
    let installed = fs::read(home.join("current/bin/holes.bin")).unwrap();
    assert_eq!(installed.len(), (8 << 20) + 3);
    assert!(installed.ends_with(b"end") && installed[..1024].iter().all(|&b| b == 0));
}
