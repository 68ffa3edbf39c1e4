//! HTTPS: the server's certificate and key (`[tls] cert`, `key`, PEM), with HTTP/1.1 and
//! HTTP/2 offered by ALPN. A certificate replaced on disk is taken in on `SIGHUP` or
//! within seconds by itself, for new connections only: running downloads keep theirs.
//! A replacement that does not load (a key of another certificate, an expired one, a
//! file half written) is refused with a log line, and the one in force stays.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::TlsError;

/// How often the files are looked at for a change.
pub const WATCH_INTERVAL: Duration = Duration::from_secs(2);
/// A certificate this close to its end is in force, with a warning.
const EXPIRY_WARNING: Duration = Duration::from_secs(14 * 86_400);

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// What identifies a file's contents on disk (modified, length), to notice a replacement.
type Stamp = Option<(SystemTime, u64)>;

fn stamp(path: &Path) -> Stamp {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

/// A loaded certificate chain and key, and when the certificate ends.
pub struct Loaded {
    pub key: Arc<CertifiedKey>,
    pub not_after: SystemTime,
    pub subject: String,
}

/// Reads and checks `cert` and `key`: both there, parsed, the key the certificate's, and
/// the certificate in its validity period.
pub fn load(cert: &Path, key: &Path) -> Result<Loaded, String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| format!("tls.cert {}: {}", cert.display(), pem_error(e)))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("tls.cert {}: {}", cert.display(), pem_error(e)))?;
    let Some(leaf) = chain.first() else {
        return Err(format!(
            "tls.cert {}: no certificate in it (expected PEM, -----BEGIN CERTIFICATE-----)",
            cert.display()
        ));
    };
    let private = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("tls.key {}: {}", key.display(), pem_error(e)))?;
    let (_, parsed) = x509_parser::parse_x509_certificate(leaf)
        .map_err(|e| format!("tls.cert {}: not a valid certificate: {e}", cert.display()))?;
    let validity = parsed.validity();
    let not_before =
        UNIX_EPOCH + Duration::from_secs(validity.not_before.timestamp().max(0) as u64);
    let not_after = UNIX_EPOCH + Duration::from_secs(validity.not_after.timestamp().max(0) as u64);
    let now = SystemTime::now();
    if now > not_after {
        return Err(format!(
            "tls.cert {}: the certificate expired on {}; install a renewed one",
            cert.display(),
            httpdate::fmt_http_date(not_after)
        ));
    }
    if now < not_before {
        return Err(format!(
            "tls.cert {}: the certificate is not valid before {}; check the clock or the certificate",
            cert.display(),
            httpdate::fmt_http_date(not_before)
        ));
    }
    let subject = parsed.subject().to_string();
    let certified = CertifiedKey::from_der(chain, private, &provider()).map_err(|e| {
        match e {
            rustls::Error::InconsistentKeys(_) => format!(
                "tls.key {} is not the key of the certificate in tls.cert {}; give the pair that belongs together",
                key.display(),
                cert.display()
            ),
            other => format!("tls.key {}: {other}", key.display()),
        }
    })?;
    Ok(Loaded {
        key: Arc::new(certified),
        not_after,
        subject,
    })
}

fn pem_error(e: rustls_pki_types::pem::Error) -> String {
    match e {
        rustls_pki_types::pem::Error::Io(io) => io.to_string(),
        rustls_pki_types::pem::Error::NoItemsFound => {
            "nothing of the expected kind in it (is it PEM, and the right file?)".into()
        }
        other => format!("not readable as PEM: {other:?}"),
    }
}

/// Hands rustls the certificate in force; [`Certificates::reload`] replaces it.
#[derive(Debug)]
pub struct Certificates {
    cert: PathBuf,
    key: PathBuf,
    current: RwLock<Arc<CertifiedKey>>,
    /// Of the certificate and of the key, as last loaded.
    stamps: RwLock<(Stamp, Stamp)>,
}

impl ResolvesServerCert for Certificates {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(
            &self.current.read().unwrap_or_else(|p| p.into_inner()),
        ))
    }
}

impl Certificates {
    /// Loads the pair, or says why it cannot serve HTTPS with it.
    pub fn open(cert: &Path, key: &Path) -> Result<Arc<Self>, TlsError> {
        let loaded = load(cert, key).map_err(TlsError)?;
        warn_if_ending(&loaded);
        tracing::info!(
            "HTTPS with {} (until {})",
            loaded.subject,
            httpdate::fmt_http_date(loaded.not_after)
        );
        Ok(Arc::new(Self {
            cert: cert.to_owned(),
            key: key.to_owned(),
            current: RwLock::new(loaded.key),
            stamps: RwLock::new((stamp(cert), stamp(key))),
        }))
    }

    /// The rustls configuration: this resolver, HTTP/2 and HTTP/1.1 by ALPN.
    pub fn server_config(self: &Arc<Self>) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError(format!("TLS: {e}")))?
            .with_no_client_auth()
            .with_cert_resolver(Arc::clone(self) as Arc<dyn ResolvesServerCert>);
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// Takes in the files again if they changed (or `force`); keeps the pair in force
    /// when the new one does not load. True if a new certificate is now in force.
    pub fn reload(&self, force: bool) -> bool {
        let now = (stamp(&self.cert), stamp(&self.key));
        let changed = *self.stamps.read().unwrap_or_else(|p| p.into_inner()) != now;
        if !changed && !force {
            return false;
        }
        match load(&self.cert, &self.key) {
            Ok(loaded) => {
                warn_if_ending(&loaded);
                *self.current.write().unwrap_or_else(|p| p.into_inner()) = loaded.key;
                *self.stamps.write().unwrap_or_else(|p| p.into_inner()) = now;
                tracing::info!(
                    "took in the new certificate of {} (until {}); running connections keep theirs",
                    loaded.subject,
                    httpdate::fmt_http_date(loaded.not_after)
                );
                true
            }
            Err(e) => {
                // Said once per change of the files, not every look.
                *self.stamps.write().unwrap_or_else(|p| p.into_inner()) = now;
                tracing::error!("{e}; the certificate in force stays");
                false
            }
        }
    }
}

fn warn_if_ending(loaded: &Loaded) {
    if let Ok(left) = loaded.not_after.duration_since(SystemTime::now())
        && left < EXPIRY_WARNING
    {
        tracing::warn!(
            "the certificate of {} ends in {} days ({}); renew it",
            loaded.subject,
            left.as_secs() / 86_400,
            httpdate::fmt_http_date(loaded.not_after)
        );
    }
}

/// Reloads on `SIGHUP`, and on a change of the files seen within [`WATCH_INTERVAL`].
pub fn watch(certificates: Arc<Certificates>) {
    tokio::spawn(async move {
        // The same signal reads server.toml again (see `reload`); each listener hears it.
        let mut reloads = crate::signals::Reloads::listen().ok();
        let mut tick = tokio::time::interval(WATCH_INTERVAL);
        loop {
            let forced = tokio::select! {
                _ = tick.tick() => false,
                () = async {
                    match reloads.as_mut() {
                        Some(r) => r.next().await,
                        None => std::future::pending().await,
                    }
                } => true,
            };
            let certificates = Arc::clone(&certificates);
            let _ = tokio::task::spawn_blocking(move || certificates.reload(forced)).await;
        }
    });
}
