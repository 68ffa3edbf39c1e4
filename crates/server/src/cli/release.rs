//! `update-server release publish|list|rollback|export`: releases through the admin API
//! of a running server.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::Subcommand;
use serde_json::Value;

use super::AdminClient;
use super::table::{date, text};

#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub enum Release {
    /// Upload a release: each agent-bundle-<v>[-<target>][.exe] with its .minisig, and
    /// the Windows MSI agent-<v>-<target>.msi with its .msi.minisig when there is one.
    Publish {
        /// Directories (their agent-bundle-* files and MSI) or files.
        #[arg(required = true, value_name = "DIR|FILE")]
        paths: Vec<PathBuf>,
        /// Keep the release for this deployment and start its rollout there; the
        /// fleet's current release (`default`'s) stays as it is.
        #[arg(long, value_name = "NAME")]
        deployment: Option<String>,
    },
    /// The current release and the ones kept before it.
    List,
    /// Make a kept release the target again, with fresh signatures over its bytes
    /// (`agent-bundle sign --key K FILE…`).
    Rollback {
        /// The kept release, `<version>+<build>`.
        #[arg(long, value_name = "VERSION+BUILD")]
        to: String,
        /// The directory of its fresh .minisig files.
        #[arg(long, value_name = "DIR")]
        signatures: PathBuf,
        /// Move this deployment back instead of default (the fleet's current release
        /// stays).
        #[arg(long, value_name = "NAME")]
        deployment: Option<String>,
    },
    /// Write the current release's files (or a kept one's) into a directory.
    Export {
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// A kept release, `<version>+<build>`, rather than the current one.
        #[arg(long, value_name = "VERSION+BUILD")]
        release: Option<String>,
    },
}

impl Release {
    pub(super) async fn run(&self, client: &AdminClient, json: bool) -> anyhow::Result<()> {
        let (answer, said) = match self {
            Release::Publish { paths, deployment } => {
                let files = release_files(paths)?;
                let answer = client.publish(&files, deployment.as_deref()).await?;
                let whose = match deployment {
                    Some(d) => format!(
                        " for deployment {d}: every server of the fleet serves it to the agents {d} selects, and {d}'s rollout starts under its policy"
                    ),
                    None => "; every server of the fleet serves it, and the rollout starts under [rollout]".to_owned(),
                };
                let msi = match answer["msi"]["name"].as_str() {
                    Some(name) => {
                        let mut url = format!(
                            "{}{}",
                            client.base().unwrap_or_default(),
                            agent_protocol::wire::MSI_PATH
                        );
                        // A deployment's release is asked for by name, as its bundles are.
                        if deployment.is_some() {
                            let id = answer["id"].as_str().unwrap_or_default();
                            url.push_str(&format!(
                                "?{}={}",
                                agent_protocol::wire::RELEASE_QUERY,
                                id.replace('+', "%2B")
                            ));
                        }
                        format!(", with its Windows MSI {name} at {url}")
                    }
                    None => String::new(),
                };
                let said = format!(
                    "published release {} ({}{msi}){whose}",
                    answer["id"].as_str().unwrap_or("?"),
                    answer["platforms"]
                        .as_array()
                        .map(|p| p
                            .iter()
                            .filter_map(|v| v.as_str())
                            .collect::<Vec<_>>()
                            .join(", "))
                        .unwrap_or_default()
                );
                (answer, said)
            }
            Release::List => {
                let answer = client.releases().await?;
                let said = render_releases(&answer);
                (answer, said.trim_end().to_owned())
            }
            Release::Rollback {
                to,
                signatures,
                deployment,
            } => {
                let answer = client
                    .rollback(to, signatures, deployment.as_deref())
                    .await?;
                let said = match deployment {
                    Some(d) => format!(
                        "release {to} is deployment {d}'s target again; its agents that keep it switch back without downloading (update-server deployment show {d} follows it)"
                    ),
                    None => format!(
                        "release {to} is the target again; agents that keep it switch back without downloading (update-server rollout status follows it)"
                    ),
                };
                (answer, said)
            }
            Release::Export { out, release } => {
                let written = client.export(out, release.as_deref()).await?;
                let said = format!(
                    "wrote {} files into {}; `update-server release publish {}` takes them on another server",
                    written.len(),
                    out.display(),
                    out.display()
                );
                (serde_json::json!({ "files": written }), said)
            }
        };
        super::print_answer(&answer, json, |_| said)
    }
}

/// How long a release's upload or one file's export may take.
const TRANSFER_TIMEOUT: Duration = Duration::from_secs(600);

