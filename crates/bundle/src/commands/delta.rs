//! `agent-bundle delta`: the delta that rebuilds one bundle from another.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::error::{IoContext, Result};

/// Make the delta that rebuilds bundle NEW from bundle OLD (what the server serves at
/// /agentupdate/delta; this is the same maker, for a look at what a release costs).
#[derive(Debug, clap::Args)]
pub struct Delta {
    /// The bundle agents run now.
    old: PathBuf,
    /// The bundle they update to.
    new: PathBuf,
    /// Where to write the delta.
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
}

impl Delta {
    pub fn run(self) -> Result<ExitCode> {
        let Delta { old, new, out } = self;
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
}
