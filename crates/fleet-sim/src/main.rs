//! `fleet-sim`: the command line is the library's ([`fleet_sim::cli`]).

use std::process::ExitCode;

/// The simulators share the machine with the servers they load: the server's allocator,
/// so that a simulated agent costs as little processor as a served one.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    fleet_sim::cli::main()
}
