//! Generates the OpAMP message types from `proto/opamp.proto` without a `protoc`
//! binary: protox parses the file in Rust, prost-build writes the code.

use std::path::PathBuf;

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/opamp.proto");
    let descriptors = protox::compile(["opamp.proto"], ["proto"])?;
    // Kept beside the code so a check can compare field numbers with other
    // clients' descriptors (tests/clients/check_descriptor.py).
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("opamp.fds"), descriptors.encode_to_vec())?;
    prost_build::Config::new()
        // Ordered maps: encoding the same message twice gives the same bytes.
        .btree_map(["."])
        .compile_fds(descriptors)?;
    Ok(())
}
