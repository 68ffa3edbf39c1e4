//! minisign-format Ed25519 keys and detached signatures, and the bundle's trusted comment.
//!
//! Files written here verify with `minisign -V`, and files written by `minisign -G -W`
//! and `minisign -S` are read here. Signing always uses the prehashed `ED` variant
//! (the signature covers the BLAKE2b-512 of the file, so a 100 MiB bundle is never held
//! in memory); verification also accepts the legacy `Ed` variant over the raw bytes.
//!
//! Layouts (all integers little-endian, all lines base64 except comments):
//! - public key:  `"Ed" | key id (8) | public key (32)`
//! - secret key:  `"Ed" | kdf ("\0\0" = unencrypted) | "B2" | salt (32) | opslimit (8) |
//!   memlimit (8) | key id (8) | seed+public (64) | BLAKE2b-256 checksum (32)`
//! - signature:   `"ED"|"Ed" | key id (8) | signature (64)`, then the trusted comment, then
//!   the global signature over `signature | trusted comment`.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use blake2::Blake2b;
use blake2::digest::consts::U32;
use ed25519_dalek::{Signer, SigningKey, VerifyingKey};
use sha2::Digest;

use crate::error::{Error, Result};
use crate::version::AgentVersion;

const ALG_LEGACY: [u8; 2] = *b"Ed";
const ALG_PREHASHED: [u8; 2] = *b"ED";
const KDF_NONE: [u8; 2] = [0, 0];
const KDF_SCRYPT: [u8; 2] = *b"Sc";
const CHK_BLAKE2B: [u8; 2] = *b"B2";
const UNTRUSTED: &str = "untrusted comment: ";
const TRUSTED: &str = "trusted comment: ";
const SECRET_KEY_LEN: usize = 2 + 2 + 2 + 32 + 8 + 8 + 8 + 64 + 32;

/// The 8 random bytes that name a key. Shown as minisign shows it: the bytes read as a
/// little-endian integer, in upper-case hex.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyId([u8; 8]);

impl KeyId {
    pub fn from_bytes(bytes: [u8; 8]) -> Self {
        Self(bytes)
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016X}", u64::from_le_bytes(self.0))
    }
}

impl fmt::Debug for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyId({self})")
    }
}

/// A minisign public key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublicKey {
    key_id: KeyId,
    key: VerifyingKey,
}

impl PublicKey {
    pub fn key_id(&self) -> KeyId {
        self.key_id
    }

    /// Parses a public key file, or just its base64 line.
    pub fn parse(text: &str) -> Result<Self> {
        let line = text
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty() && !l.starts_with(UNTRUSTED.trim_end()))
            .ok_or_else(|| Error::Key("no key line found".into()))?;
        let raw = B64
            .decode(line)
            .map_err(|e| Error::Key(format!("public key is not base64: {e}")))?;
        if raw.len() != 42 {
            return Err(Error::Key(format!(
                "public key has {} bytes, a minisign public key has 42",
                raw.len()
            )));
        }
        if raw[..2] != ALG_LEGACY {
            return Err(Error::Key(
                "public key is not an Ed25519 minisign key".into(),
            ));
        }
        let key_id = KeyId(
            raw[2..10]
                .try_into()
                .map_err(|_| Error::Key("key id".into()))?,
        );
        let bytes: [u8; 32] = raw[10..42]
            .try_into()
            .map_err(|_| Error::Key("public key length".into()))?;
        let key = VerifyingKey::from_bytes(&bytes)
            .map_err(|e| Error::Key(format!("not a valid Ed25519 public key: {e}")))?;
        Ok(Self { key_id, key })
    }

    pub fn to_base64(&self) -> String {
        let mut raw = Vec::with_capacity(42);
        raw.extend_from_slice(&ALG_LEGACY);
        raw.extend_from_slice(&self.key_id.0);
        raw.extend_from_slice(self.key.as_bytes());
        B64.encode(raw)
    }

    pub fn to_file_string(&self) -> String {
        format!(
            "{UNTRUSTED}minisign public key {}\n{}\n",
            self.key_id,
            self.to_base64()
        )
    }
}

