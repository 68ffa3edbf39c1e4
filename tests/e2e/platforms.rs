//! Releases of several platforms (docs/releases.md, "Releases of several platforms"): one
//! server, one rollout, each machine gets the bundle it runs. The fleet is three real
//! agents, each installed from its own platform's bundle: x86_64 glibc, x86_64 static
//! musl, and aarch64 glibc run by qemu-user through binfmt_misc (`scripts/test.sh` builds
//! it and registers qemu). A plain download of a release of several is refused with the
//! platforms and how to ask; a platform the release lacks is `NO_BUNDLE`, not a failure,
//! and does not hold the rollout up; a broken bundle of one platform rolls back on that
//! platform's machines and counts as their wave's failure.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use e2e::machine::{aarch64_bin, musl_bin};
use e2e::{
    ServerProc, TOKEN, TestContext, admin_agents, agent_logs, bin_path, http, property, read_file,
    require_tool, run_ok, sha256_file, start_wrappers, wait_rollout, wait_until,
};

use crate::update::{QUICK, make_old_defaults, operator_conf, script_agent};

const GNU: &str = "x86_64-unknown-linux-gnu";
const MUSL: &str = "x86_64-unknown-linux-musl";
const ARM: &str = "aarch64-unknown-linux-gnu";
/// The fleet's platforms, in the order `agent.latest.platforms` lists them (sorted).
const PLATFORMS: [&str; 3] = [ARM, GNU, MUSL];
/// qemu runs a debug aarch64 agent, its updater and its health checks several times
/// slower than the native ones: the waits are generous, and every one polls.
const WAIT: Duration = Duration::from_secs(150);

/// ELF `e_machine` values.
const EM_X86_64: u16 = 62;
const EM_AARCH64: u16 = 183;

/// The `agent`, `agent-service` or `agent-bundle` built for `platform`.
fn built_for(platform: &str, name: &str) -> PathBuf {
    match platform {
        GNU => bin_path(name),
        MUSL => musl_bin(name),
        ARM => aarch64_bin(name),
        other => panic!("no build of {other} here"),
    }
}

/// A distribution for `platform`: its own agent binary, with `marker` appended (ELF
/// ignores it) so that each version's binary is its own.
fn dist_for(ctx: &TestContext, dir: &str, platform: &str, marker: &str) -> PathBuf {
    let dist = ctx.dist(dir);
    let mut bin = fs::read(built_for(platform, "agent")).unwrap();
    bin.extend_from_slice(marker.as_bytes());
    fs::write(dist.join("bin/agent"), bin).unwrap();
    fs::copy(
        built_for(platform, "agent-service"),
        dist.join("bin/agent-service"),
    )
    .unwrap();
    dist
}

/// Packs `dist` for `platform`, with that platform's own stub: the bundle is an
/// executable of its platform.
fn pack_for(
    ctx: &TestContext,
    dist: &Path,
    version: &str,
    build: &str,
    key: &Path,
    out: &str,
    platform: &str,
) -> PathBuf {
    let stub = built_for(platform, "agent-bundle").display().to_string();
    ctx.pack_with(
        dist,
        version,
        build,
        key,
        out,
        &["--stub", &stub, "--platform", platform],
    )
}

/// The marker the agent binary of `version` for `platform` ends with.
fn marker(version: &str, platform: &str) -> String {
    format!("agent {version} for {platform}")
}

