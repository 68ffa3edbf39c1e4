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

pub fn env_var_name(prefix: &str, key: &Key) -> String {
    format!("{prefix}_{}_{}", key.section, key.name)
        .to_ascii_uppercase()
        .replace('-', "_")
}

/// Applies every override found by `env` to `table`; the error names the variable.
pub fn apply_env(
    table: &mut toml::Table,
    prefix: &str,
    keys: &[Key],
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(), String> {
    for key in keys {
        let var = env_var_name(prefix, key);
        let Some(raw) = env(&var) else { continue };
        let value = match key.kind {
            Kind::Str => toml::Value::String(raw),
            Kind::Int => toml::Value::Integer(
                raw.trim()
                    .parse()
                    .map_err(|_| format!("{var}={raw:?} is not a whole number"))?,
            ),
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
        apply_env(&mut t, "X", &keys, &env).unwrap();
        assert_eq!(t["downloads"]["limit"].as_integer(), Some(5));
        assert_eq!(t["server"]["urls"].as_array().unwrap().len(), 2);
        let bad = |_: &str| Some("many".to_owned());
        let err = apply_env(&mut t, "X", &keys[..1], &bad).unwrap_err();
        assert!(err.contains("X_DOWNLOADS_LIMIT"), "{err}");
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
