use std::process::ExitCode;

fn main() -> ExitCode {
    stamp::cli::main()
}
