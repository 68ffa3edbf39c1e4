//! Command line of `agent-bundle`. Exit codes: 0 success, 1 failure, 2 bad usage.

use crate::service::ServiceRequest;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use agent_extract::payload::Payload;
use agent_protocol::layout;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::commands;
use crate::error::{BundleError, Result};
use crate::install::{self, InstallRequest};

/// Signed, self-installing agent bundles.
///
/// As `agent-bundle-<version>`: `--install[=PREFIX]` installs the agent it carries,
/// `--update[=AGENT_HOME]` updates an installed agent to it.
#[derive(Debug, Parser)]
#[command(
    name = "agent-bundle",
    disable_version_flag = true,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    command: Option<Command>,

    /// Install the carried agent as PREFIX/agent (PREFIX defaults to the current
    /// directory; on Windows to C:\Program Files).
    #[arg(long, value_name = "PREFIX", num_args = 0..=1, default_missing_value = crate::service::DEFAULT_PREFIX, conflicts_with = "update")]
    install: Option<PathBuf>,

    /// With --install (Windows): register the service under this name (default: agent).
    #[arg(long, value_name = "NAME", requires = "install")]
    service_name: Option<String>,

    /// With --install (Windows): unpack only; register no service.
    #[arg(long, requires = "install", conflicts_with = "service_name")]
    no_service: bool,

    /// With --install (Windows): put <home>\bin, where agent.exe runs the installed
    /// version's commands, on the system Path (what the MSI asks); agent uninstall takes
    /// it off again.
    #[arg(long, requires = "install")]
    add_to_path: bool,

    /// With --install: trust this public key for updates (and check the bundle with it).
    #[arg(long, value_name = "FILE", requires = "install")]
    trust_key: Option<PathBuf>,

    /// With --install: replace an existing agent's version (conf, data and logs are kept).
    #[arg(long, requires = "install")]
    force: bool,

    /// With --install: pin this CA (PEM) for HTTPS servers (copied to conf/ca.pem).
    #[arg(long, value_name = "FILE", requires = "install")]
    ca_file: Option<PathBuf>,

    /// With --install: the server's enrollment token, presented when the agent registers.
    #[arg(long, value_name = "TOKEN", requires = "install")]
    enroll_token: Option<String>,

    /// With --install: the rollout group this machine joins (agent.group).
    #[arg(long, value_name = "NAME", requires = "install")]
    group: Option<String>,

    /// With --install: a label of this agent (agent.labels), `KEY=VALUE`; repeat it for
    /// more (`--label env=prod --label region=eu`). Selectors choose agents by them.
    /// A comma-separated list is several (`--label env=prod,region=eu`: the MSI's LABELS).
    #[arg(
        long = "label",
        value_name = "KEY=VALUE",
        requires = "install",
        value_delimiter = ','
    )]
    labels: Vec<String>,

    /// With --install: the update server the agent talks to (server.urls).
    #[arg(long, value_name = "URL", requires = "install")]
    server_url: Option<String>,

    /// With --install: the HTTP proxy the agent reaches its server through
    /// (server.proxy): http://[user:password@]host:port, or "none" to ignore the
    /// environment's https_proxy.
    #[arg(long, value_name = "URL", requires = "install")]
    proxy: Option<String>,

    /// With --install: before the agent is put in place, ask its server whether it enrolls
    /// it (its URL, enrollment token, proxy and CA); a refusal or an unreachable server
    /// fails the install with the server's words, and nothing is installed.
    #[arg(long, requires = "install")]
    check_server: bool,

    /// With --install: where an agent is installed already, update it to the carried
    /// version if that is newer, else leave it as it is, and succeed either way (what the
    /// MSI runs: an MSI older than an agent that updated itself changes nothing).
    #[arg(long, requires = "install", conflicts_with = "force")]
    upgrade: bool,

    /// Uninstall the agent installed as PREFIX/agent: its own `agent uninstall --yes`
    /// (what msiexec /x runs); nothing installed there is no error.
    #[arg(long, value_name = "PREFIX", num_args = 0..=1, default_missing_value = crate::service::DEFAULT_PREFIX, conflicts_with_all = ["install", "update"])]
    uninstall: Option<PathBuf>,

    /// Update the agent installed at AGENT_HOME to the carried version.
    #[arg(long, value_name = "AGENT_HOME", num_args = 0..=1, default_missing_value = ".")]
    update: Option<PathBuf>,

    /// With --update: the agent process to wait for before swapping.
    #[arg(long, value_name = "PID", requires = "update")]
    wait_pid: Option<u32>,

    /// With --update: only finish or roll back an interrupted update (what the wrapper runs).
    #[arg(long, requires = "update")]
    recover: bool,

    /// Show the version, build and platform of the carried agent.
    #[arg(short = 'V', long)]
    version: bool,
}

