use std::process::ExitCode;

fn main() -> ExitCode {
    agent::cli::main()
}
