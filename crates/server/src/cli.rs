//! `update-server rollout status|halt|resume|advance`, `update-server config
//! push|status|delete|halt|resume|advance`, `update-server token create|list|revoke` and
//! `update-server audit`: the admin API of a running server, from a shell. Prints tables
//! (or the API's JSON with `--json`). `update-server backup` reads the database itself.

pub mod release;

use std::fmt::Write as _;
use std::time::{Duration, UNIX_EPOCH};

use anyhow::Context;
use serde_json::Value;

/// `update-server backup --out FILE`: a consistent copy of the SQLite fleet database,
/// taken beside a running server (see `agent_fleet::backup`); returns what to print.
/// PostgreSQL is refused with the `pg_dump` command line to use.
pub async fn backup(config: &crate::Config, out: &std::path::Path) -> anyhow::Result<String> {
    let url = config.database.url.trim();
    if agent_fleet::backup::is_postgres(url) {
        anyhow::bail!("{}", agent_fleet::backup::pg_dump_advice(url, out));
    }
    // Opening a missing database would make an empty one and back that up.
    let file = match url.strip_prefix("sqlite:") {
        None if url.is_empty() => Some(config.server.home.join("fleet.db")),
        Some(rest) if !rest.starts_with(":memory:") => {
            let path = rest.trim_start_matches("//");
            Some(std::path::PathBuf::from(
                path.split('?').next().unwrap_or(path),
            ))
        }
        _ => None,
    };
    if let Some(file) = &file
        && !file.is_file()
    {
        anyhow::bail!(
            "no fleet database at {}: check server.home and database.url (--config FILE)",
            file.display()
        );
    }
    let db = agent_fleet::db::Db::open(url, &config.server.home, 1).await?;
    let written = agent_fleet::backup::sqlite_backup(&db, out).await?;
    db.pool().close().await;
    Ok(format!(
        "wrote a backup of the fleet database ({} bytes) to {}; to restore it: stop the server, copy it over {}, remove fleet.db-wal and fleet.db-shm beside it, start the server",
        written.bytes,
        written.path.display(),
        file.map_or_else(|| "the database file".into(), |f| f.display().to_string())
    ))
}

/// What to ask of the rollout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RolloutAction {
    Status,
    Halt { reason: Option<String> },
    Resume,
    Advance,
}

/// Where the admin API is and how to talk to it.
#[derive(Debug, Clone)]
pub struct AdminClient {
    pub server: String,
    pub token: String,
    /// Trust only this CA (PEM) for an HTTPS server.
    pub ca_file: Option<std::path::PathBuf>,
}

impl AdminClient {
    fn http(&self) -> anyhow::Result<reqwest::Client> {
        self.http_for(Duration::from_secs(30))
    }

    /// A client whose requests may take up to `timeout` (a release's upload or export).
    fn http_for(&self, timeout: Duration) -> anyhow::Result<reqwest::Client> {
        let mut builder = reqwest::Client::builder().timeout(timeout);
        if let Some(ca) = &self.ca_file {
            // A private CA: trusted alone, as the agents trust it.
            let pem = std::fs::read(ca).with_context(|| format!("--ca-file {}", ca.display()))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .with_context(|| format!("--ca-file {}: not PEM certificates", ca.display()))?;
            builder = builder.tls_built_in_root_certs(false);
            for cert in certs {
                builder = builder.add_root_certificate(cert);
            }
        }
        builder.build().context("cannot make an HTTP client")
    }

    /// `DELETE /admin/agents/{id}/token`.
    pub async fn forget_token(&self, id: &str) -> anyhow::Result<Value> {
        let base = self.base()?;
        let request = self
            .http()?
            .delete(format!("{base}/admin/agents/{id}/token"));
        self.send(base, request).await
    }

    /// `POST /admin/agents/{id}/override-locks`.
    pub async fn override_locks(&self, id: &str) -> anyhow::Result<Value> {
        let base = self.base()?;
        let request = self
            .http()?
            .post(format!("{base}/admin/agents/{id}/override-locks"));
        self.send(base, request).await
    }

    /// `DELETE /admin/agents/{id}`.
    pub async fn remove_agent(&self, id: &str) -> anyhow::Result<Value> {
        let base = self.base()?;
        let request = self.http()?.delete(format!("{base}/admin/agents/{id}"));
        self.send(base, request).await
    }

