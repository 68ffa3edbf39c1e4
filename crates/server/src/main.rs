//! `update-server`: the command line is the library's ([`update_server::cli`]).

use std::process::ExitCode;

/// Every held connect allocates and frees small objects by the dozen (its HTTP/2
/// stream, headers, JSON, the contact it leaves): with glibc's malloc, `malloc` and
/// `free` were in about 15 % of the samples of a server holding 20,000 agents (perf),
/// and mimalloc took 7 % off its processor (BENCHMARKS.md, "Holding a server's share
/// of the fleet").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    update_server::cli::main()
}
