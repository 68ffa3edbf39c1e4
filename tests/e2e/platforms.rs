//! Releases of several platforms (DESIGN.md, "Platforms"): one server, one rollout, each
//! machine gets the bundle it runs; a plain download of a release of several is refused
//! with the platforms and how to ask; a platform the release lacks is `NO_BUNDLE`, not a
//! failure, and does not hold the rollout up.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use e2e::machine::musl_bin;
use e2e::{
    ServerProc, TestContext, admin_agents, http, http_with_body, property, require_tool, run_ok,
    sha256_file, start_wrappers, wait_rollout, wait_until,
};

use crate::update::{QUICK, TOKEN, WAIT, make_old_defaults, operator_conf};

const GNU: &str = "x86_64-unknown-linux-gnu";
const MUSL: &str = "x86_64-unknown-linux-musl";
const ARM: &str = "aarch64-unknown-linux-gnu";

/// A distribution of `version` for `platform`: the agent built for it, with `marker`
/// appended (ELF ignores it) so that each version's binary is its own.
fn dist_for(ctx: &TestContext, dir: &str, platform: &str, marker: &str) -> PathBuf {
    let dist = ctx.dist(dir);
    let agent = if platform == MUSL {
        musl_bin("agent")
    } else {
        dist.join("bin/agent")
    };
    let mut bin = fs::read(agent).unwrap();
    bin.extend_from_slice(marker.as_bytes());
    fs::write(dist.join("bin/agent"), bin).unwrap();
    dist
}

/// Packs `dist` for `platform` (its own stub: the musl one for musl).
fn pack_for(
    ctx: &TestContext,
    dist: &Path,
    version: &str,
    build: &str,
    key: &Path,
    out: &str,
    platform: &str,
) -> PathBuf {
    let stub = musl_bin("agent-bundle").display().to_string();
    let extra: Vec<&str> = if platform == MUSL {
        vec!["--stub", &stub, "--platform", MUSL]
    } else {
        vec![]
    };
    ctx.pack_with(dist, version, build, key, out, &extra)
}

/// Drops `bundle` (and its signature) into the server's download directory as
/// `agent-bundle-<version>-<platform>`, as an operator should: copied under another name,
/// then renamed, so the server never reads half a file.
fn drop_as(server: &ServerProc, bundle: &Path, platform: &str) -> PathBuf {
    let name = format!(
        "{}-{platform}",
        bundle.file_name().unwrap().to_string_lossy()
    );
    let dir = server.download_dir();
    for (from, to) in [
        (
            PathBuf::from(format!("{}.minisig", bundle.display())),
            format!("{name}.minisig"),
        ),
        (bundle.to_path_buf(), name.clone()),
    ] {
        let part = dir.join(format!(".part-{to}"));
        fs::copy(from, &part).unwrap();
        fs::rename(&part, dir.join(to)).unwrap();
    }
    dir.join(name)
}

/// Drops every bundle of a release at once (see [`drop_as`]): a server never sees a
/// part of it as a release of its own.
fn drop_release(server: &ServerProc, bundles: &[(&Path, &str)]) {
    let staging = server.download_dir().join(".staging");
    fs::create_dir_all(&staging).unwrap();
    let staged: Vec<PathBuf> = bundles
        .iter()
        .flat_map(|(bundle, platform)| {
            let name = format!(
                "{}-{platform}",
                bundle.file_name().unwrap().to_string_lossy()
            );
            let sig = format!("{name}.minisig");
            fs::copy(format!("{}.minisig", bundle.display()), staging.join(&sig)).unwrap();
            fs::copy(bundle, staging.join(&name)).unwrap();
            [staging.join(sig), staging.join(name)]
        })
        .collect();
    // Signatures first, then bundles: renames within one directory tree.
    let (sigs, files): (Vec<_>, Vec<_>) = staged
        .into_iter()
        .partition(|p| p.extension().is_some_and(|e| e == "minisig"));
    for path in sigs.into_iter().chain(files) {
        fs::rename(&path, server.download_dir().join(path.file_name().unwrap())).unwrap();
    }
}

/// An agent 1.0.0+1 for `platform`, installed from its own bundle under `prefix`; its
/// home and that bundle.
fn installed_agent(
    ctx: &TestContext,
    key: &Path,
    platform: &str,
    prefix: &str,
) -> (PathBuf, PathBuf) {
    let dist = dist_for(ctx, &format!("d1-{prefix}"), platform, "");
    make_old_defaults(&dist);
    let bundle = pack_for(
        ctx,
        &dist,
        "1.0.0",
        "1",
        key,
        &format!("b1-{prefix}"),
        platform,
    );
    let home = ctx.install(&bundle, prefix);
    fs::write(home.join("conf/agent-env.sh"), QUICK).unwrap();
    (home, bundle)
}

