//! Latencies and errors by endpoint: what the simulator measures and prints.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use serde::Serialize;

/// Every sample of one endpoint, in microseconds.
#[derive(Debug, Default, Clone)]
struct Samples {
    all: Vec<u32>,
    /// Since the last progress line.
    window: Vec<u32>,
}

/// Percentiles of a set of latencies.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Summary {
    pub count: u64,
    pub per_second: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// The `p`-th percentile (0–100) of sorted microseconds, in milliseconds (nearest rank).
pub fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    let index = rank.clamp(1, sorted.len()) - 1;
    f64::from(sorted[index]) / 1000.0
}

pub fn summarize(samples: &[u32], seconds: f64) -> Summary {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    Summary {
        count: sorted.len() as u64,
        per_second: if seconds > 0.0 {
            sorted.len() as f64 / seconds
        } else {
            0.0
        },
        p50_ms: percentile(&sorted, 50.0),
        p90_ms: percentile(&sorted, 90.0),
        p99_ms: percentile(&sorted, 99.0),
        max_ms: sorted.last().map_or(0.0, |m| f64::from(*m) / 1000.0),
    }
}

/// Shared by every simulated agent.
#[derive(Debug, Default)]
pub struct Stats {
    endpoints: Mutex<BTreeMap<&'static str, Samples>>,
    errors: Mutex<BTreeMap<String, u64>>,
}

impl Stats {
    pub fn record(&self, endpoint: &'static str, took: Duration) {
        let micros = u32::try_from(took.as_micros()).unwrap_or(u32::MAX);
        let mut endpoints = self.endpoints.lock().unwrap_or_else(|p| p.into_inner());
        let s = endpoints.entry(endpoint).or_default();
        s.all.push(micros);
        s.window.push(micros);
    }

    /// Sends `request`; when no answer comes, counts an error of `endpoint` by its kind
    /// (timeout, connect, request) and gives `None`.
    pub async fn send(
        &self,
        endpoint: &str,
        request: reqwest::RequestBuilder,
    ) -> Option<reqwest::Response> {
        match request.send().await {
            Ok(r) => Some(r),
            Err(e) => {
                let kind = if e.is_timeout() {
                    "timeout"
                } else if e.is_connect() {
                    "connect"
                } else {
                    "request"
                };
                self.error(format!("{endpoint}: {kind}"));
                None
            }
        }
    }

    pub fn error(&self, kind: String) {
        *self
            .errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(kind)
            .or_default() += 1;
    }

    pub fn errors(&self) -> BTreeMap<String, u64> {
        self.errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Per endpoint, over the whole run.
    pub fn totals(&self, seconds: f64) -> BTreeMap<&'static str, Summary> {
        let endpoints = self.endpoints.lock().unwrap_or_else(|p| p.into_inner());
        endpoints
            .iter()
            .map(|(k, s)| (*k, summarize(&s.all, seconds)))
            .collect()
    }

    /// Per endpoint, since the last call (the progress line's window).
    pub fn window(&self, seconds: f64) -> BTreeMap<&'static str, Summary> {
        let mut endpoints = self.endpoints.lock().unwrap_or_else(|p| p.into_inner());
        endpoints
            .iter_mut()
            .map(|(k, s)| {
                let summary = summarize(&s.window, seconds);
                s.window.clear();
                (*k, summary)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let samples: Vec<u32> = (1..=100).map(|ms| ms * 1000).collect();
        let s = summarize(&samples, 10.0);
        assert_eq!(s.count, 100);
        assert_eq!(s.per_second, 10.0);
        assert_eq!(s.p50_ms, 50.0);
        assert_eq!(s.p90_ms, 90.0);
        assert_eq!(s.p99_ms, 99.0);
        assert_eq!(s.max_ms, 100.0);
        assert_eq!(summarize(&[], 1.0).p99_ms, 0.0);
        assert_eq!(percentile(&[7000], 99.0), 7.0);
    }

    #[test]
    fn the_window_empties_after_each_progress_line() {
        let stats = Stats::default();
        stats.record("connect", Duration::from_millis(2));
        stats.record("connect", Duration::from_millis(4));
        assert_eq!(stats.window(1.0)["connect"].count, 2);
        assert_eq!(stats.window(1.0)["connect"].count, 0);
        assert_eq!(stats.totals(1.0)["connect"].count, 2);
        stats.error("timeout".into());
        stats.error("timeout".into());
        assert_eq!(stats.errors()["timeout"], 2);
    }
}
