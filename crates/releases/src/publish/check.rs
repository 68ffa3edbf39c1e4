//! What makes a set of files a publishable release: every name a bundle's, its MSI's or
//! a signature's, every bundle signed and verified under a trusted key, one version and
//! build, one bundle per platform; at most one MSI, signed by the key that signed the
//! bundles for the release's version and build and for a Windows platform it has a
//! bundle for. Every refusal names its file and says why.
//!
//! The same checks take a release uploaded with `release publish` and one dropped into
//! the download directory by hand; only a hand drop may be checked, when the server
//! trusts no key of its own, against the key each bundle ships ([`Trusted::Shipped`]).

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use agent_extract::payload::Payload;
use agent_extract::unpack;
use agent_extract::verify::{self, Trust};
use agent_protocol::digest::Digests;
use agent_protocol::minisign::{BundleClaim, PublicKey, Signature, Signed};
use agent_protocol::{AgentVersion, layout, platform};

/// One file refused, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub file: String,
    pub reason: String,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.file, self.reason)
    }
}

/// Every refusal of a set of files, told together so that one attempt shows them all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub Vec<Refusal>);

impl Refused {
    /// Each file and its reason, without the words around them.
    pub fn reasons(&self) -> String {
        let all: Vec<String> = self.0.iter().map(Refusal::to_string).collect();
        all.join("; ")
    }
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the release is refused, nothing changed: {}",
            self.reasons()
        )
    }
}

fn refuse(file: &str, reason: impl Into<String>) -> Refusal {
    Refusal {
        file: file.to_owned(),
        reason: reason.into(),
    }
}

/// A bundle that passed.
#[derive(Debug, Clone)]
pub struct CheckedBundle {
    pub name: String,
    pub platform: String,
    pub version: AgentVersion,
    pub sha256: String,
    pub size: u64,
    pub signature: String,
    pub signed_at: u64,
    /// The key its signature verified under (a trusted one, or the end of the rotation
    /// chain it carries): the key its release's MSI must be signed by.
    pub signer: PublicKey,
}

/// A release's MSI that passed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedMsi {
    pub name: String,
    /// The Windows platform of the bundle it installs.
    pub platform: String,
    pub sha256: String,
    pub size: u64,
    pub signature: String,
}

/// A release that passed: its bundles, by platform, and its MSI if it carries one.
#[derive(Debug, Clone)]
pub struct Checked {
    pub version: AgentVersion,
    pub bundles: Vec<CheckedBundle>,
    pub msi: Option<CheckedMsi>,
}

impl Checked {
    /// `<version>+<build>`, what the release is known by.
    pub fn id(&self) -> String {
        self.version.to_string()
    }

    /// The latest signing time of its bundles.
    pub fn signed_at(&self) -> u64 {
        self.bundles.iter().map(|b| b.signed_at).max().unwrap_or(0)
    }
}

/// Whether `name` may be a file of a release: `agent-bundle-…` or an MSI
/// `agent-….msi` (or the `.minisig` of either), of the characters a version and a
/// target triple use, never a path.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok_chars = name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'+'));
    let file = name.strip_suffix(".minisig").unwrap_or(name);
    let known = file.starts_with("agent-bundle-") || layout::is_msi_file_name(file);
    if !known || !ok_chars || name.contains("..") || name.len() > 200 {
        return Err(
            "not a release file: a release holds agent-bundle-<version>[-<target>][.exe] files, at most one agent-<version>-<target>.msi, and their .minisig signatures"
                .into(),
        );
    }
    Ok(())
}

/// The keys a bundle must verify under.
#[derive(Debug, Clone, Copy)]
pub enum Trusted<'a> {
    /// Any one of these may vouch for a bundle, through a rotation chain it carries.
    Keys(&'a [PublicKey]),
    /// The key the bundle ships (`conf.default/update.pub`), the one a fresh install
    /// trusts: what a server that trusts no key of its own checks a hand-dropped release
    /// against, so that a bundle without its signature, or with one that does not match
    /// its bytes, is refused rather than served for every agent to refuse.
    Shipped,
}

