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
        if let Some(f) = &mut self.file {
            let _ = f.write_all(line.as_bytes());
            let _ = f.sync_data();
        }
        eprint!("{line}");
    }
}