    fn base(&self) -> anyhow::Result<&str> {
        if self.token.is_empty() {
            anyhow::bail!(
                "no admin token: pass --token, or set UPDATE_SERVER_ADMIN_TOKEN (or admin.token in --config)"
            );
        }
        Ok(self.server.trim_end_matches('/'))
    }

    /// Sends the request and returns the answer's JSON, or an error that says what the
    /// server said.
    pub async fn rollout(&self, action: &RolloutAction) -> anyhow::Result<Value> {
        let base = self.base()?;
        let http = self.http()?;
        let request = match action {
            RolloutAction::Status => http.get(format!("{base}/admin/rollout")),
            RolloutAction::Halt { reason } => {
                let body = serde_json::json!({ "reason": reason });
                http.post(format!("{base}/admin/rollout/halt")).json(&body)
            }
            RolloutAction::Resume => http.post(format!("{base}/admin/rollout/resume")),
            RolloutAction::Advance => http.post(format!("{base}/admin/rollout/advance")),
        };
        self.send(base, request).await
    }

    async fn send(&self, base: &str, request: reqwest::RequestBuilder) -> anyhow::Result<Value> {
        let response = request
            .bearer_auth(&self.token)
            .send()
            .await
            .with_context(|| {
                format!("cannot reach the update-server at {base}; is it running? (--server URL)")
            })?;
        let status = response.status();
        let text = response
            .text()
            .await
            .with_context(|| format!("{base}: the answer broke off"))?;
        let json: Value = serde_json::from_str(&text).unwrap_or(Value::String(text.clone()));
        if !status.is_success() {
            let message = json
                .get("error")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .unwrap_or(text);
            anyhow::bail!("{base} answered {status}: {message}");
        }
        Ok(json)
    }
}

/// `HH:MM:SS` (UTC) of unix seconds, or `-`.
fn clock(value: &Value) -> String {
    value
        .as_f64()
        .map(|s| {
            let date = httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs_f64(s.max(0.0)));
            // "Sun, 22 Nov 2026 06:12:03 GMT"
            date.get(17..25).unwrap_or(&date).to_owned()
        })
        .unwrap_or_else(|| "-".to_owned())
}

fn date(value: &Value) -> String {
    value
        .as_f64()
        .map(|s| httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs_f64(s.max(0.0))))
        .unwrap_or_else(|| "-".to_owned())
}

fn text<'a>(value: &'a Value, key: &str) -> &'a str {
    value.get(key).and_then(Value::as_str).unwrap_or("")
}

fn count(value: &Value, key: &str) -> u64 {
    value.get(key).and_then(Value::as_u64).unwrap_or(0)
}

/// The rollout as a person reads it: a headline, the reason if any, then one line per wave.
pub fn render_status(status: &Value) -> String {
    let mut out = String::new();
    let waves = status
        .get("waves")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let previous = match status.get("previous").and_then(Value::as_str) {
        Some(p) => format!("after {p}, the last completed rollout"),
        None => "the first rollout".to_owned(),
    };
    let _ = writeln!(
        out,
        "rollout of {} ({previous}): {}, wave {} of {}",
        text(status, "version"),
        text(status, "state"),
        count(status, "wave"),
        waves.len()
    );
    let sha = text(status, "sha256");
    let _ = writeln!(
        out,
        "sha256 {}, started {}",
        sha.get(..16).unwrap_or(sha),
        date(&status["started_at"])
    );
    if let Some(reason) = status.get("reason").and_then(Value::as_str) {
        let _ = writeln!(out, "reason: {reason}");
    }
    if let Some(mismatch) = status.get("mismatch").and_then(Value::as_str) {
        let _ = writeln!(out, "warning: {mismatch}");
    }
    let _ = writeln!(
        out,
        "{:>4}  {:<14} {:>7} {:>10} {:>7} {:>10} {:>8}  {:<9} {:<9}",
        "wave",
        "size",
        "agents",
        "installed",
        "failed",
        "timed out",
        "pending",
        "opened",
        "completed"
    );
    for (i, w) in waves.iter().enumerate() {
        let _ = writeln!(
            out,
            "{:>4}  {:<14} {:>7} {:>10} {:>7} {:>10} {:>8}  {:<9} {:<9}",
            i + 1,
            text(w, "size"),
            count(w, "agents"),
            count(w, "installed"),
            count(w, "failed"),
            count(w, "timed_out"),
            count(w, "pending"),
            clock(&w["opened_at"]),
            clock(&w["completed_at"]),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_renders_a_headline_and_one_line_per_wave() {
        let status = serde_json::json!({
            "version": "2.0.0+2", "previous": "1.0.0+1", "sha256": "ab".repeat(32),
            "state": "halted", "reason": "1 of 2 agents told failed", "wave": 1,
            "started_at": 1_763_791_923.5,
            "waves": [
                {"size": "2", "agents": 2, "installed": 1, "failed": 1, "timed_out": 0, "pending": 0,
                 "opened_at": 1_763_791_924.0, "completed_at": null},
                {"size": "100%", "agents": 8, "installed": 0, "failed": 0, "timed_out": 0, "pending": 8,
                 "opened_at": null, "completed_at": null}
            ]
        });
        let text = render_status(&status);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].contains("2.0.0+2")
                && lines[0].contains("halted")
                && lines[0].contains("wave 1 of 2"),
            "{text}"
        );
        assert!(text.contains("reason: 1 of 2 agents told failed"), "{text}");
        let wave1 = lines
            .iter()
            .find(|l| l.trim_start().starts_with("1 "))
            .unwrap();
        assert!(
            wave1.contains(':') && wave1.trim_end().ends_with('-'),
            "{wave1}"
        );
        assert_eq!(lines.len(), 6, "{text}");
    }
}

