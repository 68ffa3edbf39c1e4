//! Hostile bundles against the installer, `verify` and the updater. Each is signed by the
//! key they trust, so the checks before the unpacker pass and the unpacker itself is
//! what refuses. Named after the attack.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use e2e::{
    Part, TestContext, hand_made_bundle, patch_bytes, run, run_fails, sign_bundle, wait_until,
};
use flate2::Compression;
use flate2::write::GzEncoder;
use tar::{EntryType, Header};

/// The memory the installer or updater may use on the largest hostile case.
const MEMORY_KIB: u64 = 128 * 1024;

struct Parts {
    dir: PathBuf,
}

impl Parts {
    fn new(ctx: &TestContext, version: &str, build: &str) -> Self {
        let dir = ctx.path("parts");
        fs::create_dir_all(&dir).unwrap();
        fs::write(
            dir.join("props"),
            format!(
                "agent.latest.version={version}\nagent.latest.build-number={build}\nagent.latest.platform={}\n",
                agent_protocol::layout::PLATFORM
            ),
        )
        .unwrap();
        fs::write(dir.join("README.txt"), "hostile\n").unwrap();
        fs::write(dir.join("LICENSE"), "none\n").unwrap();
        Self { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

/// A raw tar header for `name`, of `kind`, declaring `size` bytes.
fn header(name: &str, kind: EntryType, size: u64) -> Header {
    let mut h = Header::new_gnu();
    h.as_gnu_mut().unwrap().name[..name.len()].copy_from_slice(name.as_bytes());
    h.set_entry_type(kind);
    h.set_mode(0o755);
    h.set_size(size);
    h.set_cksum();
    h
}

/// Writes `bytes` of `fill` to a gzip stream a megabyte at a time (never whole in memory).
fn stream(gz: &mut impl Write, bytes: u64, fill: u8) {
    let chunk = vec![fill; 1 << 20];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        gz.write_all(&chunk[..n]).unwrap();
        left -= n as u64;
    }
    let pad = (512 - bytes % 512) % 512;
    gz.write_all(&vec![0u8; pad as usize]).unwrap();
}

/// A .tar.gz of an extension header of `kind` that declares (and holds) `bytes`.
fn tarball_with_huge(path: &Path, kind: EntryType, bytes: u64) {
    let mut gz = GzEncoder::new(fs::File::create(path).unwrap(), Compression::fast());
    gz.write_all(header("././@LongLink", kind, bytes).as_bytes())
        .unwrap();
    stream(&mut gz, bytes, b'a');
    gz.write_all(header("agent/x", EntryType::Regular, 0).as_bytes())
        .unwrap();
    gz.write_all(&[0u8; 1024]).unwrap();
    gz.finish().unwrap();
}

/// A hostile bundle of 1.0.0 around `tarball`, signed by `ctx`'s key.
fn bundle_around(ctx: &TestContext, tarball: &Path, out: &str) -> PathBuf {
    let parts = Parts::new(ctx, "1.0.0", "1");
    hand_made_bundle(
        &ctx.path(out),
        "1.0.0",
        "1",
        &ctx.path("keys/update.key"),
        &[
            Part {
                name: "agent-update-version.properties",
                file: &parts.path("props"),
            },
            Part {
                name: "agent-1.0.0.tar.gz",
                file: tarball,
            },
            Part {
                name: "README.txt",
                file: &parts.path("README.txt"),
            },
            Part {
                name: "LICENSE",
                file: &parts.path("LICENSE"),
            },
        ],
    )
}

/// Runs `cmd` with a data limit of [`MEMORY_KIB`]; it must fail with exit 1 and one
/// short line containing each of `words`, and install nothing under `prefix`.
fn refused_in_little_memory(cmd: &mut Command, words: &[&str], prefix: Option<&Path>) -> String {
    let program = cmd.get_program().to_owned();
    let args: Vec<_> = cmd.get_args().map(|a| a.to_owned()).collect();
    let mut limited = Command::new("sh");
    limited
        .arg("-c")
        .arg(format!("ulimit -d {MEMORY_KIB} && exec \"$@\""))
        .arg("sh")
        .arg(program)
        .args(args);
    let started = Instant::now();
    let text = run_fails(&mut limited, 1);
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "took {:?}",
        started.elapsed()
    );
    for w in words {
        assert!(text.contains(w), "{w:?} not in {text}");
    }
    // One short line (the updater prints its log: each line short).
    let longest = text.lines().map(str::len).max().unwrap_or(0);
    assert!(longest < 400, "a line of {longest} bytes: {text:.2000}");
    if let Some(prefix) = prefix {
        assert!(!prefix.join("agent").exists(), "something was installed");
        let left: Vec<_> = fs::read_dir(prefix)
            .map(|d| d.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "left behind: {left:?}");
    }
    text
}

fn install_cmd(ctx: &TestContext, bundle: &Path, prefix: &str) -> Command {
    let mut c = Command::new(bundle);
    c.arg(format!("--install={}", ctx.path(prefix).display()))
        .arg("--trust-key")
        .arg(ctx.path("keys/update.pub"));
    c
}

fn huge_extension_header_is_refused_in_little_memory(kind: EntryType) {
    let ctx = TestContext::new();
    ctx.keygen("keys");
    let tarball = ctx.path("hostile.tar.gz");
    tarball_with_huge(&tarball, kind, 256 << 20);
    let bundle = bundle_around(&ctx, &tarball, "out");
    let prefix = ctx.path("opt");
    refused_in_little_memory(
        &mut install_cmd(&ctx, &bundle, "opt"),
        &["extension header", "268435456 bytes"],
        Some(&prefix),
    );
}

#[test]
fn long_name_of_256_mib() {
    huge_extension_header_is_refused_in_little_memory(EntryType::GNULongName);
}

#[test]
fn long_link_of_256_mib() {
    huge_extension_header_is_refused_in_little_memory(EntryType::GNULongLink);
}

#[test]
fn pax_header_of_256_mib() {
    huge_extension_header_is_refused_in_little_memory(EntryType::XHeader);
}

/// The updater meets the same bundle (a manual `--update` of an installed agent) and
/// refuses it the same way, leaving the installed version as it was.
#[test]
fn long_name_of_256_mib_against_the_updater() {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let good = ctx.pack(&ctx.dist("d1"), "0.9.0", "1", &key, "b0");
    let home = ctx.install(&good, "p");
    let tarball = ctx.path("hostile.tar.gz");
    tarball_with_huge(&tarball, EntryType::GNULongName, 256 << 20);
    let bundle = bundle_around(&ctx, &tarball, "out");
    let mut update = Command::new(&bundle);
    update.arg(format!("--update={}", home.display()));
    refused_in_little_memory(&mut update, &["extension header"], None);
    assert_eq!(
        fs::read_link(home.join("current")).unwrap(),
        Path::new("versions/0.9.0+1")
    );
    assert!(!home.join("versions/1.0.0+1").exists());
}

#[test]
fn six_gib_hidden_in_a_directory_entry() {
    let ctx = TestContext::new();
    ctx.keygen("keys");
    let tarball = ctx.path("hostile.tar.gz");
    let mut gz = GzEncoder::new(fs::File::create(&tarball).unwrap(), Compression::fast());
    gz.write_all(header("agent/", EntryType::Directory, 6 << 30).as_bytes())
        .unwrap();
    stream(&mut gz, 6 << 30, 0);
    gz.write_all(&[0u8; 1024]).unwrap();
    gz.finish().unwrap();
    let bundle = bundle_around(&ctx, &tarball, "out");
    let started = Instant::now();
    refused_in_little_memory(
        &mut install_cmd(&ctx, &bundle, "opt"),
        &["carries 6442450944 bytes"],
        Some(&ctx.path("opt")),
    );
    // Refused at the header, not after churning through 6 GiB.
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn data_after_the_end_of_the_archive_or_a_second_gzip_member() {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let dist = ctx.dist("d1");
    let good = ctx.pack(&dist, "1.0.0", "1", &key, "good");
    // The good bundle's tarball, extracted, then spoiled two ways.
    let mut payload = zip::ZipArchive::new(fs::File::open(&good).unwrap()).unwrap();
    let mut tarball = Vec::new();
    std::io::Read::read_to_end(
        &mut payload.by_name("agent-1.0.0.tar.gz").unwrap(),
        &mut tarball,
    )
    .unwrap();
    let second_member = ctx.path("two-members.tar.gz");
    let mut bytes = tarball.clone();
    let mut gz = GzEncoder::new(Vec::new(), Compression::fast());
    gz.write_all(b"more").unwrap();
    bytes.extend_from_slice(&gz.finish().unwrap());
    fs::write(&second_member, bytes).unwrap();
    let garbage_after = ctx.path("garbage.tar.gz");
    let mut raw = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&tarball[..]), &mut raw).unwrap();
    raw.extend_from_slice(b"hidden after the end");
    let mut gz = GzEncoder::new(Vec::new(), Compression::fast());
    gz.write_all(&raw).unwrap();
    fs::write(&garbage_after, gz.finish().unwrap()).unwrap();
    for (tarball, words, out) in [
        (
            &second_member,
            "after the end of the compressed stream",
            "o1",
        ),
        (&garbage_after, "after the end of the tar archive", "o2"),
    ] {
        let bundle = bundle_around(&ctx, tarball, out);
        let text = run_fails(&mut install_cmd(&ctx, &bundle, out), 1);
        assert!(text.contains(words), "{text}");
        assert!(!ctx.path(out).join("agent").exists());
    }
}

