//! `agent-service`'s command line, one parser for both systems: the command, `--home`,
//! and the options only the Windows service takes (`--service-name`, `--after`,
//! `--no-start`), which the Unix half refuses by name. Pure: tested without a process.

use std::path::PathBuf;

/// What the command line asked for.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Args {
    /// The command (`start`, `stop`, …); `help` for `-h`/`--help`; empty when none was
    /// given.
    pub command: String,
    /// `--home`: the agent's home, when not found from the program's own path.
    pub home: Option<PathBuf>,
    /// `--service-name` (Windows).
    pub service_name: Option<String>,
    /// `--after PID` (Windows): wait for that process to end first.
    pub after: Option<u32>,
    /// `--no-start` (Windows): install the service without starting it.
    pub no_start: bool,
}

impl Args {
    /// The Windows-only option given, if any: the Unix half refuses it by name.
    pub fn windows_option(&self) -> Option<&'static str> {
        if self.service_name.is_some() {
            Some("--service-name")
        } else if self.after.is_some() {
            Some("--after")
        } else if self.no_start {
            Some("--no-start")
        } else {
            None
        }
    }
}

/// Reads the arguments after the program's name; the error says which one is wrong.
pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Args, String> {
    let mut args = args.into_iter();
    let mut parsed = Args::default();
    while let Some(arg) = args.next() {
        let mut value = |flag: &str| args.next().ok_or_else(|| format!("{flag} needs a value"));
        match arg.as_str() {
            "--home" => parsed.home = Some(PathBuf::from(value("--home")?)),
            "--service-name" => parsed.service_name = Some(value("--service-name")?),
            "--after" => {
                let pid = value("--after")?;
                parsed.after = Some(
                    pid.parse()
                        .map_err(|_| format!("--after {pid}: not a pid"))?,
                );
            }
            "--no-start" => parsed.no_start = true,
            "-h" | "--help" => parsed.command = "help".into(),
            flag if flag.starts_with('-') => return Err(format!("unknown option {flag}")),
            command if parsed.command.is_empty() => parsed.command = command.to_owned(),
            extra => return Err(format!("unexpected argument {extra}")),
        }
    }
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Result<Args, String> {
        parse(line.split_whitespace().map(str::to_owned))
    }

    #[test]
    fn a_command_with_its_home() {
        let a = args("status --home /opt/agent").unwrap();
        assert_eq!(a.command, "status");
        assert_eq!(a.home, Some(PathBuf::from("/opt/agent")));
        assert_eq!(a.windows_option(), None);
        assert_eq!(args("").unwrap(), Args::default());
        assert_eq!(args("-h").unwrap().command, "help");
    }

    #[test]
    fn the_windows_options_are_read_and_named() {
        let a = args("install --service-name agent2 --after 42 --no-start").unwrap();
        assert_eq!(a.service_name.as_deref(), Some("agent2"));
        assert_eq!(a.after, Some(42));
        assert!(a.no_start);
        assert_eq!(a.windows_option(), Some("--service-name"));
        assert_eq!(
            args("run --no-start").unwrap().windows_option(),
            Some("--no-start")
        );
    }

    #[test]
    fn a_wrong_argument_is_named() {
        assert_eq!(args("start --home").unwrap_err(), "--home needs a value");
        assert_eq!(args("start --after x").unwrap_err(), "--after x: not a pid");
        assert_eq!(args("start --force").unwrap_err(), "unknown option --force");
        assert_eq!(args("start stop").unwrap_err(), "unexpected argument stop");
    }
}
