//! Deltas between bundles this packer makes: the rebuilt bundle is byte for byte the
//! packed one, a one-file release costs a few hundred bytes, and a damaged or misplaced
//! delta is an error, never a different bundle.

use std::fs;
use std::path::{Path, PathBuf};

use agent_bundle::pack::{PackRequest, pack};
use agent_delta::DeltaError;
use agent_delta::{apply, make};
use agent_protocol::minisign::SecretKey;
use agent_protocol::version::AgentVersion;

fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(6364136223846793005) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn dist(root: &Path, program: &[u8], conf: &str) -> PathBuf {
    let dist = root.join("dist");
    fs::create_dir_all(dist.join("bin")).expect("bin");
    fs::create_dir_all(dist.join("conf.default")).expect("conf");
    fs::write(dist.join("bin/program"), program).expect("program");
    fs::write(dist.join("bin/agent"), b"#!/bin/sh\necho agent\n").expect("agent");
    fs::write(dist.join("conf.default/agent.toml"), conf).expect("agent.toml");
    fs::write(dist.join("README.txt"), "readme\n").expect("readme");
    fs::write(dist.join("LICENSE"), "license\n").expect("license");
    dist
}

fn packed(root: &Path, key: &SecretKey, version: &str, program: &[u8], conf: &str) -> PathBuf {
    let dist = dist(root, program, conf);
    let out = root.join("out");
    pack(&PackRequest {
        dist: &dist,
        version: AgentVersion::new(version, "1").expect("version"),
        platform: "x86_64-unknown-linux-gnu".to_owned(),
        key,
        out_dir: &out,
        stub: Path::new("/bin/true"),
        signed_at: Some(1_700_000_000),
        rotations: &[],
        allow_other_key: false,
    })
    .expect("pack")
    .bundle
}

struct Pair {
    _dir: tempfile::TempDir,
    old: PathBuf,
    new: PathBuf,
    delta: PathBuf,
}

fn pair(
    old_program: &[u8],
    new_program: &[u8],
    old_conf: &str,
    new_conf: &str,
) -> (Pair, make::Made) {
    let dir = tempfile::tempdir().expect("tempdir");
    let key = SecretKey::generate().expect("key");
    let old = packed(&dir.path().join("a"), &key, "1.0.0", old_program, old_conf);
    let new = packed(&dir.path().join("b"), &key, "1.1.0", new_program, new_conf);
    let delta = dir.path().join("delta");
    let mut out = fs::File::create(&delta).expect("delta file");
    let made = make::make(&old, &new, &mut out, make::Limits::default()).expect("make");
    (
        Pair {
            _dir: dir,
            old,
            new,
            delta,
        },
        made,
    )
}

fn rebuilt(pair: &Pair) -> Result<Vec<u8>, DeltaError> {
    let mut out = Vec::new();
    apply::apply(&pair.old, &pair.delta, &mut out, Path::new("memory"))?;
    Ok(out)
}

#[test]
fn a_one_file_release_is_rebuilt_byte_for_byte_from_a_few_hundred_bytes() {
    let program = noise(2_000_000, 7);
    let (pair, made) = pair(&program, &program, "a = 1\n", "a = 2\n");
    let bundle = fs::read(&pair.new).expect("new bundle");
    assert_eq!(rebuilt(&pair).expect("apply"), bundle);
    assert_eq!(fs::metadata(&pair.delta).expect("delta").len(), made.size);
    assert!(
        made.size * 100 < bundle.len() as u64 / 10,
        "a one-file delta of {} bytes for a {}-byte bundle",
        made.size,
        bundle.len()
    );
    assert!(
        made.copied >= program.len() as u64,
        "the program is named, not sent: {made:?}"
    );
}

#[test]
fn a_changed_program_is_sent_as_a_patch_of_its_uncompressed_bytes() {
    let old = noise(1_000_000, 9);
    let mut new = old.clone();
    new[500_000..500_016].copy_from_slice(b"a small change!!");
    let (pair, made) = pair(&old, &new, "a = 1\n", "a = 1\n");
    let bundle = fs::read(&pair.new).expect("new bundle");
    assert_eq!(rebuilt(&pair).expect("apply"), bundle);
    assert!(made.patched >= 1, "{made:?}");
    assert!(made.size < 20_000, "{made:?}");
}

#[test]
fn a_flipped_byte_anywhere_in_a_delta_is_an_error_or_other_bytes_never_a_panic() {
    let program = noise(300_000, 11);
    let mut changed = program.clone();
    changed[1000] ^= 1;
    let (pair, _) = pair(&program, &changed, "a = 1\n", "a = 3\n");
    let bundle = fs::read(&pair.new).expect("new bundle");
    let delta = fs::read(&pair.delta).expect("delta");
    let (mut refused, mut other_bytes) = (0, 0);
    for at in (0..delta.len())
        .step_by(delta.len().div_ceil(97))
        .chain(8..40)
    {
        let mut damaged = delta.clone();
        damaged[at] ^= 0x40;
        fs::write(&pair.delta, &damaged).expect("write");
        // The caller compares what comes out with the sha256 the server names: a result
        // that is not the bundle is refused there.
        match rebuilt(&pair) {
            Err(DeltaError::WrongBase { .. }) if (8..40).contains(&at) => refused += 1,
            Err(e) => {
                assert!(!(8..40).contains(&at), "byte {at}: {e}");
                refused += 1;
            }
            Ok(out) if out != bundle => other_bytes += 1,
            // The result hash in the header, the level (only a recompressed file reads
            // it), padding bits of a compressed patch: flips without an effect.
            Ok(_) => {}
        }
    }
    assert!(
        refused > 32,
        "{refused} refused, {other_bytes} made other bytes"
    );
}

#[test]
fn a_delta_applied_to_another_base_is_refused() {
    let (pair, _) = pair(&noise(10_000, 1), &noise(10_000, 2), "a = 1\n", "a = 1\n");
    fs::copy(&pair.new, &pair.old).expect("swap base");
    match rebuilt(&pair) {
        Err(DeltaError::WrongBase { .. }) => {}
        other => panic!("expected WrongBase, got {:?}", other.map(|v| v.len())),
    }
}

#[test]
fn a_bundle_still_lists_unpacks_and_reads_as_one_gzip_stream() {
    let program = noise(100_000, 3);
    let (pair, _) = pair(&program, &program, "a = 1\n", "a = 2\n");
    let mut payload = agent_extract::payload::Payload::open(&pair.new).expect("payload");
    let facts = payload.facts().expect("facts");
    let target = tempfile::tempdir().expect("target");
    agent_extract::unpack::unpack_tar_gz(
        payload.dist(&facts.version).expect("dist"),
        &target.path().join("v"),
        agent_extract::unpack::Options {
            root: Some("agent"),
            ..Default::default()
        },
    )
    .expect("the one safe unpacker reads the segmented tarball");
    assert_eq!(
        fs::read(target.path().join("v/bin/program")).expect("program"),
        program
    );
    assert_eq!(
        fs::read_to_string(target.path().join("v/conf.default/agent.toml")).expect("conf"),
        "a = 2\n"
    );
}
