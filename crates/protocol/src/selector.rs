//! Label selectors, as `kubectl -l` writes them: which agents a listing, a page's filter
//! (and later a deployment) means.
//!
//! ```text
//! env=prod            env==prod          the label is there and has this value
//! env!=prod                              not there, or another value
//! env in (prod,staging)                  there, with one of these values
//! env notin (dev)                        not there, or none of these values
//! region                                 the key is there
//! !canary                                the key is not there
//! env=prod,region in (eu)                every term (`,` is AND)
//! ```
//!
//! The empty selector matches every agent. Whitespace between tokens is ignored. A
//! parse error names the column (1 is the first character) and what was expected
//! there. Pure: [`Selector::parse`] and [`Selector::matches`] need no database.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// Longest selector read, in characters.
pub const MAX_LEN: usize = 4096;

/// A parsed selector: every requirement must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    requirements: Vec<Requirement>,
}

/// One term of a selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    pub key: String,
    pub op: Op,
}

/// What a term asks of its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Exists,
    NotExists,
    Equals(String),
    NotEquals(String),
    In(BTreeSet<String>),
    NotIn(BTreeSet<String>),
}

/// Why a selector does not parse, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectorError {
    /// 1 is the selector's first character.
    pub column: usize,
    pub message: String,
}

impl fmt::Display for SelectorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "column {}: {}", self.column, self.message)
    }
}

impl std::error::Error for SelectorError {}

impl Selector {
    /// Reads a selector (see the module's doc).
    pub fn parse(text: &str) -> Result<Self, SelectorError> {
        let chars: Vec<char> = text.chars().collect();
        if chars.len() > MAX_LEN {
            return Err(SelectorError {
                column: MAX_LEN + 1,
                message: format!("a selector is at most {MAX_LEN} characters"),
            });
        }
        let mut p = Parser { chars, pos: 0 };
        p.skip_spaces();
        let mut requirements = Vec::new();
        if p.peek().is_none() {
            return Ok(Self { requirements });
        }
        loop {
            requirements.push(p.requirement()?);
            p.skip_spaces();
            match p.peek() {
                None => break,
                Some(',') => p.pos += 1,
                Some(c) => {
                    return Err(p.error(format!(
                        "expected `,` or the end after `{}`, found `{c}`",
                        requirements
                            .last()
                            .map(ToString::to_string)
                            .unwrap_or_default()
                    )));
                }
            }
        }
        Ok(Self { requirements })
    }

    /// Whether an agent of these labels is selected.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// Whether this is the empty selector (every agent).
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }
}

impl std::str::FromStr for Selector {
    type Err = SelectorError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse(text)
    }
}

impl Requirement {
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let value = labels.get(&self.key).map(String::as_str);
        match &self.op {
            Op::Exists => value.is_some(),
            Op::NotExists => value.is_none(),
            Op::Equals(v) => value == Some(v.as_str()),
            Op::NotEquals(v) => value != Some(v.as_str()),
            Op::In(set) => value.is_some_and(|v| set.contains(v)),
            Op::NotIn(set) => value.is_none_or(|v| !set.contains(v)),
        }
    }
}

/// The canonical spelling: what [`Selector::parse`] reads back as the same selector.
impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set = |s: &BTreeSet<String>| s.iter().cloned().collect::<Vec<_>>().join(",");
        let key = &self.key;
        match &self.op {
            Op::Exists => write!(f, "{key}"),
            Op::NotExists => write!(f, "!{key}"),
            Op::Equals(v) => write!(f, "{key}={v}"),
            Op::NotEquals(v) => write!(f, "{key}!={v}"),
            Op::In(s) => write!(f, "{key} in ({})", set(s)),
            Op::NotIn(s) => write!(f, "{key} notin ({})", set(s)),
        }
    }
}

struct Parser {
    chars: Vec<char>,
    pos: usize,
}

fn is_key_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/')
}

