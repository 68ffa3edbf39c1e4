//! `logs/workload.log`: the workload's stdout and stderr, and the supervisor's own lines
//! about it (starts, exits), appended; rotated to `workload.log.1` past a size cap, so
//! the two files never hold more than twice the cap.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;

/// Past this many bytes the log is rotated.
pub const MAX_BYTES: u64 = 10 * 1024 * 1024;

pub struct LogFile {
    path: PathBuf,
    max: u64,
    file: Option<File>,
    size: u64,
}

impl LogFile {
    pub fn new(path: PathBuf, max: u64) -> Self {
        Self {
            path,
            max,
            file: None,
            size: 0,
        }
    }

    fn open(&mut self) -> std::io::Result<&mut File> {
        if self.file.is_none() {
            if let Some(dir) = self.path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.path)?;
            self.size = file.metadata()?.len();
            self.file = Some(file);
        }
        self.file
            .as_mut()
            .ok_or_else(|| std::io::Error::other("log file not open"))
    }

    /// Appends `bytes`; a log that cannot be written never stops the workload, so the
    /// error is only returned for the caller to say once.
    pub fn append(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        if self.size >= self.max {
            self.rotate()?;
        }
        let file = self.open()?;
        file.write_all(bytes)?;
        self.size += bytes.len() as u64;
        Ok(())
    }

    /// A line of the supervisor's own, time-stamped.
    pub fn note(&mut self, text: &str) -> std::io::Result<()> {
        let line = format!("{} agent: {text}\n", httpdate_like_now());
        self.append(line.as_bytes())
    }

    fn rotate(&mut self) -> std::io::Result<()> {
        self.file = None;
        let old = PathBuf::from(format!("{}.1", self.path.display()));
        match std::fs::rename(&self.path, &old) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        self.size = 0;
        Ok(())
    }
}

fn httpdate_like_now() -> String {
    utc(std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0))
}

/// Unix seconds as `2026-11-23T17:31:33Z`, like the wrapper's log lines.
pub fn utc(secs: u64) -> String {
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotates_past_the_cap_and_keeps_one_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("logs/workload.log");
        let mut log = LogFile::new(path.clone(), 100);
        for i in 0..30 {
            log.append(format!("line {i:02}\n").as_bytes()).unwrap();
        }
        let now = std::fs::read_to_string(&path).unwrap();
        let old = std::fs::read_to_string(dir.path().join("logs/workload.log.1")).unwrap();
        assert!(now.len() <= 100 && old.len() <= 108, "{now:?} {old:?}");
        assert!(now.ends_with("line 29\n"), "{now}");
        assert!(!dir.path().join("logs/workload.log.2").exists());
        log.note("workload (pid 7) exited with code 1").unwrap();
        assert!(
            agent_extract::atomic::tail_lines(&path, 1)
                .contains("agent: workload (pid 7) exited with code 1")
        );
    }

    #[test]
    fn dates_are_civil() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_415), (2025, 11, 23));
        assert_eq!(utc(1_763_918_493), "2025-11-23T17:21:33Z");
    }
}
