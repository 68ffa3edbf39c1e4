//! `update-server token create|list|revoke`: operators' named tokens.

use std::fmt::Write as _;

use clap::Subcommand;
use serde_json::Value;

use super::AdminClient;
use super::table::millis_utc;

#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub enum Token {
    /// Make a token for a person; it is printed once and stored only as a hash.
    Create {
        /// Who it is for (letters, digits, - _ . @).
        #[arg(long)]
        name: String,
        /// viewer (reads), operator (also halts, resumes, advances, pushes configuration,
        /// changes auto-update and the download limit) or admin (also manages tokens).
        #[arg(long, value_parser = ["viewer", "operator", "admin"])]
        role: String,
        /// How long it opens anything (90d, 12h); without it, until revoked.
        #[arg(long, value_name = "DURATION")]
        expires: Option<String>,
    },
    /// Names, roles, when made and last used (never the tokens).
    List,
    /// Refuse a token from the next request on, on every server of the fleet.
    Revoke {
        /// The token's name.
        name: String,
    },
}

impl Token {
    pub(super) async fn run(&self, client: &AdminClient, json: bool) -> anyhow::Result<()> {
        let answer = client.tokens(self).await?;
        if json {
            return super::print_json(&answer);
        }
        match self {
            Token::Create { name, role, .. } => {
                println!("{}", answer["token"].as_str().unwrap_or_default());
                let lapses = match answer["expires_at"].as_i64() {
                    Some(_) => format!("; it lapses {}", millis_utc(&answer["expires_at"])),
                    None => String::new(),
                };
                eprintln!(
                    "made the {role} token {name:?}: it is shown this once and kept only as a hash; pass it with --token or sign in to the page with it{lapses}"
                );
            }
            Token::List => print!("{}", render_tokens(&answer)),
            Token::Revoke { name } => {
                println!("revoked the token {name:?}; it is refused from now on, on every server")
            }
        }
        Ok(())
    }
}

impl AdminClient {
    /// `/admin/tokens...`: the answer's JSON, or an error that says what the server said.
    pub async fn tokens(&self, action: &Token) -> anyhow::Result<Value> {
        let base = self.base()?;
        let http = self.http()?;
        let request = match action {
            Token::Create {
                name,
                role,
                expires,
            } => http
                .post(format!("{base}/admin/tokens"))
                .json(&serde_json::json!({ "name": name, "role": role, "expires": expires })),
            Token::List => http.get(format!("{base}/admin/tokens")),
            Token::Revoke { name } => http.delete(format!("{base}/admin/tokens/{name}")),
        };
        self.send(base, request).await
    }
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
        "{:<24} {:<9} {:<30} {:<30} lapses",
        "name", "role", "created", "last used"
    );
    for t in rows {
        let lapses = if t["expires_at"].is_i64() {
            millis_utc(&t["expires_at"])
        } else {
            "never".to_owned()
        };
        let _ = writeln!(
            out,
            "{:<24} {:<9} {:<30} {:<30} {lapses}",
            t["name"].as_str().unwrap_or("?"),
            t["role"].as_str().unwrap_or("?"),
            millis_utc(&t["created_at"]),
            millis_utc(&t["last_used_at"]),
        );
    }
    out
}