/// Two entries of the same name in the zip: the zip crate would see one (the last),
/// `unzip` both. Refused by `verify`, `--install` and the updater.
fn duplicate_entry_is_refused_everywhere(duplicate: &str, twin: &str) {
    let ctx = TestContext::new();
    let (key, public) = ctx.keygen("keys");
    let good = ctx.pack(&ctx.dist("d1"), "0.9.0", "1", &key, "b0");
    let home = ctx.install(&good, "p");
    let parts = Parts::new(&ctx, "1.0.0", "1");
    let mut payload = zip::ZipArchive::new(fs::File::open(&good).unwrap()).unwrap();
    let tarball = ctx.path("dist.tar.gz");
    std::io::copy(
        &mut payload.by_name("agent-0.9.0.tar.gz").unwrap(),
        &mut fs::File::create(&tarball).unwrap(),
    )
    .unwrap();
    let names = [
        "agent-update-version.properties",
        "agent-1.0.0.tar.gz",
        "README.txt",
        "LICENSE",
        twin,
    ];
    let files = [
        parts.path("props"),
        tarball.clone(),
        parts.path("README.txt"),
        parts.path("LICENSE"),
        if duplicate.ends_with(".properties") {
            parts.path("props")
        } else {
            tarball.clone()
        },
    ];
    let list: Vec<Part<'_>> = names
        .iter()
        .zip(&files)
        .map(|(name, file)| Part { name, file })
        .collect();
    let bundle = hand_made_bundle(&ctx.path("out"), "1.0.0", "1", &key, &list);
    // The twin's name becomes the duplicate's, in its local header and in the directory.
    assert_eq!(
        patch_bytes(&bundle, twin.as_bytes(), duplicate.as_bytes()),
        2
    );
    sign_bundle(&bundle, "1.0.0", "1", &key);
    let listing = run(Command::new("unzip").arg("-l").arg(&bundle));
    assert_eq!(
        String::from_utf8_lossy(&listing.stdout)
            .matches(duplicate)
            .count(),
        2,
        "unzip shows both"
    );
    let verify = run_fails(
        ctx.cmd("agent-bundle")
            .arg("verify")
            .arg(&bundle)
            .arg("--pub")
            .arg(&public),
        1,
    );
    assert!(verify.contains("duplicate payload entry"), "{verify}");
    let install = run_fails(&mut install_cmd(&ctx, &bundle, "opt"), 1);
    assert!(install.contains("duplicate payload entry"), "{install}");
    let update = run_fails(
        Command::new(&bundle).arg(format!("--update={}", home.display())),
        1,
    );
    assert!(update.contains("duplicate payload entry"), "{update}");
    assert_eq!(
        fs::read_link(home.join("current")).unwrap(),
        Path::new("versions/0.9.0+1")
    );
}

