//! The state every edge shares: the native routes, OpAMP (HTTP and WebSocket) and the
//! page take it from here, so that no edge imports another for it. It holds what the
//! server was configured with and the parts it runs (bundle store, fleet model, limiter,
//! metrics, pacer); it decides nothing.

use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};

use agent_fleet::Fleet;
use agent_opamp::uid::InstanceUid;
use agent_protocol::AcceptPolicy;

use crate::deltas::Deltas;
use crate::metrics::Metrics;
use crate::store::BundleStore;
use crate::transport::limiter::DownloadLimiter;
use crate::transport::pacer::Pacer;

/// Everything the handlers share.
#[derive(Clone)]
pub struct AppState {
    pub inner: Arc<Shared>,
}

pub struct Shared {
    pub store: Arc<BundleStore>,
    /// Publishing, the history and rollbacks; following the fleet's current release.
    pub releases: Arc<crate::releases::Publisher>,
    /// The kept releases deployments name, served beside the current one.
    pub catalog: Arc<agent_releases::catalog::Catalog>,
    /// The bases kept and the deltas made from them to the served bundles.
    pub deltas: Arc<Deltas>,
    /// The fleet model: database, outage spool, rollouts, fleet-wide settings.
    pub fleet: Arc<Fleet>,
    /// `server.name`: keys this server's own settings in the fleet database.
    pub server_name: String,
    pub limiter: Arc<DownloadLimiter>,
    pub metrics: Arc<Metrics>,
    pub policy: AcceptPolicy,
    pub admin_token: String,
    /// `agents.enrollment-token`; empty: open enrollment.
    pub enrollment_token: String,
    /// `agents.rotate-every`; `None`: credentials are rotated only when asked.
    pub rotate_every: Option<std::time::Duration>,
    pub download_limit: AtomicUsize,
    pub max_connections: usize,
    pub retry_after: u64,
    /// How long a non-download request may take, its body included.
    pub request_timeout: std::time::Duration,
    /// How long a download may hand no bytes to its client before its slot is freed.
    pub stall_timeout: std::time::Duration,
    /// `agents.max-wait`: the longest a long-polling connect is held.
    pub max_wait: std::time::Duration,
    /// `server.public-url` (or `http(s)://<listen address>`), without a trailing `/`.
    pub public_url: String,
    /// `downloads.public-url`: where agents fetch bundle bytes; `None`: from here.
    pub download_source: Option<String>,
    /// The OpAMP WebSockets open now, by agent.
    pub opamp_sockets: Sockets,
    /// Turns for held agents about to be told that their wave opened.
    pub pacer: Arc<Pacer>,
    /// `tls.agent-ca`, read: the CA `/install.sh` has new agents pin.
    pub agent_ca: Option<String>,
    /// Webhooks and the audit log's retention.
    pub governance: Arc<crate::governance::Governance>,
    /// `approval.expires`: how long a change waits for approval before it lapses.
    pub approval_expires: std::time::Duration,
}

/// The live sockets by agent: how many hold each uid now.
#[derive(Debug, Default)]
pub struct Sockets {
    open: Mutex<HashMap<InstanceUid, usize>>,
}

impl Sockets {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<InstanceUid, usize>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn held_elsewhere(&self, uid: &InstanceUid, mine: Option<&InstanceUid>) -> bool {
        let n = self.lock().get(uid).copied().unwrap_or(0);
        if mine == Some(uid) { n > 1 } else { n > 0 }
    }

    pub fn add(&self, uid: InstanceUid) {
        *self.lock().entry(uid).or_default() += 1;
    }

    /// True when this was the uid's last socket.
    pub fn remove(&self, uid: &InstanceUid) -> bool {
        let mut open = self.lock();
        match open.get_mut(uid) {
            Some(n) if *n > 1 => {
                *n -= 1;
                false
            }
            _ => {
                open.remove(uid);
                true
            }
        }
    }

    pub fn count(&self) -> usize {
        self.lock().values().sum()
    }
}
