//! `server.toml`; every key also `UPDATE_SERVER_<SECTION>_<KEY>`, `--listen` and `--home` flags.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use agent_protocol::AcceptPolicy;
use agent_protocol::settings::{self, Environment, Key, Kind, Strictness, key};
use serde::Deserialize;

use crate::error::ServerError;

pub const ENV_PREFIX: &str = "UPDATE_SERVER";

pub const KEYS: &[Key] = &[
    key("server", "listen", Kind::Str),
    key("server", "home", Kind::Str),
    key("server", "max-connections", Kind::Int),
    key("server", "shutdown-grace", Kind::Int),
    key("downloads", "dir", Kind::Str),
    key("downloads", "limit", Kind::Int),
    key("downloads", "retry-after", Kind::Int),
    key("bundle", "public-key", Kind::Str),
    key("agents", "accept", Kind::Str),
    key("admin", "token", Kind::Str),
    key("database", "url", Kind::Str),
];

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct Config {
    pub server: ServerSection,
    pub downloads: DownloadsSection,
    pub bundle: BundleSection,
    pub agents: AgentsSection,
    pub admin: AdminSection,
    pub database: DatabaseSection,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct ServerSection {
    pub listen: String,
    pub home: PathBuf,
    pub max_connections: usize,
    /// Seconds running downloads get to finish after SIGTERM.
    pub shutdown_grace: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct DownloadsSection {
    pub dir: PathBuf,
    pub limit: usize,
    pub retry_after: u64,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct BundleSection {
    pub public_key: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct AgentsSection {
    pub accept: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct AdminSection {
    pub token: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct DatabaseSection {
    pub url: String,
}

impl Default for ServerSection {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:7080".into(),
            home: PathBuf::from("server-home"),
            max_connections: 1024,
            shutdown_grace: 30,
        }
    }
}

impl Default for DownloadsSection {
    fn default() -> Self {
        Self {
            dir: PathBuf::from("downloads/agent"),
            limit: 45,
            retry_after: 30,
        }
    }
}

impl Default for AgentsSection {
    fn default() -> Self {
        Self {
            accept: "exact".into(),
        }
    }
}

impl Config {
    /// Reads `path` if given, then the environment; then checks the values.
    pub fn load(path: Option<&Path>, env: &dyn Environment) -> Result<Self, ServerError> {
        let (text, shown) = match path {
            Some(p) => (
                std::fs::read_to_string(p)
                    .map_err(|e| ServerError::Config(format!("{}: {e}", p.display())))?,
                p.display().to_string(),
            ),
            None => (String::new(), "the environment".to_owned()),
        };
        let bad = |m: String| ServerError::Config(format!("{shown}: {m}"));
        let mut table: toml::Table = toml::from_str(&text).map_err(|e| bad(e.to_string()))?;
        settings::apply_env(&mut table, ENV_PREFIX, KEYS, env, Strictness::WholePrefix)
            .map_err(bad)?;
        let config: Config = toml::Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| bad(e.to_string()))?;
        config.validate().map_err(bad)?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), String> {
        self.listen_addr()?;
        self.accept_policy().map_err(|e| e.to_string())?;
        if self.downloads.limit > self.server.max_connections {
            return Err(format!(
                "downloads.limit ({}) may not exceed server.max-connections ({})",
                self.downloads.limit, self.server.max_connections
            ));
        }
        if self.server.max_connections == 0 {
            return Err("server.max-connections must be at least 1".into());
        }
        Ok(())
    }

    pub fn listen_addr(&self) -> Result<SocketAddr, String> {
        self.server.listen.parse().map_err(|_| {
            format!(
                "server.listen {:?} is not an address such as 127.0.0.1:7080",
                self.server.listen
            )
        })
    }

    pub fn accept_policy(&self) -> Result<AcceptPolicy, agent_protocol::Error> {
        self.agents.accept.parse()
    }

    pub fn download_dir(&self) -> PathBuf {
        self.server.home.join(&self.downloads.dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_protocol::settings::VarMap;

    #[test]
    fn defaults_match_the_design() {
        let c = Config::load(None, &VarMap::default()).unwrap();
        assert_eq!(c.server.listen, "127.0.0.1:7080");
        assert_eq!(c.downloads.limit, 45);
        assert_eq!(c.downloads.retry_after, 30);
        assert_eq!(c.download_dir(), Path::new("server-home/downloads/agent"));
    }

    #[test]
    fn environment_and_validation() {
        let env = |k: &str| (k == "UPDATE_SERVER_DOWNLOADS_LIMIT").then(|| "5".to_owned());
        assert_eq!(Config::load(None, &env).unwrap().downloads.limit, 5);
        let too_many = |k: &str| (k == "UPDATE_SERVER_DOWNLOADS_LIMIT").then(|| "2000".to_owned());
        assert!(Config::load(None, &too_many).is_err());
        let bad_policy =
            |k: &str| (k == "UPDATE_SERVER_AGENTS_ACCEPT").then(|| "sometimes".to_owned());
        assert!(Config::load(None, &bad_policy).is_err());
    }

    /// Regression: `UPDATE_SERVER_DOWNLOADS_LIMT=5` was silently ignored while the same
    /// typo in server.toml was an error.
    #[test]
    fn a_misspelt_environment_variable_is_an_error_naming_it() {
        let env = VarMap(vec![("UPDATE_SERVER_DOWNLOADS_LIMT".into(), "5".into())]);
        let err = Config::load(None, &env).unwrap_err().to_string();
        assert!(
            err.contains("UPDATE_SERVER_DOWNLOADS_LIMT")
                && err.contains("UPDATE_SERVER_DOWNLOADS_LIMIT"),
            "{err}"
        );
    }

    #[test]
    fn unknown_key_names_the_key_and_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("server.toml");
        std::fs::write(&p, "[downloads]\nlimt = 3\n").unwrap();
        let err = Config::load(Some(&p), &VarMap::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("limt") && err.contains("server.toml"), "{err}");
    }
}
