//! `agent-launcher.exe`, installed as `<home>\bin\agent.exe`: runs the current version's
//! `agent.exe` (see `agent_service::launcher`).

fn main() -> std::process::ExitCode {
    agent_service::launcher::run(std::env::args_os().skip(1).collect())
}