/// The files `paths` name: a directory gives its `agent-bundle-*` files and its MSIs
/// (`agent-*.msi`, with their `.minisig`), a bundle or MSI brings its `.minisig` along
/// when one lies beside it.
pub fn release_files(paths: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = Vec::new();
    let mut add = |path: PathBuf| {
        if !files.contains(&path) {
            files.push(path);
        }
    };
    for path in paths {
        let meta = std::fs::metadata(path).with_context(|| format!("{}", path.display()))?;
        if meta.is_dir() {
            let mut found = Vec::new();
            for entry in std::fs::read_dir(path).with_context(|| format!("{}", path.display()))? {
                let entry = entry.with_context(|| format!("{}", path.display()))?;
                let name = entry.file_name().to_string_lossy().into_owned();
                let msi = agent_protocol::layout::is_msi_file_name(
                    name.strip_suffix(".minisig").unwrap_or(&name),
                );
                if (name.starts_with("agent-bundle-") || msi) && entry.file_type()?.is_file() {
                    found.push(entry.path());
                }
            }
            if found.is_empty() {
                anyhow::bail!(
                    "{} holds no agent-bundle-* files: give the directory that scripts/build-dist.sh wrote, or the files",
                    path.display()
                );
            }
            found.sort();
            found.into_iter().for_each(&mut add);
        } else {
            let signature = PathBuf::from(format!("{}.minisig", path.display()));
            add(path.clone());
            if !path.to_string_lossy().ends_with(".minisig") && signature.is_file() {
                add(signature);
            }
        }
    }
    Ok(files)
}

impl AdminClient {
    /// `POST /admin/releases`: uploads the files as one release.
    pub async fn publish(
        &self,
        files: &[PathBuf],
        deployment: Option<&str>,
    ) -> anyhow::Result<Value> {
        let base = self.base()?;
        let mut form = reqwest::multipart::Form::new();
        let mut total = 0u64;
        for path in files {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .with_context(|| format!("{}: not a file name", path.display()))?;
            let file = tokio::fs::File::open(path)
                .await
                .with_context(|| format!("{}", path.display()))?;
            let size = file.metadata().await?.len();
            total += size;
            let body = reqwest::Body::wrap_stream(tokio_util::io::ReaderStream::new(file));
            let part = reqwest::multipart::Part::stream_with_length(body, size)
                .file_name(name.clone())
                .mime_str("application/octet-stream")?;
            form = form.part(name, part);
        }
        eprintln!(
            "uploading {} file{} ({:.1} MiB) to {base} …",
            files.len(),
            if files.len() == 1 { "" } else { "s" },
            total as f64 / (1024.0 * 1024.0)
        );
        let request = self
            .http_for(TRANSFER_TIMEOUT)?
            .post(match deployment {
                Some(d) => format!("{base}/admin/releases?deployment={d}"),
                None => format!("{base}/admin/releases"),
            })
            .multipart(form);
        self.send(base, request).await
    }

    /// `GET /admin/releases`.
    pub async fn releases(&self) -> anyhow::Result<Value> {
        let base = self.base()?;
        let request = self.http()?.get(format!("{base}/admin/releases"));
        self.send(base, request).await
    }

    /// `POST /admin/releases/rollback` with the `.minisig` files of `signatures`.
    pub async fn rollback(
        &self,
        to: &str,
        signatures: &Path,
        deployment: Option<&str>,
    ) -> anyhow::Result<Value> {
        let base = self.base()?;
        let mut given = BTreeMap::new();
        let entries = std::fs::read_dir(signatures)
            .with_context(|| format!("--signatures {}", signatures.display()))?;
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("agent-bundle-") && name.ends_with(".minisig") {
                let text = std::fs::read_to_string(entry.path())
                    .with_context(|| format!("{}", entry.path().display()))?;
                given.insert(name, text);
            }
        }
        if given.is_empty() {
            anyhow::bail!(
                "--signatures {} holds no agent-bundle-*.minisig: sign the kept release's bundles with `agent-bundle sign --key K FILE…` (get them with `update-server release export --release {to} --out DIR`)",
                signatures.display()
            );
        }
        let body = serde_json::json!({ "to": to, "signatures": given, "deployment": deployment });
        let request = self
            .http()?
            .post(format!("{base}/admin/releases/rollback"))
            .json(&body);
        self.send(base, request).await
    }

    /// Writes the files of the current release (or of the kept release `id`) into
    /// `out`; returns the names written.
    pub async fn export(&self, out: &Path, id: Option<&str>) -> anyhow::Result<Vec<String>> {
        let base = self.base()?;
        let list = self.releases().await?;
        let releases = list["releases"].as_array().cloned().unwrap_or_default();
        let entry = match id {
            None => releases.first().cloned().context(
                "no release was published yet: publish one with `update-server release publish DIR`",
            )?,
            Some(id) => releases
                .iter()
                .find(|r| r["id"].as_str() == Some(id))
                .cloned()
                .with_context(|| {
                    let kept: Vec<&str> = releases.iter().filter_map(|r| r["id"].as_str()).collect();
                    format!("release {id} is not kept (kept: {})", kept.join(", "))
                })?,
        };
        let release = text(&entry, "id").to_owned();
        std::fs::create_dir_all(out).with_context(|| format!("--out {}", out.display()))?;
        let http = self.http_for(TRANSFER_TIMEOUT)?;
        let mut written = Vec::new();
        let files = entry["files"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        for file in files
            .iter()
            .chain(Some(&entry["msi"]).filter(|m| m.is_object()))
        {
            let name = text(file, "name");
            for name in [name.to_owned(), format!("{name}.minisig")] {
                let url = format!("{base}/admin/releases/{release}/files/{name}");
                let response = http
                    .get(&url)
                    .bearer_auth(&self.token)
                    .send()
                    .await
                    .with_context(|| format!("cannot reach the update-server at {base}"))?;
                if !response.status().is_success() {
                    anyhow::bail!("{url} answered {}", response.status());
                }
                let bytes = response
                    .bytes()
                    .await
                    .with_context(|| format!("{url}: the answer broke off"))?;
                let target = out.join(&name);
                agent_extract::atomic::write(&target, &bytes)
                    .with_context(|| format!("{}", target.display()))?;
                written.push(name);
            }
        }
        Ok(written)
    }
}

