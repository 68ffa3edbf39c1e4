//! An installed agent's log files in `logs/`, rotated by size so that a machine that
//! runs for years never fills its disk with them (`[log]` in agent.toml: `max-size`,
//! `keep`). Here, beside the updater's own log, so that every program of the
//! installation (the agent, the updater, the supervisor) can share it.
//!
//! A file past `max-size` is renamed `<name>.1`, an older `<name>.1` becomes `<name>.2`
//! and so on up to `<name>.<keep>`; the one past `keep` is deleted. So at most
//! `keep + 1` files of each name remain, and nothing older than the `keep` rotated
//! copies is ever dropped.
//!
//! - `agent.log`, which the agent writes itself, rotates as it is written
//!   ([`RotatingFile`]): before a line that would take it past `max-size`.
//! - `agent.out`, the agent's console that `agent-wrapper.sh` redirects to, rotates
//!   with it: when the agent's stderr is that very file, the agent renames it and puts
//!   a new `agent.out` in its place (Unix; a redirect cannot be moved otherwise).
//! - `update.log`, `update.out` (the updater's, appended to for each update) and
//!   `wrapper.log` are rotated when the agent starts, if they are past `max-size`:
//!   they grow by a few lines per update or start, and an agent starts after each.
//!
//! Whether to rotate ([`due`]) and what to rename ([`plan`]) are pure; [`rotate`] does
//! what the plan says.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// How big a log file grows and how many rotated copies of it are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Bytes; 0: never rotated.
    pub max_size: u64,
    /// Rotated copies kept (`<name>.1` … `<name>.<keep>`).
    pub keep: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_size: 10 * MIB,
            keep: 5,
        }
    }
}

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const GIB: u64 = 1024 * MIB;

/// A size as written in agent.toml: `"10MiB"`, `"512KiB"`, `"1GiB"`, `"5MB"`, or bytes
/// (`"4096"`, `"4096B"`); `"0"`: no limit.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let bad = || {
        format!("{text:?} is not a size; write it like \"10MiB\", \"512KiB\", \"1GiB\" or bytes")
    };
    let number: u64 = number.parse().map_err(|_| bad())?;
    let scale = match unit.trim() {
        "" | "B" => 1,
        "KiB" | "K" => KIB,
        "MiB" | "M" => MIB,
        "GiB" | "G" => GIB,
        "kB" | "KB" => 1000,
        "MB" => 1000 * 1000,
        "GB" => 1000 * 1000 * 1000,
        _ => return Err(bad()),
    };
    number.checked_mul(scale).ok_or_else(bad)
}

/// Whether a log file of `size` bytes must be rotated before `incoming` more bytes go
/// in. An empty file never is (a single line longer than the limit still goes in).
pub fn due(size: u64, incoming: u64, limits: Limits) -> bool {
    limits.max_size > 0 && size > 0 && size.saturating_add(incoming) > limits.max_size
}

/// `<path>.<n>`.
pub fn numbered(path: &Path, n: u32) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{n}"));
    PathBuf::from(name)
}

/// One file operation of a rotation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Remove(PathBuf),
    Rename { from: PathBuf, to: PathBuf },
}

/// The operations that rotate `path` keeping `keep` copies, in order: the oldest copy
/// removed, each other copy moved one up, the file itself to `.1`. With `keep` 0 the
/// file is removed (it starts again empty).
pub fn plan(path: &Path, keep: u32) -> Vec<Step> {
    if keep == 0 {
        return vec![Step::Remove(path.to_owned())];
    }
    let mut steps = vec![Step::Remove(numbered(path, keep))];
    for n in (1..keep).rev() {
        steps.push(Step::Rename {
            from: numbered(path, n),
            to: numbered(path, n + 1),
        });
    }
    steps.push(Step::Rename {
        from: path.to_owned(),
        to: numbered(path, 1),
    });
    steps
}

