//! Update locks: the workload, or a person on the machine, holds off bundle updates.
//!
//! A lock is a file in `<home>/run/update-locks/`: its name names it, its text is the
//! reason (a workload writes one with `echo "nightly backup" > …/backup`). `agent lock
//! take NAME [--reason R] [--for DURATION]` writes one, with an `expires-at=<unix
//! seconds>` last line for `--for`; an expired lock is not held. A lock of a process
//! that died is still held: the lock's owner says when it is done, not its pid.
//!
//! While a lock is held the agent does not start an update (it downloads and verifies
//! ahead), and reports `DEFERRED`; `update.max-defer` bounds how long one offer waits,
//! and an operator may override at once (`POST /admin/agents/<id>/override-locks`).
//! Configuration sets are not held.

use std::path::{Path, PathBuf};
use std::time::Duration;

use agent_protocol::layout::AgentHome;
use agent_protocol::shown::shown;

/// A lock file bigger than this is read only this far.
const MAX_LOCK_TEXT: usize = 4096;
/// A lock's reason is shown (and reported) cut to this many characters.
const MAX_REASON_CHARS: usize = 200;
/// A lock's name as shown, at most (a name `agent lock take` writes has 64 at most).
const MAX_NAME_CHARS: usize = 64;
/// The locks' text in one `DEFERRED` report, at most: well within what the server takes
/// (a 4.6 kB lock file made the server refuse the report, and the agent dropped it).
pub const MAX_REPORT_TEXT: usize = 1024;
const EXPIRES: &str = "expires-at=";

/// A lock as read from its file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lock {
    pub name: String,
    pub reason: String,
    /// Unix seconds; `None`: until released.
    pub expires_at: Option<u64>,
}

impl Lock {
    /// `name (reason)`, or the name alone: control characters escaped (a name with an
    /// ESC or a newline cannot move a terminal's cursor or forge a line), each cut.
    pub fn describe(&self) -> String {
        let name = shown(&self.name, MAX_NAME_CHARS);
        if self.reason.is_empty() {
            name
        } else {
            format!("{name} ({})", shown(&self.reason, MAX_REASON_CHARS))
        }
    }
}

/// Parses a lock file's text: the reason, and an expiry on a last `expires-at=` line.
pub fn parse(name: &str, text: &str) -> Lock {
    let mut lines: Vec<&str> = text.lines().collect();
    let expires_at = lines
        .last()
        .and_then(|l| l.trim().strip_prefix(EXPIRES))
        .and_then(|t| t.trim().parse::<u64>().ok());
    if expires_at.is_some() {
        lines.pop();
    }
    Lock {
        name: name.to_owned(),
        reason: lines.join(" ").trim().to_owned(),
        expires_at,
    }
}

/// The locks held at `now` (unix seconds), by name; unreadable lock files are held
/// (a lock is a lock) with their trouble as the reason, and said in `warnings`.
pub fn held(home: &AgentHome, now: u64) -> (Vec<Lock>, Vec<String>) {
    let dir = home.update_locks();
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return (Vec::new(), Vec::new());
    };
    let mut locks = Vec::new();
    let mut warnings = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        // Half-written files of `agent lock take` and editors' leftovers.
        if name.starts_with('.') || !entry.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        let lock = match read_capped(&entry.path()) {
            Ok(bytes) => match String::from_utf8(bytes) {
                Ok(text) => parse(&name, &text),
                Err(_) => {
                    warnings.push(format!(
                        "update lock {} is not UTF-8 text; it holds updates all the same (its text is the reason: write it as text)",
                        shown(&entry.path().display().to_string(), 300)
                    ));
                    Lock {
                        name: name.clone(),
                        reason: "its reason is not UTF-8 text".into(),
                        expires_at: None,
                    }
                }
            },
            Err(e) => {
                warnings.push(format!(
                    "update lock {} cannot be read ({e}); it holds updates all the same",
                    shown(&entry.path().display().to_string(), 300)
                ));
                Lock {
                    name: name.clone(),
                    reason: format!("unreadable: {e}"),
                    expires_at: None,
                }
            }
        };
        if lock.expires_at.is_none_or(|t| t > now) {
            locks.push(lock);
        }
    }
    locks.sort_by(|a, b| a.name.cmp(&b.name));
    (locks, warnings)
}

