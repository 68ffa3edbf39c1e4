//! The admin API's client: where the server is, the token, the CA to trust, and one
//! way to send a request and read its answer (or say what the server said).

use std::time::Duration;

use anyhow::Context;
use serde_json::Value;

/// Where the admin API is and how to talk to it.
#[derive(Debug, Clone)]
pub struct AdminClient {
    pub server: String,
    pub token: String,
    /// Trust only this CA (PEM) for an HTTPS server.
    pub ca_file: Option<std::path::PathBuf>,
}

impl AdminClient {
    pub(super) fn http(&self) -> anyhow::Result<reqwest::Client> {
        self.http_for(Duration::from_secs(30))
    }

    /// A client whose requests may take up to `timeout` (a release's upload or export).
    pub(super) fn http_for(&self, timeout: Duration) -> anyhow::Result<reqwest::Client> {
        let mut builder = reqwest::Client::builder().timeout(timeout);
        if let Some(ca) = &self.ca_file {
            // A private CA: trusted alone, as the agents trust it.
            let pem = std::fs::read(ca).with_context(|| format!("--ca-file {}", ca.display()))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .with_context(|| format!("--ca-file {}: not PEM certificates", ca.display()))?;
            builder = builder.tls_built_in_root_certs(false);
            for cert in certs {
                builder = builder.add_root_certificate(cert);
            }
        }
        builder.build().context("cannot make an HTTP client")
    }

    /// The server's base URL, once a token is known to send.
    pub(super) fn base(&self) -> anyhow::Result<&str> {
        if self.token.is_empty() {
            anyhow::bail!(
                "no admin token: pass --token, or set UPDATE_SERVER_ADMIN_TOKEN (or admin.token in --config)"
            );
        }
        Ok(self.server.trim_end_matches('/'))
    }

    /// Sends the request and returns the answer's JSON, or an error that says what the
    /// server said.
    pub(super) async fn send(
        &self,
        base: &str,
        request: reqwest::RequestBuilder,
    ) -> anyhow::Result<Value> {
        let response = request
            .bearer_auth(&self.token)
            .send()
            .await
            .with_context(|| {
                format!("cannot reach the update-server at {base}; is it running? (--server URL)")
            })?;
        let status = response.status();
        let text = response
            .text()
            .await
            .with_context(|| format!("{base}: the answer broke off"))?;
        let json: Value = serde_json::from_str(&text).unwrap_or(Value::String(text.clone()));
        if !status.is_success() {
            let message = json
                .get("error")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .unwrap_or(text);
            anyhow::bail!("{base} answered {status}: {message}");
        }
        Ok(json)
    }
}
