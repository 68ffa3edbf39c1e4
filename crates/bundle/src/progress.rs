//! A one-line progress display on a terminal; silent when stderr is piped.

use std::io::{IsTerminal, Write};

pub(crate) struct Progress {
    label: String,
    total: u64,
    shown_percent: Option<u64>,
    enabled: bool,
}

impl Progress {
    pub(crate) fn new(label: impl Into<String>, total: u64) -> Self {
        Self {
            label: label.into(),
            total: total.max(1),
            shown_percent: None,
            enabled: std::io::stderr().is_terminal(),
        }
    }

    pub(crate) fn update(&mut self, done: u64) {
        if !self.enabled {
            return;
        }
        let percent = (done.min(self.total) * 100) / self.total;
        if self.shown_percent != Some(percent) {
            self.shown_percent = Some(percent);
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r{}: {percent:>3}%", self.label);
            let _ = err.flush();
        }
    }

    pub(crate) fn finish(&mut self) {
        if self.enabled && self.shown_percent.is_some() {
            eprintln!();
        }
        self.enabled = false;
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}
