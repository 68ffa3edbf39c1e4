//! Command line of `agent`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use agent_protocol::layout::{self, AgentHome};
use agent_protocol::settings::ProcessEnv;
use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::config::Config;
use crate::daemon::{self, RunEnd};
use crate::error::AgentError;
use crate::state::home::Installation;

/// The agent daemon and its maintenance commands.
#[derive(Debug, Parser)]
#[command(name = "agent", disable_version_flag = true)]
pub struct Cli {
    #[cfg_attr(
        unix,
        doc = "AGENT_HOME (default: found from this binary's location, <home>/current/bin/agent)."
    )]
    #[cfg_attr(
        windows,
        doc = r"AGENT_HOME (default: found from this program's location, <home>\versions\<version>\bin\agent.exe, which <home>\bin\agent.exe runs)."
    )]
    #[arg(long, global = true, env = "AGENT_HOME", value_name = "DIR")]
    home: Option<PathBuf>,

    /// Print the version this installation runs and exit.
    #[arg(short = 'V', long)]
    version: bool,

    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    #[cfg_attr(unix, doc = "Run in the foreground (what agent-wrapper.sh starts).")]
    #[cfg_attr(
        windows,
        doc = r"Run in the foreground (what the Windows service, <home>\bin\agent-service.exe, starts)."
    )]
    Run,
    /// Show version, identity, servers, health, update state and bad bundles.
    Status,
    /// Update to the server's bundle now (the running agent is stopped and restarted).
    Update {
        /// Only say what the server offers and whether this agent would update.
        #[arg(long)]
        check: bool,
        /// Forget the bundles that failed to come up (data/bad-versions), then stop.
        #[arg(long)]
        clear_bad: bool,
    },
    /// Hold off bundle updates on this machine (the home's run/update-locks/), or let them
    /// through.
    Lock {
        #[command(subcommand)]
        action: LockAction,
    },
    #[cfg_attr(
        unix,
        doc = "Check the configuration (conf/agent.toml, or FILE) without starting anything:\nwhat `agent-wrapper.sh restart` and the service run before they stop the agent."
    )]
    #[cfg_attr(
        windows,
        doc = "Check the configuration (conf\\agent.toml, or FILE) without starting anything:\nwhat `agent-service.exe restart` runs before it stops the agent."
    )]
    Config {
        #[command(subcommand)]
        action: ConfigAction,
    },
    #[cfg_attr(
        unix,
        doc = "Leave the fleet: tell the server, stop the agent and its workload, remove the\nsystemd unit and the installed versions; conf/, data/ and logs/ stay."
    )]
    #[cfg_attr(
        windows,
        doc = "Leave the fleet: tell the server, stop and remove the Windows service (sc delete),\nremove the installed versions and bin\\; conf\\, data\\ and logs\\ stay. An MSI install is\nremoved with msiexec /x, which runs this."
    )]
    Uninstall {
        /// Remove the whole home, conf/, data/ and logs/ included.
        #[arg(long)]
        purge: bool,
        /// Do not ask.
        #[arg(long, short = 'y')]
        yes: bool,
    },
    /// Ask the server whether it enrolls this agent (server.urls, with the enrollment
    /// token, proxy and CA of conf/agent.toml) without registering: exit 0 if it does,
    /// else its words and exit 1. What the MSI runs before it starts the service.
    CheckEnrollment,
}

