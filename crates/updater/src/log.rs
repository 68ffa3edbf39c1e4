//! `logs/update.log`: every step with its time and duration, in an operator's words.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::time::{Instant, SystemTime};

pub struct UpdateLog {
    file: Option<File>,
    started: Instant,
    step_started: Instant,
    prefix: String,
    /// Said once: the log file refuses writes (a full disk).
    write_failed: bool,
}

impl UpdateLog {
    pub fn open(path: &Path) -> Self {
        let file = path
            .parent()
            .map(fs::create_dir_all)
            .transpose()
            .ok()
            .and_then(|_| OpenOptions::new().create(true).append(true).open(path).ok());
        let now = Instant::now();
        Self {
            file,
            started: now,
            step_started: now,
            prefix: String::new(),
            write_failed: false,
        }
    }

    /// Names the update on every following line, e.g. `1.0.0+1 -> 2.0.0+2`.
    pub fn set_prefix(&mut self, prefix: String) {
        self.prefix = prefix;
    }

    /// One line, with the time since the previous step and since the start.
    pub fn step(&mut self, message: &str) {
        let now = Instant::now();
        let line = format!(
            "{} [{}] {message} (step {:.2}s, total {:.2}s)\n",
            httpdate::fmt_http_date(SystemTime::now()),
            self.prefix,
            (now - self.step_started).as_secs_f64(),
            (now - self.started).as_secs_f64()
        );
        self.step_started = now;
        tracing::info!("{}", line.trim_end());
        // Written to stderr as well (logs/update.out when the agent started us), and
        // neither write may stop the update: on a full disk both fail, and `eprint!`
        // would panic where the old agent is still to be started.
        let mut stderr = std::io::stderr();
        let _ = stderr.write_all(line.as_bytes());
        if let Some(f) = &mut self.file
            && let Err(e) = f.write_all(line.as_bytes()).and_then(|()| f.sync_data())
            && !self.write_failed
        {
            self.write_failed = true;
            let _ = writeln!(
                stderr,
                "cannot write logs/update.log ({e}); the update goes on, logging here only"
            );
        }
    }
}