#[test]
fn duplicate_properties_entries() {
    duplicate_entry_is_refused_everywhere(
        "agent-update-version.properties",
        "agent-update-version.propertiez",
    );
}

#[test]
fn duplicate_tarball_entries() {
    duplicate_entry_is_refused_everywhere("agent-1.0.0.tar.gz", "agent-1.0.0.tar.gy");
}

#[test]
fn a_bundle_for_another_platform_is_refused_naming_both() {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let other = ctx.pack_with(
        &ctx.dist("d1"),
        "1.0.0",
        "1",
        &key,
        "b1",
        &["--platform", "aarch64-unknown-linux-gnu"],
    );
    let text = run_fails(
        Command::new(&other).arg(format!("--install={}", ctx.path("opt").display())),
        1,
    );
    assert!(
        text.contains("aarch64-unknown-linux-gnu")
            && text.contains(agent_protocol::layout::PLATFORM),
        "{text}"
    );
    assert!(!ctx.path("opt").exists());
}

fn staging_dirs(prefix: &Path) -> Vec<String> {
    fs::read_dir(prefix)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(".agent-install-"))
                .collect()
        })
        .unwrap_or_default()
}

/// A bundle large enough that its unpack can be interrupted.
fn big_bundle(ctx: &TestContext) -> PathBuf {
    let (key, _) = ctx.keygen("keys");
    let dist = ctx.dist("big");
    e2e::pad_dist(&dist, 96 << 20);
    ctx.pack(&dist, "1.0.0", "1", &key, "big-out")
}

