//! `update-server config push|status|delete|halt|resume|advance`: the workload's
//! configuration sets and their rollouts.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context;
use clap::Subcommand;
use serde_json::Value;

use super::AdminClient;
use super::table::{clock, count, date, text};

#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub enum ConfigCommand {
    /// Store the regular files of DIR as a group's set; it reaches the group's agents in
    /// waves, as [rollout] says.
    Push {
        /// The agents' group (agent.group); `default`: agents whose group has no set.
        #[arg(long, default_value = "default")]
        group: String,
        /// The agents a label selector chooses instead of a group (`env=prod,region in
        /// (eu)`): their set comes before their group's.
        #[arg(long, value_name = "SELECTOR", conflicts_with = "group")]
        selector: Option<String>,
        /// The directory whose regular files make the set.
        dir: PathBuf,
        /// Store a set with no files although it empties conf/workload/ on every agent
        /// of the group (refused without it).
        #[arg(long)]
        allow_empty: bool,
        /// Store a set that keeps none of the group's current file names (refused
        /// without it: usually the wrong directory).
        #[arg(long)]
        replace_all: bool,
    },
    /// Every set, how many agents applied it, are applying it or failed it, and its
    /// config rollout.
    Status,
    /// Return a group to `default`'s set.
    Delete {
        #[arg(long, required_unless_present = "selector")]
        group: Option<String>,
        /// The agents a label selector chooses instead of a group (`env=prod,region in
        /// (eu)`): their set comes before their group's.
        #[arg(long, value_name = "SELECTOR", conflicts_with = "group")]
        selector: Option<String>,
    },
    /// Send the group's set to no more agents.
    Halt {
        #[arg(long, default_value = "default")]
        group: String,
        /// The agents a label selector chooses instead of a group (`env=prod,region in
        /// (eu)`): their set comes before their group's.
        #[arg(long, value_name = "SELECTOR", conflicts_with = "group")]
        selector: Option<String>,
        /// Why, recorded with the halt.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Let a halted config rollout go on (failures seen so far no longer count).
    Resume {
        #[arg(long, default_value = "default")]
        group: String,
        /// The agents a label selector chooses instead of a group (`env=prod,region in
        /// (eu)`): their set comes before their group's.
        #[arg(long, value_name = "SELECTOR", conflicts_with = "group")]
        selector: Option<String>,
    },
    /// Open the config rollout's next wave now.
    Advance {
        #[arg(long, default_value = "default")]
        group: String,
        /// The agents a label selector chooses instead of a group (`env=prod,region in
        /// (eu)`): their set comes before their group's.
        #[arg(long, value_name = "SELECTOR", conflicts_with = "group")]
        selector: Option<String>,
    },
}

/// The key of the set a command names: the group's name, or `selector:S`.
fn key(group: Option<&str>, selector: Option<&str>) -> String {
    match selector {
        Some(s) => format!("selector:{s}"),
        None => group.unwrap_or("default").to_owned(),
    }
}

/// A set's key as one path segment: a selector's spaces, commas and parentheses escaped.
fn path_segment(key: &str) -> String {
    key.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b':' | b'=') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Who a set is for, in words: `group canary`, `selector env=prod`.
fn whose(key: &str) -> String {
    match key.strip_prefix("selector:") {
        Some(s) => format!("the agents of selector {s}"),
        None => format!("group {key}"),
    }
}

impl ConfigCommand {
    /// The key of the set this command is about.
    fn set_key(&self) -> String {
        match self {
            ConfigCommand::Push {
                group, selector, ..
            }
            | ConfigCommand::Halt {
                group, selector, ..
            }
            | ConfigCommand::Resume { group, selector }
            | ConfigCommand::Advance { group, selector } => key(Some(group), selector.as_deref()),
            ConfigCommand::Delete { group, selector } => key(group.as_deref(), selector.as_deref()),
            ConfigCommand::Status => String::new(),
        }
    }

    pub(super) async fn run(&self, client: &AdminClient, json: bool) -> anyhow::Result<()> {
        let answer = client.config(self).await?;
        if json {
            return super::print_json(&answer);
        }
        if let Some(parked) = super::approval::parked_words(&answer) {
            println!("{parked}");
            return Ok(());
        }
        match self {
            ConfigCommand::Push { .. } => println!(
                "stored set {} for {}",
                answer["hash"].as_str().unwrap_or("?"),
                whose(&self.set_key())
            ),
            ConfigCommand::Delete { .. } => println!(
                "deleted the set of {}; its agents run their group's or default's set",
                whose(&self.set_key())
            ),
            _ => print!("{}", render_config(&answer)),
        }
        Ok(())
    }
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
    pub async fn config(&self, action: &ConfigCommand) -> anyhow::Result<Value> {
        let base = self.base()?;
        let http = self.http()?;
        let key = action.set_key();
        // A selector that does not parse is said before any file is read.
        if let Some(text) = key.strip_prefix("selector:") {
            agent_protocol::selector::Selector::parse(text)
                .map_err(|e| anyhow::anyhow!("--selector {text:?}: {e}"))?;
        }
        let set = path_segment(&key);
        let request = match action {
            ConfigCommand::Push {
                dir,
                allow_empty,
                replace_all,
                ..
            } => {
                let files = read_set(dir)?;
                http.put(format!("{base}/admin/config/{set}"))
                    .json(&serde_json::json!({
                        "files": files,
                        "allow_empty": allow_empty,
                        "replace_all": replace_all,
                    }))
            }
            ConfigCommand::Status => http.get(format!("{base}/admin/config")),
            ConfigCommand::Delete { .. } => http.delete(format!("{base}/admin/config/{set}")),
            ConfigCommand::Halt { reason, .. } => http
                .post(format!("{base}/admin/config/{set}/halt"))
                .json(&serde_json::json!({ "reason": reason })),
            ConfigCommand::Resume { .. } => http.post(format!("{base}/admin/config/{set}/resume")),
            ConfigCommand::Advance { .. } => {
                http.post(format!("{base}/admin/config/{set}/advance"))
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