/// An unencrypted minisign secret key (`minisign -G -W`, or `agent-bundle keygen`).
pub struct SecretKey {
    key_id: KeyId,
    signing: SigningKey,
}

impl fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretKey({})", self.key_id)
    }
}

impl SecretKey {
    pub fn generate() -> Result<Self> {
        let mut seed = [0u8; 32];
        let mut id = [0u8; 8];
        getrandom::fill(&mut seed).map_err(|e| Error::Key(format!("no randomness: {e}")))?;
        getrandom::fill(&mut id).map_err(|e| Error::Key(format!("no randomness: {e}")))?;
        Ok(Self {
            key_id: KeyId(id),
            signing: SigningKey::from_bytes(&seed),
        })
    }

    pub fn key_id(&self) -> KeyId {
        self.key_id
    }

    pub fn public_key(&self) -> PublicKey {
        PublicKey {
            key_id: self.key_id,
            key: self.signing.verifying_key(),
        }
    }

    pub fn parse(text: &str) -> Result<Self> {
        let line = text
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty() && !l.starts_with(UNTRUSTED.trim_end()))
            .ok_or_else(|| Error::Key("no key line found in the secret key file".into()))?;
        let raw = B64
            .decode(line)
            .map_err(|e| Error::Key(format!("secret key is not base64: {e}")))?;
        if raw.len() != SECRET_KEY_LEN {
            return Err(Error::Key(format!(
                "secret key has {} bytes, a minisign secret key has {SECRET_KEY_LEN}; \
                 is this a public key?",
                raw.len()
            )));
        }
        if raw[0..2] != ALG_LEGACY || raw[4..6] != CHK_BLAKE2B {
            return Err(Error::Key("not an Ed25519 minisign secret key".into()));
        }
        match [raw[2], raw[3]] {
            KDF_NONE => {}
            KDF_SCRYPT => {
                return Err(Error::Key(
                    "the secret key is password-protected; make an unencrypted signing key \
                     with `agent-bundle keygen` or `minisign -G -W`"
                        .into(),
                ));
            }
            _ => return Err(Error::Key("unknown key derivation in secret key".into())),
        }
        let body = &raw[54..];
        let key_id = KeyId(
            body[..8]
                .try_into()
                .map_err(|_| Error::Key("key id".into()))?,
        );
        let keypair: [u8; 64] = body[8..72]
            .try_into()
            .map_err(|_| Error::Key("secret key length".into()))?;
        let checksum = &body[72..104];
        // minisign 0.11 writes an all-zero checksum for unencrypted (-W) keys.
        if checksum != key_checksum(&key_id, &keypair) && checksum.iter().any(|&b| b != 0) {
            return Err(Error::Key(
                "secret key checksum does not match; the file is damaged".into(),
            ));
        }
        let signing = SigningKey::from_keypair_bytes(&keypair)
            .map_err(|e| Error::Key(format!("inconsistent secret key: {e}")))?;
        Ok(Self { key_id, signing })
    }

    pub fn to_file_string(&self) -> String {
        let mut keypair = [0u8; 64];
        keypair[..32].copy_from_slice(self.signing.as_bytes());
        keypair[32..].copy_from_slice(self.signing.verifying_key().as_bytes());
        let mut raw = Vec::with_capacity(SECRET_KEY_LEN);
        raw.extend_from_slice(&ALG_LEGACY);
        raw.extend_from_slice(&KDF_NONE);
        raw.extend_from_slice(&CHK_BLAKE2B);
        raw.extend_from_slice(&[0u8; 32]); // salt: unused without a kdf
        raw.extend_from_slice(&0u64.to_le_bytes());
        raw.extend_from_slice(&0u64.to_le_bytes());
        raw.extend_from_slice(&self.key_id.0);
        raw.extend_from_slice(&keypair);
        raw.extend_from_slice(&key_checksum(&self.key_id, &keypair));
        format!(
            "{UNTRUSTED}minisign secret key {} (unencrypted; keep it offline)\n{}\n",
            self.key_id,
            B64.encode(raw)
        )
    }

    /// Signs a file given its BLAKE2b-512, minisign's default `ED` variant.
    pub fn sign_prehashed(&self, blake2b: &[u8; 64], trusted_comment: &str) -> Result<Signature> {
        if trusted_comment.contains(['\n', '\r']) {
            return Err(Error::SignatureFormat(
                "a trusted comment must be a single line".into(),
            ));
        }
        let signature = self.signing.sign(blake2b).to_bytes();
        let mut global = Vec::with_capacity(64 + trusted_comment.len());
        global.extend_from_slice(&signature);
        global.extend_from_slice(trusted_comment.as_bytes());
        Ok(Signature {
            algorithm: ALG_PREHASHED,
            key_id: self.key_id,
            signature,
            untrusted_comment: format!("signature from agent-bundle secret key {}", self.key_id),
            trusted_comment: trusted_comment.to_owned(),
            global_signature: self.signing.sign(&global).to_bytes(),
        })
    }
}