/// What to ask of the configuration sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigAction {
    /// Store the regular files of a directory as a group's set.
    Push {
        group: String,
        dir: std::path::PathBuf,
        /// A set with no files is meant: it empties the agents' conf/workload/.
        allow_empty: bool,
        /// A set that keeps none of the group's current file names is meant.
        replace_all: bool,
    },
    Status,
    Delete {
        group: String,
    },
    Halt {
        group: String,
        reason: Option<String>,
    },
    Resume {
        group: String,
    },
    Advance {
        group: String,
    },
}

/// The regular files of `dir` (not its subdirectories, not symlinks) as a set: name to
/// UTF-8 text. The server checks names and sizes; this refuses what it cannot send.
pub fn read_set(
    dir: &std::path::Path,
) -> anyhow::Result<std::collections::BTreeMap<String, String>> {
    let mut files = std::collections::BTreeMap::new();
    let entries = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read the directory {}", dir.display()))?;
    for entry in entries {
        let entry =
            entry.with_context(|| format!("cannot read the directory {}", dir.display()))?;
        let path = entry.path();
        let meta = std::fs::symlink_metadata(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        if !meta.is_file() {
            eprintln!(
                "update-server: skipping {} (not a regular file)",
                path.display()
            );
            continue;
        }
        let name = entry.file_name().into_string().map_err(|n| {
            anyhow::anyhow!(
                "{}: the file name {n:?} is not UTF-8; rename it",
                dir.display()
            )
        })?;
        let bytes =
            std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
        let text = String::from_utf8(bytes).map_err(|_| {
            anyhow::anyhow!(
                "{} is not UTF-8 text; a configuration set carries text files only",
                path.display()
            )
        })?;
        files.insert(name, text);
    }
    Ok(files)
}

impl AdminClient {
    /// `/admin/config...`: the answer's JSON, or an error that says what the server said.
    pub async fn config(&self, action: &ConfigAction) -> anyhow::Result<Value> {
        let base = self.base()?;
        let http = self.http()?;
        let request = match action {
            ConfigAction::Push {
                group,
                dir,
                allow_empty,
                replace_all,
            } => {
                let files = read_set(dir)?;
                http.put(format!("{base}/admin/config/{group}"))
                    .json(&serde_json::json!({
                        "files": files,
                        "allow_empty": allow_empty,
                        "replace_all": replace_all,
                    }))
            }
            ConfigAction::Status => http.get(format!("{base}/admin/config")),
            ConfigAction::Delete { group } => http.delete(format!("{base}/admin/config/{group}")),
            ConfigAction::Halt { group, reason } => http
                .post(format!("{base}/admin/config/{group}/halt"))
                .json(&serde_json::json!({ "reason": reason })),
            ConfigAction::Resume { group } => {
                http.post(format!("{base}/admin/config/{group}/resume"))
            }
            ConfigAction::Advance { group } => {
                http.post(format!("{base}/admin/config/{group}/advance"))
            }
        };
        self.send(base, request).await
    }
}

/// `GET /admin/config` as a person reads it: one block per set.
pub fn render_config(status: &Value) -> String {
    let mut out = String::new();
    let sets = status
        .get("sets")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if sets.is_empty() {
        out.push_str("no configuration sets; push one with `update-server config push --group default DIR`\n");
        return out;
    }
    for set in &sets {
        let rollout = set.get("rollout").cloned().unwrap_or(Value::Null);
        let files = set
            .get("files")
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        let _ = writeln!(
            out,
            "group {}: set {} ({files} files, created {}), rollout {} (wave {})",
            text(set, "group"),
            text(set, "hash").get(..12).unwrap_or(text(set, "hash")),
            date(&set["created_at"]),
            match text(&rollout, "state") {
                "" => "-",
                s => s,
            },
            count(&rollout, "wave"),
        );
        let _ = writeln!(
            out,
            "  applied {}, applying {}, failed {}, timed out {}",
            count(set, "applied"),
            count(set, "applying"),
            count(set, "failed"),
            count(set, "timed_out")
        );
        if let Some(reason) = rollout.get("reason").and_then(Value::as_str) {
            let _ = writeln!(out, "  reason: {reason}");
        }
        if let Some(waves) = rollout.get("waves").and_then(Value::as_array) {
            for (i, w) in waves.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "  wave {} {:>6}  agents {:>5}  applied {:>5}  failed {:>4}  timed out {:>4}  pending {:>5}  opened {}  completed {}",
                    i + 1,
                    text(w, "size"),
                    count(w, "agents"),
                    count(w, "applied"),
                    count(w, "failed"),
                    count(w, "timed_out"),
                    count(w, "pending"),
                    clock(&w["opened_at"]),
                    clock(&w["completed_at"]),
                );
            }
        }
    }
    out
}

