//! What the transport counts of its connections; the server renders them in `/metrics`.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct ConnCounters {
    /// Connections closed because a write made no progress for `downloads.stall-timeout`.
    pub stall_closed: AtomicU64,
    /// Connections closed for want of a whole request head in `server.header-timeout`.
    pub header_timeouts: AtomicU64,
    /// Keep-alive connections closed after `server.idle-timeout`.
    pub idle_closed: AtomicU64,
    /// Idle connections closed to make room for a new one at `server.max-connections`.
    pub evicted: AtomicU64,
    pub connections_total: AtomicU64,
    pub connections_open: AtomicU64,
}

pub fn inc(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}
