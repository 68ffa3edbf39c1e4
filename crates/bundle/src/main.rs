use std::process::ExitCode;

fn main() -> ExitCode {
    agent_bundle::cli::main()
}