#[derive(Debug, Subcommand)]
enum Command {
    Keygen(commands::keygen::Keygen),
    Pack(commands::pack::Pack),
    RotateKey(commands::rotate_key::RotateKey),
    Delta(commands::delta::Delta),
    ApplyDelta(commands::apply_delta::ApplyDelta),
    Sign(commands::sign::Sign),
    Verify(commands::verify::Verify),
}

pub fn main() -> ExitCode {
    let cli = match parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            // Help and `help <command>` are answers, not usage errors.
            return if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    init_tracing();
    match run(cli) {
        Ok(code) => code,
        Err(BundleError::Extract(agent_extract::Error::Interrupted)) => {
            say_err("agent-bundle: interrupted; nothing was installed");
            ExitCode::from(130)
        }
        Err(e) => {
            say_err(&format!("agent-bundle: error: {e}"));
            ExitCode::FAILURE
        }
    }
}

/// One line to stderr that cannot panic: the updater's stderr is logs/update.out, which a
/// full disk refuses, and `eprintln!` would panic there.
fn say_err(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// The command line, with the carried agent's README.txt shown above `--help`.
fn parse() -> Result<Cli, clap::Error> {
    let mut command = Cli::command();
    if let Ok(exe) = commands::this_exe()
        && let Ok(mut payload) = Payload::open(&exe)
        && let Ok(readme) =
            payload.read_text(layout::README_ENTRY, agent_extract::payload::MAX_TEXT_ENTRY)
    {
        command = command.before_help(readme.trim_end().to_owned());
    }
    let matches = command.try_get_matches()?;
    Cli::from_arg_matches(&matches)
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("AGENT_BUNDLE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

pub fn run(cli: Cli) -> Result<ExitCode> {
    let exe = commands::this_exe()?;
    if cli.version {
        match install::open_payload(&exe) {
            Ok(mut payload) => {
                let facts = payload.facts()?;
                println!(
                    "agent-bundle {} (build {}, platform {})",
                    facts.version.version_str(),
                    facts.version.build(),
                    facts.platform
                );
            }
            Err(BundleError::NoPayload) => {
                println!("agent-bundle {} (no payload)", env!("CARGO_PKG_VERSION"));
            }
            Err(e) => return Err(e),
        }
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(prefix) = &cli.install {
        let service = ServiceRequest {
            name: cli.service_name.as_deref(),
            none: cli.no_service,
            add_to_path: cli.add_to_path,
        };
        crate::service::check(&service)?;
        if cli.upgrade
            && let Some(code) = commands::install::upgrade(&exe, prefix)?
        {
            return Ok(code);
        }
        return commands::install::run(
            &service,
            &InstallRequest {
                bundle: &exe,
                prefix,
                trust_key: cli.trust_key.as_deref(),
                force: cli.force,
                ca_file: cli.ca_file.as_deref(),
                enroll_token: cli.enroll_token.as_deref(),
                group: cli.group.as_deref(),
                server_url: cli.server_url.as_deref(),
                proxy: cli.proxy.as_deref(),
                labels: &cli.labels,
                check_server: cli.check_server,
            },
        );
    }
    if let Some(prefix) = &cli.uninstall {
        return commands::install::uninstall(prefix);
    }
    if let Some(home) = &cli.update {
        let outcome = agent_updater::run_update(&agent_updater::Request {
            bundle: &exe,
            home,
            wait_pid: cli.wait_pid,
            recover: cli.recover,
        })?;
        // Like say_err: stdout is logs/update.out too.
        let _ = writeln!(std::io::stdout(), "{outcome}");
        return Ok(ExitCode::SUCCESS);
    }
    match cli.command {
        Some(Command::Keygen(c)) => c.run(),
        Some(Command::Pack(c)) => c.run(),
        Some(Command::RotateKey(c)) => c.run(),
        Some(Command::Delta(c)) => c.run(),
        Some(Command::ApplyDelta(c)) => c.run(),
        Some(Command::Sign(c)) => c.run(),
        Some(Command::Verify(c)) => c.run(),
        None => {
            let _ = Cli::command().print_help();
            Ok(ExitCode::from(2))
        }
    }
}

#[cfg(test)]
mod tests {
    /// clap checks a command line's definition only when it is used: every
    /// subcommand, at once, here.
    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }

    /// `--help` shows the carried README.txt: a Windows bundle's (scripts/build-dist.sh
    /// packs installer/windows/README.txt for a Windows target) names Windows paths and
    /// the service, never the Unix wrapper.
    #[test]
    fn each_systems_readme_names_its_own_paths_and_commands() {
        let windows = include_str!("../../../installer/windows/README.txt");
        let unix = include_str!("../../../installer/README.txt");
        for unix_only in ["/opt", "agent-wrapper.sh", "--install="] {
            assert!(
                !windows.contains(unix_only),
                "{unix_only} in the Windows README"
            );
        }
        assert!(windows.contains(r"C:\Program Files\agent\bin\agent-service.exe"));
        assert!(unix.contains("current/bin/agent-wrapper.sh start"));
    }
}
