use std::path::PathBuf;
use std::process::ExitCode;

use agent_protocol::settings::ProcessEnv;
use clap::{Args, Parser, Subcommand};
use update_server::cli::{AdminClient, AgentQuery, ConfigAction, RolloutAction, TokenAction};

/// Every held connect allocates and frees small objects by the dozen (its HTTP/2
/// stream, headers, JSON, the contact it leaves): with glibc's malloc, `malloc` and
/// `free` were in about 15 % of the samples of a server holding 20,000 agents (perf),
/// and mimalloc took 7 % off its processor (BENCHMARKS.md, "Holding a server's share
/// of the fleet").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Serves one signed agent bundle and enforces the agent version directive; with a
/// command, talks to a running server's admin API.
#[derive(Debug, Parser)]
#[command(name = "update-server", version)]
struct Cli {
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
        action: Rollout,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// The workload's configuration sets (through the admin API of a running server).
    Config {
        #[command(subcommand)]
        action: ConfigCmd,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// The agents, their credentials, and removing a lost machine (through the admin
    /// API of a running server). `update-server agent …` is the same.
    #[command(visible_alias = "agent")]
    Agents {
        #[command(subcommand)]
        action: Agents,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Operators' named tokens with their roles (an admin's; through the admin API).
    Token {
        #[command(subcommand)]
        action: Token,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Releases: publish one (checked before any agent sees it), the history, a
    /// rollback to a kept release, an export for an isolated network (through the admin
    /// API of a running server).
    Release {
        #[command(subcommand)]
        action: Release,
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
    /// The audit log: every change, who made it and from where, newest first.
    Audit {
        /// Only entries by this token name (or server:NAME).
        #[arg(long)]
        who: Option<String>,
        /// Only these actions (`rollout` matches rollout.halt, rollout.resume, …).
        #[arg(long)]
        action: Option<String>,
        #[arg(long, default_value_t = 1)]
        page: u32,
        #[command(flatten)]
        admin: AdminArgs,
    },
}

#[derive(Debug, Subcommand)]
enum Release {
    /// Upload a release: each agent-bundle-<v>[-<target>][.exe] with its .minisig.
    Publish {
        /// Directories (their agent-bundle-* files) or files.
        #[arg(required = true, value_name = "DIR|FILE")]
        paths: Vec<PathBuf>,
    },
    /// The current release and the ones kept before it.
    List,
    /// Make a kept release the target again, with fresh signatures over its bytes
    /// (`agent-bundle sign --key K FILE…`).
    Rollback {
        /// The kept release, `<version>+<build>`.
        #[arg(long, value_name = "VERSION+BUILD")]
        to: String,
        /// The directory of its fresh .minisig files.
        #[arg(long, value_name = "DIR")]
        signatures: PathBuf,
    },
    /// Write the current release's files (or a kept one's) into a directory.
    Export {
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// A kept release, `<version>+<build>`, rather than the current one.
        #[arg(long, value_name = "VERSION+BUILD")]
        release: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
enum Token {
    /// Make a token for a person; it is printed once and stored only as a hash.
    Create {
        /// Who it is for (letters, digits, - _ . @).
        #[arg(long)]
        name: String,
        /// viewer (reads), operator (also halts, resumes, advances, pushes configuration,
        /// changes auto-update and the download limit) or admin (also manages tokens).
        #[arg(long, value_parser = ["viewer", "operator", "admin"])]
        role: String,
    },
    /// Names, roles, when made and last used (never the tokens).
    List,
    /// Refuse a token from the next request on, on every server of the fleet.
    Revoke {
        /// The token's name.
        name: String,
    },
}

#[derive(Debug, Subcommand)]
enum ConfigCmd {
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

#[derive(Debug, Subcommand)]
enum Agents {
    /// The agents the server knows: id, name, version, group, last update status and
    /// last contact (`--json`: the API's rows).
    List {
        /// Only agents on this VERSION+BUILD.
        #[arg(long, value_name = "VERSION+BUILD")]
        version: Option<String>,
        /// Only agents whose last update status is this (INSTALLED, INSTALL_FAILED,
        /// RETRYING, …).
        #[arg(long)]
        status: Option<String>,
        /// Only agents of this group (`default`: also those with none).
        #[arg(long)]
        group: Option<String>,
        /// Only agents whose labels this selector matches, as `kubectl -l` writes it:
        /// `env=prod`, `env!=prod`, `env in (prod,staging)`, `env notin (dev)`, `region`,
        /// `!canary`, terms joined by `,`.
        #[arg(long, short = 'l', value_name = "SELECTOR")]
        selector: Option<String>,
    },
    /// Set or remove the server's own labels of an agent, as `kubectl label` does:
    /// `env=prod` sets, `tier-` removes; they win over the agent's labels of the same
    /// key (an operator's; audited).
    Label {
        /// The agent's id (data/agent-id, or `id` in GET /admin/agents).
        id: String,
        /// `KEY=VALUE` to set, `KEY-` to remove.
        #[arg(required = true, value_name = "KEY=VALUE|KEY-")]
        labels: Vec<String>,
    },
    /// Forget an agent's credentials (it lost data/agent-token); its next register gets
    /// new ones.
    ForgetToken {
        /// The agent's id (data/agent-id, or `id` in GET /admin/agents).
        id: String,
    },
    /// Forget a lost machine: its credentials are refused from then on, and no rollout
    /// waits for it (an operator's; audited).
    Remove {
        /// The agent's id (data/agent-id, or `id` in GET /admin/agents).
        id: String,
    },
    /// Let the fleet's current release through the agent's update locks now (an
    /// operator's; audited): it updates at its next contact.
    OverrideLocks {
        /// The agent's id (data/agent-id, or `id` in GET /admin/agents).
        id: String,
    },
}

#[derive(Debug, Subcommand)]
enum Rollout {
    /// The rollout's state and a table of its waves.
    Status,
    /// Tell no more agents to update; agents on the previous version stay accepted.
    Halt {
        /// Why, recorded with the halt.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Let a halted rollout go on (failures seen so far no longer count).
    Resume,
    /// Open the next wave now, without waiting for the current one or the soak.
    Advance,
}

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
    fn client(&self, config: &update_server::Config) -> AdminClient {
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,tower_http=warn,sqlx=warn".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let result = (|| -> anyhow::Result<()> {
        let mut config = update_server::Config::load(cli.config.as_deref(), &ProcessEnv)?;
        if let Some(listen) = cli.listen {
            config.server.listen = listen;
        }
        if let Some(home) = cli.home {
            config.server.home = home;
        }
        config.validate().map_err(anyhow::Error::msg)?;
        let runtime = tokio::runtime::Runtime::new()?;
        match cli.command {
            None => runtime.block_on(update_server::serve(
                config,
                update_server::shutdown_signal(),
            ))?,
            Some(Command::Agents { action, admin }) => {
                let client = admin.client(&config);
                let (answer, said) = match action {
                    Agents::List {
                        version,
                        status,
                        group,
                        selector,
                    } => {
                        let status = status
                            .map(|s| update_server::cli::known_status(&s))
                            .transpose()?;
                        let query = AgentQuery {
                            version,
                            status,
                            group,
                            selector,
                        };
                        let answer = runtime.block_on(client.agents(&query))?;
                        let table = update_server::cli::render_agents(&answer);
                        (answer, table.trim_end().to_owned())
                    }
                    Agents::Label { id, labels } => {
                        let answer = runtime.block_on(client.label_agent(&id, &labels))?;
                        let said = update_server::cli::render_labels(&id, &answer);
                        (answer, said)
                    }
                    Agents::ForgetToken { id } => (
                        runtime.block_on(client.forget_token(&id))?,
                        format!(
                            "forgot the credentials of agent {id}; its next register gets new ones"
                        ),
                    ),
                    Agents::OverrideLocks { id } => {
                        let answer = runtime.block_on(client.override_locks(&id))?;
                        let release = answer["override_locks"]
                            .as_str()
                            .unwrap_or("the current release")
                            .to_owned();
                        (
                            answer,
                            format!(
                                "agent {id} takes {release} despite its update locks, at its next contact"
                            ),
                        )
                    }
                    Agents::Remove { id } => (
                        runtime.block_on(client.remove_agent(&id))?,
                        format!(
                            "removed agent {id} from the fleet: its credentials are refused from now on and no rollout waits for it"
                        ),
                    ),
                };
                if admin.json {
                    println!("{}", serde_json::to_string_pretty(&answer)?);
                } else {
                    println!("{said}");
                }
            }
            Some(Command::Token { action, admin }) => {
                let client = admin.client(&config);
                let action = match action {
                    Token::Create { name, role } => TokenAction::Create { name, role },
                    Token::List => TokenAction::List,
                    Token::Revoke { name } => TokenAction::Revoke { name },
                };
                let answer = runtime.block_on(client.tokens(&action))?;
                if admin.json {
                    println!("{}", serde_json::to_string_pretty(&answer)?);
                } else {
                    match &action {
                        TokenAction::Create { name, role } => {
                            println!("{}", answer["token"].as_str().unwrap_or_default());
                            eprintln!(
                                "made the {role} token {name:?}: it is shown this once and kept only as a hash; pass it with --token or sign in to the page with it"
                            );
                        }
                        TokenAction::List => {
                            print!("{}", update_server::cli::render_tokens(&answer))
                        }
                        TokenAction::Revoke { name } => {
                            println!(
                                "revoked the token {name:?}; it is refused from now on, on every server"
                            )
                        }
                    }
                }
            }
            Some(Command::Release { action, admin }) => {
                let client = admin.client(&config);
                let (answer, said) = match action {
                    Release::Publish { paths } => {
                        let files = update_server::cli::release::release_files(&paths)?;
                        let answer = runtime.block_on(client.publish(&files))?;
                        let said = format!(
                            "published release {} ({}); every server of the fleet serves it, and the rollout starts under [rollout]",
                            answer["id"].as_str().unwrap_or("?"),
                            answer["platforms"]
                                .as_array()
                                .map(|p| p
                                    .iter()
                                    .filter_map(|v| v.as_str())
                                    .collect::<Vec<_>>()
                                    .join(", "))
                                .unwrap_or_default()
                        );
                        (answer, said)
                    }
                    Release::List => {
                        let answer = runtime.block_on(client.releases())?;
                        let said = update_server::cli::release::render_releases(&answer);
                        (answer, said.trim_end().to_owned())
                    }
                    Release::Rollback { to, signatures } => {
                        let answer = runtime.block_on(client.rollback(&to, &signatures))?;
                        let said = format!(
                            "release {to} is the target again; agents that keep it switch back without downloading (update-server rollout status follows it)"
                        );
                        (answer, said)
                    }
                    Release::Export { out, release } => {
                        let written = runtime.block_on(client.export(&out, release.as_deref()))?;
                        let said = format!(
                            "wrote {} files into {}; `update-server release publish {}` takes them on another server",
                            written.len(),
                            out.display(),
                            out.display()
                        );
                        (serde_json::json!({ "files": written }), said)
                    }
                };
                if admin.json {
                    println!("{}", serde_json::to_string_pretty(&answer)?);
                } else {
                    println!("{said}");
                }
            }
            Some(Command::Backup { out }) => {
                println!(
                    "{}",
                    runtime.block_on(update_server::cli::backup(&config, &out))?
                );
            }
            Some(Command::Audit {
                who,
                action,
                page,
                admin,
            }) => {
                let client = admin.client(&config);
                let answer =
                    runtime.block_on(client.audit(who.as_deref(), action.as_deref(), page))?;
                if admin.json {
                    println!("{}", serde_json::to_string_pretty(&answer)?);
                } else {
                    print!("{}", update_server::cli::render_audit(&answer));
                }
            }
            Some(Command::Config { action, admin }) => {
                let client = admin.client(&config);
                let action = match action {
                    ConfigCmd::Push {
                        group,
                        dir,
                        allow_empty,
                        replace_all,
                    } => ConfigAction::Push {
                        group,
                        dir,
                        allow_empty,
                        replace_all,
                    },
                    ConfigCmd::Status => ConfigAction::Status,
                    ConfigCmd::Delete { group } => ConfigAction::Delete { group },
                    ConfigCmd::Halt { group, reason } => ConfigAction::Halt { group, reason },
                    ConfigCmd::Resume { group } => ConfigAction::Resume { group },
                    ConfigCmd::Advance { group } => ConfigAction::Advance { group },
                };
                let answer = runtime.block_on(client.config(&action))?;
                if admin.json {
                    println!("{}", serde_json::to_string_pretty(&answer)?);
                } else if let ConfigAction::Push { group, .. } = &action {
                    println!(
                        "stored set {} for group {group}",
                        answer["hash"].as_str().unwrap_or("?")
                    );
                } else if let ConfigAction::Delete { group } = &action {
                    println!("deleted the set of group {group}; its agents run default's set");
                } else {
                    print!("{}", update_server::cli::render_config(&answer));
                }
            }
            Some(Command::Rollout { action, admin }) => {
                let client = admin.client(&config);
                let action = match action {
                    Rollout::Status => RolloutAction::Status,
                    Rollout::Halt { reason } => RolloutAction::Halt { reason },
                    Rollout::Resume => RolloutAction::Resume,
                    Rollout::Advance => RolloutAction::Advance,
                };
                let status = runtime.block_on(client.rollout(&action))?;
                if admin.json {
                    println!("{}", serde_json::to_string_pretty(&status)?);
                } else {
                    print!("{}", update_server::cli::render_status(&status));
                }
            }
        }
        Ok(())
    })();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("update-server: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
