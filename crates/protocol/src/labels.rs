//! Agent labels: `[agent] labels = { env = "prod" }` in agent.toml, `--label env=prod`
//! on `--install` and `install.sh`, `"labels"` in a register or connect, and the labels
//! an operator sets on the server. One set of rules for every place that reads them.
//!
//! Keys: lowercase letters, digits, `-`, `_` and `.`, starting with a letter or digit,
//! with one `/`-separated prefix allowed (`team.example/owner`), at most
//! [`MAX_KEY`] characters. Values: at most [`MAX_VALUE`] of letters, digits, `-`, `_`
//! and `.` (empty allowed). At most [`MAX_LABELS`] labels an agent. The built-in keys
//! ([`BUILT_IN`]) are the server's to say and nobody else's.

use std::collections::BTreeMap;

/// Labels by key.
pub type Labels = BTreeMap<String, String>;

/// Longest key.
pub const MAX_KEY: usize = 63;
/// Longest value.
pub const MAX_VALUE: usize = 63;
/// Most labels an agent carries (its own and the server's, built-ins not counted).
pub const MAX_LABELS: usize = 32;

/// Labels every agent has, worked out by the server: never set by an agent or an
/// operator.
pub const BUILT_IN: [&str; 5] = ["platform", "os", "arch", "group", "version"];

/// Whether `key` is a built-in label.
pub fn is_built_in(key: &str) -> bool {
    BUILT_IN.contains(&key)
}

/// Checks a key's spelling (a built-in key is well spelled).
pub fn check_key(key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err("a label key is empty".to_owned());
    }
    if key.len() > MAX_KEY {
        return Err(format!(
            "label key {key:?} is longer than {MAX_KEY} characters"
        ));
    }
    let mut parts = key.split('/');
    let (first, second) = (parts.next(), parts.next());
    if parts.next().is_some() {
        return Err(format!(
            "label key {key:?} has more than one `/` (one prefix/ is allowed)"
        ));
    }
    for part in [first, second].into_iter().flatten() {
        let starts_well = part
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        let plain = part.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_' | b'.')
        });
        if !starts_well || !plain {
            return Err(format!(
                "label key {key:?} is not a plain name: lowercase letters, digits, `-`, `_` and `.`, starting with a letter or digit (and one prefix/ allowed)"
            ));
        }
    }
    Ok(())
}

/// Checks a value's spelling.
pub fn check_value(key: &str, value: &str) -> Result<(), String> {
    if value.len() > MAX_VALUE {
        return Err(format!(
            "label {key}: its value is longer than {MAX_VALUE} characters"
        ));
    }
    if !value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err(format!(
            "label {key}={value:?}: a value is letters, digits, `-`, `_` and `.` only"
        ));
    }
    Ok(())
}

/// Checks a label an agent or an operator sets: well spelled and not built in.
pub fn check_label(key: &str, value: &str) -> Result<(), String> {
    check_key(key)?;
    if is_built_in(key) {
        return Err(format!(
            "label {key} is built in (the server says every agent's {}): choose another key",
            BUILT_IN.join(", ")
        ));
    }
    check_value(key, value)
}

/// Checks a set of labels an agent or an operator sets.
pub fn check(labels: &Labels) -> Result<(), String> {
    if labels.len() > MAX_LABELS {
        return Err(format!(
            "{} labels: at most {MAX_LABELS} are allowed",
            labels.len()
        ));
    }
    labels.iter().try_for_each(|(k, v)| check_label(k, v))
}

/// `key=value` (a `--label`), checked.
pub fn parse_assignment(text: &str) -> Result<(String, String), String> {
    let (key, value) = text
        .split_once('=')
        .ok_or_else(|| format!("label {text:?} is not KEY=VALUE"))?;
    let (key, value) = (key.trim(), value.trim());
    check_label(key, value)?;
    Ok((key.to_owned(), value.to_owned()))
}

/// Many `key=value`s (repeated `--label`s, or `LABELS="k=v,k=v"` split at commas): a
/// key said twice keeps the last value.
pub fn parse_assignments<S: AsRef<str>>(texts: &[S]) -> Result<Labels, String> {
    let mut labels = Labels::new();
    for text in texts {
        let (k, v) = parse_assignment(text.as_ref())?;
        labels.insert(k, v);
    }
    check(&labels)?;
    Ok(labels)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_plain_lowercase_names_with_one_prefix_allowed() {
        for good in [
            "env",
            "region",
            "a",
            "team.example/owner",
            "k8s-node_1.x",
            "9lives",
        ] {
            assert_eq!(check_key(good), Ok(()), "{good}");
        }
        for bad in [
            "",
            "Env",
            "-env",
            "a/b/c",
            "/env",
            "env/",
            "env=prod",
            "é",
            "has space",
            &"k".repeat(64),
        ] {
            assert!(check_key(bad).is_err(), "{bad:?}");
        }
        assert!(check_key(&"k".repeat(63)).is_ok());
    }

    #[test]
    fn values_are_plain_and_bounded_and_a_refusal_names_the_label() {
        assert_eq!(check_value("env", "Prod-1_a.b"), Ok(()));
        assert_eq!(check_value("env", ""), Ok(()));
        let e = check_value("env", "pr od").unwrap_err();
        assert!(e.contains("env"), "{e}");
        let e = check_value("tier", &"v".repeat(64)).unwrap_err();
        assert!(e.contains("tier") && e.contains("63"), "{e}");
    }

    #[test]
    fn built_in_labels_are_refused_and_so_is_a_33rd() {
        let e = check_label("platform", "x").unwrap_err();
        assert!(e.starts_with("label platform is built in"), "{e}");
        let many: Labels = (0..33).map(|i| (format!("k{i}"), "v".to_owned())).collect();
        assert!(check(&many).unwrap_err().contains("at most 32"));
        let enough: Labels = (0..32).map(|i| (format!("k{i}"), "v".to_owned())).collect();
        assert_eq!(check(&enough), Ok(()));
    }

    #[test]
    fn assignments_read_key_equals_value_and_the_last_wins() {
        assert_eq!(
            parse_assignment("env=prod"),
            Ok(("env".to_owned(), "prod".to_owned()))
        );
        assert!(parse_assignment("env").unwrap_err().contains("KEY=VALUE"));
        let labels = parse_assignments(&["env=dev", "region=eu", "env=prod"]).unwrap();
        assert_eq!(labels["env"], "prod");
        assert_eq!(labels.len(), 2);
        assert!(parse_assignments(&["os=linux"]).is_err());
    }
}
