//! Command line of `agent`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::home::Installation;

/// The agent daemon and its maintenance commands.
#[derive(Debug, Parser)]
#[command(name = "agent", disable_version_flag = true)]
pub struct Cli {
    /// AGENT_HOME (default: found from this binary's location, <home>/current/bin/agent).
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
    /// Run in the foreground (what agent-wrapper.sh starts).
    Run,
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
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let install = Installation::discover(cli.home.as_deref())?;
    if cli.version {
        println!(
            "agent {} ({})",
            install.version,
            agent_protocol::layout::PLATFORM
        );
        return Ok(ExitCode::SUCCESS);
    }
    match cli.command {
        Some(Command::Run) | None => anyhow::bail!("agent run is not built yet"),
    }
}
