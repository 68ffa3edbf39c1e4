//! Configuration sets: the workload's files that the server hands to agents
//! (docs/workload.md, "Configuring the fleet"). What a set may contain, and its hash, are
//! defined here once so that the server that stores a set and the agent that applies it
//! agree.
//!
//! A set is a map of plain file names to UTF-8 text. A name is one path component:
//! not empty, not `.` or `..`, no `/`, no `\`, no NUL, at most [`MAX_NAME`] bytes. A set
//! has at most [`MAX_FILES`] files and [`MAX_BYTES`] bytes of names and contents in all.
//!
//! The hash (the set's version) is the lowercase hex sha256 of this encoding, with the
//! files in the byte order of their names (a `BTreeMap`'s order):
//!
//! ```text
//! "agent-config-set/1\n"
//! for each file: u64 big-endian length of the name, the name's bytes,
//!                u64 big-endian length of the content, the content's bytes
//! ```
//!
//! Every field is length-prefixed, so no two different sets encode alike (a name
//! cannot run into its content, nor a file into the next), and the empty set has a
//! hash of its own.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

/// Most files in one set.
pub const MAX_FILES: usize = 64;
/// Most bytes of names and contents in one set.
pub const MAX_BYTES: usize = 1024 * 1024;
/// Longest file name, in bytes (a common file system's limit).
pub const MAX_NAME: usize = 255;
/// What the hash encoding starts with; a later encoding would change it.
const DOMAIN: &[u8] = b"agent-config-set/1\n";

/// Why a set (or one name in it) is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SetError {
    #[error(
        "file name {0:?} is not a plain file name: no '/', '\\', NUL, '.' or '..', not empty, at most 255 bytes"
    )]
    BadName(String),
    #[error("{0} files: a configuration set has at most {MAX_FILES}")]
    TooManyFiles(usize),
    #[error("{0} bytes of names and contents: a configuration set has at most {MAX_BYTES} (1 MiB)")]
    TooBig(usize),
}

/// Whether `name` is a plain file name a set may carry.
pub fn check_name(name: &str) -> Result<(), SetError> {
    let bad = name.is_empty()
        || name == "."
        || name == ".."
        || name.len() > MAX_NAME
        || name.contains(['/', '\\', '\0']);
    if bad {
        return Err(SetError::BadName(name.to_owned()));
    }
    Ok(())
}

/// Whether `files` is a set within the limits, every name plain.
pub fn check_set(files: &BTreeMap<String, String>) -> Result<(), SetError> {
    if files.len() > MAX_FILES {
        return Err(SetError::TooManyFiles(files.len()));
    }
    let total: usize = files.iter().map(|(n, c)| n.len() + c.len()).sum();
    if total > MAX_BYTES {
        return Err(SetError::TooBig(total));
    }
    for name in files.keys() {
        check_name(name)?;
    }
    Ok(())
}

/// The set's hash: see the module doc for the encoding.
pub fn hash(files: &BTreeMap<String, String>) -> String {
    let mut h = Sha256::new();
    h.update(DOMAIN);
    for (name, content) in files {
        h.update((name.len() as u64).to_be_bytes());
        h.update(name.as_bytes());
        h.update((content.len() as u64).to_be_bytes());
        h.update(content.as_bytes());
    }
    hex::encode(h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(files: &[(&str, &str)]) -> BTreeMap<String, String> {
        files
            .iter()
            .map(|(n, c)| ((*n).to_owned(), (*c).to_owned()))
            .collect()
    }

    #[test]
    fn names_are_plain_file_names() {
        for good in ["web.yml", ".hidden", "a..b", "x y", "ü"] {
            assert_eq!(check_name(good), Ok(()), "{good}");
        }
        let long = "a".repeat(256);
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "/etc",
            "../x",
            "a\\b",
            "a\0b",
            long.as_str(),
        ] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn limits_are_counted_in_files_and_bytes() {
        let many: BTreeMap<String, String> = (0..=MAX_FILES)
            .map(|i| (format!("f{i}"), String::new()))
            .collect();
        assert_eq!(check_set(&many), Err(SetError::TooManyFiles(MAX_FILES + 1)));
        let big = set(&[("a", &"x".repeat(MAX_BYTES))]);
        assert_eq!(check_set(&big), Err(SetError::TooBig(MAX_BYTES + 1)));
        let just = set(&[("a", &"x".repeat(MAX_BYTES - 1))]);
        assert_eq!(check_set(&just), Ok(()));
        assert!(check_set(&set(&[("ok", ""), ("..", "")])).is_err());
    }

    #[test]
    fn the_hash_tells_names_from_contents() {
        let a = hash(&set(&[("ab", "c")]));
        assert_eq!(a.len(), 64);
        assert_ne!(a, hash(&set(&[("a", "bc")])));
        assert_ne!(
            hash(&set(&[("a", ""), ("b", "")])),
            hash(&set(&[("a", "\0\0\0\0\0\0\0\u{1}b\0\0\0\0\0\0\0\0")]))
        );
        assert_ne!(hash(&set(&[])), hash(&set(&[("a", "")])));
        // Order of insertion does not matter; the map's order does.
        let mut m = BTreeMap::new();
        m.insert("b".to_owned(), "2".to_owned());
        m.insert("a".to_owned(), "1".to_owned());
        assert_eq!(hash(&m), hash(&set(&[("a", "1"), ("b", "2")])));
        // Pinned: the encoding is a contract between server and agent.
        assert_eq!(
            hash(&set(&[])),
            hex::encode(Sha256::digest(b"agent-config-set/1\n"))
        );
    }
}
