//! `agent-bundle apply-delta`: a bundle rebuilt from its base and a delta, as an agent does.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::error::{BundleError, IoContext, Result};

/// Rebuild a bundle from the bundle a delta starts from and the delta (what an agent
/// does). Check the result as any downloaded bundle: `agent-bundle verify`.
#[derive(Debug, clap::Args)]
pub struct ApplyDelta {
    /// The bundle the delta starts from.
    old: PathBuf,
    /// The delta.
    delta: PathBuf,
    /// Where to write the rebuilt bundle.
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
}

impl ApplyDelta {
    pub fn run(self) -> Result<ExitCode> {
        let ApplyDelta { old, delta, out } = self;
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
}
