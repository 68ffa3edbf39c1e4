//! Hostile archives, each refused with an error naming the entry, with nothing written
//! outside the staging directory and the staging directory itself removed.

#![allow(
    clippy::unwrap_used,
    reason = "tests: a failed step should fail the test loudly"
)]

use std::fs;
use std::io::{Read, Write};
use std::path::Path;

use agent_extract::Error;
use agent_extract::unpack::{Limits, Options, unpack_tar_gz};
use flate2::Compression;
use flate2::write::GzEncoder;
use tar::{EntryType, Header};

/// An entry written with raw header bytes, so that names the `tar` builder would
/// refuse (`..`, absolute paths) can be made.
struct Raw<'a> {
    name: &'a str,
    kind: EntryType,
    data: &'a [u8],
    link: Option<&'a str>,
}

fn file<'a>(name: &'a str, data: &'a [u8]) -> Raw<'a> {
    Raw {
        name,
        kind: EntryType::Regular,
        data,
        link: None,
    }
}

fn link<'a>(name: &'a str, kind: EntryType, target: &'a str) -> Raw<'a> {
    Raw {
        name,
        kind,
        data: b"",
        link: Some(target),
    }
}

fn archive(entries: &[Raw<'_>]) -> Vec<u8> {
    let mut gz = GzEncoder::new(Vec::new(), Compression::fast());
    for e in entries {
        let mut h = Header::new_gnu();
        {
            let gnu = h.as_gnu_mut().unwrap();
            gnu.name[..e.name.len()].copy_from_slice(e.name.as_bytes());
            if let Some(target) = e.link {
                gnu.linkname[..target.len()].copy_from_slice(target.as_bytes());
            }
        }
        h.set_entry_type(e.kind);
        h.set_mode(0o755);
        h.set_size(e.data.len() as u64);
        h.set_cksum();
        gz.write_all(h.as_bytes()).unwrap();
        gz.write_all(e.data).unwrap();
        let pad = (512 - e.data.len() % 512) % 512;
        gz.write_all(&vec![0u8; pad]).unwrap();
    }
    gz.write_all(&[0u8; 1024]).unwrap();
    gz.finish().unwrap()
}

/// Unpacks into `<tmp>/stage/staging`, returns the error and checks nothing else appeared.
fn refuse(bytes: &[u8], limits: Limits) -> Error {
    let tmp = tempfile::tempdir().unwrap();
    let stage_parent = tmp.path().join("stage");
    fs::create_dir(&stage_parent).unwrap();
    let staging = stage_parent.join("staging");
    let err = unpack_tar_gz(
        bytes,
        &staging,
        Options {
            limits,
            root: Some("agent"),
            ..Options::default()
        },
    )
    .expect_err("hostile archive was accepted");
    assert!(
        !staging.exists(),
        "staging directory left behind after {err}"
    );
    let outside: Vec<_> = fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        outside,
        vec!["stage"],
        "something was written outside staging: {outside:?}"
    );
    assert!(!Path::new("/tmp/escaped-by-test").exists());
    err
}

fn assert_names(err: &Error, entry: &str) {
    let msg = err.to_string();
    assert!(msg.contains(entry), "error {msg:?} does not name {entry:?}");
}

#[test]
fn dotdot_entry_is_refused() {
    let err = refuse(
        &archive(&[file("agent/../escaped", b"x")]),
        Limits::default(),
    );
    assert_names(&err, "agent/../escaped");
}

#[test]
fn absolute_path_is_refused() {
    let err = refuse(
        &archive(&[file("/tmp/escaped-by-test", b"x")]),
        Limits::default(),
    );
    assert_names(&err, "/tmp/escaped-by-test");
}

#[test]
fn symlink_to_etc_is_refused() {
    let err = refuse(
        &archive(&[link("agent/etc", EntryType::Symlink, "/etc")]),
        Limits::default(),
    );
    assert_names(&err, "agent/etc");
    let err = refuse(
        &archive(&[link("agent/up", EntryType::Symlink, "../../etc")]),
        Limits::default(),
    );
    assert_names(&err, "agent/up");
}

#[test]
fn file_through_a_symlink_is_refused() {
    let bytes = archive(&[
        link("agent/d", EntryType::Symlink, "sub"),
        file("agent/d/passwd", b"x"),
    ]);
    let err = refuse(&bytes, Limits::default());
    assert_names(&err, "agent/d/passwd");
}

#[test]
fn hard_link_is_refused() {
    let bytes = archive(&[
        file("agent/a", b"x"),
        link("agent/b", EntryType::Link, "agent/a"),
    ]);
    assert_names(&refuse(&bytes, Limits::default()), "agent/b");
}

