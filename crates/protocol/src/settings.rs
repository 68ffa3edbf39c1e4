//! Environment overrides for TOML configuration: every key `[section] key` is also
//! `<PREFIX>_<SECTION>_<KEY>` (upper case, `-` as `_`). One implementation for the agent
//! and the server, so both read the environment the same way.

/// How an environment string becomes a TOML value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Str,
    Int,
    Bool,
    /// Comma-separated.
    List,
    /// Comma-separated `NAME=VALUE` pairs (a table of strings).
    Map,
    /// A whole number of seconds, written bare (`90`) or with a unit (`"15m"`, `"30s"`):
    /// see [`normalize_seconds`].
    Seconds,
}

/// A documented configuration key.
#[derive(Debug, Clone, Copy)]
pub struct Key {
    pub section: &'static str,
    pub name: &'static str,
    pub kind: Kind,
}

pub const fn key(section: &'static str, name: &'static str, kind: Kind) -> Key {
    Key {
        section,
        name,
        kind,
    }
}

/// Where overrides come from: the process environment, or anything a test makes up.
pub trait Environment {
    fn var(&self, name: &str) -> Option<String>;
    /// Every variable name, to find the misspelt ones; may be empty when unknown.
    fn names(&self) -> Vec<String>;
}

/// A lookup function knows no names, so it never reports a misspelt variable.
impl<F: Fn(&str) -> Option<String>> Environment for F {
    fn var(&self, name: &str) -> Option<String> {
        self(name)
    }

    fn names(&self) -> Vec<String> {
        Vec::new()
    }
}

/// The environment of this process.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessEnv;

impl Environment for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }

    fn names(&self) -> Vec<String> {
        std::env::vars_os()
            .filter_map(|(k, _)| k.into_string().ok())
            .collect()
    }
}

/// A fixed set of variables.
#[derive(Debug, Clone, Default)]
pub struct VarMap(pub Vec<(String, String)>);

impl Environment for VarMap {
    fn var(&self, name: &str) -> Option<String> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    }

    fn names(&self) -> Vec<String> {
        self.0.iter().map(|(k, _)| k.clone()).collect()
    }
}

/// Which variables with the prefix must name a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strictness {
    /// Every `<PREFIX>_…` variable (the prefix belongs to these settings alone).
    WholePrefix,
    /// `<PREFIX>_<SECTION>_…` for a section of these settings (the prefix is shared with
    /// other knobs, such as `AGENT_LOG`).
    KnownSections,
    /// None: only some of the keys are read here.
    Lenient,
}

pub fn env_var_name(prefix: &str, key: &Key) -> String {
    format!("{prefix}_{}_{}", key.section, key.name)
        .to_ascii_uppercase()
        .replace('-', "_")
}

/// The variables of `env` that look like settings of `keys` but are none, each with the
/// closest real name.
pub fn unknown_vars(
    prefix: &str,
    keys: &[Key],
    env: &dyn Environment,
    strictness: Strictness,
) -> Vec<(String, String)> {
    let known: Vec<String> = keys.iter().map(|k| env_var_name(prefix, k)).collect();
    let sections: Vec<String> = keys
        .iter()
        .map(|k| format!("{prefix}_{}_", k.section).to_ascii_uppercase())
        .collect();
    let whole = format!("{prefix}_");
    let mut unknown: Vec<(String, String)> = env
        .names()
        .into_iter()
        .filter(|name| match strictness {
            Strictness::WholePrefix => name.starts_with(&whole),
            Strictness::KnownSections => sections.iter().any(|s| name.starts_with(s)),
            Strictness::Lenient => false,
        })
        .filter(|name| !known.contains(name))
        .map(|name| {
            let closest = known
                .iter()
                .min_by_key(|k| edit_distance(k, &name))
                .cloned()
                .unwrap_or_default();
            (name, closest)
        })
        .collect();
    unknown.sort();
    unknown
}

/// Levenshtein distance, for "did you mean".
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

