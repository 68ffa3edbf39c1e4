//! The agent's identity `VERSION+BUILD` and the server's version directive.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// `VERSION+BUILD`, e.g. `2.2.0+1234`. Two identities are equal only if both parts are.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AgentVersion {
    version: semver::Version,
    build: String,
}

impl AgentVersion {
    /// Builds an identity from a plain semver version (no build metadata) and a build number.
    pub fn new(version: &str, build: &str) -> Result<Self> {
        let bad = |reason: &str| Error::Version {
            value: format!("{version}+{build}"),
            reason: reason.to_owned(),
        };
        let parsed = semver::Version::parse(version.trim()).map_err(|e| bad(&e.to_string()))?;
        if !parsed.build.is_empty() {
            return Err(bad("the version part must not carry its own +build"));
        }
        let build = build.trim();
        validate_build(build).map_err(|reason| bad(&reason))?;
        Ok(Self {
            version: parsed,
            build: build.to_owned(),
        })
    }

    pub fn version(&self) -> &semver::Version {
        &self.version
    }

    /// The version without its build, as written in file names: `2.2.0`.
    pub fn version_str(&self) -> String {
        self.version.to_string()
    }

    pub fn build(&self) -> &str {
        &self.build
    }
}

fn validate_build(build: &str) -> std::result::Result<(), String> {
    if build.is_empty() {
        return Err("the build number is empty".into());
    }
    if build.len() > 64 {
        return Err("the build number is longer than 64 characters".into());
    }
    if !build
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
    {
        return Err("the build number may hold only letters, digits, '-' and '.'".into());
    }
    Ok(())
}

impl FromStr for AgentVersion {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim();
        let Some((version, build)) = s.split_once('+') else {
            return Err(Error::Version {
                value: s.to_owned(),
                reason: "no +BUILD part".into(),
            });
        };
        Self::new(version, build)
    }
}

impl fmt::Display for AgentVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}+{}", self.version, self.build)
    }
}

impl Serialize for AgentVersion {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for AgentVersion {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Which agent versions a server talks to. `Exact` is the default directive.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum AcceptPolicy {
    #[default]
    Exact,
    /// Same major and minor, any patch or build: for patches that do not change the wire.
    SameMinor,
    /// A semver requirement on the version part; the build is not compared.
    Requirement(semver::VersionReq),
}

impl AcceptPolicy {
    pub fn accepts(&self, expected: &AgentVersion, agent: &AgentVersion) -> bool {
        match self {
            AcceptPolicy::Exact => expected == agent,
            AcceptPolicy::SameMinor => {
                expected.version.major == agent.version.major
                    && expected.version.minor == agent.version.minor
                    && agent.version.pre == expected.version.pre
            }
            AcceptPolicy::Requirement(req) => req.matches(&agent.version),
        }
    }
}

impl FromStr for AcceptPolicy {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim() {
            "exact" | "" => Ok(AcceptPolicy::Exact),
            "same-minor" => Ok(AcceptPolicy::SameMinor),
            other => semver::VersionReq::parse(other)
                .map(AcceptPolicy::Requirement)
                .map_err(|e| Error::Policy {
                    value: other.to_owned(),
                    reason: e.to_string(),
                }),
        }
    }
}

impl fmt::Display for AcceptPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AcceptPolicy::Exact => f.write_str("exact"),
            AcceptPolicy::SameMinor => f.write_str("same-minor"),
            AcceptPolicy::Requirement(r) => write!(f, "{r}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> AgentVersion {
        s.parse().unwrap()
    }

    #[test]
    fn parses_and_prints_version_plus_build() {
        let id = v("2.2.0+1234");
        assert_eq!(id.version_str(), "2.2.0");
        assert_eq!(id.build(), "1234");
        assert_eq!(id.to_string(), "2.2.0+1234");
    }

    #[test]
    fn rejects_malformed_identities() {
        for bad in [
            "",
            "2.2.0",
            "2.2+1",
            "x+1",
            "2.2.0+",
            "2.2.0+a b",
            "2.2.0+1+2",
            "+12",
        ] {
            assert!(bad.parse::<AgentVersion>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn exact_compares_both_parts() {
        let p = AcceptPolicy::Exact;
        assert!(p.accepts(&v("2.2.0+1234"), &v("2.2.0+1234")));
        assert!(!p.accepts(&v("2.2.0+1234"), &v("2.2.0+1235")));
        assert!(!p.accepts(&v("2.2.0+1234"), &v("2.2.1+1234")));
    }

    #[test]
    fn same_minor_ignores_patch_and_build() {
        let p: AcceptPolicy = "same-minor".parse().unwrap();
        assert!(p.accepts(&v("2.2.0+1234"), &v("2.2.7+1")));
        assert!(!p.accepts(&v("2.2.0+1234"), &v("2.3.0+1234")));
        assert!(!p.accepts(&v("2.2.0+1234"), &v("3.2.0+1234")));
    }

    #[test]
    fn requirement_matches_version_part() {
        let p: AcceptPolicy = ">=2.1, <2.3".parse().unwrap();
        assert!(p.accepts(&v("2.2.0+1"), &v("2.1.5+9")));
        assert!(!p.accepts(&v("2.2.0+1"), &v("2.3.0+1")));
        assert!("not a req".parse::<AcceptPolicy>().is_err());
    }
}