/// What to ask of the operators' tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenAction {
    Create { name: String, role: String },
    List,
    Revoke { name: String },
}

impl AdminClient {
    /// `/admin/tokens...`: the answer's JSON, or an error that says what the server said.
    pub async fn tokens(&self, action: &TokenAction) -> anyhow::Result<Value> {
        let base = self.base()?;
        let http = self.http()?;
        let request = match action {
            TokenAction::Create { name, role } => http
                .post(format!("{base}/admin/tokens"))
                .json(&serde_json::json!({ "name": name, "role": role })),
            TokenAction::List => http.get(format!("{base}/admin/tokens")),
            TokenAction::Revoke { name } => http.delete(format!("{base}/admin/tokens/{name}")),
        };
        self.send(base, request).await
    }

    /// `GET /admin/audit`, newest first.
    pub async fn audit(
        &self,
        who: Option<&str>,
        action: Option<&str>,
        page: u32,
    ) -> anyhow::Result<Value> {
        let base = self.base()?;
        let mut query = vec![("page", page.to_string())];
        if let Some(who) = who {
            query.push(("who", who.to_owned()));
        }
        if let Some(action) = action {
            query.push(("action", action.to_owned()));
        }
        let request = self
            .http()?
            .get(format!("{base}/admin/audit"))
            .query(&query);
        self.send(base, request).await
    }
}

fn millis_utc(v: &Value) -> String {
    v.as_i64().map_or_else(
        || "never".to_owned(),
        |ms| httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64)),
    )
}

/// `GET /admin/tokens` as a person reads it: one line per token, never a token.
pub fn render_tokens(list: &Value) -> String {
    let mut out = String::new();
    let rows = list.as_array().map(Vec::as_slice).unwrap_or_default();
    if rows.is_empty() {
        return "no named tokens (admin.token is the only one)\n".to_owned();
    }
    let _ = writeln!(
        out,
        "{:<24} {:<9} {:<30} last used",
        "name", "role", "created"
    );
    for t in rows {
        let _ = writeln!(
            out,
            "{:<24} {:<9} {:<30} {}",
            t["name"].as_str().unwrap_or("?"),
            t["role"].as_str().unwrap_or("?"),
            millis_utc(&t["created_at"]),
            millis_utc(&t["last_used_at"]),
        );
    }
    out
}

