//! Authenticode: `scripts/build-dist.sh --authenticode CERT.pfx
//! --authenticode-password-file F` signs agent.exe, agent-service.exe, the launcher and
//! the stub before packing, the bundle with its payload, and the MSI; `osslsigncode
//! verify` passes on each against the throw-away CA that issued the certificate, and
//! refuses each with one byte flipped. The signed bundle still reads its payload (it
//! stops at the signature), installs under Wine, and its update signature is over its
//! final bytes.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use e2e::wine::{WINDOWS, WinMachine};
use e2e::{TestContext, describe, in_target_dir, run_ok, stdout};

/// A throw-away CA and a code-signing certificate it issued, as `leaf.pfx` with its
/// password in `password`: (pfx, password file, CA certificate).
fn code_signing(ctx: &TestContext) -> (PathBuf, PathBuf, PathBuf) {
    let dir = ctx.path("pki");
    fs::create_dir_all(&dir).unwrap();
    let sh = |script: &str| {
        run_ok(Command::new("sh").arg("-ec").arg(script).current_dir(&dir));
    };
    sh("openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 \
        -subj '/CN=Test Code Signing CA' \
        -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign 2>/dev/null
       openssl req -newkey rsa:2048 -nodes -keyout leaf.key -out leaf.csr -subj '/CN=Test Signer' 2>/dev/null
       printf 'basicConstraints=CA:FALSE\\nkeyUsage=critical,digitalSignature\\nextendedKeyUsage=codeSigning\\n' > leaf.ext
       openssl x509 -req -in leaf.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out leaf.pem \
        -days 2 -extfile leaf.ext 2>/dev/null
       printf 'pfx-secret\\n' > password
       openssl pkcs12 -export -out leaf.pfx -inkey leaf.key -in leaf.pem -certfile ca.pem \
        -passout file:password");
    (
        dir.join("leaf.pfx"),
        dir.join("password"),
        dir.join("ca.pem"),
    )
}

fn verify(file: &Path, ca: &Path) -> std::process::Output {
    let mut cmd = Command::new("osslsigncode");
    cmd.args(["verify", "-CAfile"]).arg(ca).arg("-in").arg(file);
    let out = cmd.output().unwrap();
    eprintln!("{}", describe(&cmd, &out));
    out
}

#[test]
fn build_dist_signs_every_windows_file_and_one_flipped_byte_is_refused() {
    let ctx = TestContext::new();
    let (key, key_pub) = ctx.keygen("keys");
    let (pfx, password, ca) = code_signing(&ctx);
    let out_dir = ctx.path("release");
    let script = e2e::repo_root().join("scripts/build-dist.sh");
    let mut cmd = Command::new(&script);
    cmd.args([
        "--version",
        "3.1.0",
        "--build",
        "7",
        "--target",
        WINDOWS,
        "--key",
    ])
    .arg(&key)
    .arg("--out")
    .arg(&out_dir)
    .arg("--authenticode")
    .arg(&pfx)
    .arg("--authenticode-password-file")
    .arg(&password)
    .env("AGENT_BIN_DIR", in_target_dir("debug"))
    .env("AGENT_TARGET_BIN_DIR", in_target_dir("cross"))
    .env("AGENT_TARGET_PROFILE", "debug")
    .env("AGENT_DIST_ROOT", ctx.path("dist-root"));
    let made = run_ok(&mut cmd);
    let listed = stdout(&made);
    let bundle = out_dir.join(format!("agent-bundle-3.1.0-{WINDOWS}.exe"));
    let msi = out_dir.join(format!("agent-3.1.0-{WINDOWS}.msi"));
    assert!(listed.contains(&bundle.display().to_string()), "{listed}");
    assert!(listed.contains(&msi.display().to_string()), "{listed}");

    let dist = ctx.path(&format!("dist-root/agent-3.1.0-{WINDOWS}/bin"));
    let mut signed: Vec<PathBuf> = [
        "agent.exe",
        "agent-service.exe",
        "agent-bundle.exe",
        "agent-launcher.exe",
    ]
    .iter()
    .map(|name| dist.join(name))
    .collect();
    signed.push(bundle.clone());
    signed.push(msi.clone());
    for file in &signed {
        let out = verify(file, &ca);
        assert!(
            out.status.success(),
            "{} is not signed:\n{}",
            file.display(),
            String::from_utf8_lossy(&out.stdout)
        );
        // One byte flipped in the middle (the code, the payload, the MSI's cabinet):
        // the signature no longer matches.
        let tampered = ctx.path("tampered");
        let mut bytes = fs::read(file).unwrap();
        let at = bytes.len() / 2;
        bytes[at] ^= 0x01;
        fs::write(&tampered, &bytes).unwrap();
        let out = verify(&tampered, &ca);
        assert!(
            !out.status.success(),
            "{} with a flipped byte passed:\n{}",
            file.display(),
            String::from_utf8_lossy(&out.stdout)
        );
    }

    // The update signature is over the final, Authenticode-signed bytes; the payload is
    // read up to the signature.
    let checked = run_ok(
        ctx.cmd("agent-bundle")
            .arg("verify")
            .arg(&bundle)
            .arg("--pub")
            .arg(&key_pub),
    );
    assert!(stdout(&checked).contains("3.1.0"), "{}", stdout(&checked));
    let listing = run_ok(Command::new("unzip").arg("-l").arg(&bundle));
    assert!(stdout(&listing).contains("agent-update-version.properties"));

    // The signed stub finds its payload on Windows too.
    let m = WinMachine::new(&ctx, "win");
    let installed = m.install(&bundle, &[]);
    assert!(
        stdout(&installed).contains("Installed agent 3.1.0+7"),
        "{}",
        stdout(&installed)
    );
    assert!(m.home().join("bin/agent.exe").is_file(), "the launcher");
}