/// Where a distribution ships the key its bundles are signed with.
const SHIPPED_KEY: &str = "conf.default/update.pub";

/// Checks the files of `dir` (each name already passed [`check_name`]) against `trusted`
/// and, when set, `served_key` (the key this server checks what it serves against: a
/// release it would refuse to serve is refused here) and `max_unpacked` (bytes a
/// bundle's distribution may inflate to: `releases.max-unpacked`).
pub fn check_dir(
    dir: &Path,
    names: &[String],
    trusted: Trusted<'_>,
    served_key: Option<&PublicKey>,
    max_unpacked: Option<u64>,
) -> Result<Checked, Refused> {
    let mut refusals = Vec::new();
    let mut bundles = Vec::new();
    let mut msis = Vec::new();
    for name in names {
        if let Some(bundle) = name.strip_suffix(".minisig") {
            if !names.iter().any(|n| n == bundle) {
                refusals.push(refuse(name, "a signature without its bundle"));
            }
            continue;
        }
        if layout::is_msi_file_name(name) {
            // Checked against the release its bundles make, once they pass.
            msis.push(name);
            continue;
        }
        match check_bundle(dir, name, names, trusted, served_key, max_unpacked) {
            Ok(bundle) => bundles.push(bundle),
            Err(reason) => refusals.push(refuse(name, reason)),
        }
    }
    if bundles.is_empty() && refusals.is_empty() {
        refusals.push(refuse(
            "(the release)",
            "no bundle in it: give agent-bundle-<version>[-<target>] files with their .minisig",
        ));
    }
    if let [_, second, ..] = msis.as_slice() {
        refusals.push(refuse(
            second,
            format!(
                "a second MSI (beside {}): a release carries one, its Windows bundle's",
                msis[0]
            ),
        ));
    }
    if !refusals.is_empty() {
        return Err(Refused(refusals));
    }
    let mut checked = assemble(bundles).map_err(Refused)?;
    if let Some(name) = msis.first() {
        checked.msi = Some(
            check_msi(dir, name, names, &checked).map_err(|r| Refused(vec![refuse(name, r)]))?,
        );
    }
    Ok(checked)
}