/// Applies every override found in `env` to `table`; the error names the variable. A
/// variable that looks like a setting but is none is an error too (see [`Strictness`]),
/// as an unknown key in the file is.
pub fn apply_env(
    table: &mut toml::Table,
    prefix: &str,
    keys: &[Key],
    env: &dyn Environment,
    strictness: Strictness,
) -> Result<(), String> {
    if let Some((name, closest)) = unknown_vars(prefix, keys, env, strictness).first() {
        return Err(format!(
            "{name} is not a setting; did you mean {closest}? Unset it or correct its name"
        ));
    }
    for key in keys {
        let var = env_var_name(prefix, key);
        let Some(raw) = env.var(&var) else { continue };
        let value = match key.kind {
            Kind::Str => toml::Value::String(raw),
            Kind::Int => toml::Value::Integer(
                raw.trim()
                    .parse()
                    .map_err(|_| format!("{var}={raw:?} is not a whole number"))?,
            ),
            // Checked, with the key's name, by `normalize_seconds` after the file is read.
            Kind::Seconds => match raw.trim().parse() {
                Ok(n) => toml::Value::Integer(n),
                Err(_) => toml::Value::String(raw),
            },
            Kind::Bool => toml::Value::Boolean(
                raw.trim()
                    .parse()
                    .map_err(|_| format!("{var}={raw:?} is not true or false"))?,
            ),
            Kind::List => toml::Value::Array(
                raw.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(|s| toml::Value::String(s.to_owned()))
                    .collect(),
            ),
            Kind::Map => {
                let mut map = toml::Table::new();
                for pair in raw.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                    let (name, value) = pair.split_once('=').ok_or_else(|| {
                        format!("{var}: {pair:?} is not NAME=VALUE; write e.g. {var}=A=1,B=2")
                    })?;
                    map.insert(
                        name.trim().to_owned(),
                        toml::Value::String(value.trim().to_owned()),
                    );
                }
                toml::Value::Table(map)
            }
        };
        let section = table
            .entry(key.section.to_owned())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        match section {
            toml::Value::Table(t) => {
                t.insert(key.name.to_owned(), value);
            }
            _ => return Err(format!("[{}] is not a table", key.section)),
        }
    }
    Ok(())
}

/// The forms a [`Kind::Seconds`] key accepts, for error messages.
pub const SECONDS_FORMS: &str =
    "seconds (90) or a duration with a unit (\"30s\", \"15m\", \"1h\", \"1d\")";

/// A duration in whole seconds: bare (`"90"`) or with a unit, as the agent writes them.
pub fn parse_seconds(s: &str) -> Result<u64, String> {
    let s = s.trim();
    if let Ok(n) = s.parse::<u64>() {
        return Ok(n);
    }
    let d = parse_duration(s)?;
    if d.subsec_nanos() != 0 {
        return Err(format!("{s:?} is not a whole number of seconds"));
    }
    Ok(d.as_secs())
}

/// Rewrites every [`Kind::Seconds`] key of `table` that is written as a string
/// (`"15m"`) to its number of seconds, so the file may use either form; the error names
/// the key and the forms it takes.
pub fn normalize_seconds(table: &mut toml::Table, keys: &[Key]) -> Result<(), String> {
    for key in keys.iter().filter(|k| k.kind == Kind::Seconds) {
        let Some(toml::Value::Table(section)) = table.get_mut(key.section) else {
            continue;
        };
        let Some(value) = section.get_mut(key.name) else {
            continue;
        };
        let shown = format!("{}.{}", key.section, key.name);
        let seconds = match &*value {
            toml::Value::Integer(n) => u64::try_from(*n)
                .map_err(|_| format!("{shown} = {n} is negative; write {SECONDS_FORMS}"))?,
            toml::Value::String(s) => parse_seconds(s)
                .map_err(|e| format!("{shown} = {s:?}: {e}; write {SECONDS_FORMS}"))?,
            other => {
                return Err(format!(
                    "{shown} = {other} is not a duration; write {SECONDS_FORMS}"
                ));
            }
        };
        let seconds = i64::try_from(seconds)
            .map_err(|_| format!("{shown} is too long; write {SECONDS_FORMS}"))?;
        *value = toml::Value::Integer(seconds);
    }
    Ok(())
}

/// A duration as people write it, in the largest unit that divides it exactly
/// (`2h`, `90m`, `45s`, `250ms`): what [`parse_duration`] reads back.
pub fn format_duration(d: std::time::Duration) -> String {
    let ms = d.as_millis();
    if ms % 1000 != 0 {
        return format!("{ms}ms");
    }
    let secs = d.as_secs();
    for (unit, size) in [("d", 86_400), ("h", 3600), ("m", 60)] {
        if secs >= size && secs % size == 0 {
            return format!("{}{unit}", secs / size);
        }
    }
    format!("{secs}s")
}

