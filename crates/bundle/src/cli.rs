//! Command line of `agent-bundle`. Exit codes: 0 success, 1 failure, 2 bad usage.

use crate::service::ServiceRequest;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use agent_extract::atomic;
use agent_extract::payload::Payload;
use agent_extract::verify::{self, Verified};
use agent_protocol::layout;
use agent_protocol::minisign::Signature;
use agent_protocol::version::AgentVersion;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::error::{BundleError, IoContext, Result};
use crate::install::{self, InstallRequest, TrustSource};
use crate::keygen;
use crate::pack::{self, PackRequest};
use crate::shipped_key::Verdict;

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
    #[arg(long = "label", value_name = "KEY=VALUE", requires = "install")]
    labels: Vec<String>,

    /// With --install: the update server the agent talks to (server.urls).
    #[arg(long, value_name = "URL", requires = "install")]
    server_url: Option<String>,

    /// With --install: the HTTP proxy the agent reaches its server through
    /// (server.proxy): http://[user:password@]host:port, or "none" to ignore the
    /// environment's https_proxy.
    #[arg(long, value_name = "URL", requires = "install")]
    proxy: Option<String>,

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
    /// Make a signing key pair: update.key (secret, keep offline) and update.pub.
    Keygen {
        /// Directory to write the keys into.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// Overwrite existing key files.
        #[arg(long)]
        force: bool,
    },
    /// Pack a distribution directory into a signed bundle.
    Pack {
        /// Distribution directory, laid out like versions/<v>/ (bin/agent, conf.default/, ...).
        #[arg(long, value_name = "DIR")]
        dist: PathBuf,
        /// Agent version, e.g. 2.2.0.
        #[arg(long = "version", value_name = "V")]
        agent_version: String,
        /// Build number, e.g. 1234.
        #[arg(long, value_name = "N")]
        build: String,
        /// Rust target triple the distribution runs on.
        #[arg(long, value_name = "TRIPLE", default_value = layout::PLATFORM)]
        platform: String,
        /// Secret key file (from `agent-bundle keygen` or `minisign -G -W`).
        #[arg(long, value_name = "FILE")]
        key: PathBuf,
        /// Output directory for agent-bundle-V and agent-bundle-V.minisig.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// Executable to put in front of the payload (default: this agent-bundle).
        #[arg(long, value_name = "FILE")]
        stub: Option<PathBuf>,
        /// Signing time in unix seconds for the trusted comment (default: now). Agents
        /// refuse a bundle signed before the one they run.
        #[arg(long, value_name = "SECS")]
        signed_at: Option<u64>,
        /// A key rotation statement from `rotate-key` (repeatable, oldest first): agents
        /// that trust an older key follow the chain to the signing key.
        #[arg(long, value_name = "FILE")]
        rotation: Vec<PathBuf>,
        /// Pack although DIST/conf.default/update.pub is not the signing key's public
        /// half and no --rotation leads from it (a deliberate rotation: fresh installs
        /// then need --trust-key).
        #[arg(long)]
        allow_other_key: bool,
    },
    /// Hand trust from the current signing key to a new one: writes
    /// DIR/rotation-<new key id>.minisig (NEW.pub signed by OLD.key) and a copy of NEW.pub.
    ///
    /// Pack the next bundles with the new key and `--rotation DIR/rotation-<id>.minisig`;
    /// agents that trust the old key follow it and then trust only the new one. Check a
    /// statement by hand with
    /// `minisign -Vm DIR/rotation-<id>.pub -x DIR/rotation-<id>.minisig -p OLD.pub`.
    RotateKey {
        /// The current (old) secret key.
        #[arg(long, value_name = "OLD.key")]
        old: PathBuf,
        /// The new key's public half (from `agent-bundle keygen`).
        #[arg(long, value_name = "NEW.pub")]
        new: PathBuf,
        /// Directory to write the statement into.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
    /// Make the delta that rebuilds bundle NEW from bundle OLD (what the server serves at
    /// /agentupdate/delta; this is the same maker, for a look at what a release costs).
    Delta {
        /// The bundle agents run now.
        old: PathBuf,
        /// The bundle they update to.
        new: PathBuf,
        /// Where to write the delta.
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
    },
    /// Rebuild a bundle from the bundle a delta starts from and the delta (what an agent
    /// does). Check the result as any downloaded bundle: `agent-bundle verify`.
    ApplyDelta {
        /// The bundle the delta starts from.
        old: PathBuf,
        /// The delta.
        delta: PathBuf,
        /// Where to write the rebuilt bundle.
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
    },
    /// Sign bundles again, today (signed-at now), leaving their bytes as they are: the
    /// way back to a release the fleet ran before (agents refuse an older signature).
    Sign {
        /// The secret key (update.key).
        #[arg(long, value_name = "FILE")]
        key: PathBuf,
        /// The bundles; each gets a fresh FILE.minisig beside it.
        #[arg(required = true, value_name = "FILE")]
        bundles: Vec<PathBuf>,
    },
    /// Verify a bundle's signature, trusted comment and contents.
    Verify {
        /// The bundle file.
        bundle: PathBuf,
        /// The trusted public key.
        #[arg(long = "pub", value_name = "FILE")]
        public_key: PathBuf,
        /// The signature (default: BUNDLE.minisig).
        #[arg(long, value_name = "FILE")]
        sig: Option<PathBuf>,
    },
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
    if let Ok(exe) = this_exe()
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

fn this_exe() -> Result<PathBuf> {
    std::env::current_exe()
        .map_err(|e| BundleError::Invalid(format!("cannot find this executable: {e}")))
}

pub fn run(cli: Cli) -> Result<ExitCode> {
    let exe = this_exe()?;
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
        };
        crate::service::check(&service)?;
        return run_install(
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
            },
        );
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
        Some(Command::Keygen { out, force }) => {
            let keys = keygen::keygen(&out, force)?;
            println!(
                "Wrote {} (secret: keep it offline, never on the server) and {} (key id {}).",
                keys.secret.display(),
                keys.public.display(),
                keys.key_id
            );
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Pack {
            dist,
            agent_version,
            build,
            platform,
            key,
            out,
            stub,
            signed_at,
            rotation,
            allow_other_key,
        }) => {
            let version = AgentVersion::new(&agent_version, &build)?;
            let key = keygen::read_secret_key(&key)?;
            let rotations = rotation
                .iter()
                .map(|p| keygen::read_rotation(p))
                .collect::<Result<Vec<_>>>()?;
            let stub = stub.unwrap_or(exe);
            let packed = pack::pack(&PackRequest {
                dist: &dist,
                version,
                platform,
                key: &key,
                out_dir: &out,
                stub: &stub,
                signed_at,
                rotations: &rotations,
                allow_other_key,
            })?;
            println!(
                "Packed {} ({} bytes, sha256 {}) and {}, signed by key {}.",
                packed.bundle.display(),
                packed.digests.size,
                packed.digests.sha256_hex(),
                packed.signature.display(),
                key.key_id()
            );
            if !rotations.is_empty() {
                println!(
                    "It carries {} key rotation statement(s) ending at key {}.",
                    rotations.len(),
                    key.key_id()
                );
            }
            match &packed.shipped_key {
                Verdict::Matches | Verdict::Refused { .. } => {}
                Verdict::Rotation(chain) => println!(
                    "Fresh installs trust the key it ships ({}) and follow the rotation {chain}.",
                    dist.join("conf.default/update.pub").display()
                ),
                Verdict::Allowed { shipped, signer } => eprintln!(
                    "agent-bundle: warning: the rotation {shipped} -> {signer} has no statement: \
                     {} is key {shipped}, the bundle is signed by key {signer} (--allow-other-key); \
                     fresh installs refuse it unless --install is given --trust-key with key {signer}'s public half",
                    dist.join("conf.default/update.pub").display()
                ),
            }
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Delta { old, new, out }) => {
            let started = std::time::Instant::now();
            let mut file = std::io::BufWriter::new(std::fs::File::create(&out).at(&out)?);
            let made = agent_delta::make::make(&old, &new, &mut file, Default::default())?;
            file.flush().at(&out)?;
            println!(
                "Wrote {} ({} bytes, {:.2} % of the {}-byte bundle) in {:.2}s: {} bytes named in the old bundle, {} sent as they are, {} in {} patch(es).",
                out.display(),
                made.size,
                made.size as f64 * 100.0 / made.bundle_size.max(1) as f64,
                made.bundle_size,
                started.elapsed().as_secs_f64(),
                made.copied,
                made.literal,
                made.patch_bytes,
                made.patched
            );
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::ApplyDelta { old, delta, out }) => {
            let started = std::time::Instant::now();
            let mut file = std::io::BufWriter::new(std::fs::File::create(&out).at(&out)?);
            let header = agent_delta::apply::apply(&old, &delta, &mut file, &out)?;
            file.flush().at(&out)?;
            drop(file);
            let digests =
                agent_protocol::digest::Digests::of_reader(std::fs::File::open(&out).at(&out)?)
                    .at(&out)?;
            if digests.sha256 != header.to {
                let _ = std::fs::remove_file(&out);
                return Err(BundleError::Invalid(format!(
                    "the delta rebuilt {} bytes with sha256 {}, not the bundle it names; nothing kept",
                    digests.size,
                    digests.sha256_hex()
                )));
            }
            println!(
                "Rebuilt {} ({} bytes, sha256 {}) in {:.2}s; check it with agent-bundle verify.",
                out.display(),
                digests.size,
                digests.sha256_hex(),
                started.elapsed().as_secs_f64()
            );
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::RotateKey { old, new, out }) => {
            let files = keygen::rotate_key(&old, &new, &out, pack::now_secs())?;
            println!(
                "Wrote {} (key {} hands trust to key {}) and {}.",
                files.signature.display(),
                files.from,
                files.to,
                files.public.display()
            );
            println!(
                "Pack the next bundles with the new secret key and --rotation {}.",
                files.signature.display()
            );
            println!(
                "Check it by hand with: minisign -Vm {} -x {} -p <old update.pub>",
                files.public.display(),
                files.signature.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Sign { key, bundles }) => {
            let key = keygen::read_secret_key(&key)?;
            let now = pack::now_secs();
            // A glob over a release directory takes its signatures too
            // (`agent-bundle-2.2.0*`): they are what this writes, not bundles.
            let (signatures, bundles): (Vec<PathBuf>, Vec<PathBuf>) = bundles
                .into_iter()
                .partition(|b| b.extension().is_some_and(|e| e == "minisig"));
            for s in &signatures {
                println!("Skipped {}: a signature, not a bundle", s.display());
            }
            if bundles.is_empty() {
                return Err(BundleError::Invalid(
                    "no bundle to sign: only signatures were given; name the agent-bundle-<version>… files".into(),
                ));
            }
            for bundle in &bundles {
                let signed = crate::sign::sign(bundle, &key, now)?;
                println!(
                    "Signed {} again ({} for {}, sha256 {}, signed-at {now}): {}",
                    bundle.display(),
                    signed.claim.version,
                    signed.claim.platform,
                    signed.claim.sha256,
                    signed.signature.display()
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Verify {
            bundle,
            public_key,
            sig,
        }) => Ok(run_verify(&bundle, &public_key, sig.as_deref())),
        None => {
            let _ = Cli::command().print_help();
            Ok(ExitCode::from(2))
        }
    }
}

fn run_install(service: &ServiceRequest<'_>, request: &InstallRequest<'_>) -> Result<ExitCode> {
    let installed = install::install(request)?;
    let home = installed.home.display();
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "Installed agent {} for {} in {home}.",
        installed.facts.version, installed.facts.platform
    );
    let _ = match &installed.trust {
        TrustSource::Operator { path, key_id } => {
            writeln!(
                out,
                "Trusting update key {key_id} from {} (--trust-key); the bundle's signature verified with it.",
                path.display()
            )
        }
        TrustSource::Bundle {
            key_id,
            signature_checked: true,
        } => writeln!(
            out,
            "Trusting update key {key_id} shipped inside the bundle; its signature verified with it. Pass --trust-key to pin your own."
        ),
        TrustSource::Bundle {
            key_id,
            signature_checked: false,
        } => writeln!(
            out,
            "Trusting update key {key_id} shipped inside the bundle; no .minisig beside the bundle, so its signature was NOT checked. Pass --trust-key with the signature to check it."
        ),
    };
    if let Some(chain) = &installed.chain {
        let _ = writeln!(
            out,
            "The bundle is signed by key {} through the key rotation {chain}; the agent trusts key {} and refuses the older keys.",
            chain.end.key_id(),
            chain.end.key_id()
        );
    }
    if request.ca_file.is_some() {
        let _ = writeln!(
            out,
            "HTTPS servers are verified against the CA in {home}/{} only.",
            install::CA_FILE
        );
    }
    if let Some(group) = request.group {
        let _ = writeln!(out, "It joins the rollout group {group} (agent.group).");
    }
    if !request.labels.is_empty() {
        let _ = writeln!(
            out,
            "Its labels: {} (agent.labels).",
            request.labels.join(", ")
        );
    }
    if let Some(url) = request.server_url {
        let _ = writeln!(out, "It talks to the update server {url} (server.urls).");
    }
    if let Some(proxy) = request.proxy {
        let _ = writeln!(
            out,
            "It reaches the server through the proxy {} (server.proxy).",
            install::shown_proxy(proxy)
        );
    }
    if request.enroll_token.is_some() {
        let _ = writeln!(
            out,
            "The enrollment token is in {home}/conf/agent.toml (server.enrollment-token)."
        );
    }
    let started = crate::service::after_install(&installed.home, service)?;
    let _ = writeln!(out, "{started}");
    Ok(ExitCode::SUCCESS)
}

fn run_verify(bundle: &Path, public_key: &Path, sig: Option<&Path>) -> ExitCode {
    let name = bundle
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    match verify_bundle(bundle, public_key, sig) {
        Ok(v) => {
            println!(
                "OK {name}: agent {} for {}, sha256 {}, signed by key {} at {} (unix seconds)",
                v.claim.version,
                v.claim.platform,
                v.claim.sha256,
                v.signature.key_id(),
                v.claim.signed_at
            );
            if let Some(chain) = &v.chain {
                println!("key rotation followed: {chain}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("FAILED {name}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn verify_bundle(bundle: &Path, public_key: &Path, sig: Option<&Path>) -> Result<Verified> {
    let key = install::read_public_key(public_key)?;
    let sig_path = sig
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(format!("{}.minisig", bundle.display())));
    let text = atomic::read_text(&sig_path, 64 * 1024)?;
    let signature = Signature::parse(&text)
        .map_err(|e| BundleError::Invalid(format!("{}: {e}", sig_path.display())))?;
    Ok(verify::verify_file(
        bundle,
        &signature,
        &verify::Trust::key(&key),
    )?)
}

#[cfg(test)]
mod tests {
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
