//! A bundle's bytes from the server's download source (`downloads.public-url`: an nginx,
//! a CDN, an object store), the server itself when that source fails.
//!
//! Only the bytes come from the source: what they must be (size, md5, sha256) and the
//! signature over them come from the server, and are checked exactly as for a download
//! from the server. A source that cannot be reached, answers anything but the file,
//! stalls, or serves other bytes is tried once per round; the agent then says why in one
//! line and downloads from the server, from the first byte (a partial file from a source
//! that lied cannot be resumed elsewhere).

use std::path::Path;

use agent_protocol::wire::{self, VersionInfo};

use crate::contact::client::Client;
use crate::update::download::{self, Downloaded, Limits};

/// What trying the download source gave.
#[derive(Debug)]
pub enum Attempt {
    /// The server names no source (or the bundle is already here): download from it.
    NoSource,
    /// The source served the very bytes the server describes.
    Took(Downloaded),
    /// The source failed (said in the log): download from the server.
    FellBack,
}

impl Attempt {
    /// The bundle, when the source delivered it.
    pub fn downloaded(self) -> Option<Downloaded> {
        match self {
            Attempt::Took(d) => Some(d),
            _ => None,
        }
    }

    /// What the `INSTALLING` report says of where the bytes came from
    /// ([`wire::BUNDLE_FROM_HEADER`]): nothing when the server named no source.
    pub fn bundle_from(&self) -> Option<&'static str> {
        match self {
            Attempt::NoSource => None,
            Attempt::Took(_) => Some(wire::FROM_SOURCE),
            Attempt::FellBack => Some(wire::FROM_SERVER),
        }
    }
}

/// Downloads the bundle `info` describes from the server's download source, once.
pub async fn try_source(
    client: &Client,
    info: &VersionInfo,
    dir: &Path,
    limits: &Limits,
) -> Attempt {
    let Some(url) = info.source_url() else {
        return Attempt::NoSource;
    };
    // A bundle already downloaded whole (an earlier round failed past the download) is
    // used again from disk by the server download; nothing to fetch.
    if download::bundle_path(dir, info).exists() {
        return Attempt::NoSource;
    }
    tracing::info!(
        "downloading agent {} ({} bytes) from the download source {url}{}",
        info.agent,
        info.size,
        client.proxies().note(&url)
    );
    match download::fetch_from(client.http(), &url, info, dir, limits).await {
        Ok(downloaded) => Attempt::Took(downloaded),
        Err(e) => {
            let said = e.to_string();
            let said = if said.starts_with(&url) {
                said
            } else {
                format!("{url}: {said}")
            };
            // Bytes from a source that failed are not trusted as a prefix of the server's.
            let _ = download::discard_partial(dir, info);
            tracing::warn!(
                "the download source failed: {}; downloading from the server {} instead",
                client.explained(&url, &said),
                client.base()
            );
            Attempt::FellBack
        }
    }
}