fn key_checksum(key_id: &KeyId, keypair: &[u8; 64]) -> [u8; 32] {
    let mut h = Blake2b::<U32>::new();
    h.update(ALG_LEGACY);
    h.update(key_id.0);
    h.update(keypair);
    h.finalize().into()
}

/// What a signature covers: the file's BLAKE2b-512 (`ED`) or, for legacy `Ed`, its bytes.
pub enum Signed<'a> {
    Prehashed(&'a [u8; 64]),
    Raw(&'a [u8]),
}

/// A detached minisign signature file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signature {
    algorithm: [u8; 2],
    key_id: KeyId,
    signature: [u8; 64],
    untrusted_comment: String,
    trusted_comment: String,
    global_signature: [u8; 64],
}

impl Signature {
    pub fn key_id(&self) -> KeyId {
        self.key_id
    }

    pub fn is_prehashed(&self) -> bool {
        self.algorithm == ALG_PREHASHED
    }

    /// The same signature with another untrusted comment (which nothing vouches for).
    pub fn with_untrusted_comment(mut self, comment: &str) -> Self {
        self.untrusted_comment = comment.replace(['\n', '\r'], " ");
        self
    }

    /// The trusted comment as written; only meaningful after [`Signature::verify`].
    pub fn trusted_comment(&self) -> &str {
        &self.trusted_comment
    }

    pub fn parse(text: &str) -> Result<Self> {
        let bad = |what: &str| Error::SignatureFormat(what.to_owned());
        let mut lines = text.lines();
        let untrusted = lines
            .next()
            .and_then(|l| l.strip_prefix(UNTRUSTED))
            .ok_or_else(|| bad("first line is not an untrusted comment"))?;
        let sig_line = lines.next().ok_or_else(|| bad("no signature line"))?;
        let raw = B64
            .decode(sig_line.trim())
            .map_err(|e| bad(&format!("signature line is not base64: {e}")))?;
        if raw.len() != 74 {
            return Err(bad("signature line has the wrong length"));
        }
        let algorithm: [u8; 2] = [raw[0], raw[1]];
        if algorithm != ALG_PREHASHED && algorithm != ALG_LEGACY {
            return Err(bad("unknown signature algorithm"));
        }
        let key_id = KeyId(raw[2..10].try_into().map_err(|_| bad("key id"))?);
        let signature: [u8; 64] = raw[10..74].try_into().map_err(|_| bad("signature"))?;
        let trusted = lines
            .next()
            .and_then(|l| l.strip_prefix(TRUSTED))
            .ok_or_else(|| bad("third line is not a trusted comment"))?;
        let global_line = lines
            .next()
            .ok_or_else(|| bad("no global signature line"))?;
        let global = B64
            .decode(global_line.trim())
            .map_err(|e| bad(&format!("global signature is not base64: {e}")))?;
        let global_signature: [u8; 64] = global
            .as_slice()
            .try_into()
            .map_err(|_| bad("global signature has the wrong length"))?;
        if lines.any(|l| !l.trim().is_empty()) {
            return Err(bad("unexpected text after the global signature"));
        }
        Ok(Self {
            algorithm,
            key_id,
            signature,
            untrusted_comment: untrusted.to_owned(),
            trusted_comment: trusted.to_owned(),
            global_signature,
        })
    }

