//! `update-server approval list|approve ID|reject ID [--reason R]|require on|off`: the
//! changes waiting for a second operator's approval (through the admin API).

use std::fmt::Write as _;

use clap::Subcommand;
use serde_json::{Value, json};

use super::AdminClient;
use super::table::millis_utc;

#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub enum Approval {
    /// The changes waiting for approval (and the last ones decided), and whether the
    /// fleet requires it.
    List,
    /// One change, and exactly what approving it applies (a configuration set's files,
    /// a deployment's change, the kept release).
    Show { id: i64 },
    /// Approve a change another operator asked for: it is applied now, as it would have
    /// been at once.
    Approve { id: i64 },
    /// Reject a change (or withdraw one's own): nothing of it is applied.
    Reject {
        id: i64,
        /// Why, for the audit log and the operator who asked.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Require a second operator's approval of every change that moves agents (on), or
    /// apply them at once again (off); an admin's, for the whole fleet at once.
    Require {
        #[arg(value_parser = ["on", "off"])]
        switch: String,
    },
}

impl Approval {
    pub(super) async fn run(&self, client: &AdminClient, json: bool) -> anyhow::Result<()> {
        let answer = client.approval(self).await?;
        // The change itself, not the words a command that parked one says.
        if let (Approval::Show { .. }, false) = (self, json) {
            print!("{}", render_one(&answer));
            return Ok(());
        }
        super::print_answer(&answer, json, |a| match self {
            Approval::List => render_list(a),
            Approval::Show { .. } => render_one(a),
            Approval::Approve { id } => {
                format!("approved change {id} ({}); it is applied", describe(a))
            }
            Approval::Reject { id, .. } => {
                format!(
                    "rejected change {id} ({}); nothing of it is applied",
                    describe(a)
                )
            }
            Approval::Require { .. } => {
                if a["required"] == true {
                    "approval is required: a release, a rollback, a deployment's release or selector and a configuration push now wait for a second operator, on every server".to_owned()
                } else {
                    "approval is not required: changes are applied at once, on every server"
                        .to_owned()
                }
            }
        })
    }
}

impl AdminClient {
    /// `/admin/approvals…` and `/admin/approval`: the answer's JSON, or an error that
    /// says what the server said.
    pub async fn approval(&self, action: &Approval) -> anyhow::Result<Value> {
        let base = self.base()?;
        let http = self.http()?;
        let request = match action {
            Approval::List => http.get(format!("{base}/admin/approvals")),
            Approval::Show { id } => http.get(format!("{base}/admin/approvals/{id}")),
            Approval::Approve { id } => http.post(format!("{base}/admin/approvals/{id}/approve")),
            Approval::Reject { id, reason } => http
                .post(format!("{base}/admin/approvals/{id}/reject"))
                .json(&json!({ "reason": reason })),
            Approval::Require { switch } => http
                .put(format!("{base}/admin/approval"))
                .json(&json!({ "required": switch == "on" })),
        };
        self.send(base, request).await
    }
}

/// What a change does, in a few words: its action and what it names.
fn describe(a: &Value) -> String {
    let subject = &a["subject"];
    let what: Vec<String> = ["release", "deployment", "group", "selector"]
        .iter()
        .filter_map(|k| {
            subject
                .get(*k)
                .and_then(Value::as_str)
                .map(|v| format!("{k} {v}"))
        })
        .collect();
    let action = a["action"].as_str().unwrap_or("?");
    if what.is_empty() {
        action.to_owned()
    } else {
        format!("{action}: {}", what.join(", "))
    }
}

/// What a command that was parked for approval says instead of its usual words, when
/// `answer` is such a change (`"state": "awaiting-approval"`).
pub fn parked_words(answer: &Value) -> Option<String> {
    if answer["state"] != "awaiting-approval" {
        return None;
    }
    let id = &answer["id"];
    Some(format!(
        "change {id} waits for approval ({}), until {}: nothing changed yet; another operator approves it with `update-server approval approve {id}` (or rejects it)",
        describe(answer),
        millis_utc(&answer["expires_at"])
    ))
}

/// `GET /admin/approvals/<id>` as a person reads it: the change, who asked, where it
/// stands, then what it applies (a configuration set's files in full).
pub fn render_one(a: &Value) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "change {} ({}): {}, asked by {} at {}, lapses {}",
        a["id"],
        describe(a),
        a["state"].as_str().unwrap_or("?"),
        a["requested_by"].as_str().unwrap_or("?"),
        millis_utc(&a["requested_at"]),
        millis_utc(&a["expires_at"]),
    );
    if let Some(by) = a["decided_by"].as_str() {
        let _ = writeln!(
            out,
            "decided by {by}{}",
            a["reason"]
                .as_str()
                .map(|r| format!(": {r}"))
                .unwrap_or_default()
        );
    }
    let change = &a["change"];
    if let Some(files) = change["files"].as_object() {
        for (name, text) in files {
            let _ = writeln!(out, "--- {name}");
            out.push_str(text.as_str().unwrap_or(""));
            if !out.ends_with('\n') {
                out.push('\n');
            }
        }
    } else {
        let _ = writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(change).unwrap_or_default()
        );
    }
    out
}

/// `GET /admin/approvals` as a person reads it.
pub fn render_list(answer: &Value) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "approval is {}required; a change waits {} s at most",
        if answer["required"] == true {
            ""
        } else {
            "not "
        },
        answer["expires"]
    );
    let rows = answer["approvals"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    if rows.is_empty() {
        out.push_str("no changes waiting or decided\n");
        return out;
    }
    let _ = writeln!(
        out,
        "{:<5} {:<18} {:<16} {:<16} {:<30} change",
        "id", "state", "asked by", "decided by", "asked at"
    );
    for a in rows {
        let _ = writeln!(
            out,
            "{:<5} {:<18} {:<16} {:<16} {:<30} {}{}",
            a["id"],
            a["state"].as_str().unwrap_or("?"),
            a["requested_by"].as_str().unwrap_or("?"),
            a["decided_by"].as_str().unwrap_or("-"),
            millis_utc(&a["requested_at"]),
            describe(a),
            a["reason"]
                .as_str()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default(),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_parked_answer_says_who_approves_it_and_others_say_nothing() {
        let parked = json!({
            "id": 7, "state": "awaiting-approval", "action": "release.publish",
            "subject": {"release": "2.0.0+2"}, "expires_at": 0,
        });
        let words = parked_words(&parked).unwrap();
        assert!(words.contains("approval approve 7"), "{words}");
        assert!(
            words.contains("release.publish: release 2.0.0+2"),
            "{words}"
        );
        assert!(parked_words(&json!({"id": "2.0.0+2", "kind": "publish"})).is_none());
    }

    #[test]
    fn one_change_shows_a_sets_files_in_full() {
        let shown = render_one(&json!({
            "id": 3, "state": "awaiting-approval", "action": "config.push",
            "subject": {"group": "web"}, "requested_by": "alice",
            "change": {"act": "config-push", "group": "web", "files": {"app.conf": "level = debug"}},
        }));
        assert!(shown.contains("asked by alice"), "{shown}");
        assert!(shown.contains("--- app.conf\nlevel = debug\n"), "{shown}");
    }
}