/// `GET /admin/releases` as a person reads it.
pub fn render_releases(list: &Value) -> String {
    let mut out = String::new();
    let rows = list["releases"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let serving = &list["serving"];
    if let Some(version) = serving["version"].as_str() {
        let _ = writeln!(
            out,
            "serving {version} ({}) from {}",
            serving["platforms"]
                .as_array()
                .map(|p| p
                    .iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(", "))
                .unwrap_or_default(),
            match text(serving, "source") {
                "published" => "the published release",
                _ => "the download directory",
            }
        );
    } else if let Some(problem) = serving["problem"].as_str() {
        let _ = writeln!(out, "serving nothing: {problem}");
    }
    if rows.is_empty() {
        out.push_str("no release was published yet (update-server release publish DIR)\n");
        return out;
    }
    let _ = writeln!(
        out,
        "{:<2}{:<24} {:<9} {:<30} {:<16} platforms",
        "", "release", "how", "when", "by"
    );
    for r in rows {
        let platforms: Vec<&str> = r["platforms"]
            .as_array()
            .map(|p| p.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "{:<2}{:<24} {:<9} {:<30} {:<16} {}",
            if r["current"].as_bool() == Some(true) {
                "*"
            } else {
                ""
            },
            text(r, "id"),
            text(r, "kind"),
            date(&r["published_at"]),
            text(r, "published_by"),
            if r["msi"].is_object() {
                format!("{}, and its MSI", platforms.join(", "))
            } else {
                platforms.join(", ")
            }
        );
    }
    let _ = writeln!(
        out,
        "(* the current release; {} kept before it for `release rollback --to`)",
        list["keep"].as_u64().unwrap_or(0)
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_gives_its_release_files_and_a_bundle_brings_its_signature() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "agent-bundle-1.0.0",
            "agent-bundle-1.0.0.minisig",
            "agent-1.0.0-x86_64-pc-windows-gnu.msi",
            "agent-1.0.0-x86_64-pc-windows-gnu.msi.minisig",
            "notes.txt",
            "other.msi",
        ] {
            std::fs::write(dir.path().join(name), "x").unwrap();
        }
        let files = release_files(&[dir.path().to_owned()]).unwrap();
        assert_eq!(files.len(), 4, "{files:?}");
        let msi = dir.path().join("agent-1.0.0-x86_64-pc-windows-gnu.msi");
        assert_eq!(
            release_files(&[msi]).unwrap().len(),
            2,
            "with its signature"
        );
        let files = release_files(&[dir.path().join("agent-bundle-1.0.0")]).unwrap();
        assert_eq!(files.len(), 2, "{files:?}");
        let empty = tempfile::tempdir().unwrap();
        let e = release_files(&[empty.path().to_owned()]).unwrap_err();
        assert!(e.to_string().contains("no agent-bundle-"), "{e}");
    }

    #[test]
    fn the_list_marks_the_current_release() {
        let list = serde_json::json!({
            "keep": 5,
            "serving": {"version": "1.0.0+2", "platforms": ["x86_64-unknown-linux-gnu"], "source": "published"},
            "releases": [
                {"id": "1.0.0+2", "kind": "publish", "published_at": 1.0, "published_by": "ops", "current": true, "platforms": ["x86_64-unknown-linux-gnu"]},
                {"id": "1.0.0+1", "kind": "publish", "published_at": 0.5, "published_by": "ops", "current": false, "platforms": ["x86_64-pc-windows-gnu"], "msi": {"name": "agent-1.0.0-x86_64-pc-windows-gnu.msi"}}
            ]
        });
        let shown = render_releases(&list);
        assert!(shown.contains("* 1.0.0+2"), "{shown}");
        assert!(shown.contains("  1.0.0+1"), "{shown}");
        assert!(
            shown.contains("x86_64-pc-windows-gnu, and its MSI"),
            "{shown}"
        );
        assert!(shown.contains("from the published release"), "{shown}");
    }
}
