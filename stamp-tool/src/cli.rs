//! Command line of `stamp`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Fake versions to test version skew.
#[derive(Debug, Parser)]
#[command(name = "stamp", version)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Rewrite the version an installed agent believes it runs.
    Agent {
        /// AGENT_HOME (the directory with current/, conf/, data/).
        #[arg(long, value_name = "DIR")]
        home: PathBuf,
        /// Only print the current stamp.
        #[arg(long)]
        show: bool,
        /// The version the agent will believe it runs, e.g. 2.1.0 (SemVer, no +build).
        #[arg(long = "version", value_name = "V", required_unless_present = "show")]
        agent_version: Option<String>,
        /// The build number to go with it, e.g. 1100.
        #[arg(long, value_name = "N", required_unless_present = "show")]
        build: Option<String>,
    },
    /// Rewrite the server's bundle as another version and sign it again.
    Server {
        /// The server's download directory (server-home/downloads/agent).
        #[arg(long, value_name = "DIR")]
        bundle_dir: PathBuf,
        /// The version the re-packed bundle will carry, e.g. 2.3.0 (SemVer, no +build).
        #[arg(long = "version", value_name = "V")]
        agent_version: String,
        /// The build number to go with it, e.g. 1.
        #[arg(long, value_name = "N")]
        build: String,
        /// The secret key the bundle was signed with (it must verify with it).
        #[arg(long, value_name = "FILE")]
        key: PathBuf,
    },
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
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stamp: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> crate::Result<()> {
    match cli.command {
        Command::Agent {
            home, show: true, ..
        } => {
            println!("{}", crate::show_agent(&home)?);
        }
        Command::Agent {
            home,
            agent_version,
            build,
            ..
        } => {
            let version = crate::parse_version(
                agent_version.as_deref().unwrap_or_default(),
                build.as_deref().unwrap_or_default(),
            )?;
            let was = crate::stamp_agent(&home, &version)?;
            println!(
                "stamped the agent at {} as {version} (was {was}); restart it to meet the server: current/bin/agent-wrapper.sh restart",
                home.display()
            );
        }
        Command::Server {
            bundle_dir,
            agent_version,
            build,
            key,
        } => {
            let version = crate::parse_version(&agent_version, &build)?;
            let stamped = crate::stamp_server(&bundle_dir, &version, &key)?;
            println!(
                "stamped the server's bundle as {version} (was {}): {} sha256 {}; agents of that server now update to it",
                stamped.was,
                stamped.bundle.display(),
                stamped.sha256
            );
        }
    }
    Ok(())
}