/// A value as a selector reads it: a label's value, or a built-in's (a `version` has a
/// `+`).
fn is_value_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '+')
}

impl Parser {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn skip_spaces(&mut self) {
        while self.peek().is_some_and(char::is_whitespace) {
            self.pos += 1;
        }
    }

    fn error(&self, message: String) -> SelectorError {
        SelectorError {
            column: self.pos + 1,
            message,
        }
    }

    fn take_while(&mut self, keep: impl Fn(char) -> bool) -> String {
        let start = self.pos;
        while self.peek().is_some_and(&keep) {
            self.pos += 1;
        }
        self.chars[start..self.pos].iter().collect()
    }

    /// What the cursor is on, for a message: `found `x``, or `the selector ends`.
    fn found(&self) -> String {
        match self.peek() {
            Some(c) => format!("found `{c}`"),
            None => "the selector ends".to_owned(),
        }
    }

    fn key(&mut self, after: &str) -> Result<String, SelectorError> {
        let start = self.pos;
        let key = self.take_while(is_key_char);
        if key.is_empty() {
            return Err(self.error(format!("expected a label key {after}, {}", self.found())));
        }
        crate::labels::check_key(&key).map_err(|message| SelectorError {
            column: start + 1,
            message,
        })?;
        Ok(key)
    }

    fn requirement(&mut self) -> Result<Requirement, SelectorError> {
        self.skip_spaces();
        let first = self.pos == 0 || self.chars[..self.pos].iter().all(|c| c.is_whitespace());
        let after = if first { "first" } else { "after `,`" };
        if self.peek() == Some('!') {
            self.pos += 1;
            self.skip_spaces();
            let key = self.key("after `!`")?;
            self.skip_spaces();
            if let Some(c @ ('=' | '!' | '(')) = self.peek() {
                return Err(self.error(format!("`!{key}` takes no value, found `{c}`")));
            }
            return Ok(Requirement {
                key,
                op: Op::NotExists,
            });
        }
        let key = self.key(after)?;
        self.skip_spaces();
        let op = match self.peek() {
            None | Some(',') => Op::Exists,
            Some('=') => {
                self.pos += 1;
                let op = if self.peek() == Some('=') {
                    self.pos += 1;
                    "=="
                } else {
                    "="
                };
                Op::Equals(self.value(op)?)
            }
            Some('!') => {
                self.pos += 1;
                if self.peek() != Some('=') {
                    return Err(
                        self.error(format!("expected `=` after `{key} !`, {}", self.found()))
                    );
                }
                self.pos += 1;
                Op::NotEquals(self.value("!=")?)
            }
            Some(c) if c.is_ascii_alphabetic() => {
                let start = self.pos;
                let word = self.take_while(|c| c.is_ascii_alphanumeric());
                match word.as_str() {
                    "in" => Op::In(self.set("in")?),
                    "notin" => Op::NotIn(self.set("notin")?),
                    _ => {
                        return Err(SelectorError {
                            column: start + 1,
                            message: format!(
                                "expected an operator after `{key}` (=, ==, !=, in, notin), `,` or the end, found `{word}`"
                            ),
                        });
                    }
                }
            }
            Some(c) => {
                return Err(self.error(format!(
                    "expected an operator after `{key}` (=, ==, !=, in, notin), `,` or the end, found `{c}`"
                )));
            }
        };
        Ok(Requirement { key, op })
    }

    /// The value after `=`, `==` or `!=` (empty allowed, as kubectl reads `env=`).
    fn value(&mut self, op: &str) -> Result<String, SelectorError> {
        self.skip_spaces();
        let value = self.take_while(is_value_char);
        self.skip_spaces();
        match self.peek() {
            None | Some(',') => Ok(value),
            Some(c) if value.is_empty() => Err(self.error(format!(
                "expected a value after `{op}`, found `{c}` (a value is letters, digits, `-`, `_`, `.` and `+`)"
            ))),
            Some(c) => Err(self.error(format!(
                "expected `,` or the end after the value `{value}`, found `{c}`"
            ))),
        }
    }

