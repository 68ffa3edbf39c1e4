//! Pushes that would take every file away from a group's agents: a set with no files
//! empties `conf/workload/` on each of them, and a set that keeps none of the current
//! set's names usually means the wrong directory. Both are refused unless the operator
//! says it is meant (`--allow-empty`, `--replace-all`). Pure: a function of the two sets.

use std::collections::BTreeMap;

/// What the operator said is meant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Consent {
    /// A set with no files may be stored.
    pub allow_empty: bool,
    /// A set that keeps none of the current set's file names may be stored.
    pub replace_all: bool,
}

/// Why the push is refused, or `None` when it may go ahead. `current` is the names of
/// the group's set before the push, if it has one.
pub fn refusal<'a>(
    group: &str,
    current: Option<impl IntoIterator<Item = &'a String>>,
    new: &BTreeMap<String, String>,
    consent: Consent,
) -> Option<String> {
    if new.is_empty() {
        return (!consent.allow_empty).then(|| {
            format!(
                "the set has no files: it would empty conf/workload/ on every agent of group {group}. \
                 Nothing was stored. If that is what you mean, push it again with --allow-empty \
                 (API: \"allow_empty\": true)"
            )
        });
    }
    let current: Vec<&String> = current.map(|c| c.into_iter().collect()).unwrap_or_default();
    let keeps_one = current.iter().any(|name| new.contains_key(*name));
    if current.is_empty() || keeps_one || consent.replace_all {
        return None;
    }
    let mut dropped: Vec<&str> = current.iter().map(|n| n.as_str()).take(5).collect();
    if current.len() > dropped.len() {
        dropped.push("…");
    }
    Some(format!(
        "the set keeps none of the files group {group} has now ({}): every one would be removed \
         from conf/workload/ on its agents. Nothing was stored. Check the directory; if a whole \
         new set is meant, push it again with --replace-all (API: \"replace_all\": true)",
        dropped.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> BTreeMap<String, String> {
        names
            .iter()
            .map(|n| ((*n).to_owned(), "x".to_owned()))
            .collect()
    }

    #[test]
    fn an_empty_set_needs_allow_empty() {
        let none: Option<Vec<&String>> = None;
        let why = refusal("default", none.clone(), &set(&[]), Consent::default()).unwrap();
        assert!(
            why.contains("--allow-empty") && why.contains("group default"),
            "{why}"
        );
        let allowed = Consent {
            allow_empty: true,
            replace_all: false,
        };
        assert_eq!(refusal("default", none, &set(&[]), allowed), None);
    }

    #[test]
    fn a_set_that_drops_every_current_file_needs_replace_all() {
        let current = set(&["a.conf", "b.conf"]);
        let why = refusal(
            "web",
            Some(current.keys()),
            &set(&["other.conf"]),
            Consent::default(),
        )
        .unwrap();
        assert!(
            why.contains("a.conf, b.conf") && why.contains("--replace-all"),
            "{why}"
        );
        let replace = Consent {
            allow_empty: false,
            replace_all: true,
        };
        assert_eq!(
            refusal("web", Some(current.keys()), &set(&["other.conf"]), replace),
            None
        );
        // Keeping one name, or a group's first set, goes ahead.
        let keep = set(&["a.conf", "c.conf"]);
        assert_eq!(
            refusal("web", Some(current.keys()), &keep, Consent::default()),
            None
        );
        let none: Option<Vec<&String>> = None;
        assert_eq!(refusal("web", none, &keep, Consent::default()), None);
    }
}
