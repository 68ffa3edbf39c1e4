//! Fetching an offered `agent` package and checking it: the whole file hashed as it
//! arrives (or, in `head` mode, `HEAD` and its first bytes only), its sha256 against
//! the offer's `content_hash`, and the offer's signature (the `.minisig` file): the
//! bundle claim in its trusted comment must name the offered version and hash, and
//! with a trusted key (`--trust-key`) the signature must verify under it.

use std::time::Instant;

use agent_protocol::digest::{Digests, MultiHasher};
use agent_protocol::minisign::{BundleClaim, PublicKey, Signature, Signed};
use futures_util::StreamExt;
use reqwest::{Method, StatusCode};

use super::state::Offer;
use crate::{DownloadMode, Shared};

/// How many times a download is tried through `503`s before giving up until the next
/// offer.
const DOWNLOAD_TRIES: u32 = 20;
/// The first bytes fetched in `head` mode.
const FIRST_BYTES: u64 = 64 * 1024;

/// How a fetch ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Fetched {
    /// Fetched and checked: install it.
    Good,
    /// Not had (refused, cut off, the simulation ended): nothing to report.
    GaveUp,
    /// Had, but it is not what was offered: `INSTALL_FAILED` with this reason.
    Bad(String),
}

/// Checks what was fetched against the offer. `digests` is `None` when only the first
/// bytes were fetched (the signature is then checked as far as it can be without them).
pub fn check(
    offer: &Offer,
    digests: Option<&Digests>,
    key: Option<&PublicKey>,
) -> Result<(), String> {
    let offered = hex::encode(&offer.content_hash);
    if let Some(d) = digests
        && d.sha256_hex() != offered
    {
        return Err(format!(
            "the download's sha256 is {}, the offer's content_hash is {offered}",
            d.sha256_hex()
        ));
    }
    if offer.signature.is_empty() {
        return match key {
            Some(_) => Err("the offer carries no signature, and a trusted key is set".into()),
            None => Ok(()),
        };
    }
    let text = std::str::from_utf8(&offer.signature)
        .map_err(|_| "the offered signature is not a minisign file (not UTF-8)".to_owned())?;
    let signature = Signature::parse(text).map_err(|e| format!("the offered signature: {e}"))?;
    if let Some(key) = key {
        match digests {
            Some(d) if signature.is_prehashed() => signature
                .verify(key, Signed::Prehashed(&d.blake2b))
                .map_err(|e| format!("signature: {e}"))?,
            Some(_) => {
                return Err("legacy (non-prehashed) signatures are not checked here".into());
            }
            None => signature
                .verify_trusted_comment(key)
                .map_err(|e| format!("signature: {e}"))?,
        }
    }
    let claim = BundleClaim::parse(signature.trusted_comment())
        .map_err(|e| format!("the signature's trusted comment: {e}"))?;
    if claim.sha256 != offered {
        return Err(format!(
            "the signature vouches for sha256 {}, the offer's content_hash is {offered}",
            claim.sha256
        ));
    }
    if claim.version != offer.version {
        return Err(format!(
            "the signature vouches for version {}, the offer is version {}",
            claim.version, offer.version
        ));
    }
    Ok(())
}

/// One request for the package, timed under `endpoint`; the body hashed (or only
/// counted) as it arrives.
async fn get(
    shared: &Shared,
    offer: &Offer,
    endpoint: &'static str,
    method: Method,
    range: Option<String>,
    hasher: Option<&mut MultiHasher>,
) -> Option<(StatusCode, reqwest::header::HeaderMap)> {
    let mut request = shared.http.request(method, &offer.download_url);
    for (name, value) in &offer.headers {
        request = request.header(name, value);
    }
    if let Some(range) = range {
        request = request.header(reqwest::header::RANGE, range);
    }
    let started = Instant::now();
    let response = shared.stats.send(endpoint, request).await?;
    let status = response.status();
    let headers = response.headers().clone();
    let mut hasher = hasher.filter(|_| status.is_success());
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(c) => {
                shared.add_bytes(c.len() as u64);
                if let Some(h) = hasher.as_deref_mut() {
                    h.update(&c);
                }
            }
            Err(_) => {
                shared.stats.error(format!("{endpoint}: body cut off"));
                return None;
            }
        }
    }
    if shared.measuring() {
        shared.stats.record(endpoint, started.elapsed());
    }
    if !status.is_success() && status != StatusCode::SERVICE_UNAVAILABLE {
        shared.stats.error(format!("{endpoint}: {status}"));
    }
    Some((status, headers))
}