#[derive(Debug, Subcommand)]
enum ConfigAction {
    /// Parse the configuration as the agent would: exit 0 if it would start, else the
    /// file, line and key at fault and exit 78.
    Check {
        /// The file to check (default: the installation's conf/agent.toml).
        #[arg(long, value_name = "FILE")]
        file: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
enum LockAction {
    /// Take (or replace) the lock NAME: no update starts while it is held.
    Take {
        name: String,
        /// Why, for `agent status`, the server and the page.
        #[arg(long, default_value = "")]
        reason: String,
        /// Let it expire after this long ("30m", "2h"); default: until released.
        #[arg(long = "for", value_name = "DURATION", value_parser = agent_protocol::settings::parse_duration)]
        hold_for: Option<std::time::Duration>,
    },
    /// Release the lock NAME.
    Release { name: String },
    /// List the locks held now.
    List,
}

pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("agent: error: {e:#}");
            if is_config_error(&e) {
                ExitCode::from(layout::EXIT_CONFIG)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// A configuration the operator must fix: the wrapper must not restart the agent for it.
fn is_config_error(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        matches!(
            cause.downcast_ref::<AgentError>(),
            Some(AgentError::Config { .. } | AgentError::NoHome(_))
        )
    })
}

fn load_config(home: &AgentHome) -> anyhow::Result<Config> {
    Ok(Config::load(&home.agent_toml(), &ProcessEnv)?)
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    if let Some(Command::Uninstall { purge, yes }) = cli.command {
        return uninstall(cli.home.as_deref(), purge, yes);
    }
    let install = Installation::discover(cli.home.as_deref())?;
    if cli.version {
        // AGENT_BUILD_NOTE, set when the agent is compiled, tells two builds of one
        // version apart (the delta tests pack a second build as the next release).
        match option_env!("AGENT_BUILD_NOTE").filter(|note| !note.is_empty()) {
            Some(note) => println!("agent {} ({}, {note})", install.version, layout::PLATFORM),
            None => println!("agent {} ({})", install.version, layout::PLATFORM),
        }
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(Command::Config {
        action: ConfigAction::Check { file },
    }) = &cli.command
    {
        let path = file.clone().unwrap_or_else(|| install.home.agent_toml());
        Config::load(&path, &ProcessEnv)?;
        println!(
            "{}: the configuration is good; the agent would start with it",
            path.display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let config = load_config(&install.home)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    match cli.command {
        Some(Command::Run) | None => {
            let _guard = init_logging(install.home.root(), "agent.log", config.log.limits());
            let end = runtime.block_on(daemon::run(install, config))?;
            if let RunEnd::HandedOff { to } = &end {
                tracing::info!("exiting so the updater can install {to}");
            }
            Ok(ExitCode::from(end.exit_code()))
        }
        Some(Command::Status) => {
            print!("{}", crate::state::status::render(&install, &config));
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Update {
            check: _,
            clear_bad: true,
        }) => {
            let n = agent_updater::state::clear_bad(&install.home)?;
            println!("forgot {n} bad bundle(s); the next refusal retries the server's bundle");
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Update { check, .. }) => {
            let _guard = init_logging(install.home.root(), "agent.log", config.log.limits());
            runtime.block_on(crate::update::manual::update(&install, &config, check))
        }
        Some(Command::Lock { action }) => lock(&install.home, action),
        Some(Command::CheckEnrollment) => runtime.block_on(check_enrollment(&install, &config)),
        Some(Command::Uninstall { .. } | Command::Config { .. }) => handled_earlier(),
    }
}

/// `agent check-enrollment`: the server's verdict on this agent's enrollment token, from
/// each server in turn until one answers.
async fn check_enrollment(install: &Installation, config: &Config) -> anyhow::Result<ExitCode> {
    let client = crate::contact::client::Client::new(
        config.server.urls.clone(),
        install.version.clone(),
        crate::contact::identity::hello("", config),
        crate::contact::client::Trust::of(config, &install.home),
    )?;
    match client.check_enrollment().await? {
        Ok(server) => {
            println!("{server} enrolls this agent");
            Ok(ExitCode::SUCCESS)
        }
        Err((server, why)) => {
            println!("{server} refuses to enroll this agent: {why}");
            Ok(ExitCode::FAILURE)
        }
    }
}

fn lock(home: &AgentHome, action: LockAction) -> anyhow::Result<ExitCode> {
    let now = agent_updater::state::now_secs();
    match action {
        LockAction::Take {
            name,
            reason,
            hold_for,
        } => {
            let path = crate::update::locks::take(home, &name, &reason, hold_for, now)
                .map_err(anyhow::Error::msg)?;
            let until = hold_for
                .map(|d| format!("for {}", agent_protocol::settings::format_duration(d)))
                .unwrap_or_else(|| "until `agent lock release`".into());
            println!(
                "update lock {name} taken {until} ({}): no update starts while it is held",
                path.display()
            );
        }
        LockAction::Release { name } => {
            crate::update::locks::release(home, &name).map_err(anyhow::Error::msg)?;
            println!("update lock {name} released");
        }
        LockAction::List => {
            let (held, warnings) = crate::update::locks::held(home, now);
            for w in warnings {
                eprintln!("agent: {w}");
            }
            if held.is_empty() {
                println!("no update lock is held");
            }
            for l in held {
                println!("{}", l.describe());
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `uninstall` (before an installation is looked for: it may have none left) and
/// `config check` (before the configuration is loaded) are handled above.
fn handled_earlier() -> anyhow::Result<ExitCode> {
    anyhow::bail!("this command is handled before the configuration is read")
}

/// `agent uninstall`: the home from `--home`, or from this binary's place in it; a home
/// already uninstalled (no version left) has nothing to do, and says so.
fn uninstall(home: Option<&Path>, purge: bool, yes: bool) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    match Installation::discover(home) {
        Ok(install) => {
            let config = load_config(&install.home).ok();
            let installed = config.as_ref().map(|c| (c, &install.version));
            runtime.block_on(crate::uninstall::run(
                install.home.root(),
                installed,
                purge,
                yes,
            ))
        }
        Err(e) => match home {
            Some(root) => runtime.block_on(crate::uninstall::run(root, None, purge, yes)),
            None => Err(e).context("cannot find the agent's home: pass --home DIR"),
        },
    }
}

/// Logs to stderr and to `logs/<file>`, rotated by size with stderr's `logs/agent.out`,
/// after rotating the other logs past `[log] max-size` (see [`agent_updater::logfiles`]); the
/// guard flushes the file on drop.
fn init_logging(
    home: &Path,
    file: &str,
    limits: agent_updater::logfiles::Limits,
) -> Option<tracing_appender::non_blocking::WorkerGuard> {
    use tracing_subscriber::EnvFilter;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;

    let filter = EnvFilter::try_from_env("AGENT_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    // The wrapper sends stderr to logs/agent.out: colour codes only on a terminal.
    let stderr = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false);
    let logs = home.join("logs");
    let opened = std::fs::create_dir_all(&logs).and_then(|()| {
        agent_updater::logfiles::rotate_at_start(&logs, limits);
        let console = logs.join("agent.out");
        agent_updater::logfiles::RotatingFile::open(&logs.join(file), limits, Some(&console))
    });
    let (file_layer, guard) = match opened {
        Ok(appender) => {
            let (writer, guard) = tracing_appender::non_blocking(appender);
            (
                Some(
                    tracing_subscriber::fmt::layer()
                        .with_writer(writer)
                        .with_ansi(false)
                        .with_target(false),
                ),
                Some(guard),
            )
        }
        Err(e) => {
            eprintln!(
                "agent: cannot write {}: {e}; logging to stderr only",
                logs.display()
            );
            (None, None)
        }
    };
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(stderr)
        .with(file_layer)
        // The agent's log lines as OTLP logs, while a destination names a logs URL.
        .with(crate::telemetry::layer())
        .try_init();
    guard
}