/// `GET /admin/audit` as a person reads it: one line per entry, newest first.
pub fn render_audit(answer: &Value) -> String {
    let mut out = String::new();
    let entries = answer["entries"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    for e in entries {
        let _ = writeln!(
            out,
            "{}  {:<20} {:<16} {:<22} {:<8} {}",
            millis_utc(&e["at"]),
            e["who"].as_str().unwrap_or("?"),
            e["address"].as_str().unwrap_or(""),
            e["action"].as_str().unwrap_or("?"),
            e["outcome"].as_str().unwrap_or("?"),
            crate::web::words::audit_details(&e["details"]),
        );
    }
    let total = answer["total"].as_i64().unwrap_or(0);
    let _ = writeln!(
        out,
        "{} of {} (page {})",
        entries.len(),
        crate::web::words::count(total, "entry", "entries"),
        answer["page"]
    );
    out
}

/// Which agents `agents list` shows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentQuery {
    pub version: Option<String>,
    pub status: Option<String>,
    pub group: Option<String>,
    /// A label selector (`env=prod,region in (eu)`).
    pub selector: Option<String>,
}

impl AdminClient {
    /// `POST /admin/agents/{id}/labels`: `args` as `kubectl label` reads them (`k=v`
    /// sets, `k-` removes), checked before anything is sent.
    pub async fn label_agent(&self, id: &str, args: &[String]) -> anyhow::Result<Value> {
        let edit = agent_fleet::labels::Edit::parse(args).map_err(anyhow::Error::msg)?;
        let base = self.base()?;
        let request = self
            .http()?
            .post(format!("{base}/admin/agents/{id}/labels"))
            .json(&edit);
        self.send(base, request).await
    }

    /// `GET /admin/agents?version=&status=&group=&selector=`.
    pub async fn agents(&self, query: &AgentQuery) -> anyhow::Result<Value> {
        let base = self.base()?;
        let mut pairs = Vec::new();
        for (name, value) in [
            ("version", &query.version),
            ("status", &query.status),
            ("group", &query.group),
            ("selector", &query.selector),
        ] {
            if let Some(v) = value {
                pairs.push((name, v.clone()));
            }
        }
        let request = self
            .http()?
            .get(format!("{base}/admin/agents"))
            .query(&pairs);
        self.send(base, request).await
    }
}

/// `GET /admin/agents` as a person reads it: one line per agent, and a count.
pub fn render_agents(list: &Value) -> String {
    let mut out = String::new();
    let rows = list.as_array().map(Vec::as_slice).unwrap_or_default();
    if rows.is_empty() {
        return "no agents match\n".to_owned();
    }
    let _ = writeln!(
        out,
        "{:<36}  {:<20} {:<16} {:<10} {:<15} {:<29} {:<24} error",
        "id", "name", "version", "group", "status", "last contact", "labels"
    );
    for a in rows {
        let group = match text(a, "group") {
            "" => "default",
            g => g,
        };
        // As the page says it: no update asked of this agent yet.
        let status = match text(a, "update_status") {
            "" => "NONE",
            s => s,
        };
        let error = agent_protocol::shown::cut_at_word(text(a, "update_error"), 60);
        let _ = writeln!(
            out,
            "{:<36}  {:<20} {:<16} {:<10} {:<15} {:<29} {:<24} {}",
            text(a, "id"),
            text(a, "name"),
            text(a, "version"),
            group,
            status,
            text(a, "last_contact"),
            own_labels(a),
            error,
        );
    }
    let _ = writeln!(
        out,
        "{} agent{}",
        rows.len(),
        if rows.len() == 1 { "" } else { "s" }
    );
    out
}

/// A row's labels but the built-in ones (which the other columns show), `k=v,k=v`;
/// `-` for none.
fn own_labels(row: &Value) -> String {
    let own: Vec<String> = row["labels"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| !agent_fleet::labels::is_built_in(k))
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
        .collect();
    if own.is_empty() {
        "-".to_owned()
    } else {
        own.join(",")
    }
}

/// `agent label ID k=v k2-` as a person reads it.
pub fn render_labels(id: &str, answer: &Value) -> String {
    let shown = |v: &Value| {
        let pairs: Vec<String> = v
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
            .collect();
        if pairs.is_empty() {
            "none".to_owned()
        } else {
            pairs.join(", ")
        }
    };
    format!(
        "agent {id}: server labels {}\nlabels: {}",
        shown(&answer["server_labels"]),
        shown(&answer["labels"])
    )
}

/// `--status` of `agents list`, checked before anything is asked (a typo answered "no
/// agents match").
pub fn known_status(text: &str) -> anyhow::Result<String> {
    agent_protocol::wire::UpdateStatus::filter_name(text).map_err(anyhow::Error::msg)
}