    pub fn to_file_string(&self) -> String {
        let mut raw = Vec::with_capacity(74);
        raw.extend_from_slice(&self.algorithm);
        raw.extend_from_slice(&self.key_id.0);
        raw.extend_from_slice(&self.signature);
        format!(
            "{UNTRUSTED}{}\n{}\n{TRUSTED}{}\n{}\n",
            self.untrusted_comment,
            B64.encode(raw),
            self.trusted_comment,
            B64.encode(self.global_signature)
        )
    }

    /// Checks the key id and the trusted comment (the global signature) only: what can be
    /// known before the signed file is at hand. [`Signature::verify`] checks everything.
    pub fn verify_trusted_comment(&self, key: &PublicKey) -> Result<()> {
        if self.key_id != key.key_id {
            return Err(Error::WrongKey {
                signed_by: self.key_id.to_string(),
                trusted: key.key_id.to_string(),
            });
        }
        let mut global = Vec::with_capacity(64 + self.trusted_comment.len());
        global.extend_from_slice(&self.signature);
        global.extend_from_slice(self.trusted_comment.as_bytes());
        let global_sig = ed25519_dalek::Signature::from_bytes(&self.global_signature);
        key.key
            .verify_strict(&global, &global_sig)
            .map_err(|_| Error::BadTrustedComment {
                key_id: self.key_id.to_string(),
            })
    }

    /// Checks the key id, the signature over the file and the trusted comment.
    pub fn verify(&self, key: &PublicKey, signed: Signed<'_>) -> Result<()> {
        if self.key_id != key.key_id {
            return Err(Error::WrongKey {
                signed_by: self.key_id.to_string(),
                trusted: key.key_id.to_string(),
            });
        }
        let message: &[u8] = match (self.is_prehashed(), signed) {
            (true, Signed::Prehashed(h)) => h,
            (false, Signed::Raw(bytes)) => bytes,
            (true, Signed::Raw(_)) | (false, Signed::Prehashed(_)) => {
                return Err(Error::SignatureFormat(
                    "the signature variant does not match what was hashed".into(),
                ));
            }
        };
        let sig = ed25519_dalek::Signature::from_bytes(&self.signature);
        key.key
            .verify_strict(message, &sig)
            .map_err(|_| Error::BadSignature {
                key_id: self.key_id.to_string(),
            })?;
        self.verify_trusted_comment(key)
    }
}

/// What a bundle signature vouches for, carried in its trusted comment:
/// `version=2.2.0 build=1234 platform=x86_64-unknown-linux-gnu sha256=<hex> signed-at=<secs>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BundleClaim {
    pub version: AgentVersion,
    pub platform: String,
    pub sha256: String,
    pub signed_at: u64,
}

impl BundleClaim {
    pub fn to_comment(&self) -> String {
        format!(
            "version={} build={} platform={} sha256={} signed-at={}",
            self.version.version_str(),
            self.version.build(),
            self.platform,
            self.sha256,
            self.signed_at
        )
    }