/// Rotates `path` (see [`plan`]); a copy that is not there is skipped.
pub fn rotate(path: &Path, keep: u32) -> io::Result<()> {
    for step in plan(path, keep) {
        let done = match &step {
            Step::Remove(p) => std::fs::remove_file(p),
            Step::Rename { from, to } => std::fs::rename(from, to),
        };
        match done {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

/// Rotates `path` if it is already past `max-size` (a file another process fills, at
/// the start of its writer). True if it was rotated.
pub fn rotate_if_due(path: &Path, limits: Limits) -> io::Result<bool> {
    let size = match std::fs::metadata(path) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    if !due(size, 1, limits) {
        return Ok(false);
    }
    rotate(path, limits.keep)?;
    Ok(true)
}

/// The files of `logs/` the agent rotates when it starts (see the module doc).
pub const ROTATED_AT_START: &[&str] = &["update.log", "update.out", "wrapper.log"];

/// Rotates the files of [`ROTATED_AT_START`] that are past `max-size`; what could not
/// be rotated is said on stderr and left to grow (a log never stops the agent).
pub fn rotate_at_start(logs: &Path, limits: Limits) {
    for name in ROTATED_AT_START {
        let path = logs.join(name);
        if let Err(e) = rotate_if_due(&path, limits) {
            let _ = writeln!(
                io::stderr(),
                "agent: cannot rotate {}: {e}; it keeps growing",
                path.display()
            );
        }
    }
}

/// A log file that rotates itself before a write would take it past `max-size`, and
/// rotates its twin on the console (`agent.out`) at the same time. For
/// `tracing_appender::non_blocking`, which writes each line with one `write_all`.
pub struct RotatingFile {
    path: PathBuf,
    limits: Limits,
    file: File,
    size: u64,
    /// `logs/agent.out` when it is this process's stderr.
    console: Option<PathBuf>,
    /// Said once: rotation fails (the file keeps growing).
    failed: bool,
}

impl RotatingFile {
    /// Opens `path` for appending, rotating it first if it is past `max-size`; with
    /// `console`, the file stderr is redirected to is rotated alongside, if it is it.
    pub fn open(path: &Path, limits: Limits, console: Option<&Path>) -> io::Result<Self> {
        rotate_if_due(path, limits)?;
        let file = append(path)?;
        let size = file.metadata()?.len();
        let console = console.filter(|c| stderr_is(c)).map(Path::to_owned);
        let mut this = Self {
            path: path.to_owned(),
            limits,
            file,
            size,
            console,
            failed: false,
        };
        this.rotate_console();
        Ok(this)
    }

    fn rotate(&mut self) {
        let rotated = rotate(&self.path, self.limits.keep).and_then(|()| append(&self.path));
        match rotated {
            Ok(file) => {
                self.file = file;
                self.size = 0;
                self.failed = false;
            }
            Err(e) => {
                if !self.failed {
                    self.failed = true;
                    let _ = writeln!(
                        io::stderr(),
                        "agent: cannot rotate {}: {e}; it keeps growing",
                        self.path.display()
                    );
                }
                // Not again before another max-size of lines.
                self.size = 0;
            }
        }
        self.rotate_console();
    }

    /// Rotates the console file if it is past `max-size` and still this process's
    /// stderr, and points stderr at a new one.
    fn rotate_console(&mut self) {
        let Some(console) = &self.console else {
            return;
        };
        let size = std::fs::metadata(console).map(|m| m.len()).unwrap_or(0);
        if !due(size, 1, self.limits) || !stderr_is(console) {
            return;
        }
        if let Err(e) = rotate(console, self.limits.keep)
            .and_then(|()| append(console))
            .and_then(redirect_stderr)
        {
            let _ = writeln!(
                io::stderr(),
                "agent: cannot rotate {}: {e}; it keeps growing",
                console.display()
            );
            self.console = None;
        }
    }
}

impl Write for RotatingFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if due(self.size, buf.len() as u64, self.limits) {
            self.rotate();
        }
        let n = self.file.write(buf)?;
        self.size += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

fn append(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

/// Whether this process's stderr is the file at `path` (the same inode).
#[cfg(unix)]
fn stderr_is(path: &Path) -> bool {
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;

    let Ok(fd) = io::stderr().as_fd().try_clone_to_owned() else {
        return false;
    };
    match (File::from(fd).metadata(), std::fs::metadata(path)) {
        (Ok(ours), Ok(theirs)) => {
            ours.is_file() && ours.dev() == theirs.dev() && ours.ino() == theirs.ino()
        }
        _ => false,
    }
}

/// Windows: the service opened agent.out for the agent; it is not moved under it.
#[cfg(not(unix))]
fn stderr_is(_: &Path) -> bool {
    false
}

#[cfg(unix)]
fn redirect_stderr(file: File) -> io::Result<()> {
    nix::unistd::dup2_stderr(&file).map_err(io::Error::from)
}

#[cfg(not(unix))]
fn redirect_stderr(_: File) -> io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: Limits = Limits {
        max_size: 100,
        keep: 2,
    };

    #[test]
    fn sizes_are_read_with_their_units() {
        assert_eq!(parse_size("10MiB"), Ok(10 * 1024 * 1024));
        assert_eq!(parse_size(" 512KiB "), Ok(512 * 1024));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("5MB"), Ok(5_000_000));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4096B"), Ok(4096));
        assert_eq!(parse_size("0"), Ok(0));
        for bad in [
            "",
            "MiB",
            "10 parsecs",
            "-1MiB",
            "1.5MiB",
            "99999999999999GiB",
        ] {
            let err = parse_size(bad).unwrap_err();
            assert!(err.contains("MiB"), "{bad}: {err}");
        }
    }

    #[test]
    fn a_file_rotates_before_a_write_would_pass_the_limit() {
        assert!(!due(0, 500, SMALL), "an empty file takes any line");
        assert!(!due(50, 50, SMALL), "exactly at the limit is within it");
        assert!(due(50, 51, SMALL));
        assert!(due(101, 1, SMALL));
        let unlimited = Limits {
            max_size: 0,
            keep: 2,
        };
        assert!(!due(u64::MAX, 1, unlimited));
        assert!(due(u64::MAX, u64::MAX, SMALL), "no overflow");
    }

    #[test]
    fn the_plan_shifts_the_copies_and_drops_the_oldest() {
        let p = Path::new("/h/logs/agent.log");
        let n = |i| numbered(p, i);
        assert_eq!(
            plan(p, 3),
            vec![
                Step::Remove(n(3)),
                Step::Rename {
                    from: n(2),
                    to: n(3)
                },
                Step::Rename {
                    from: n(1),
                    to: n(2)
                },
                Step::Rename {
                    from: p.to_owned(),
                    to: n(1)
                },
            ]
        );
        assert_eq!(
            plan(p, 1),
            vec![
                Step::Remove(n(1)),
                Step::Rename {
                    from: p.to_owned(),
                    to: n(1)
                }
            ]
        );
        assert_eq!(plan(p, 0), vec![Step::Remove(p.to_owned())]);
        assert_eq!(n(2), Path::new("/h/logs/agent.log.2"));
    }

    #[test]
    fn rotating_keeps_at_most_keep_copies_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("update.out");
        for round in 0..5 {
            std::fs::write(&log, format!("round {round}\n").repeat(20)).unwrap();
            assert!(rotate_if_due(&log, SMALL).unwrap());
        }
        assert!(!log.exists());
        let mut names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["update.out.1", "update.out.2"]);
        let first = |i| {
            std::fs::read_to_string(numbered(&log, i))
                .unwrap()
                .lines()
                .next()
                .unwrap()
                .to_owned()
        };
        assert_eq!((first(1), first(2)), ("round 4".into(), "round 3".into()));
        // Small or missing: left alone.
        std::fs::write(&log, "short\n").unwrap();
        assert!(!rotate_if_due(&log, SMALL).unwrap());
        assert!(!rotate_if_due(&dir.path().join("none"), SMALL).unwrap());
    }

    #[test]
    fn a_rotating_file_never_holds_more_than_the_limit_and_loses_only_what_keep_drops() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("agent.log");
        let mut file = RotatingFile::open(&log, SMALL, None).unwrap();
        for i in 0..30 {
            file.write_all(format!("line {i:02} ........\n").as_bytes())
                .unwrap();
        }
        file.flush().unwrap();
        drop(file);
        let mut names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["agent.log", "agent.log.1", "agent.log.2"]);
        let mut kept = String::new();
        for path in [numbered(&log, 2), numbered(&log, 1), log.clone()] {
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(text.len() <= 100, "{}: {}", path.display(), text.len());
            kept.push_str(&text);
        }
        // 20 bytes a line, 5 lines a file: the last 15 lines, in order.
        let lines: Vec<_> = kept.lines().collect();
        assert_eq!(lines.len(), 15, "{kept}");
        assert!(lines[0].starts_with("line 15") && lines[14].starts_with("line 29"));

        // Reopened past the limit, it rotates first.
        std::fs::write(&log, "x".repeat(150)).unwrap();
        let file = RotatingFile::open(&log, SMALL, None).unwrap();
        assert_eq!(file.size, 0);
        assert_eq!(std::fs::read(numbered(&log, 1)).unwrap().len(), 150);
    }
}
