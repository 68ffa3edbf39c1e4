//! `.properties` files: one `name=value` a line, `#` or `!` comments, blank lines.
//!
//! Order and unknown keys are kept, so a file read and written back loses nothing a
//! newer version may have put there. A line without `=` is an error naming its number
//! rather than a silently dropped setting.

use std::io::{self, BufRead, Write};

use crate::error::{Error, Result};

/// Bytes past which a properties file is refused: they are small by design, and a server
/// or archive that sends more is not to be believed.
pub const MAX_PROPERTIES_BYTES: usize = 64 * 1024;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Properties {
    entries: Vec<(String, String)>,
}

impl Properties {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn parse(text: &str) -> Result<Self> {
        if text.len() > MAX_PROPERTIES_BYTES {
            return Err(Error::Properties {
                line: 0,
                reason: format!("larger than {MAX_PROPERTIES_BYTES} bytes"),
            });
        }
        let mut props = Properties::new();
        for (index, raw) in text.lines().enumerate() {
            let line_no = index + 1;
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
                continue;
            }
            let Some((name, value)) = line.split_once('=') else {
                return Err(Error::Properties {
                    line: line_no,
                    reason: format!("expected name=value, found {:?}", truncate(line)),
                });
            };
            let name = name.trim();
            if name.is_empty() {
                return Err(Error::Properties {
                    line: line_no,
                    reason: "empty property name".into(),
                });
            }
            if name.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(Error::Properties {
                    line: line_no,
                    reason: format!("invalid property name {:?}", truncate(name)),
                });
            }
            if value.chars().any(|c| c.is_control() && c != '\t') {
                return Err(Error::Properties {
                    line: line_no,
                    reason: format!("control character in the value of {name}"),
                });
            }
            props.set(name, value.trim());
        }
        Ok(props)
    }

    /// Reads at most [`MAX_PROPERTIES_BYTES`] from `reader`.
    pub fn read_from(reader: impl io::Read) -> Result<Self> {
        let mut text = String::new();
        let mut limited = io::BufReader::new(reader.take(MAX_PROPERTIES_BYTES as u64 + 1));
        loop {
            let n = limited.read_line(&mut text).map_err(|e| {
                if e.kind() == io::ErrorKind::InvalidData {
                    Error::Properties {
                        line: text.lines().count() + 1,
                        reason: "not valid UTF-8".into(),
                    }
                } else {
                    Error::Io(e)
                }
            })?;
            if n == 0 {
                break;
            }
        }
        Self::parse(&text)
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.entries
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn require(&self, name: &str) -> Result<&str> {
        match self.get(name) {
            Some(v) if !v.is_empty() => Ok(v),
            _ => Err(Error::MissingProperty(name.to_owned())),
        }
    }

    /// Sets `name`, keeping its position if it already exists.
    pub fn set(&mut self, name: &str, value: &str) {
        if let Some(entry) = self.entries.iter_mut().find(|(k, _)| k == name) {
            entry.1 = value.to_owned();
        } else {
            self.entries.push((name.to_owned(), value.to_owned()));
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    pub fn write_to(&self, mut out: impl Write) -> io::Result<()> {
        for (k, v) in &self.entries {
            writeln!(out, "{k}={v}")?;
        }
        Ok(())
    }

    pub fn to_text(&self) -> String {
        let mut s = String::new();
        for (k, v) in &self.entries {
            s.push_str(k);
            s.push('=');
            s.push_str(v);
            s.push('\n');
        }
        s
    }
}

fn truncate(s: &str) -> String {
    s.chars().take(60).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_keeps_unknown_keys_in_order() {
        let text = "# comment\nb=2\n\na = 1 \nfuture.key=x=y\n";
        let p = Properties::parse(text).unwrap();
        assert_eq!(p.get("a"), Some("1"));
        assert_eq!(p.get("future.key"), Some("x=y"));
        assert_eq!(p.to_text(), "b=2\na=1\nfuture.key=x=y\n");
    }

    #[test]
    fn malformed_line_names_its_number() {
        let err = Properties::parse("a=1\n\nthis is not a property\n").unwrap_err();
        assert!(
            err.to_string().starts_with("line 3:"),
            "unexpected error: {err}"
        );
        assert!(Properties::parse("=1").is_err());
        assert!(Properties::parse("a b=1").is_err());
        assert!(Properties::parse("a=\u{0}").is_err());
    }

    #[test]
    fn refuses_oversized_input() {
        let big = "a=1\n".repeat(MAX_PROPERTIES_BYTES);
        assert!(Properties::parse(&big).is_err());
        assert!(Properties::read_from(big.as_bytes()).is_err());
    }

    #[test]
    fn non_utf8_is_an_error_not_a_panic() {
        assert!(Properties::read_from(&b"a=\xff\xfe\n"[..]).is_err());
    }

    #[test]
    fn require_rejects_missing_and_empty() {
        let p = Properties::parse("a=\n").unwrap();
        assert!(p.require("a").is_err());
        assert!(p.require("b").is_err());
    }
}