/// A lock file's text, up to [`MAX_LOCK_TEXT`] bytes. Only a regular file with one link
/// is read: its text is published to the fleet's viewers, and a hard link to a file
/// the agent's user may read but the lock's writer may not (a root-only file) would
/// publish that file. The check is made on the opened file, not its name.
fn read_capped(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let file = std::fs::File::open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::other(
            "not a regular file; its text is not read",
        ));
    }
    let links = crate::os::link_count(&meta);
    if links != 1 {
        return Err(std::io::Error::other(format!(
            "it has {links} links (a hard link to another file); its text is not read"
        )));
    }
    let mut bytes = Vec::new();
    file.take(MAX_LOCK_TEXT as u64).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// A lock name is a plain file name a person can type.
pub fn check_name(name: &str) -> Result<(), String> {
    // Not starting with '.': the lock is a file, and hidden ones are a writer's temp files.
    if agent_protocol::names::is_plain(name, 64) && !name.starts_with('.') {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a lock name: use 1 to 64 letters, digits, '.', '_' or '-', not starting with '.'"
        ))
    }
}

/// `agent lock take`: writes the lock (replacing one of the same name).
pub fn take(
    home: &AgentHome,
    name: &str,
    reason: &str,
    hold_for: Option<Duration>,
    now: u64,
) -> Result<PathBuf, String> {
    check_name(name)?;
    let dir = home.update_locks();
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut text = reason.trim().to_owned();
    if let Some(d) = hold_for {
        text = format!("{text}\n{EXPIRES}{}", now.saturating_add(d.as_secs()));
    }
    text.push('\n');
    let path = dir.join(name);
    agent_extract::atomic::write_with_mode(&path, text.as_bytes(), Some(0o644))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

/// `agent lock release`.
pub fn release(home: &AgentHome, name: &str) -> Result<PathBuf, String> {
    check_name(name)?;
    let path = home.update_locks().join(name);
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(format!(
            "no update lock {name:?} is held ({} does not exist); `agent status` lists the locks",
            path.display()
        )),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// Whether an update may start now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// No lock is held.
    Go,
    /// Held off by these locks.
    Defer,
    /// Locks are held, but this offer waited `max-defer` or an operator overrode them:
    /// the update goes ahead, and the overridden locks are logged.
    Override { why: String },
}

/// `deferred_for`: how long this offer has been held off so far.
pub fn decide(
    locks: &[Lock],
    deferred_for: Duration,
    max_defer: Duration,
    operator_override: bool,
) -> Verdict {
    if locks.is_empty() {
        Verdict::Go
    } else if operator_override {
        Verdict::Override {
            why: "an operator overrode the update locks".into(),
        }
    } else if deferred_for >= max_defer {
        Verdict::Override {
            why: format!(
                "the update waited {}s for its locks, update.max-defer",
                deferred_for.as_secs()
            ),
        }
    } else {
        Verdict::Defer
    }
}

/// The locks in one line: `backup (nightly backup), batch`.
pub fn describe_all(locks: &[Lock]) -> String {
    locks
        .iter()
        .map(Lock::describe)
        .collect::<Vec<_>>()
        .join(", ")
}

/// [`describe_all`] cut to [`MAX_REPORT_TEXT`] bytes, for a report the server takes.
pub fn describe_for_report(locks: &[Lock]) -> String {
    let all = describe_all(locks);
    if all.len() <= MAX_REPORT_TEXT {
        return all;
    }
    let cut = agent_protocol::shown::cut_to_bytes(&all, MAX_REPORT_TEXT - 40);
    format!("{cut}… ({} locks in all)", locks.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_reasons_are_shown_escaped_and_cut() {
        let l = parse("evil\u{1b}[2Jname\n", &"r".repeat(4600));
        let shown = l.describe();
        assert!(
            !shown.contains('\u{1b}') && !shown.contains('\n'),
            "{shown:?}"
        );
        assert!(shown.contains("\\u{1b}"), "{shown:?}");
        assert!(shown.len() < 400, "{} bytes", shown.len());
        let many: Vec<Lock> = (0..50)
            .map(|i| parse(&format!("lock{i}"), &"why ".repeat(100)))
            .collect();
        let report = describe_for_report(&many);
        assert!(report.len() <= MAX_REPORT_TEXT, "{} bytes", report.len());
        assert!(report.ends_with("(50 locks in all)"), "{report}");
    }

    #[cfg(unix)]
    #[test]
    fn a_hard_link_is_held_but_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let home = AgentHome::new(dir.path());
        std::fs::create_dir_all(home.update_locks()).unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "root's secret").unwrap();
        std::fs::hard_link(&secret, home.update_locks().join("linked")).unwrap();
        std::fs::write(home.update_locks().join("plain"), "backup").unwrap();
        let (held, warnings) = held(&home, 0);
        assert_eq!(held.len(), 2, "{held:?}");
        let linked = held.iter().find(|l| l.name == "linked").unwrap();
        assert!(!linked.reason.contains("secret"), "{linked:?}");
        assert!(linked.reason.contains("links"), "{linked:?}");
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert_eq!(
            held.iter().find(|l| l.name == "plain").unwrap().reason,
            "backup"
        );
    }

    #[test]
    fn a_lock_files_text_is_its_reason_and_a_last_expires_line_its_expiry() {
        assert_eq!(
            parse("backup", "nightly backup\n"),
            Lock {
                name: "backup".into(),
                reason: "nightly backup".into(),
                expires_at: None
            }
        );
        let l = parse("batch", "payroll\nrun\nexpires-at=1000\n");
        assert_eq!(
            (l.reason.as_str(), l.expires_at),
            ("payroll run", Some(1000))
        );
        assert_eq!(parse("x", "").describe(), "x");
        assert_eq!(parse("x", "why").describe(), "x (why)");
    }

    #[test]
    fn held_locks_skip_expired_and_hidden_ones_and_keep_unreadable_ones() {
        let dir = tempfile::tempdir().unwrap();
        let home = AgentHome::new(dir.path());
        take(&home, "backup", "nightly backup", None, 100).unwrap();
        take(
            &home,
            "short",
            "a minute",
            Some(Duration::from_secs(60)),
            100,
        )
        .unwrap();
        std::fs::write(home.update_locks().join(".tmp-x"), "half").unwrap();
        std::fs::write(home.update_locks().join("binary"), [0xff, 0xfe, 0x00]).unwrap();
        let (locks, warnings) = held(&home, 120);
        let names: Vec<&str> = locks.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["backup", "binary", "short"]);
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("binary") && warnings[0].contains("not UTF-8"));
        // The --for lock expires.
        let (locks, _) = held(&home, 161);
        let names: Vec<&str> = locks.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["backup", "binary"]);
        release(&home, "backup").unwrap();
        assert!(
            release(&home, "backup")
                .unwrap_err()
                .contains("no update lock")
        );
    }

    #[test]
    fn names_are_plain_file_names() {
        for bad in ["", "../x", "a/b", ".hidden", &"x".repeat(65), "sp ace"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        for good in ["backup", "batch-job.1", "A_B"] {
            assert!(check_name(good).is_ok(), "{good:?}");
        }
    }

    #[test]
    fn locks_defer_until_max_defer_or_an_override() {
        let lock = [parse("backup", "nightly")];
        let day = Duration::from_secs(86_400);
        assert_eq!(decide(&[], Duration::ZERO, day, false), Verdict::Go);
        assert_eq!(
            decide(&lock, Duration::from_secs(60), day, false),
            Verdict::Defer
        );
        assert!(matches!(
            decide(&lock, day, day, false),
            Verdict::Override { why } if why.contains("max-defer")
        ));
        assert!(matches!(
            decide(&lock, Duration::ZERO, day, true),
            Verdict::Override { why } if why.contains("operator")
        ));
    }
}