/// Starts the install and returns once its staging directory exists.
fn install_until_staging(ctx: &TestContext, bundle: &Path, prefix: &Path) -> std::process::Child {
    fs::create_dir_all(prefix).unwrap();
    let child = Command::new(bundle)
        .arg(format!("--install={}", prefix.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until(Duration::from_secs(60), "the install to stage", || {
        !staging_dirs(prefix).is_empty()
    });
    let _ = ctx;
    child
}

#[test]
fn sigint_during_install_leaves_nothing_behind() {
    let ctx = TestContext::new();
    let bundle = big_bundle(&ctx);
    let prefix = ctx.path("opt");
    let child = install_until_staging(&ctx, &bundle, &prefix);
    e2e::signal(child.id(), "INT");
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("interrupted"));
    assert!(
        staging_dirs(&prefix).is_empty(),
        "{:?}",
        staging_dirs(&prefix)
    );
    assert!(!prefix.join("agent").exists());
}

#[test]
fn sigkill_during_install_leaves_nothing_behind_after_the_next_run() {
    let ctx = TestContext::new();
    let bundle = big_bundle(&ctx);
    let prefix = ctx.path("opt");
    let mut child = install_until_staging(&ctx, &bundle, &prefix);
    e2e::signal(child.id(), "KILL");
    let _ = child.wait();
    assert_eq!(staging_dirs(&prefix).len(), 1, "the kill left its staging");
    let out = run(Command::new(&bundle).arg(format!("--install={}", prefix.display())));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("left by an interrupted install"));
    assert!(
        staging_dirs(&prefix).is_empty(),
        "{:?}",
        staging_dirs(&prefix)
    );
    assert!(prefix.join("agent/current/bin/agent").exists());
}