/// Fetches the offered package as the download mode says and checks it.
pub async fn fetch(shared: &Shared, offer: &Offer) -> Fetched {
    let key = shared.options.trust_key.as_ref();
    for _ in 0..DOWNLOAD_TRIES {
        let (answer, digests) = match shared.options.download {
            DownloadMode::Full => {
                let mut hasher = MultiHasher::new();
                let a = get(
                    shared,
                    offer,
                    "download",
                    Method::GET,
                    None,
                    Some(&mut hasher),
                )
                .await;
                (a, Some(hasher.finish()))
            }
            DownloadMode::Head => {
                let head = get(shared, offer, "download (HEAD)", Method::HEAD, None, None).await;
                let a = match head {
                    Some((s, _)) if s.is_success() => {
                        let range = format!("bytes=0-{}", FIRST_BYTES - 1);
                        get(
                            shared,
                            offer,
                            "download (first bytes)",
                            Method::GET,
                            Some(range),
                            None,
                        )
                        .await
                    }
                    other => other,
                };
                (a, None)
            }
        };
        match answer {
            Some((status, _)) if status.is_success() => {
                return match check(offer, digests.as_ref(), key) {
                    Ok(()) => Fetched::Good,
                    Err(why) => {
                        shared.stats.error("package check failed".into());
                        Fetched::Bad(why)
                    }
                };
            }
            Some((StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS, headers)) => {
                if shared.wait_out_busy(&headers).await {
                    return Fetched::GaveUp;
                }
            }
            _ => return Fetched::GaveUp,
        }
    }
    Fetched::GaveUp
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_protocol::minisign::SecretKey;

    fn signed(bytes: &[u8], version: &str) -> (Offer, Digests, PublicKey) {
        let key = SecretKey::generate().unwrap();
        let mut h = MultiHasher::new();
        h.update(bytes);
        let d = h.finish();
        let claim = BundleClaim {
            version: version.parse().unwrap(),
            platform: "x86_64-unknown-linux-gnu".into(),
            sha256: d.sha256_hex(),
            signed_at: 1,
        };
        let sig = key.sign_prehashed(&d.blake2b, &claim.to_comment()).unwrap();
        let offer = Offer {
            version: version.parse().unwrap(),
            download_url: String::new(),
            headers: vec![],
            content_hash: d.sha256.to_vec(),
            signature: sig.to_file_string().into_bytes(),
            package_hash: vec![1; 32],
            all_packages_hash: vec![2; 32],
        };
        (offer, d, key.public_key())
    }

    #[test]
    fn a_genuine_package_passes_with_and_without_its_bytes() {
        let (offer, d, key) = signed(b"bundle bytes", "2.0.0+2");
        assert_eq!(check(&offer, Some(&d), Some(&key)), Ok(()));
        assert_eq!(check(&offer, None, Some(&key)), Ok(()));
        assert_eq!(check(&offer, Some(&d), None), Ok(()));
    }

    #[test]
    fn other_bytes_another_key_or_another_version_fail() {
        let (offer, _, key) = signed(b"bundle bytes", "2.0.0+2");
        let mut h = MultiHasher::new();
        h.update(b"tampered");
        let err = check(&offer, Some(&h.finish()), Some(&key)).unwrap_err();
        assert!(err.contains("sha256"), "{err}");
        let (_, _, other) = signed(b"x", "2.0.0+2");
        let (offer, d, _) = signed(b"bundle bytes", "2.0.0+2");
        let err = check(&offer, Some(&d), Some(&other)).unwrap_err();
        assert!(err.contains("signature"), "{err}");
        let err = check(&offer, None, Some(&other)).unwrap_err();
        assert!(err.contains("signature"), "{err}");
        let mut later = offer.clone();
        later.version = "3.0.0+3".parse().unwrap();
        let err = check(&later, Some(&d), None).unwrap_err();
        assert!(err.contains("version"), "{err}");
        let mut unsigned = offer;
        unsigned.signature.clear();
        assert!(check(&unsigned, Some(&d), None).is_ok());
        assert!(check(&unsigned, Some(&d), Some(&other)).is_err());
    }
}