/// The ELF `e_machine` of the file at `path`.
fn elf_machine(path: &Path) -> u16 {
    let elf = fs::read(path).unwrap();
    assert!(
        elf.len() > 20 && elf.starts_with(b"\x7fELF"),
        "{} is no ELF file",
        path.display()
    );
    u16::from_le_bytes([elf[18], elf[19]])
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

/// Asserts that the agent installed at `home` is `version`'s binary for `platform`: its
/// marker, its machine (x86_64 or aarch64), and a program interpreter exactly when it
/// is a glibc build (the musl one is static).
fn assert_own_binary(home: &Path, platform: &str, version: &str) {
    let bin = home.join("current/bin/agent");
    let describe = || {
        String::from_utf8_lossy(&run_ok(Command::new("file").arg("-L").arg(&bin)).stdout)
            .into_owned()
    };
    let bytes = fs::read(&bin).unwrap();
    let wanted = marker(version, platform);
    assert!(
        bytes.ends_with(wanted.as_bytes()),
        "{} is not the binary of {wanted}: {}",
        bin.display(),
        describe()
    );
    let machine = if platform.starts_with("aarch64-") {
        EM_AARCH64
    } else {
        EM_X86_64
    };
    assert_eq!(elf_machine(&bin), machine, "{platform}: {}", describe());
    assert_eq!(
        has_interpreter(&bin),
        platform.ends_with("-gnu"),
        "{platform}: {}",
        describe()
    );
}

/// The fleet: an agent 1.0.0+1 per platform of [`PLATFORMS`], each installed from its
/// own platform's bundle; `(platform, home)`.
fn installed_fleet(ctx: &TestContext, key: &Path) -> Vec<(&'static str, PathBuf)> {
    PLATFORMS
        .iter()
        .map(|&platform| {
            let tag = &platform[..platform.find('-').unwrap()];
            let prefix = format!("{tag}-{}", &platform[platform.rfind('-').unwrap() + 1..]);
            let dist = dist_for(
                ctx,
                &format!("d1-{prefix}"),
                platform,
                &marker("1.0.0", platform),
            );
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
            let home = ctx.install(&bundle, &prefix);
            fs::write(home.join("conf/agent-env.sh"), QUICK).unwrap();
            assert_own_binary(&home, platform, "1.0.0");
            (platform, home)
        })
        .collect()
}

/// Packs `version` (build `build`) for each of `platforms` (for `broken`, an agent that
/// exits at once: it never reports healthy), drops them into the server's download
/// directory as one release, and waits until the server serves each.
fn release(
    ctx: &TestContext,
    server: &ServerProc,
    key: &Path,
    version: &str,
    build: &str,
    platforms: &[&'static str],
    broken: Option<&str>,
) -> Vec<(&'static str, PathBuf)> {
    let bundles: Vec<(&'static str, PathBuf)> = platforms
        .iter()
        .map(|&platform| {
            let dir = format!("{version}-{platform}");
            let dist = dist_for(
                ctx,
                &format!("d{dir}"),
                platform,
                &marker(version, platform),
            );
            if broken == Some(platform) {
                script_agent(&dist, "exit 1");
            }
            let bundle = pack_for(
                ctx,
                &dist,
                version,
                build,
                key,
                &format!("b{dir}"),
                platform,
            );
            (platform, bundle)
        })
        .collect();
    server.clear_bundles();
    drop_release(server, &bundles);
    for (platform, bundle) in &bundles {
        let path = format!("/agentupdate/version?platform={platform}");
        wait_until(
            Duration::from_secs(30),
            &format!("the server to serve {version} for {platform}"),
            || {
                http(server.port, "GET", &path, &[]).is_ok_and(|a| {
                    property(&a.text(), "agent.latest.sha256") == Some(sha256_file(bundle))
                })
            },
        );
    }
    bundles
}

/// Drops every bundle of a release at once (`agent-bundle-<version>-<platform>` and its
/// signature): copied in under other names first, then renamed, signatures before
/// bundles, so the server never reads half a file.
fn drop_release(server: &ServerProc, bundles: &[(&str, PathBuf)]) {
    let staging = server.download_dir().join(".staging");
    fs::create_dir_all(&staging).unwrap();
    let mut sigs = Vec::new();
    let mut files = Vec::new();
    for (platform, bundle) in bundles {
        let name = format!(
            "{}-{platform}",
            bundle.file_name().unwrap().to_string_lossy()
        );
        let sig = format!("{name}.minisig");
        fs::copy(format!("{}.minisig", bundle.display()), staging.join(&sig)).unwrap();
        fs::copy(bundle, staging.join(&name)).unwrap();
        sigs.push(sig);
        files.push(name);
    }
    for name in sigs.into_iter().chain(files) {
        fs::rename(staging.join(&name), server.download_dir().join(&name)).unwrap();
    }
}

fn agents(server: &ServerProc) -> Vec<serde_json::Value> {
    admin_agents(server.port, TOKEN)
}

/// The `/admin/agents` row of the agent of `platform` (one per platform here).
fn row_of(server: &ServerProc, platform: &str) -> Option<serde_json::Value> {
    agents(server)
        .into_iter()
        .find(|a| a["platform"] == platform)
}

/// Points each agent at `server` and starts it through its wrapper; waits until the
/// server lists all of them at 1.0.0+1.
fn start_fleet(server: &ServerProc, fleet: &[(&str, PathBuf)]) {
    for (_, home) in fleet {
        operator_conf(home, &server.url(""));
    }
    let homes: Vec<PathBuf> = fleet.iter().map(|(_, h)| h.clone()).collect();
    start_wrappers(&homes);
    wait_until(WAIT, "the three agents to register", || {
        agents(server).len() == fleet.len()
    });
}

/// Waits until every agent of `fleet` whose platform is in `platforms` reports `version`
/// `INSTALLED`; on timeout shows the rows and their logs.
fn wait_installed(
    server: &ServerProc,
    fleet: &[(&str, PathBuf)],
    platforms: &[&str],
    version: &str,
) {
    let started = std::time::Instant::now();
    loop {
        let rows = agents(server);
        let done = platforms.iter().all(|p| {
            rows.iter().any(|a| {
                a["platform"] == *p && a["version"] == version && a["update_status"] == "INSTALLED"
            })
        });
        if done {
            return;
        }
        if started.elapsed() > WAIT {
            let logs: Vec<String> = fleet
                .iter()
                .map(|(p, home)| format!("=== {p}\n{}", agent_logs(home)))
                .collect();
            panic!(
                "timed out waiting for {platforms:?} to run {version}: {rows:#?}\n{}",
                logs.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn platform_release_reaches_each_agent_with_its_own_binary() {
    let ctx = TestContext::new();
    let (key, public) = ctx.keygen("keys");
    let fleet = installed_fleet(&ctx, &key);
    let server = ctx.server("srv", &[("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)]);
    let b2 = release(&ctx, &server, &key, "2.0.0", "2", &PLATFORMS, None);

    // /version lists the platforms.
    let version = http(server.port, "GET", "/agentupdate/version", &[]).unwrap();
    assert_eq!(
        property(&version.text(), "agent.latest.platforms"),
        Some(PLATFORMS.join(",")),
        "{}",
        version.text()
    );
    // A plain download of a release of several platforms hands out none of them.
    for path in ["/agentupdate/download", "/agentupdate/download.minisig"] {
        let plain = http(server.port, "GET", path, &[]).unwrap();
        let text = plain.text();
        assert_eq!(plain.status, 300, "{path}: {text}");
        assert!(
            PLATFORMS.iter().all(|p| text.contains(p)) && text.contains("?platform="),
            "{path}: {text}"
        );
        assert!(plain.body.len() < 4096, "{path}: a bundle was sent");
    }

    // wget --content-disposition saves each platform's bundle under its name, and the
    // real minisign verifies it and the platform its signed comment names.
    require_tool("wget");
    require_tool("minisign");
    for (platform, bundle) in &b2 {
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
        // The saved bundle is an executable of its platform (its own stub).
        let machine = if platform.starts_with("aarch64-") {
            EM_AARCH64
        } else {
            EM_X86_64
        };
        assert_eq!(elf_machine(&saved), machine, "{name}");
    }

    // Every agent comes, is refused, and takes its own platform's bundle.
    start_fleet(&server, &fleet);
    wait_installed(&server, &fleet, &PLATFORMS, "2.0.0+2");
    for (platform, home) in &fleet {
        assert_own_binary(home, platform, "2.0.0");
    }
    let r = wait_rollout(
        &server,
        TOKEN,
        WAIT,
        "the release's rollout to complete",
        |r| r["version"] == "2.0.0+2" && r["state"] == "completed",
    );
    assert_eq!(r["waves"][0]["failed"], 0, "{r}");
    assert_eq!(r["waves"][0]["installed"], 3, "{r}");
}

#[test]
fn platform_missing_from_a_release_is_no_bundle_and_a_broken_one_rolls_back_on_its_platform() {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let fleet = installed_fleet(&ctx, &key);
    let server = ctx.server(
        "srv",
        &[
            ("UPDATE_SERVER_ADMIN_TOKEN", TOKEN),
            // One wave of the whole fleet; its first failure halts the rollout.
            ("UPDATE_SERVER_ROLLOUT_WAVES", "100%"),
            ("UPDATE_SERVER_ROLLOUT_MAX_FAILURES", "0"),
        ],
    );
    // The fleet runs 1.0.0, the release served (a server that serves nothing is one
    // agents wait for).
    release(&ctx, &server, &key, "1.0.0", "1", &PLATFORMS, None);
    start_fleet(&server, &fleet);
    wait_rollout(&server, TOKEN, WAIT, "1.0.0's rollout to complete", |r| {
        r["version"] == "1.0.0+1" && r["state"] == "completed"
    });
    let arm_home = &fleet.iter().find(|(p, _)| *p == ARM).unwrap().1;

    // 2.0.0 for x86_64 only: no aarch64 bundle, and no static aarch64 one to fall back
    // to. The x86_64 agents update; the aarch64 one is told so and kept on its version.
    release(&ctx, &server, &key, "2.0.0", "2", &[GNU, MUSL], None);
    wait_installed(&server, &fleet, &[GNU, MUSL], "2.0.0+2");
    let r = wait_rollout(&server, TOKEN, WAIT, "2.0.0's rollout to end", |r| {
        r["version"] == "2.0.0+2" && r["state"] != "running"
    });
    assert_eq!(r["state"], "completed", "{r}");
    let wave = &r["waves"][0];
    assert_eq!(
        (&wave["installed"], &wave["no_bundle"], &wave["failed"]),
        (&2.into(), &1.into(), &0.into()),
        "{r}"
    );
    let arm = row_of(&server, ARM).unwrap();
    assert_eq!(
        (&arm["version"], &arm["update_status"]),
        (&"1.0.0+1".into(), &"NO_BUNDLE".into()),
        "{arm}"
    );
    assert_own_binary(arm_home, ARM, "1.0.0");
    for (platform, home) in fleet.iter().filter(|(p, _)| *p != ARM) {
        assert_own_binary(home, platform, "2.0.0");
    }

    // 3.0.0 for all three, with a broken aarch64 agent: the aarch64 machine takes it,
    // sees it never come up, rolls back to what it ran, and the wave counts it failed.
    let b3 = release(&ctx, &server, &key, "3.0.0", "3", &PLATFORMS, Some(ARM));
    let halted = wait_rollout(&server, TOKEN, WAIT, "3.0.0's rollout to halt", |r| {
        r["version"] == "3.0.0+3" && r["state"] == "halted"
    });
    assert_eq!(halted["waves"][0]["failed"], 1, "{halted}");
    let mut arm = serde_json::Value::Null;
    wait_until(WAIT, "the aarch64 agent to run 1.0.0+1 again", || {
        arm = row_of(&server, ARM).unwrap();
        arm["version"] == "1.0.0+1" && arm["update_status"] != "NO_BUNDLE"
    });
    assert_ne!(arm["update_status"], "INSTALLED", "{arm}");
    assert_own_binary(arm_home, ARM, "1.0.0");
    let arm_b3 = &b3.iter().find(|(p, _)| *p == ARM).unwrap().1;
    assert!(
        read_file(&arm_home.join("data/bad-versions")).contains(&sha256_file(arm_b3)),
        "the broken bundle is not in data/bad-versions\n{}",
        agent_logs(arm_home)
    );
    assert!(
        read_file(&arm_home.join("logs/update.log")).contains("rolling back"),
        "{}",
        agent_logs(arm_home)
    );
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
    // An agent is told the release is refused; the operator is told why.
    let (_, _, health) = h.get("/healthz");
    assert!(health.contains("one version and build"), "{health}");
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
