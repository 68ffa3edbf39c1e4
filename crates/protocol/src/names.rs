//! Names that people choose and that end up in file names, URLs and database keys (an
//! agent group, an update lock): one rule for all of them, so that what one part accepts
//! another never refuses.

/// Whether `name` is 1 to `max` letters, digits, `.`, `_` or `-`.
pub fn is_plain(name: &str, max: usize) -> bool {
    !name.is_empty()
        && name.len() <= max
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_are_short_and_of_a_few_characters() {
        assert!(is_plain("db-nightly_1.2", 64));
        for bad in ["", "a/b", "..x/", "a b", "<script>", "é"] {
            assert!(!is_plain(bad, 64), "{bad:?}");
        }
        assert!(!is_plain(&"a".repeat(65), 64));
    }
}
