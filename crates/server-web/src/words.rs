//! How the page says things a person reads: counts with their nouns, a set's files, an
//! audit entry's details. Pure, unit-tested.

use serde_json::Value;

/// `1 entry`, `2 entries`.
pub fn count(n: i64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// A configuration set's files as its heading shows them; an empty set says what it
/// does to the agents.
pub fn set_files(files: &[String]) -> String {
    match files.len() {
        0 => "no files (empties conf/workload/ on its agents)".to_owned(),
        n => format!("{}: {}", count(n as i64, "file", "files"), files.join(", ")),
    }
}

/// An audit entry's details as words: `group: default · files: a.conf, b.conf`; a
/// refused call's HTTP status as what it means.
pub fn audit_details(details: &Value) -> String {
    let Some(fields) = details.as_object() else {
        return plain(details);
    };
    fields
        .iter()
        .map(|(key, value)| match (key.as_str(), value.as_u64()) {
            ("status", Some(code)) => refusal(code),
            _ => format!("{}: {}", key.replace('_', " "), plain(value)),
        })
        .collect::<Vec<_>>()
        .join(" · ")
}

fn refusal(code: u64) -> String {
    match code {
        401 => "no valid token (401)".to_owned(),
        403 => "the token's role may not do this, or the admin API is off (403)".to_owned(),
        429 => "too many attempts (429)".to_owned(),
        other => format!("answered {other}"),
    }
}

fn plain(value: &Value) -> String {
    match value {
        Value::Null => "none".to_owned(),
        Value::String(s) => s.clone(),
        Value::Array(items) if items.is_empty() => "none".to_owned(),
        Value::Array(items) => items.iter().map(plain).collect::<Vec<_>>().join(", "),
        Value::Object(_) => audit_details(value),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn counts_sets_and_audit_details_read_as_words() {
        assert_eq!(count(1, "entry", "entries"), "1 entry");
        assert_eq!(count(0, "entry", "entries"), "0 entries");
        assert_eq!(
            set_files(&[]),
            "no files (empties conf/workload/ on its agents)"
        );
        assert_eq!(
            set_files(&["a.conf".into(), "b.conf".into()]),
            "2 files: a.conf, b.conf"
        );
        let refused = audit_details(&json!({"status": 403}));
        assert!(
            refused.contains("403") && !refused.contains('{'),
            "{refused}"
        );
        let pushed = audit_details(&json!({"group": "default", "files": ["a", "b"], "new": true}));
        for part in ["files: a, b", "group: default", "new: true"] {
            assert!(pushed.contains(part), "{pushed}");
        }
    }
}
