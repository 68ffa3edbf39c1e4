//! The `fleet-sim` command line: its flags, checked, as [`crate::Options`]; the
//! binary's `main` only calls [`main`]. The process's edge: errors are `anyhow`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use agent_protocol::settings::parse_duration;
use clap::{Parser, ValueEnum};

use crate::{DownloadMode, Options};

/// Simulates a fleet of agents against update-servers and reports what it measured.
#[derive(Debug, Parser)]
#[command(name = "fleet-sim", version)]
pub struct Cli {
    /// An update-server's base URL (HOST:PORT is http://HOST:PORT); several are tried
    /// in order, as agents fail over.
    #[arg(long = "server", value_name = "URL", required = true, value_parser = agent_protocol::server_url::base_url)]
    servers: Vec<String>,
    /// How many agents.
    #[arg(long, default_value_t = 1000)]
    agents: usize,
    /// The version every agent starts on (VERSION+BUILD).
    #[arg(long, value_name = "VERSION+BUILD", default_value = "1.0.0+1")]
    agent_version: String,
    /// Heartbeat interval (e.g. 30s).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    heartbeat: Duration,
    /// Each heartbeat waits heartbeat × (1 ± jitter).
    #[arg(long, default_value_t = 0.2)]
    jitter: f64,
    /// What a refused agent fetches: the whole bundle, or HEAD and its first 64 KiB.
    #[arg(long, value_enum, default_value_t = Download::Full)]
    download: Download,
    /// How long a simulated install takes.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    install_time: Duration,
    /// Probability (0–1) that an install fails (INSTALL_FAILED, never retried).
    #[arg(long, default_value_t = 0.0)]
    fail_rate: f64,
    /// Agents start spread over this long.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    ramp: Duration,
    /// NAME=SHARE: that share (0–1) of the agents say they are in group NAME.
    #[arg(long = "group", value_name = "NAME=SHARE")]
    groups: Vec<String>,
    /// TARGET=SHARE: that share (0–1) of the agents say they run on that platform (a
    /// Rust target triple) and ask for its bundle (OpAMP agents describe it as `os.type`
    /// and `host.arch`); spread over the whole fleet, so every wave mixes them. The rest
    /// run on this machine's platform.
    #[arg(long = "platform", value_name = "TARGET=SHARE")]
    platforms: Vec<String>,
    /// Stop after this long.
    #[arg(long, value_parser = parse_duration)]
    duration: Option<Duration>,
    /// Stop when the rollout of a new version completes or halts (needs --token).
    #[arg(long)]
    until_rollout_end: bool,
    /// Admin token, to watch /admin/rollout (default: UPDATE_SERVER_ADMIN_TOKEN).
    #[arg(long, env = "UPDATE_SERVER_ADMIN_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Seconds between progress lines.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    progress: Duration,
    /// Latencies of the first this-long are not counted (e.g. while agents register).
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    warmup: Duration,
    /// Also write the summary as JSON to this file.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Long-poll as real agents do by default (connect?wait=HEARTBEAT): the server holds
    /// each connect until something changes for the agent. Without it, agents heartbeat.
    #[arg(long)]
    long_poll: bool,
    /// What the agents speak: this project's protocol, or OpAMP on /v1/opamp.
    #[arg(long, value_enum, default_value_t = Protocol::Native)]
    protocol: Protocol,
    /// How OpAMP agents reach the server: a POST per heartbeat, or one WebSocket each.
    #[arg(long, value_enum, default_value_t = Transport::Http)]
    transport: Transport,
    /// OpAMP agents verify an offered package's signature with this public key file
    /// (without it, only that the signature vouches for the offered version and hash).
    #[arg(long, value_name = "FILE")]
    trust_key: Option<PathBuf>,
    /// OpAMP agents send this as their bearer (the server's agents.enrollment-token).
    #[arg(
        long,
        env = "UPDATE_SERVER_AGENTS_ENROLLMENT_TOKEN",
        hide_env_values = true
    )]
    enrollment_token: Option<String>,
    /// Agents that update ask for a delta from the bundle they run first
    /// (/agentupdate/delta), and download the bundle when the server has none (404). They
    /// learn that bundle's sha256 from /agentupdate/version when they start, so start
    /// the simulation before the new release is dropped. Native protocol only.
    #[arg(long)]
    deltas: bool,
    /// Before a whole download, agents ask /agentupdate/version and take the bundle from
    /// the download source it names (the server's downloads.public-url) as real agents
    /// do, from the server when that fails; their INSTALLING report says which.
    #[arg(long)]
    download_source: bool,
    /// Agents told of a release behind their maintenance window do not fetch it before
    /// the window opens (a real agent's `update.download-ahead = false`).
    #[arg(long)]
    no_download_ahead: bool,
    /// Native agents share N HTTP/2 connections to the servers (h2c), agent i on the
    /// i mod N-th, instead of a connection per request: one process then simulates more
    /// held agents than its file limit allows. 0: HTTP/1.1, as real agents connect.
    #[arg(long, value_name = "N", default_value_t = 0)]
    http2: usize,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Protocol {
    Native,
    Opamp,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Transport {
    Http,
    Ws,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Download {
    Full,
    Head,
}

/// The whole program: parses the command line, runs the simulation, says an error once.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fleet-sim: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `NAME=SHARE` arguments of `--flag`, checked.
fn shares(flag: &str, example: &str, args: &[String]) -> anyhow::Result<Vec<(String, f64)>> {
    let mut out = Vec::new();
    for arg in args {
        let (name, share) = arg
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--{flag} {arg:?}: write it as {example}"))?;
        let share: f64 = share
            .parse()
            .ok()
            .filter(|s| (0.0..=1.0).contains(s))
            .ok_or_else(|| {
                anyhow::anyhow!("--{flag} {arg:?}: the share is a number between 0 and 1")
            })?;
        out.push((name.to_owned(), share));
    }
    if out.iter().map(|(_, s)| s).sum::<f64>() > 1.0 + 1e-9 {
        anyhow::bail!("--{flag}: the shares add up to more than 1");
    }
    Ok(out)
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let groups = shares("group", "NAME=SHARE, e.g. canary=0.01", &cli.groups)?;
    let platforms = shares(
        "platform",
        "TARGET=SHARE, e.g. aarch64-unknown-linux-gnu=0.3",
        &cli.platforms,
    )?;
    if cli.deltas && matches!(cli.protocol, Protocol::Opamp) {
        anyhow::bail!("--deltas is for native agents (OpAMP packages have no deltas)");
    }
    if !(0.0..=1.0).contains(&cli.fail_rate) {
        anyhow::bail!("--fail-rate is a probability between 0 and 1");
    }
    let trust_key = match &cli.trust_key {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("--trust-key {}: {e}", path.display()))?;
            Some(
                agent_protocol::minisign::PublicKey::parse(&text).map_err(|e| {
                    anyhow::anyhow!(
                        "--trust-key {}: not a minisign public key: {e}",
                        path.display()
                    )
                })?,
            )
        }
        None => None,
    };
    let options = Options {
        servers: cli.servers,
        agents: cli.agents,
        version: cli.agent_version.parse()?,
        heartbeat: cli.heartbeat,
        jitter: cli.jitter.clamp(0.0, 1.0),
        download: match cli.download {
            Download::Full => DownloadMode::Full,
            Download::Head => DownloadMode::Head,
        },
        install_time: cli.install_time,
        fail_rate: cli.fail_rate,
        ramp: cli.ramp,
        groups,
        platforms,
        duration: cli.duration,
        until_rollout_end: cli.until_rollout_end,
        admin_token: cli.token,
        progress: cli.progress.max(Duration::from_millis(100)),
        warmup: cli.warmup,
        long_poll: cli.long_poll,
        protocol: match cli.protocol {
            Protocol::Native => crate::Protocol::Native,
            Protocol::Opamp => crate::Protocol::Opamp,
        },
        transport: match cli.transport {
            Transport::Http => crate::opamp::Transport::Http,
            Transport::Ws => crate::opamp::Transport::WebSocket,
        },
        trust_key,
        enrollment_token: cli.enrollment_token,
        deltas: cli.deltas,
        download_source: cli.download_source,
        download_ahead: !cli.no_download_ahead,
        http2_connections: cli.http2,
    };
    let runtime = tokio::runtime::Runtime::new()?;
    let report = runtime.block_on(crate::run(options))?;
    print!("{}", crate::render(&report));
    if let Some(path) = cli.json {
        std::fs::write(&path, serde_json::to_vec_pretty(&report)?)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn shares_are_checked_and_may_not_add_up_past_one() {
        let args = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let ok = shares("group", "NAME=SHARE", &args(&["canary=0.25", "b=0.5"])).unwrap();
        assert_eq!(ok, [("canary".to_owned(), 0.25), ("b".to_owned(), 0.5)]);
        for bad in [&["canary"][..], &["canary=2"], &["a=0.6", "b=0.6"]] {
            assert!(
                shares("group", "NAME=SHARE", &args(bad)).is_err(),
                "{bad:?}"
            );
        }
    }
}
