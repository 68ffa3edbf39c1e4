use std::path::PathBuf;
use std::process::ExitCode;

use agent_protocol::settings::ProcessEnv;
use clap::Parser;

/// Serves one signed agent bundle and enforces the agent version directive.
#[derive(Debug, Parser)]
#[command(name = "update-server", version)]
struct Cli {
    /// Configuration file (TOML); without one, embedded defaults and the environment apply.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Address to listen on (server.listen).
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
    /// Home directory for downloads, caches and the database (server.home).
    #[arg(long, value_name = "DIR")]
    home: Option<PathBuf>,
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
        runtime.block_on(update_server::serve(
            config,
            update_server::shutdown_signal(),
        ))?;
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