/// Durations written as `30s`, `5m`, `1h`, `250ms`, `1d`.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    use std::time::Duration;
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{s:?} has no unit; write e.g. 30s, 5m, 1h or 250ms"))?;
    let (number, unit) = s.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{s:?} does not start with a number"))?;
    let secs = |mult: u64| Duration::from_secs(n.saturating_mul(mult));
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(secs(1)),
        "m" => Ok(secs(60)),
        "h" => Ok(secs(3600)),
        "d" => Ok(secs(86400)),
        _ => Err(format!(
            "{s:?}: unknown unit {unit:?}; use ms, s, m, h or d"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_written_as_people_write_them_and_read_back() {
        for (secs, text) in [
            (7200, "2h"),
            (5400, "90m"),
            (45, "45s"),
            (86_400, "1d"),
            (0, "0s"),
        ] {
            let d = std::time::Duration::from_secs(secs);
            assert_eq!(format_duration(d), text);
            assert_eq!(parse_duration(text), Ok(d));
        }
        assert_eq!(
            format_duration(std::time::Duration::from_millis(250)),
            "250ms"
        );
    }

    #[test]
    fn overrides_each_kind_and_names_bad_variables() {
        let keys = [
            key("downloads", "limit", Kind::Int),
            key("server", "urls", Kind::List),
            key("update", "enabled", Kind::Bool),
        ];
        let env = |k: &str| match k {
            "X_DOWNLOADS_LIMIT" => Some("5".to_owned()),
            "X_SERVER_URLS" => Some("a, b".to_owned()),
            "X_UPDATE_ENABLED" => Some("false".to_owned()),
            _ => None,
        };
        let mut t = toml::Table::new();
        apply_env(&mut t, "X", &keys, &env, Strictness::WholePrefix).unwrap();
        assert_eq!(t["downloads"]["limit"].as_integer(), Some(5));
        assert_eq!(t["server"]["urls"].as_array().unwrap().len(), 2);
        let map = [key("workload", "env", Kind::Map)];
        let env = |k: &str| (k == "X_WORKLOAD_ENV").then(|| "A=1, B=x=y".to_owned());
        apply_env(&mut t, "X", &map, &env, Strictness::WholePrefix).unwrap();
        assert_eq!(t["workload"]["env"]["B"].as_str(), Some("x=y"));
        let bad = |_: &str| Some("A".to_owned());
        assert!(apply_env(&mut t, "X", &map, &bad, Strictness::WholePrefix).is_err());
        let bad = |_: &str| Some("many".to_owned());
        let err = apply_env(&mut t, "X", &keys[..1], &bad, Strictness::WholePrefix).unwrap_err();
        assert!(err.contains("X_DOWNLOADS_LIMIT"), "{err}");
    }

    #[test]
    fn a_misspelt_variable_is_an_error_that_names_it_and_the_closest_key() {
        let keys = [
            key("downloads", "limit", Kind::Int),
            key("update", "enabled", Kind::Bool),
        ];
        let env = |pairs: &[(&str, &str)]| {
            VarMap(
                pairs
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            )
        };
        let mut t = toml::Table::new();
        let typo = env(&[("X_DOWNLOADS_LIMT", "5")]);
        let err = apply_env(&mut t, "X", &keys, &typo, Strictness::WholePrefix).unwrap_err();
        assert!(
            err.contains("X_DOWNLOADS_LIMT") && err.contains("X_DOWNLOADS_LIMIT"),
            "{err}"
        );
        // A knob that shares the prefix but not a section is left alone where asked.
        let knob = env(&[("X_LOG", "debug"), ("X_UPDATER_STOP_PATIENCE", "5s")]);
        assert!(apply_env(&mut t, "X", &keys, &knob, Strictness::KnownSections).is_ok());
        assert!(apply_env(&mut t, "X", &keys, &knob, Strictness::WholePrefix).is_err());
        let section_typo = env(&[("X_UPDATE_ENABELD", "true")]);
        assert!(apply_env(&mut t, "X", &keys, &section_typo, Strictness::KnownSections).is_err());
        assert!(apply_env(&mut t, "X", &keys, &section_typo, Strictness::Lenient).is_ok());
    }

    #[test]
    fn seconds_take_bare_numbers_and_units_and_errors_name_the_key() {
        assert_eq!(parse_seconds("90").unwrap(), 90);
        assert_eq!(parse_seconds("15m").unwrap(), 900);
        assert_eq!(parse_seconds("30s").unwrap(), 30);
        assert!(parse_seconds("1500ms").is_err());
        let keys = [
            key("rollout", "wave-wait", Kind::Seconds),
            key("rollout", "agent-deadline", Kind::Seconds),
        ];
        let mut t: toml::Table =
            toml::from_str("[rollout]\nwave-wait = \"15m\"\nagent-deadline = 60\n").unwrap();
        normalize_seconds(&mut t, &keys).unwrap();
        assert_eq!(t["rollout"]["wave-wait"].as_integer(), Some(900));
        assert_eq!(t["rollout"]["agent-deadline"].as_integer(), Some(60));
        let mut t: toml::Table = toml::from_str("[rollout]\nwave-wait = \"soon\"\n").unwrap();
        let err = normalize_seconds(&mut t, &keys).unwrap_err();
        assert!(
            err.contains("rollout.wave-wait") && err.contains("15m"),
            "{err}"
        );
        let env = |k: &str| (k == "X_ROLLOUT_WAVE_WAIT").then(|| "2h".to_owned());
        let mut t = toml::Table::new();
        apply_env(&mut t, "X", &keys, &env, Strictness::WholePrefix).unwrap();
        normalize_seconds(&mut t, &keys).unwrap();
        assert_eq!(t["rollout"]["wave-wait"].as_integer(), Some(7200));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s").unwrap().as_secs(), 30);
        assert_eq!(parse_duration("1h").unwrap().as_secs(), 3600);
        assert_eq!(parse_duration("250ms").unwrap().as_millis(), 250);
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("5").is_err());
    }
}

/// A duration written as text (`"30s"`, `"5m"`: [`parse_duration`]) in a configuration
/// file, for serde's `with`.
pub mod duration_text {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        super::parse_duration(&s).map_err(serde::de::Error::custom)
    }
}
