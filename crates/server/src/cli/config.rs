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
        #[arg(long)]
        group: String,
    },
    /// Send the group's set to no more agents.
    Halt {
        #[arg(long, default_value = "default")]
        group: String,
        /// Why, recorded with the halt.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Let a halted config rollout go on (failures seen so far no longer count).
    Resume {
        #[arg(long, default_value = "default")]
        group: String,
    },
    /// Open the config rollout's next wave now.
    Advance {
        #[arg(long, default_value = "default")]
        group: String,
    },
}

impl ConfigCommand {
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
            ConfigCommand::Push { group, .. } => println!(
                "stored set {} for group {group}",
                answer["hash"].as_str().unwrap_or("?")
            ),
            ConfigCommand::Delete { group } => {
                println!("deleted the set of group {group}; its agents run default's set")
            }
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
        let request = match action {
            ConfigCommand::Push {
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
            ConfigCommand::Status => http.get(format!("{base}/admin/config")),
            ConfigCommand::Delete { group } => http.delete(format!("{base}/admin/config/{group}")),
            ConfigCommand::Halt { group, reason } => http
                .post(format!("{base}/admin/config/{group}/halt"))
                .json(&serde_json::json!({ "reason": reason })),
            ConfigCommand::Resume { group } => {
                http.post(format!("{base}/admin/config/{group}/resume"))
            }
            ConfigCommand::Advance { group } => {
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