    pub fn parse(comment: &str) -> Result<Self> {
        let mut version = None;
        let mut build = None;
        let mut platform = None;
        let mut sha256 = None;
        let mut signed_at = None;
        for field in comment.split_whitespace() {
            let Some((k, v)) = field.split_once('=') else {
                return Err(Error::TrustedComment(format!(
                    "field {field:?} is not name=value"
                )));
            };
            let slot = match k {
                "version" => &mut version,
                "build" => &mut build,
                "platform" => &mut platform,
                "sha256" => &mut sha256,
                "signed-at" => &mut signed_at,
                _ => continue, // later versions may add fields
            };
            if slot.replace(v).is_some() {
                return Err(Error::TrustedComment(format!("field {k} appears twice")));
            }
        }
        fn need<'a>(v: Option<&'a str>, name: &str, comment: &str) -> Result<&'a str> {
            v.ok_or_else(|| Error::TrustedComment(format!("no {name}= field in {comment:?}")))
        }
        let version = AgentVersion::new(
            need(version, "version", comment)?,
            need(build, "build", comment)?,
        )?;
        let platform = need(platform, "platform", comment)?.to_owned();
        let sha256 = need(sha256, "sha256", comment)?.to_ascii_lowercase();
        if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::TrustedComment("sha256= is not 64 hex digits".into()));
        }
        let signed_at = need(signed_at, "signed-at", comment)?
            .parse()
            .map_err(|_| Error::TrustedComment("signed-at= is not a number of seconds".into()))?;
        Ok(Self {
            version,
            platform,
            sha256,
            signed_at,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim() -> BundleClaim {
        BundleClaim {
            version: "2.2.0+1234".parse().unwrap(),
            platform: "x86_64-unknown-linux-gnu".into(),
            sha256: "ab".repeat(32),
            signed_at: 1_700_000_000,
        }
    }

    #[test]
    fn keys_round_trip_through_their_files() {
        let sk = SecretKey::generate().unwrap();
        let sk2 = SecretKey::parse(&sk.to_file_string()).unwrap();
        assert_eq!(sk.public_key(), sk2.public_key());
        let pk = PublicKey::parse(&sk.public_key().to_file_string()).unwrap();
        assert_eq!(pk, sk.public_key());
        assert!(
            sk.public_key()
                .to_file_string()
                .contains(&sk.key_id().to_string())
        );
    }

    #[test]
    fn signature_verifies_and_detects_tampering() {
        let sk = SecretKey::generate().unwrap();
        let hash = [7u8; 64];
        let sig = sk.sign_prehashed(&hash, &claim().to_comment()).unwrap();
        let parsed = Signature::parse(&sig.to_file_string()).unwrap();
        parsed
            .verify(&sk.public_key(), Signed::Prehashed(&hash))
            .unwrap();

        let other = [8u8; 64];
        assert!(matches!(
            parsed.verify(&sk.public_key(), Signed::Prehashed(&other)),
            Err(Error::BadSignature { .. })
        ));

        let edited = sig
            .to_file_string()
            .replace("signed-at=1700000000", "signed-at=1800000000");
        let edited = Signature::parse(&edited).unwrap();
        assert!(matches!(
            edited.verify(&sk.public_key(), Signed::Prehashed(&hash)),
            Err(Error::BadTrustedComment { .. })
        ));
        assert!(matches!(
            edited.verify_trusted_comment(&sk.public_key()),
            Err(Error::BadTrustedComment { .. })
        ));
        parsed.verify_trusted_comment(&sk.public_key()).unwrap();
    }

    #[test]
    fn wrong_key_names_both_key_ids() {
        let sk = SecretKey::generate().unwrap();
        let other = SecretKey::generate().unwrap();
        let sig = sk.sign_prehashed(&[0u8; 64], "x").unwrap();
        let err = sig
            .verify(&other.public_key(), Signed::Prehashed(&[0u8; 64]))
            .unwrap_err()
            .to_string();
        assert!(err.contains(&sk.key_id().to_string()), "{err}");
        assert!(err.contains(&other.key_id().to_string()), "{err}");
    }

    #[test]
    fn claim_round_trips_and_rejects_garbage() {
        let c = claim();
        assert_eq!(BundleClaim::parse(&c.to_comment()).unwrap(), c);
        let extra = format!("{} future=1", c.to_comment());
        assert_eq!(BundleClaim::parse(&extra).unwrap(), c);
        assert!(BundleClaim::parse("timestamp:1 file:x").is_err());
        assert!(BundleClaim::parse(&c.to_comment().replace("sha256=", "sha256=zz")).is_err());
        let twice = format!("{} version=9.9.9", c.to_comment());
        assert!(BundleClaim::parse(&twice).is_err());
    }

    #[test]
    fn malformed_files_are_errors() {
        for text in ["", "untrusted comment: x\n", "untrusted comment: x\n!!!\n"] {
            assert!(Signature::parse(text).is_err());
            assert!(PublicKey::parse(text).is_err());
            assert!(SecretKey::parse(text).is_err());
        }
    }

    #[test]
    fn key_id_is_printed_like_minisign() {
        let id = KeyId([0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08]);
        assert_eq!(id.to_string(), "0807060504030201");
    }
}