    /// `(a, b, …)` after `in` or `notin`: one value at least.
    fn set(&mut self, op: &str) -> Result<BTreeSet<String>, SelectorError> {
        self.skip_spaces();
        if self.peek() != Some('(') {
            return Err(self.error(format!("expected `(` after `{op}`, {}", self.found())));
        }
        self.pos += 1;
        let mut set = BTreeSet::new();
        let mut after = format!("`{op} (`");
        loop {
            self.skip_spaces();
            let value = self.take_while(is_value_char);
            if value.is_empty() {
                return Err(self.error(format!("expected a value after {after}, {}", self.found())));
            }
            self.skip_spaces();
            match self.peek() {
                Some(',') => {
                    self.pos += 1;
                    after = format!("`{value},`");
                    set.insert(value);
                }
                Some(')') => {
                    self.pos += 1;
                    set.insert(value);
                    return Ok(set);
                }
                _ => {
                    return Err(self.error(format!(
                        "expected `,` or `)` after the value `{value}`, {}",
                        self.found()
                    )));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn selects(selector: &str, pairs: &[(&str, &str)]) -> bool {
        Selector::parse(selector)
            .unwrap_or_else(|e| panic!("{selector:?}: {e}"))
            .matches(&labels(pairs))
    }

    fn error(selector: &str) -> String {
        match Selector::parse(selector) {
            Ok(s) => panic!("{selector:?} parsed as {s:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn equality_in_its_three_spellings() {
        let prod = [("env", "prod")];
        assert!(selects("env=prod", &prod));
        assert!(selects("env==prod", &prod));
        assert!(!selects("env!=prod", &prod));
        assert!(!selects("env=staging", &prod));
        assert!(selects("env!=staging", &prod));
        // `!=` holds for an agent without the key, as kubectl has it; `=` does not.
        assert!(selects("env!=prod", &[]));
        assert!(!selects("env=prod", &[]));
    }

    #[test]
    fn sets_and_their_negation() {
        let staging = [("env", "staging")];
        assert!(selects("env in (prod,staging)", &staging));
        assert!(selects("env in(prod, staging )", &staging));
        assert!(!selects("env in (prod)", &staging));
        assert!(!selects("env in (prod)", &[]));
        assert!(selects("env notin (dev)", &staging));
        assert!(!selects("env notin (dev,staging)", &staging));
        assert!(selects("env notin (dev)", &[]));
    }

    #[test]
    fn existence_and_absence() {
        assert!(selects("region", &[("region", "eu")]));
        assert!(selects("region", &[("region", "")]));
        assert!(!selects("region", &[("env", "prod")]));
        assert!(selects("!canary", &[("env", "prod")]));
        assert!(!selects("!canary", &[("canary", "yes")]));
        assert!(selects("! canary", &[]));
    }

    #[test]
    fn commas_are_and_and_the_empty_selector_takes_every_agent() {
        let eu_prod = [("env", "prod"), ("region", "eu")];
        assert!(selects("env=prod,region in (eu)", &eu_prod));
        assert!(selects(" env = prod , region ", &eu_prod));
        assert!(!selects("env=prod,region in (us)", &eu_prod));
        assert!(!selects("env=prod,!region", &eu_prod));
        assert!(selects("", &[]));
        assert!(selects("   ", &eu_prod));
        assert!(Selector::parse("").unwrap().is_empty());
    }

    #[test]
    fn built_in_values_are_selectable_even_with_a_plus() {
        let agent = [
            ("version", "1.2.0+7"),
            ("platform", "x86_64-unknown-linux-musl"),
            ("group", ""),
        ];
        assert!(selects("version=1.2.0+7", &agent));
        assert!(selects("platform in (x86_64-unknown-linux-musl)", &agent));
        // An empty value, as kubectl reads `group=`.
        assert!(selects("group=", &agent));
        assert!(selects("group==,version", &agent));
        assert!(!selects("group!=", &agent));
    }

    #[test]
    fn prefixed_keys_parse() {
        assert!(selects(
            "team.example/owner=ops",
            &[("team.example/owner", "ops")]
        ));
    }

    #[test]
    fn display_reads_back_as_the_same_selector() {
        for text in [
            "env=prod",
            "env!=prod",
            "env in (prod,staging)",
            "env notin (dev)",
            "region",
            "!canary",
            "env=prod,region in (eu),!canary",
            "",
        ] {
            let s = Selector::parse(text).unwrap();
            assert_eq!(s.to_string(), text);
            assert_eq!(Selector::parse(&s.to_string()).unwrap(), s);
        }
        assert_eq!(
            Selector::parse("env==prod , x in ( b,a )")
                .unwrap()
                .to_string(),
            "env=prod,x in (a,b)"
        );
    }

    #[test]
    fn errors_point_at_the_column() {
        assert_eq!(
            error("env in ("),
            "column 9: expected a value after `in (`, the selector ends"
        );
        assert_eq!(
            error("env in ()"),
            "column 9: expected a value after `in (`, found `)`"
        );
        assert_eq!(
            error("env in (a,"),
            "column 11: expected a value after `a,`, the selector ends"
        );
        assert_eq!(
            error("env in (a b)"),
            "column 11: expected `,` or `)` after the value `a`, found `b`"
        );
        assert_eq!(
            error("env in (a"),
            "column 10: expected `,` or `)` after the value `a`, the selector ends"
        );
        assert_eq!(
            error("env notin prod"),
            "column 11: expected `(` after `notin`, found `p`"
        );
        assert_eq!(
            error("env=prod,"),
            "column 10: expected a label key after `,`, the selector ends"
        );
        assert_eq!(
            error(",env"),
            "column 1: expected a label key first, found `,`"
        );
        assert_eq!(
            error("env=prod,,x"),
            "column 10: expected a label key after `,`, found `,`"
        );
        assert_eq!(
            error("env ~ prod"),
            "column 5: expected an operator after `env` (=, ==, !=, in, notin), `,` or the end, found `~`"
        );
        assert_eq!(
            error("env is (a)"),
            "column 5: expected an operator after `env` (=, ==, !=, in, notin), `,` or the end, found `is`"
        );
        assert_eq!(
            error("env ! prod"),
            "column 6: expected `=` after `env !`, found ` `"
        );
        assert_eq!(
            error("env=pr od"),
            "column 8: expected `,` or the end after the value `pr`, found `o`"
        );
        assert_eq!(
            error("env=(prod)"),
            "column 5: expected a value after `=`, found `(` (a value is letters, digits, `-`, `_`, `.` and `+`)"
        );
        assert_eq!(
            error("!canary=yes"),
            "column 8: `!canary` takes no value, found `=`"
        );
        assert_eq!(
            error("env in (a) x"),
            "column 12: expected `,` or the end after `env in (a)`, found `x`"
        );
        assert_eq!(
            error("!"),
            "column 2: expected a label key after `!`, the selector ends"
        );
    }

    #[test]
    fn a_key_that_is_not_a_label_key_is_named_at_its_column() {
        let e = error("env=prod,Region=eu");
        assert!(e.starts_with("column 10: label key \"Region\""), "{e}");
        let e = error("a/b/c");
        assert!(
            e.starts_with("column 1: label key \"a/b/c\" has more than one"),
            "{e}"
        );
        let e = Selector::parse(&"a".repeat(MAX_LEN + 1)).unwrap_err();
        assert!(e.message.contains("at most"), "{e}");
    }

    #[test]
    fn non_ascii_is_refused_with_a_column_in_characters() {
        assert_eq!(
            error("é=1"),
            "column 1: expected a label key first, found `é`"
        );
        assert_eq!(
            error("env=é"),
            "column 5: expected a value after `=`, found `é` (a value is letters, digits, `-`, `_`, `.` and `+`)"
        );
    }
}
