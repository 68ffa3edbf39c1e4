//! `agent-bundle pack`: a distribution directory into a signed bundle.

use std::path::PathBuf;
use std::process::ExitCode;

use agent_protocol::layout;
use agent_protocol::version::AgentVersion;

use crate::error::Result;
use crate::keygen;
use crate::pack::{self, PackRequest};
use crate::shipped_key::Verdict;

/// Pack a distribution directory into a signed bundle.
#[derive(Debug, clap::Args)]
pub struct Pack {
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
}

impl Pack {
    pub fn run(self) -> Result<ExitCode> {
        let Pack {
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
        } = self;
        let version = AgentVersion::new(&agent_version, &build)?;
        let key = keygen::read_secret_key(&key)?;
        let rotations = rotation
            .iter()
            .map(|p| keygen::read_rotation(p))
            .collect::<Result<Vec<_>>>()?;
        let stub = match stub {
            Some(stub) => stub,
            None => super::this_exe()?,
        };
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
}