/// The MSI `name` of the release `checked` (its bundles passed): signed, by the key that
/// signed them, as an MSI of their version and build for a Windows platform they have a
/// bundle for, and named for it. What it holds inside is not read: its signature says
/// what it is, and `agent-bundle sign` signs it for the bundle it was built around.
fn check_msi(
    dir: &Path,
    name: &str,
    names: &[String],
    checked: &Checked,
) -> Result<CheckedMsi, String> {
    let sig_name = layout::signature_file_name(name);
    let how_to_sign = format!(
        "sign it with the key that signed the bundles (agent-bundle sign --key K {name}, with its bundle beside it) and give both"
    );
    if !names.contains(&sig_name) {
        return Err(format!("no signature {sig_name} beside it: {how_to_sign}"));
    }
    let text = verify::read_signature_file(&dir.join(&sig_name)).map_err(|e| {
        format!(
            "its signature {sig_name} cannot be read ({}): {how_to_sign}",
            io_reason(&e)
        )
    })?;
    let signature =
        Signature::parse(&text).map_err(|e| format!("its signature is not minisign's: {e}"))?;
    let Some(key) = checked
        .bundles
        .iter()
        .map(|b| &b.signer)
        .find(|k| k.key_id() == signature.key_id())
    else {
        let signers: Vec<String> = checked
            .bundles
            .iter()
            .map(|b| b.signer.key_id().to_string())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        return Err(format!(
            "it is signed by key {}, but the release's bundles by key {}: {how_to_sign}",
            signature.key_id(),
            signers.join(", ")
        ));
    };
    let path = dir.join(name);
    let digests = std::fs::File::open(&path)
        .and_then(Digests::of_reader)
        .map_err(|e| format!("it cannot be read: {e}"))?;
    let verified = if signature.is_prehashed() {
        signature.verify(key, Signed::Prehashed(&digests.blake2b))
    } else {
        std::fs::read(&path)
            .map_err(agent_protocol::Error::from)
            .and_then(|bytes| signature.verify(key, Signed::Raw(&bytes)))
    };
    verified.map_err(|e| format!("it does not verify: {e}; {how_to_sign}"))?;
    let claim = BundleClaim::parse(signature.trusted_comment()).map_err(|e| {
        format!(
            "its signature does not say which release it is ({e}): a plain `minisign -S` signs no version; {how_to_sign}"
        )
    })?;
    if claim.sha256 != digests.sha256_hex() {
        return Err(format!(
            "its signature vouches for sha256 {}, but its sha256 is {}: {how_to_sign}",
            claim.sha256,
            digests.sha256_hex()
        ));
    }
    if claim.version != checked.version {
        return Err(format!(
            "it is signed as an MSI of {}, but the release's bundles are {}: publish a build's MSI with that build's bundles",
            claim.version, checked.version
        ));
    }
    let windows = platform::exe_suffix(&claim.platform) == ".exe";
    if !windows || !checked.bundles.iter().any(|b| b.platform == claim.platform) {
        return Err(format!(
            "it is signed as the MSI of {}'s bundle, which this release does not have (it has {}): publish the MSI with the Windows bundle it installs",
            claim.platform,
            checked
                .bundles
                .iter()
                .map(|b| b.platform.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let expected = layout::msi_file_name(&checked.version, &claim.platform);
    if name != expected {
        return Err(format!(
            "its name does not say what it holds (the MSI of {} for {}): name it {expected}",
            checked.version, claim.platform
        ));
    }
    Ok(CheckedMsi {
        name: name.to_owned(),
        platform: claim.platform,
        sha256: digests.sha256_hex(),
        size: digests.size,
        signature: text,
    })
}

fn check_bundle(
    dir: &Path,
    name: &str,
    names: &[String],
    trusted: Trusted<'_>,
    served_key: Option<&PublicKey>,
    max_unpacked: Option<u64>,
) -> Result<CheckedBundle, String> {
    let sig_name = layout::signature_file_name(name);
    if !names.contains(&sig_name) {
        return Err(format!(
            "no signature {sig_name} beside it: sign it (agent-bundle sign --key K {name}) and give both"
        ));
    }
    let text = verify::read_signature_file(&dir.join(&sig_name)).map_err(|e| {
        format!(
            "its signature {sig_name} cannot be read ({}): give the .minisig that `agent-bundle sign` or `minisign -S` wrote, a few hundred bytes (at most {} KiB are read)",
            io_reason(&e),
            verify::MAX_SIGNATURE_FILE / 1024
        )
    })?;
    let signature =
        Signature::parse(&text).map_err(|e| format!("its signature is not minisign's: {e}"))?;
    let path = dir.join(name);
    let (verified, trusted_key) = match trusted {
        Trusted::Keys(keys) => verify_under_any(&path, &signature, keys)?,
        Trusted::Shipped => {
            let key = shipped_key(&path)?;
            let verified = verify::verify_file(&path, &signature, &Trust::key(&key)).map_err(|e| {
                format!(
                    "it does not verify under the key it ships ({SHIPPED_KEY}, key {}), the one a fresh install trusts: {}; this server trusts no key of its own (releases.trusted-keys in server.toml)",
                    key.key_id(),
                    crate::refusal::in_servers_words(&e)
                )
            })?;
            (verified, key)
        }
    };
    let signer = verified
        .chain
        .as_ref()
        .map_or(trusted_key, |chain| chain.end.clone());
    if let Some(key) = served_key {
        verify::verify_file(&path, &signature, &Trust::key(key)).map_err(|e| {
            format!(
                "it does not verify under this server's bundle.public-key {}: {}",
                key.key_id(),
                crate::refusal::in_servers_words(&e)
            )
        })?;
    }
    let platform = verified.facts.platform.clone();
    if !platform::is_target(&platform) {
        return Err(format!("it names no plain platform ({platform:?})"));
    }
    if let Some(max) = max_unpacked {
        check_unpacked(&path, &verified.facts.version, verified.digests.size, max)?;
    }
    let version = verified.facts.version.clone();
    let expected = format!("agent-bundle-{}", version.version_str());
    let rest = name
        .strip_prefix(&expected)
        .map(|r| r.trim_end_matches(".exe"));
    if !matches!(rest, Some(r) if r.is_empty() || r == format!("-{platform}")) {
        return Err(format!(
            "its name does not say what it holds ({version} for {platform}): name it {expected}-{platform}"
        ));
    }
    Ok(CheckedBundle {
        name: name.to_owned(),
        platform,
        version,
        sha256: verified.digests.sha256_hex(),
        size: verified.digests.size,
        signature: text,
        signed_at: verified.claim.signed_at,
        signer,
    })
}

/// Refuses a bundle whose distribution inflates to more than `max` bytes, counted as it
/// is inflated (one byte past `max` is enough to know), after the signature checked out:
/// an unsigned bundle costs no inflating.
fn check_unpacked(path: &Path, version: &AgentVersion, size: u64, max: u64) -> Result<(), String> {
    let unpacked = Payload::open(path)
        .and_then(|mut payload| payload.dist_unpacked_size(version, max.saturating_add(1)))
        .map_err(|e| format!("its distribution cannot be read: {}", extract_reason(&e)))?;
    if unpacked > max {
        return Err(format!(
            "its distribution unpacks to more than {} (the bundle is {}): over releases.max-unpacked = {} in server.toml, the most a release may unpack to. If this build is meant to be that large, raise releases.max-unpacked and restart the server; else publish a build without what made it so",
            mib(max),
            mib(size),
            max / MIB
        ));
    }
    Ok(())
}

const MIB: u64 = 1024 * 1024;

/// Bytes as MiB for a message: `512 MiB`, `1.3 MiB`.
fn mib(bytes: u64) -> String {
    if bytes % MIB == 0 {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{:.1} MiB", bytes as f64 / MIB as f64)
    }
}

/// An unpacking error without the server's private path.
fn extract_reason(e: &agent_extract::Error) -> String {
    match e {
        agent_extract::Error::NotABundle { reason, .. }
        | agent_extract::Error::NoZip { reason, .. } => reason.clone(),
        agent_extract::Error::Io { source, .. } => source.to_string(),
        other => other.to_string(),
    }
}

/// An I/O error of a read file, without the server's private path.
fn io_reason(e: &agent_extract::Error) -> String {
    match e {
        agent_extract::Error::Io { source, .. } => source.to_string(),
        other => other.to_string(),
    }
}

/// The key the bundle at `path` ships, read without unpacking anything else. What it
/// claims is not trusted yet: the signature is checked against it next, and the version
/// it names is checked again by that.
fn shipped_key(path: &Path) -> Result<PublicKey, String> {
    let unusable =
        |e: agent_extract::Error| format!("it is not a usable bundle: {}", extract_reason(&e));
    let mut payload = Payload::open(path).map_err(unusable)?;
    let facts = payload.facts().map_err(unusable)?;
    let dist = payload.dist(&facts.version).map_err(unusable)?;
    let text = unpack::read_entry(
        dist,
        Some(layout::DIST_ROOT),
        Path::new(SHIPPED_KEY),
        64 * 1024,
        unpack::Limits::default(),
    )
    .map_err(unusable)?
    .ok_or_else(|| {
        format!(
            "this server trusts no key of its own and the bundle ships none ({SHIPPED_KEY}) to check it against: set releases.trusted-keys (public key files) or bundle.public-key in server.toml"
        )
    })?;
    PublicKey::parse(&String::from_utf8_lossy(&text))
        .map_err(|e| format!("the key it ships ({SHIPPED_KEY}) is no minisign public key: {e}"))
}

/// The bundle at `path` verified under one of `keys`, and that key.
fn verify_under_any(
    path: &Path,
    signature: &Signature,
    keys: &[PublicKey],
) -> Result<(verify::Verified, PublicKey), String> {
    let mut last = None;
    for key in keys {
        match verify::verify_file(path, signature, &Trust::key(key)) {
            Ok(verified) => return Ok((verified, key.clone())),
            Err(e) => last = Some(crate::refusal::in_servers_words(&e)),
        }
    }
    let trusted: Vec<String> = keys.iter().map(|k| k.key_id().to_string()).collect();
    Err(match last {
        Some(why) if keys.len() == 1 => format!("it does not verify: {why}"),
        Some(why) => format!(
            "it verifies under none of the trusted keys ({}): {why}",
            trusted.join(", ")
        ),
        None => "the server trusts no key".into(),
    })
}

/// One version and build, one bundle per platform.
fn assemble(mut bundles: Vec<CheckedBundle>) -> Result<Checked, Vec<Refusal>> {
    bundles.sort_by(|a, b| (&a.platform, &a.name).cmp(&(&b.platform, &b.name)));
    let mut refusals = Vec::new();
    let mut versions: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for b in &bundles {
        versions
            .entry(b.version.to_string())
            .or_default()
            .push(&b.name);
    }
    if versions.len() > 1 {
        let said: Vec<String> = versions
            .iter()
            .map(|(v, names)| format!("{v} in {}", names.join(", ")))
            .collect();
        for b in &bundles {
            refusals.push(refuse(
                &b.name,
                format!(
                    "a release is one version and build, and these are not ({}): publish one build",
                    said.join("; ")
                ),
            ));
        }
    }
    for pair in bundles.windows(2) {
        if pair[0].platform == pair[1].platform {
            refusals.push(refuse(
                &pair[1].name,
                format!(
                    "a second bundle for {} (beside {}): one bundle per platform",
                    pair[1].platform, pair[0].name
                ),
            ));
        }
    }
    if !refusals.is_empty() {
        return Err(refusals);
    }
    let version = bundles[0].version.clone();
    Ok(Checked {
        version,
        bundles,
        msi: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_release_file_names_are_taken() {
        for good in [
            "agent-bundle-1.2.0",
            "agent-bundle-1.2.0-x86_64-unknown-linux-gnu",
            "agent-bundle-1.2.0-x86_64-pc-windows-gnu.exe.minisig",
            "agent-1.2.0-x86_64-pc-windows-gnu.msi",
            "agent-1.2.0-x86_64-pc-windows-gnu.msi.minisig",
        ] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in [
            "../agent-bundle-1",
            "agent-bundle-1/../../x",
            "agent-bundle-..",
            "notes.txt",
            "agent-bundle-1 2",
            "agent-bundle-<script>",
            "setup.msi",
            "agent-1.2.0.exe",
            "",
        ] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }

    /// A signed bundle whose distribution holds `zeros` bytes of zeros, packed into
    /// `<dir>/out`; returns the directory, the names of the bundle and its signature, and
    /// the key.
    fn packed(zeros: u64) -> (tempfile::TempDir, Vec<String>, PublicKey) {
        let (dir, names, key) = packed_for(zeros, "x86_64-unknown-linux-gnu");
        (dir, names, key.public_key())
    }

    /// As [`packed`], for `platform`, with the secret key.
    fn packed_for(
        zeros: u64,
        platform: &str,
    ) -> (
        tempfile::TempDir,
        Vec<String>,
        agent_protocol::minisign::SecretKey,
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let dist = dir.path().join("dist");
        std::fs::create_dir_all(dist.join("bin")).expect("bin");
        std::fs::write(dist.join("bin/agent"), "#!/bin/sh\n").expect("agent");
        std::fs::write(dist.join("README.txt"), "readme\n").expect("readme");
        std::fs::write(dist.join("LICENSE"), "license\n").expect("license");
        std::fs::File::create(dist.join("zeros"))
            .and_then(|f| f.set_len(zeros))
            .expect("zeros");
        let key = agent_protocol::minisign::SecretKey::generate().expect("key");
        let out = dir.path().join("out");
        let packed = agent_bundle::pack::pack(&agent_bundle::pack::PackRequest {
            dist: &dist,
            version: AgentVersion::new("1.0.0", "1").expect("version"),
            platform: platform.to_owned(),
            key: &key,
            out_dir: &out,
            stub: Path::new("/bin/true"),
            signed_at: Some(1_700_000_000),
            rotations: &[],
            allow_other_key: false,
        })
        .expect("pack");
        let names = [&packed.bundle, &packed.signature]
            .iter()
            .map(|p| p.file_name().expect("name").to_string_lossy().into_owned())
            .collect();
        (dir, names, key)
    }

    /// Writes `bytes` as the MSI `name` into `dir`, signed by `key` with `comment`'s claim
    /// made over them (`sha256` left empty: the real one).
    fn msi(
        dir: &Path,
        name: &str,
        bytes: &[u8],
        key: &agent_protocol::minisign::SecretKey,
        claim: &BundleClaim,
    ) {
        std::fs::write(dir.join(name), bytes).expect("msi");
        let digests = Digests::of_reader(bytes).expect("digests");
        let mut claim = claim.clone();
        if claim.sha256.is_empty() {
            claim.sha256 = digests.sha256_hex();
        }
        let signature = key
            .sign_prehashed(&digests.blake2b, &claim.to_comment())
            .expect("sign");
        std::fs::write(
            dir.join(layout::signature_file_name(name)),
            signature.to_file_string(),
        )
        .expect("signature");
    }

    const WINDOWS: &str = "x86_64-pc-windows-gnu";
    const MSI: &str = "agent-1.0.0-x86_64-pc-windows-gnu.msi";

    fn msi_claim(version: &str, platform: &str) -> BundleClaim {
        BundleClaim {
            version: version.parse().expect("version"),
            platform: platform.into(),
            sha256: String::new(),
            signed_at: 1_700_000_000,
        }
    }

    #[test]
    fn a_release_carries_the_msi_its_bundles_signer_signed_for_its_build() {
        let (dir, mut names, key) = packed_for(0, WINDOWS);
        let release = dir.path().join("out");
        let keys = [key.public_key()];
        msi(
            &release,
            MSI,
            b"an msi",
            &key,
            &msi_claim("1.0.0+1", WINDOWS),
        );
        names.extend([MSI.to_owned(), format!("{MSI}.minisig")]);
        let checked =
            check_dir(&release, &names, Trusted::Keys(&keys), None, None).expect("with its MSI");
        let carried = checked.msi.expect("the MSI");
        assert_eq!(carried.name, MSI);
        assert_eq!(carried.platform, WINDOWS);
        assert_eq!(carried.size, 6);
        assert_eq!(checked.bundles.len(), 1, "the MSI is no bundle");

        let refused = |names: &[String]| {
            check_dir(&release, names, Trusted::Keys(&keys), None, None)
                .expect_err("refused")
                .to_string()
        };
        // Without its signature.
        let text = refused(&names[..3]);
        assert!(text.contains(&format!("{MSI}: no signature")), "{text}");
        assert!(text.contains("agent-bundle sign --key K"), "{text}");

        // Signed for another build, by another key, with no claim, over other bytes.
        msi(
            &release,
            MSI,
            b"an msi",
            &key,
            &msi_claim("1.0.0+2", WINDOWS),
        );
        let text = refused(&names);
        assert!(
            text.contains("MSI of 1.0.0+2, but the release's bundles are 1.0.0+1"),
            "{text}"
        );
        let stranger = agent_protocol::minisign::SecretKey::generate().expect("key");
        msi(
            &release,
            MSI,
            b"an msi",
            &stranger,
            &msi_claim("1.0.0+1", WINDOWS),
        );
        let text = refused(&names);
        assert!(text.contains("but the release's bundles by key"), "{text}");
        let digests = Digests::of_reader(&b"an msi"[..]).expect("digests");
        let plain = key
            .sign_prehashed(&digests.blake2b, "timestamp:1700000000\tfile:agent.msi")
            .expect("sign");
        std::fs::write(
            release.join(format!("{MSI}.minisig")),
            plain.to_file_string(),
        )
        .expect("write");
        let text = refused(&names);
        assert!(
            text.contains("plain `minisign -S` signs no version"),
            "{text}"
        );
        msi(
            &release,
            MSI,
            b"an msi",
            &key,
            &msi_claim("1.0.0+1", WINDOWS),
        );
        std::fs::write(release.join(MSI), b"another msi").expect("write");
        let text = refused(&names);
        assert!(text.contains("does not verify"), "{text}");
        assert!(
            text.starts_with("the release is refused, nothing changed"),
            "{text}"
        );

        // For a platform the release has no bundle of, or under a name that hides it.
        msi(
            &release,
            MSI,
            b"an msi",
            &key,
            &msi_claim("1.0.0+1", "aarch64-pc-windows-msvc"),
        );
        let text = refused(&names);
        assert!(text.contains("which this release does not have"), "{text}");
        let other = "agent-1.0.1-x86_64-pc-windows-gnu.msi";
        msi(
            &release,
            other,
            b"an msi",
            &key,
            &msi_claim("1.0.0+1", WINDOWS),
        );
        let renamed = [&names[..2], &[other.to_owned(), format!("{other}.minisig")]].concat();
        let text = refused(&renamed);
        assert!(text.contains(&format!("name it {MSI}")), "{text}");

        // One MSI a release.
        msi(
            &release,
            MSI,
            b"an msi",
            &key,
            &msi_claim("1.0.0+1", WINDOWS),
        );
        let two = [&names[..], &[other.to_owned(), format!("{other}.minisig")]].concat();
        let text = refused(&two);
        assert!(text.contains("a second MSI"), "{text}");
    }

    #[test]
    fn endless_data_a_distribution_over_the_limit_is_refused_with_the_limit() {
        let (dir, names, key) = packed(3 << 20);
        let release = dir.path().join("out");
        let keys = [key];
        let checked = check_dir(&release, &names, Trusted::Keys(&keys), None, Some(4 << 20));
        assert!(checked.is_ok(), "{checked:?}");
        let refused = check_dir(&release, &names, Trusted::Keys(&keys), None, Some(2 << 20))
            .expect_err("over the limit");
        let text = refused.to_string();
        assert_eq!(refused.0.len(), 1, "{text}");
        assert_eq!(refused.0[0].file, names[0]);
        for word in [
            "unpacks to more than 2 MiB",
            "releases.max-unpacked = 2 in server.toml",
            "raise releases.max-unpacked",
            "nothing changed",
        ] {
            assert!(text.contains(word), "{word:?} missing: {text}");
        }
        // A rollback's check takes kept bytes as they are.
        assert!(check_dir(&release, &names, Trusted::Keys(&keys), None, None).is_ok());
    }

    #[test]
    fn a_signature_larger_than_a_signature_is_refused_unread() {
        let (dir, names, key) = packed(0);
        let release = dir.path().join("out");
        let keys = [key];
        let signature = release.join(&names[1]);
        let text = std::fs::read_to_string(&signature).expect("signature");
        let mut padded = text.clone().into_bytes();
        padded.resize(64 << 20, b'\n');
        std::fs::write(&signature, padded).expect("pad");
        let refused = check_dir(&release, &names, Trusted::Keys(&keys), None, None)
            .expect_err("too large")
            .to_string();
        assert!(refused.contains("larger than 8192 bytes"), "{refused}");
        assert!(refused.contains("agent-bundle sign"), "{refused}");
        std::fs::write(&signature, text).expect("restore");
        assert!(check_dir(&release, &names, Trusted::Keys(&keys), None, None).is_ok());
    }

    #[test]
    fn without_a_key_of_its_own_a_hand_drop_is_checked_against_the_key_it_ships() {
        let (dir, names, _) = packed(0);
        let release = dir.path().join("out");
        assert!(check_dir(&release, &names, Trusted::Shipped, None, None).is_ok());

        // Without its signature: refused, saying how to make one.
        let refused = check_dir(&release, &names[..1], Trusted::Shipped, None, None)
            .expect_err("unsigned")
            .to_string();
        assert!(
            refused.contains("no signature") && refused.contains("agent-bundle sign"),
            "{refused}"
        );

        // Signed by a key it does not ship: refused, naming the key it ships.
        let bundle = release.join(&names[0]);
        let digests = agent_protocol::digest::Digests::of_reader(
            std::fs::File::open(&bundle).expect("bundle"),
        )
        .expect("digests");
        let claim = agent_protocol::minisign::BundleClaim {
            version: AgentVersion::new("1.0.0", "1").expect("version"),
            platform: "x86_64-unknown-linux-gnu".into(),
            sha256: digests.sha256_hex(),
            signed_at: 1_700_000_001,
        };
        let stranger = agent_protocol::minisign::SecretKey::generate().expect("key");
        let signature = stranger
            .sign_prehashed(&digests.blake2b, &claim.to_comment())
            .expect("sign");
        std::fs::write(release.join(&names[1]), signature.to_file_string()).expect("write");
        let refused = check_dir(&release, &names, Trusted::Shipped, None, None)
            .expect_err("another key")
            .to_string();
        assert!(
            refused.contains("does not verify under the key it ships")
                && refused.contains("releases.trusted-keys"),
            "{refused}"
        );
        // With that key trusted, it would pass: the key decides, not the file.
        let keys = [stranger.public_key()];
        assert!(check_dir(&release, &names, Trusted::Keys(&keys), None, None).is_ok());
    }

    fn bundle(name: &str, version: &str, platform: &str) -> CheckedBundle {
        CheckedBundle {
            name: name.into(),
            platform: platform.into(),
            version: version.parse().unwrap(),
            sha256: "0".repeat(64),
            size: 1,
            signature: String::new(),
            signed_at: 1,
            signer: agent_protocol::minisign::SecretKey::generate()
                .expect("key")
                .public_key(),
        }
    }

    #[test]
    fn a_release_is_one_build_and_one_bundle_per_platform() {
        let ok = assemble(vec![
            bundle("b", "1.0.0+2", "x86_64-unknown-linux-musl"),
            bundle("a", "1.0.0+2", "aarch64-unknown-linux-gnu"),
        ])
        .unwrap();
        assert_eq!(ok.id(), "1.0.0+2");
        assert_eq!(ok.bundles[0].name, "a");

        let mixed = assemble(vec![
            bundle("a", "1.0.0+2", "aarch64-unknown-linux-gnu"),
            bundle("b", "1.0.0+3", "x86_64-unknown-linux-musl"),
        ])
        .unwrap_err();
        assert_eq!(mixed.len(), 2, "each file is named");
        assert!(
            mixed[0].reason.contains("one version and build"),
            "{mixed:?}"
        );

        let twice = assemble(vec![
            bundle("a", "1.0.0+2", "aarch64-unknown-linux-gnu"),
            bundle("b", "1.0.0+2", "aarch64-unknown-linux-gnu"),
        ])
        .unwrap_err();
        assert_eq!(twice[0].file, "b");
        assert!(twice[0].reason.contains("one bundle per platform"));
    }
}