#[test]
fn fifo_and_devices_are_refused() {
    for kind in [EntryType::Fifo, EntryType::Char, EntryType::Block] {
        let bytes = archive(&[Raw {
            name: "agent/dev",
            kind,
            data: b"",
            link: None,
        }]);
        assert_names(&refuse(&bytes, Limits::default()), "agent/dev");
    }
}

#[test]
fn duplicate_names_are_refused() {
    let bytes = archive(&[file("agent/a", b"1"), file("agent/./a", b"2")]);
    let err = refuse(&bytes, Limits::default());
    assert!(err.to_string().contains("duplicate"), "{err}");
}

#[test]
fn entry_outside_the_root_is_refused() {
    assert_names(
        &refuse(&archive(&[file("other/a", b"1")]), Limits::default()),
        "other/a",
    );
}

#[test]
fn endless_data_is_capped_by_bytes_really_written() {
    // 1 GiB of zeros that compresses to about 1 MiB, declared as a 1 KiB entry: the
    // unpacker must stop at its cap on bytes written, not trust either number.
    let mut gz = GzEncoder::new(Vec::new(), Compression::best());
    let mut h = Header::new_gnu();
    h.as_gnu_mut().unwrap().name[..10].copy_from_slice(b"agent/bomb");
    h.set_entry_type(EntryType::Regular);
    h.set_mode(0o644);
    h.set_size(1 << 30);
    h.set_cksum();
    gz.write_all(h.as_bytes()).unwrap();
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..1024 {
        gz.write_all(&zeros).unwrap();
    }
    let bytes = gz.finish().unwrap();
    assert!(bytes.len() < 2 << 20, "bomb is {} bytes", bytes.len());
    let limits = Limits {
        max_entries: 10,
        max_bytes: 64 << 20,
    };
    let err = refuse(&bytes, limits);
    assert!(matches!(err, Error::TooLarge { .. }), "{err}");
    assert_names(&err, "agent/bomb");
}

#[test]
fn too_many_entries_are_refused() {
    let names: Vec<String> = (0..20).map(|i| format!("agent/f{i}")).collect();
    let entries: Vec<Raw<'_>> = names.iter().map(|n| file(n, b"")).collect();
    let err = refuse(
        &archive(&entries),
        Limits {
            max_entries: 10,
            max_bytes: 1 << 20,
        },
    );
    assert!(matches!(err, Error::TooManyEntries { .. }), "{err}");
}

#[test]
fn garbage_is_an_error_not_a_panic() {
    refuse(b"this is not gzip", Limits::default());
    let mut gz = GzEncoder::new(Vec::new(), Compression::fast());
    gz.write_all(&[0xffu8; 700]).unwrap();
    refuse(&gz.finish().unwrap(), Limits::default());
    let good = archive(&[file("agent/a", &[1u8; 5000])]);
    refuse(&good[..good.len() / 2], Limits::default());
}

/// Unix: an executable is a mode bit.
#[cfg(unix)]
#[test]
fn a_normal_tree_unpacks_with_modes_and_links() {
    let tmp = tempfile::tempdir().unwrap();
    let staging = tmp.path().join("staging");
    let bytes = archive(&[
        Raw {
            name: "agent/bin/",
            kind: EntryType::Directory,
            data: b"",
            link: None,
        },
        file("agent/bin/agent", b"#!/bin/sh\n"),
        link("agent/bin/alias", EntryType::Symlink, "agent"),
        link("agent/top", EntryType::Symlink, "bin/agent"),
    ]);
    let stats = unpack_tar_gz(
        &bytes[..],
        &staging,
        Options {
            root: Some("agent"),
            sync: true,
            ..Options::default()
        },
    )
    .unwrap();
    assert_eq!(stats.entries, 4);
    use std::os::unix::fs::PermissionsExt;
    let mode = fs::metadata(staging.join("bin/agent"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o755);
    assert_eq!(fs::read(staging.join("top")).unwrap(), b"#!/bin/sh\n");
}

#[test]
fn gigabytes_of_padding_after_the_end_are_refused_without_reading_them() {
    // A proper end, then 2 GiB of zeros: refused after a megabyte, not after 2 GiB.
    let mut gz = GzEncoder::new(Vec::new(), Compression::fast());
    gz.write_all(&archive_raw(&[file("agent/a", b"x")]))
        .unwrap();
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..2048 {
        gz.write_all(&zeros).unwrap();
    }
    let bytes = gz.finish().unwrap();
    let started = std::time::Instant::now();
    let err = refuse(&bytes, Limits::default());
    assert!(err.to_string().contains("padding after the end"), "{err}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

/// The uncompressed tar of `entries` (with its end blocks).
fn archive_raw(entries: &[Raw<'_>]) -> Vec<u8> {
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(&archive(entries)[..])
        .read_to_end(&mut raw)
        .unwrap();
    raw
}