/// `POST path` for the made-up agent `arm-1` of [`ARM`] at 1.0.0+1, with its token if
/// it has one: the status and the JSON answered.
fn arm_hello(server: &ServerProc, path: &str, token: Option<&str>) -> (u16, serde_json::Value) {
    let hello = format!(r#"{{"id":"arm-1","name":"arm-1","platform":"{ARM}"}}"#);
    let auth = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![
        ("Agent-Version", "1.0.0+1"),
        ("Content-Type", "application/json"),
    ];
    if let Some(auth) = &auth {
        headers.push(("Authorization", auth));
    }
    let answer = http_with_body(server.port, "POST", path, &headers, hello.as_bytes()).unwrap();
    let body = serde_json::from_slice(&answer.body)
        .unwrap_or_else(|_| serde_json::Value::String(answer.text()));
    (answer.status, body)
}

/// Whether the ELF file at `path` asks for a program interpreter (is dynamically
/// linked): a `PT_INTERP` among its program headers.
fn has_interpreter(path: &Path) -> bool {
    let elf = fs::read(path).unwrap();
    assert_eq!(&elf[..4], b"\x7fELF", "{} is no ELF file", path.display());
    assert_eq!(elf[4], 2, "64-bit ELF expected");
    let u16_at = |at: usize| u16::from_le_bytes(elf[at..at + 2].try_into().unwrap()) as usize;
    let u64_at = |at: usize| u64::from_le_bytes(elf[at..at + 8].try_into().unwrap()) as usize;
    let (phoff, phentsize, phnum) = (u64_at(0x20), u16_at(0x36), u16_at(0x38));
    (0..phnum).any(|i| {
        let p_type = u32::from_le_bytes(
            elf[phoff + i * phentsize..phoff + i * phentsize + 4]
                .try_into()
                .unwrap(),
        );
        p_type == 3 // PT_INTERP
    })
}

fn agents(server: &ServerProc) -> Vec<serde_json::Value> {
    admin_agents(server.port, TOKEN)
}

#[test]
fn platform_release_reaches_each_agent_with_its_own_binary() {
    let ctx = TestContext::new();
    let (key, public) = ctx.keygen("keys");
    let (glibc, _) = installed_agent(&ctx, &key, GNU, "pg");
    let (musl, _) = installed_agent(&ctx, &key, MUSL, "pm");

    let d2g = dist_for(&ctx, "d2g", GNU, "agent 2.0.0 glibc");
    let d2m = dist_for(&ctx, "d2m", MUSL, "agent 2.0.0 musl");
    let b2g = pack_for(&ctx, &d2g, "2.0.0", "2", &key, "b2g", GNU);
    let b2m = pack_for(&ctx, &d2m, "2.0.0", "2", &key, "b2m", MUSL);
    let server = ctx.server("srv", &[("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)]);
    drop_release(&server, &[(&b2m, MUSL), (&b2g, GNU)]);
    // The primary bundle (the server's own platform) answers a plain /version.
    server.wait_serving(&sha256_file(&b2g));

    // /version lists the platforms, and answers for each.
    let version = http(server.port, "GET", "/agentupdate/version", &[]).unwrap();
    assert_eq!(
        property(&version.text(), "agent.latest.platforms").as_deref(),
        Some(format!("{GNU},{MUSL}").as_str()),
        "{}",
        version.text()
    );
    let musl_version = http(
        server.port,
        "GET",
        &format!("/agentupdate/version?platform={MUSL}"),
        &[],
    )
    .unwrap();
    assert_eq!(
        property(&musl_version.text(), "agent.latest.sha256"),
        Some(sha256_file(&b2m)),
        "{}",
        musl_version.text()
    );

    // A plain download of a release of two platforms hands out neither.
    for path in ["/agentupdate/download", "/agentupdate/download.minisig"] {
        let plain = http(server.port, "GET", path, &[]).unwrap();
        let text = plain.text();
        assert_eq!(plain.status, 300, "{path}: {text}");
        assert!(
            text.contains(GNU) && text.contains(MUSL) && text.contains("?platform="),
            "{path}: {text}"
        );
        assert!(plain.body.len() < 4096, "{path}: a bundle was sent");
    }

    // wget --content-disposition saves each platform's bundle under its name, and the
    // real minisign verifies it.
    require_tool("wget");
    require_tool("minisign");
    for (platform, bundle) in [(GNU, &b2g), (MUSL, &b2m)] {
        let dir = ctx.path(&format!("wget-{platform}"));
        fs::create_dir_all(&dir).unwrap();
        run_ok(
            Command::new("wget")
                .current_dir(&dir)
                .args(["-q", "--content-disposition"])
                .arg(server.url(&format!("/agentupdate/download?platform={platform}"))),
        );
        let name = format!("agent-bundle-2.0.0-{platform}");
        let saved = dir.join(&name);
        assert!(
            saved.exists(),
            "wget saved {:?}",
            fs::read_dir(&dir)
                .unwrap()
                .flatten()
                .map(|e| e.file_name())
                .collect::<Vec<_>>()
        );
        assert_eq!(sha256_file(&saved), sha256_file(bundle));
        run_ok(
            Command::new("wget")
                .current_dir(&dir)
                .args(["-q", "-O", &format!("{name}.minisig")])
                .arg(server.url(&format!(
                    "/agentupdate/download.minisig?platform={platform}"
                ))),
        );
        let out = run_ok(
            Command::new("minisign")
                .current_dir(&dir)
                .arg("-V")
                .arg("-p")
                .arg(&public)
                .arg("-m")
                .arg(&name),
        );
        assert!(
            String::from_utf8_lossy(&out.stdout).contains(&format!("platform={platform}")),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }

    // Both agents come, are refused, and each takes its own platform's bundle.
    for home in [&glibc, &musl] {
        operator_conf(home, &server.url(""));
    }
    start_wrappers(&[glibc.clone(), musl.clone()]);
    wait_until(WAIT, "both agents to run 2.0.0+2", || {
        let rows = agents(&server);
        rows.len() == 2
            && rows
                .iter()
                .all(|a| a["version"] == "2.0.0+2" && a["update_status"] == "INSTALLED")
    });
    let rows = agents(&server);
    let mut platforms: Vec<&str> = rows
        .iter()
        .map(|a| a["platform"].as_str().unwrap())
        .collect();
    platforms.sort_unstable();
    assert_eq!(platforms, [GNU, MUSL]);
    for (home, marker, dynamic) in [
        (&glibc, "agent 2.0.0 glibc", true),
        (&musl, "agent 2.0.0 musl", false),
    ] {
        let bin = home.join("current/bin/agent");
        let bytes = fs::read(&bin).unwrap();
        assert!(
            bytes.ends_with(marker.as_bytes()),
            "{} is not the {marker} binary",
            bin.display()
        );
        assert_eq!(
            has_interpreter(&bin),
            dynamic,
            "{}: {}",
            bin.display(),
            String::from_utf8_lossy(&run_ok(Command::new("file").arg("-L").arg(&bin)).stdout)
        );
    }
    let r = wait_rollout(
        &server,
        TOKEN,
        WAIT,
        "the release's rollout to complete",
        |r| r["version"] == "2.0.0+2" && r["state"] == "completed",
    );
    assert_eq!(r["waves"][0]["failed"], 0, "{r}");
}

#[test]
fn platform_missing_from_a_release_is_no_bundle_and_the_rollout_completes() {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let (glibc, b1) = installed_agent(&ctx, &key, GNU, "pg");
    let server = ctx.server("srv", &[("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)]);
    // The fleet runs 1.0.0: the glibc agent, and a made-up aarch64 machine.
    ctx.publish_served(&server, &b1);
    let (status, body) = arm_hello(&server, "/agent/register", None);
    assert_eq!(status, 200, "{body}");
    assert!(
        body.get("no_bundle").is_none(),
        "it runs the release: {body}"
    );
    let token = body["token"].as_str().unwrap().to_owned();
    operator_conf(&glibc, &server.url(""));
    start_wrappers(std::slice::from_ref(&glibc));
    wait_rollout(&server, TOKEN, WAIT, "1.0.0's rollout to complete", |r| {
        r["version"] == "1.0.0+1" && r["state"] == "completed"
    });
    wait_until(WAIT, "both agents to be known", || {
        agents(&server).len() == 2
    });

    // 2.0.0 for glibc only: no aarch64 bundle, and no static musl one to fall back to.
    let d2 = dist_for(&ctx, "d2", GNU, "agent 2.0.0 glibc");
    let b2 = pack_for(&ctx, &d2, "2.0.0", "2", &key, "b2", GNU);
    server.clear_bundles();
    drop_as(&server, &b2, GNU);
    server.wait_serving(&sha256_file(&b2));
    wait_rollout(&server, TOKEN, WAIT, "2.0.0's rollout to start", |r| {
        r["version"] == "2.0.0+2"
    });

    // The aarch64 machine is told so and kept on its version, not refused.
    let (status, body) = arm_hello(&server, "/agent/connect", Some(&token));
    assert_eq!(status, 200, "{body}");
    let note = body["no_bundle"].as_str().unwrap_or_default();
    assert!(note.contains(ARM) && note.contains(GNU), "{body}");
    let asked = http(
        server.port,
        "GET",
        &format!("/agentupdate/download?platform={ARM}"),
        &[],
    )
    .unwrap();
    assert_eq!(asked.status, 404, "{}", asked.text());

    // The glibc agent updates; the wave does not wait for aarch64, nor count it failed.
    let r = wait_rollout(&server, TOKEN, WAIT, "2.0.0's rollout to end", |r| {
        r["version"] == "2.0.0+2" && r["state"] != "running"
    });
    assert_eq!(r["state"], "completed", "{r}");
    let wave = &r["waves"][0];
    assert_eq!(
        (&wave["installed"], &wave["no_bundle"], &wave["failed"]),
        (&1.into(), &1.into(), &0.into()),
        "{r}"
    );
    let rows = agents(&server);
    let arm = rows.iter().find(|a| a["id"] == "arm-1").unwrap();
    assert_eq!(arm["update_status"], "NO_BUNDLE", "{arm}");
    assert_eq!(arm["version"], "1.0.0+1", "{arm}");
    assert_eq!(arm["platform"], ARM, "{arm}");
    // Running the target counted as installed; its report follows its commit.
    wait_until(WAIT, "the glibc agent's INSTALLED", || {
        agents(&server).iter().any(|a| {
            a["id"] != "arm-1" && a["version"] == "2.0.0+2" && a["update_status"] == "INSTALLED"
        })
    });
}

/// The router of a server whose download directory holds `bundles` (`(version, build,
/// platform, file name)`), each packed from the test agent and claiming its platform,
/// driven with `oneshot`.
struct Handlers {
    ctx: TestContext,
    state: update_server::AppState,
    runtime: tokio::runtime::Runtime,
}

impl Handlers {
    fn new(bundles: &[(&str, &str, &str, &str)]) -> Self {
        let ctx = TestContext::new();
        let (key, _) = ctx.keygen("keys");
        let dist = ctx.dist("dist");
        let home = ctx.path("home");
        let vars = vec![(
            "UPDATE_SERVER_SERVER_HOME".to_owned(),
            home.display().to_string(),
        )];
        let config =
            update_server::Config::load(None, &agent_protocol::settings::VarMap(vars)).unwrap();
        let dir = config.download_dir();
        fs::create_dir_all(&dir).unwrap();
        for (i, (version, build, platform, name)) in bundles.iter().enumerate() {
            let bundle = ctx.pack_with(
                &dist,
                version,
                build,
                &key,
                &format!("out{i}"),
                &["--platform", platform],
            );
            fs::copy(&bundle, dir.join(name)).unwrap();
            fs::copy(
                format!("{}.minisig", bundle.display()),
                dir.join(format!("{name}.minisig")),
            )
            .unwrap();
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let state = runtime
            .block_on(update_server::build_state(&config))
            .unwrap();
        Self {
            ctx,
            state,
            runtime,
        }
    }

    fn call(
        &self,
        req: axum::http::Request<axum::body::Body>,
    ) -> (u16, axum::http::HeaderMap, String) {
        use http_body_util::BodyExt;
        use tower::ServiceExt;
        self.runtime.block_on(async {
            let resp = update_server::app(self.state.clone())
                .oneshot(req)
                .await
                .unwrap();
            let status = resp.status().as_u16();
            let headers = resp.headers().clone();
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            (status, headers, String::from_utf8_lossy(&body).into_owned())
        })
    }

    fn get(&self, path: &str) -> (u16, axum::http::HeaderMap, String) {
        self.call(
            axum::http::Request::get(path)
                .body(axum::body::Body::empty())
                .unwrap(),
        )
    }

    fn register(&self, version: &str, platform: &str) -> (u16, serde_json::Value) {
        let body = format!(r#"{{"id":"a-{platform}","name":"h","platform":"{platform}"}}"#);
        let (status, _, text) = self.call(
            axum::http::Request::post("/agent/register")
                .header("Agent-Version", version)
                .header("Content-Type", "application/json")
                .body(axum::body::Body::from(body))
                .unwrap(),
        );
        (status, serde_json::from_str(&text).unwrap_or_default())
    }
}

#[test]
fn platform_endpoints_answer_for_each_platform_of_a_release() {
    let h = Handlers::new(&[
        (
            "2.2.0",
            "7",
            GNU,
            "agent-bundle-2.2.0-x86_64-unknown-linux-gnu",
        ),
        (
            "2.2.0",
            "7",
            MUSL,
            "agent-bundle-2.2.0-x86_64-unknown-linux-musl",
        ),
    ]);
    let (status, _, text) = h.get("/agentupdate/version");
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        property(&text, "agent.latest.platforms").as_deref(),
        Some(format!("{GNU},{MUSL}").as_str())
    );
    assert_eq!(
        property(&text, "agent.latest.platform").as_deref(),
        Some(agent_protocol::layout::PLATFORM)
    );
    let (_, _, gnu) = h.get(&format!("/agentupdate/version?platform={GNU}"));
    let (_, _, musl) = h.get(&format!("/agentupdate/version?platform={MUSL}"));
    let sha = |t: &str| property(t, "agent.latest.sha256").unwrap();
    assert_ne!(sha(&gnu), sha(&musl));
    assert_eq!(
        property(&musl, "agent.latest.filename").as_deref(),
        Some("agent-bundle-2.2.0-x86_64-unknown-linux-musl")
    );

    // A plain download or signature: 300, the platforms and how to ask.
    for path in ["/agentupdate/download", "/agentupdate/download.minisig"] {
        let (status, _, text) = h.get(path);
        assert_eq!(status, 300, "{path}: {text}");
        assert!(
            text.contains(&format!("{path}?platform={GNU}"))
                && text.contains(&format!("{path}?platform={MUSL}")),
            "{path}: {text}"
        );
    }
    // Each platform's bundle, under its own name and its own ETag.
    let (status, headers, _) = h.call(
        axum::http::Request::head(format!("/agentupdate/download?platform={MUSL}"))
            .body(axum::body::Body::empty())
            .unwrap(),
    );
    assert_eq!(status, 200);
    assert_eq!(
        headers["content-disposition"],
        "attachment; filename=\"agent-bundle-2.2.0-x86_64-unknown-linux-musl\""
    );
    assert_eq!(headers["etag"], format!("\"{}\"", sha(&musl)).as_str());
    let (status, _, sig) = h.get(&format!("/agentupdate/download.minisig?platform={MUSL}"));
    assert_eq!(status, 200);
    assert!(sig.contains(&format!("platform={MUSL}")), "{sig}");
    // Another architecture: nothing; a platform that is no triple: refused.
    let (status, _, text) = h.get(&format!("/agentupdate/download?platform={ARM}"));
    assert_eq!(status, 404, "{text}");
    assert!(text.contains(ARM) && text.contains(MUSL), "{text}");
    let (status, _, _) = h.get("/agentupdate/download?platform=..%2Fetc");
    assert_eq!(status, 400);

    // A refused agent is pointed at its own platform's bundle.
    let (status, body) = h.register("1.0.0+1", MUSL);
    assert_eq!(status, 409, "{body}");
    assert_eq!(
        body["download"],
        format!("/agentupdate/download?platform={MUSL}")
    );
    assert_eq!(body["sha256"], sha(&musl).as_str());
    // One of another architecture is not refused: there is nothing it could run.
    let (status, body) = h.register("1.0.0+1", ARM);
    assert_eq!(status, 200, "{body}");
    assert!(
        body["no_bundle"].as_str().is_some_and(|n| n.contains(ARM)),
        "{body}"
    );
    drop(h.ctx);
}

#[test]
fn platform_bundles_of_different_versions_are_no_release() {
    let h = Handlers::new(&[
        (
            "2.2.0",
            "7",
            GNU,
            "agent-bundle-2.2.0-x86_64-unknown-linux-gnu",
        ),
        (
            "2.3.0",
            "8",
            MUSL,
            "agent-bundle-2.3.0-x86_64-unknown-linux-musl",
        ),
    ]);
    let (status, _, text) = h.get("/agentupdate/version");
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("one version and build"), "{text}");
}

#[test]
fn platform_static_musl_serves_a_glibc_machine_of_its_arch() {
    let h = Handlers::new(&[("2.2.0", "7", MUSL, "agent-bundle-2.2.0")]);
    let (status, _, text) = h.get(&format!("/agentupdate/version?platform={GNU}"));
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        property(&text, "agent.latest.platform").as_deref(),
        Some(MUSL)
    );
    // A release of one bundle still answers a plain download.
    let (status, _, _) = h.call(
        axum::http::Request::head("/agentupdate/download")
            .body(axum::body::Body::empty())
            .unwrap(),
    );
    assert_eq!(status, 200);
    let (status, body) = h.register("1.0.0+1", GNU);
    assert_eq!(status, 409, "{body}");
}
