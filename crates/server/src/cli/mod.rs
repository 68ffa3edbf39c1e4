//! The `update-server` command line: with no subcommand it serves; each subcommand
//! (`rollout`, `config`, `agents`, `deployment`, `maintenance`, `token`, `release`,
//! `audit`, `webhook`, `telemetry`) asks the admin API of a
//! running server, one module each, and prints a table (or the API's JSON with
//! `--json`); `backup` reads the database itself. The binary's `main` only calls
//! [`main`]. This is the process's edge: errors are `anyhow`, said once, at the end.

pub mod agents;
pub mod approval;
pub mod audit;
pub mod backup;
pub mod client;
pub mod config;
pub mod deployment;
pub mod maintenance;
pub mod release;
pub mod rollout;
mod table;
pub mod telemetry;
pub mod token;
pub mod webhook;

use std::path::PathBuf;
use std::process::ExitCode;

use agent_protocol::settings::ProcessEnv;
use clap::{Args, Parser, Subcommand};

pub use client::AdminClient;

/// Serves one signed agent bundle and enforces the agent version directive; with a
/// command, talks to a running server's admin API.
#[derive(Debug, Parser)]
#[command(name = "update-server", version)]
pub struct Cli {
    /// Configuration file (TOML); without one, embedded defaults and the environment apply.
    #[arg(long, value_name = "FILE", global = true)]
    config: Option<PathBuf>,
    /// Address to listen on (server.listen).
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
    /// Home directory for downloads, caches and the database (server.home).
    #[arg(long, value_name = "DIR")]
    home: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show or steer the fleet's rollout (through the admin API of a running server).
    Rollout {
        #[command(subcommand)]
        action: rollout::Rollout,
        /// Another deployment's rollout than default's.
        #[arg(long, value_name = "NAME", global = true)]
        deployment: Option<String>,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// The workload's configuration sets (through the admin API of a running server).
    Config {
        #[command(subcommand)]
        action: config::ConfigCommand,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// The agents, their credentials, and removing a lost machine (through the admin
    /// API of a running server). `update-server agent …` is the same.
    #[command(visible_alias = "agent")]
    Agents {
        #[command(subcommand)]
        action: agents::Agents,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Deployments: which agents (a label selector) run which release, each with its
    /// own rollout (through the admin API of a running server).
    Deployment {
        #[command(subcommand)]
        action: deployment::Deployment,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Maintenance windows: when each deployment's agents may install new bundles, fleet
    /// policy every server follows (through the admin API of a running server).
    Maintenance {
        #[command(subcommand)]
        action: maintenance::Maintenance,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Where agents export their own telemetry (OTLP/HTTP), by label selector (through
    /// the admin API of a running server).
    Telemetry {
        #[command(subcommand)]
        action: telemetry::Telemetry,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Operators' named tokens with their roles (an admin's; through the admin API).
    Token {
        #[command(subcommand)]
        action: token::Token,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Releases: publish one (checked before any agent sees it), the history, a
    /// rollback to a kept release, an export for an isolated network (through the admin
    /// API of a running server).
    Release {
        #[command(subcommand)]
        action: release::Release,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Webhooks: the fleet's events POSTed, signed, to URLs (an admin's; through the
    /// admin API).
    Webhook {
        #[command(subcommand)]
        action: webhook::Webhook,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Changes waiting for a second operator's approval: list, approve, reject, and the
    /// fleet's switch (through the admin API of a running server).
    Approval {
        #[command(subcommand)]
        action: approval::Approval,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Write a consistent copy of the fleet database (SQLite) to FILE, beside a running
    /// server; for PostgreSQL, says the pg_dump command to use instead.
    Backup {
        /// The new backup file (an existing one is refused).
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
    },
    /// The audit log: every change, who made it and from where, newest first; `audit
    /// export` streams a time range of it as JSON lines or CSV.
    Audit {
        #[command(subcommand)]
        export: Option<audit::AuditCommand>,
        #[command(flatten)]
        query: audit::AuditQuery,
        #[command(flatten)]
        admin: AdminArgs,
    },
}

/// How a subcommand reaches the admin API.
#[derive(Debug, Args)]
struct AdminArgs {
    /// The server's base URL, or HOST:PORT for http://HOST:PORT (default: its
    /// server.listen address).
    #[arg(long, value_name = "URL", global = true, value_parser = server_url)]
    server: Option<String>,
    /// The admin token (default: UPDATE_SERVER_ADMIN_TOKEN, or admin.token).
    #[arg(long, value_name = "TOKEN", global = true)]
    token: Option<String>,
    /// Print the API's JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    /// Trust only this CA (PEM) when the server speaks HTTPS with a private certificate.
    #[arg(long, value_name = "FILE", global = true)]
    ca_file: Option<PathBuf>,
}

/// `--server` as a base URL: `host:port` is `http://host:port`.
fn server_url(text: &str) -> Result<String, String> {
    agent_protocol::server_url::base_url(text)
}

impl AdminArgs {
    fn client(&self, config: &crate::Config) -> AdminClient {
        AdminClient {
            server: self.server.clone().unwrap_or_else(|| config.admin_url()),
            token: self
                .token
                .clone()
                .unwrap_or_else(|| config.admin.token.clone()),
            ca_file: self.ca_file.clone(),
        }
    }
}

/// The whole program: parses the command line, logs to stderr, runs the server or
/// the subcommand, and says an error once.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,tower_http=warn,sqlx=warn".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("update-server: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    // Kept for the server: SIGHUP reads the same file, with the same overrides, again.
    let source = crate::ConfigSource {
        file: cli.config,
        listen: cli.listen,
        home: cli.home,
    };
    let config = source.load(&ProcessEnv)?;
    let runtime = tokio::runtime::Runtime::new()?;
    let Some(command) = cli.command else {
        runtime.block_on(crate::serve(config, source, crate::shutdown_signal()))?;
        return Ok(());
    };
    runtime.block_on(async {
        match command {
            Command::Backup { out } => {
                println!("{}", backup::backup(&config, &out).await?);
                Ok(())
            }
            Command::Rollout {
                action,
                deployment,
                admin,
            } => {
                let client = admin.client(&config);
                match deployment.filter(|d| d != "default") {
                    Some(name) => {
                        deployment::Deployment::rollout_step(&action, &name, &client, admin.json)
                            .await
                    }
                    None => action.run(&client, admin.json).await,
                }
            }
            Command::Config { action, admin } => {
                action.run(&admin.client(&config), admin.json).await
            }
            Command::Agents { action, admin } => {
                action.run(&admin.client(&config), admin.json).await
            }
            Command::Deployment { action, admin } => {
                action.run(&admin.client(&config), admin.json).await
            }
            Command::Maintenance { action, admin } => {
                action.run(&admin.client(&config), admin.json).await
            }
            Command::Telemetry { action, admin } => {
                action.run(&admin.client(&config), admin.json).await
            }
            Command::Token { action, admin } => {
                action.run(&admin.client(&config), admin.json).await
            }
            Command::Release { action, admin } => {
                action.run(&admin.client(&config), admin.json).await
            }
            Command::Audit {
                export: Some(export),
                admin,
                ..
            } => export.run(&admin.client(&config)).await,
            Command::Audit { query, admin, .. } => {
                query.run(&admin.client(&config), admin.json).await
            }
            Command::Webhook { action, admin } => {
                action.run(&admin.client(&config), admin.json).await
            }
            Command::Approval { action, admin } => {
                action.run(&admin.client(&config), admin.json).await
            }
        }
    })
}

/// Prints the API's answer as it came (`--json`), or what a person reads of it.
fn print_json(answer: &serde_json::Value) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(answer)?);
    Ok(())
}

/// The API's answer as it came with `--json`; otherwise `said`, the words or table a
/// person reads (or, for a change the server parked for approval, words that say so).
fn print_answer(
    answer: &serde_json::Value,
    json: bool,
    said: impl FnOnce(&serde_json::Value) -> String,
) -> anyhow::Result<()> {
    if json {
        return print_json(answer);
    }
    if let Some(parked) = approval::parked_words(answer) {
        println!("{parked}");
        return Ok(());
    }
    println!("{}", said(answer).trim_end());
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// clap checks a command line's definition only when it is used: every
    /// subcommand, at once, here.
    #[test]
    fn the_command_line_is_well_formed() {
        super::Cli::command().debug_assert();
    }
}
