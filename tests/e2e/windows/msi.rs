//! The MSI (installer/windows/agent.wxs, built with wixl) under Wine's msiexec: a silent
//! install with its properties registers the agent with its labels, `msiexec /x` runs
//! the agent's uninstall, a newer MSI replaces an older one and updates the agent, an MSI
//! older than the agent changes nothing, a wrong enrollment token fails the msiexec and
//! leaves nothing. A release carries its MSI (`release publish`, or dropped by hand):
//! every server serves it at `/agentupdate/agent.msi` with its signature, and
//! `msiexec /i http://SERVER/agentupdate/agent.msi` installs from there.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use e2e::wine::{WINDOWS, WinMachine, run_ok_wine, test_guid, win_path, wixl};
use e2e::{
    ServerProc, TOKEN, TestContext, admin_agents, http, read_file, run_fails, run_ok, stdout,
    wait_until,
};

use super::{WAIT, dist, pack};

const ENROLL: &str = "the-enrollment-token";

struct Setup {
    ctx: TestContext,
    key: PathBuf,
    key_pub: PathBuf,
    server: ServerProc,
    upgrade_code: String,
}

/// A server requiring an enrollment token, trusting the test's key (for `release
/// publish`) and serving 1.0.0 for Windows.
fn setup() -> (Setup, PathBuf) {
    let ctx = TestContext::new();
    let (key, key_pub) = ctx.keygen("keys");
    let trusted = key_pub.display().to_string();
    let server = ctx.server(
        "srv",
        &[
            ("UPDATE_SERVER_ADMIN_TOKEN", TOKEN),
            ("UPDATE_SERVER_AGENTS_ENROLLMENT_TOKEN", ENROLL),
            ("UPDATE_SERVER_BUNDLE_PUBLIC_KEY", trusted.as_str()),
        ],
    );
    let upgrade_code = test_guid(&ctx);
    let setup = Setup {
        ctx,
        key,
        key_pub,
        server,
        upgrade_code,
    };
    let b1 = setup.bundle("1.0.0", "1");
    setup.ctx.publish_served(&setup.server, &b1);
    (setup, b1)
}

impl Setup {
    fn bundle(&self, version: &str, build: &str) -> PathBuf {
        let d = dist(
            &self.ctx,
            &format!("d{version}"),
            &format!("agent {version}"),
            &self.key_pub,
        );
        pack(&self.ctx, &d, version, build, &self.key)
    }

    fn msi(&self, bundle: &Path, version: &str) -> PathBuf {
        wixl(
            bundle,
            version,
            &self.upgrade_code,
            &self.ctx.path(&format!("msi/agent-{version}-{WINDOWS}.msi")),
        )
    }

    /// The release's MSI, built beside `bundle` as scripts/build-dist.sh builds it
    /// (`agent-<version>-<target>.msi`) and signed with `agent-bundle sign` for that
    /// bundle's build: its `.msi.minisig`.
    fn release_msi(&self, bundle: &Path, version: &str) -> PathBuf {
        let dir = bundle.parent().unwrap();
        let msi = wixl(
            bundle,
            version,
            &self.upgrade_code,
            &dir.join(format!("agent-{version}-{WINDOWS}.msi")),
        );
        let said = stdout(&run_ok(
            self.ctx
                .cmd("agent-bundle")
                .args(["sign", "--key"])
                .arg(&self.key)
                .arg(&msi),
        ));
        assert!(said.contains(&format!("for {WINDOWS}")), "{said}");
        msi
    }

    /// `GET path` of the server.
    fn get(&self, path: &str) -> e2e::HttpAnswer {
        http(self.server.port, "GET", path, &[]).unwrap()
    }

    fn rows(&self) -> Vec<serde_json::Value> {
        admin_agents(self.server.port, TOKEN)
    }

    fn wait_row(
        &self,
        machine: &WinMachine,
        what: &str,
        cond: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let start = Instant::now();
        loop {
            let rows = self.rows();
            if let Some(r) = rows.iter().find(|r| cond(r)) {
                return r.clone();
            }
            assert!(
                start.elapsed() < WAIT,
                "{what}: not within {WAIT:?}; rows {rows:?}\n--- service.log:\n{}\n--- agent.log:\n{}",
                read_file(&machine.home().join("logs/service.log")),
                e2e::tail(&machine.home().join("logs/agent.log"), 30)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// `msiexec /i MSI /qn` with the machine's directory and service name, and `props`.
fn install(m: &WinMachine, msi: &str, props: &[String]) -> (std::process::Output, String) {
    let mut args = vec!["/i".to_owned(), msi.to_owned()];
    args.extend(m.msi_properties());
    args.extend(props.iter().cloned());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    m.msiexec(&args)
}

fn assert_ok(what: &str, (out, log): &(std::process::Output, String)) {
    assert!(
        out.status.success(),
        "{what}: msiexec {}\n{}\n--- what the bundle said:\n{}\n--- the MSI log's end:\n{}",
        out.status,
        stdout(out),
        log.lines()
            .filter(|l| l.contains("agent-bundle:"))
            .collect::<Vec<_>>()
            .join("\n"),
        log.lines()
            .rev()
            .take(60)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

fn props(server: &ServerProc, extra: &[&str]) -> Vec<String> {
    let mut p = vec![
        format!("SERVER_URL={}", server.url("")),
        format!("ENROLL_TOKEN={ENROLL}"),
    ];
    p.extend(extra.iter().map(|s| (*s).to_owned()));
    p
}

/// The system `Path` (lower case), as `reg query` shows it.
fn system_path(m: &WinMachine) -> String {
    let out = run_ok_wine(m.cmd("reg").args([
        "query",
        r"HKLM\SYSTEM\CurrentControlSet\Control\Session Manager\Environment",
        "/v",
        "Path",
    ]));
    stdout(&out).to_lowercase()
}

/// The launcher, `<home>\bin\agent.exe`: the stable path of the agent's commands.
fn launcher(m: &WinMachine) -> std::process::Command {
    m.cmd(m.home().join("bin/agent.exe"))
}

#[test]
fn an_msi_installs_the_agent_with_its_properties_and_msiexec_x_runs_its_uninstall() {
    let (s, b1) = setup();
    let m = WinMachine::new(&s.ctx, "win");
    let msi = s.msi(&b1, "1.0.0");
    let installed = install(
        &m,
        &win_path(&msi),
        &props(&s.server, &["LABELS=env=prod,region=eu", "GROUP=canary"]),
    );
    assert_ok("install", &installed);
    let row = s.wait_row(&m, "the agent to register with its labels", |r| {
        r["platform"] == WINDOWS && r["version"] == "1.0.0+1"
    });
    assert_eq!(row["labels"]["env"], "prod", "{row}");
    assert_eq!(row["labels"]["region"], "eu", "{row}");
    assert_eq!(row["group"], "canary", "{row}");
    // Windows Installer owns its copy of the bundle, beside the agent, not the agent.
    assert!(m.root.join("agent-setup/agent-bundle.exe").is_file());
    assert_eq!(read_file(&m.home().join("current")).trim(), "1.0.0+1");

    // <home>\bin, the launcher's folder, is on the system Path.
    let bin = win_path(&m.home().join("bin")).to_lowercase();
    assert!(system_path(&m).contains(&bin), "{}", system_path(&m));

    // The stable path runs the current version's commands.
    let status = stdout(&run_ok_wine(launcher(&m).arg("status")));
    assert!(
        status.contains(&format!("agent 1.0.0+1 ({WINDOWS})")),
        "{status}"
    );
    let locked = stdout(&run_ok_wine(
        launcher(&m).args(["lock", "take", "msi-test"]),
    ));
    assert!(locked.contains("update lock msi-test taken"), "{locked}");
    assert!(m.home().join("run/update-locks").is_dir());

    let removed = m.msiexec(&["/x", &win_path(&msi)]);
    assert_ok("msiexec /x", &removed);
    assert!(removed.1.contains("left the fleet"), "{}", removed.1);
    let query = e2e::wine::output(m.cmd("sc").args(["query", &m.service]));
    assert!(!query.status.success(), "{}", stdout(&query));
    wait_until(WAIT, "every process of the installation to end", || {
        m.processes().is_empty()
    });
    assert!(!system_path(&m).contains(&bin), "{}", system_path(&m));
    for gone in ["versions", "current", "run", "bin"] {
        assert!(
            m.home().join(gone).symlink_metadata().is_err(),
            "{gone} is still there:\n{}",
            removed.1
        );
    }
    // Windows Installer's own copy of the bundle (agent-setup\) is not checked: Wine's
    // msiexec /x of a product installed anywhere but its default folder removes the files
    // and then copies them again (measured with a one-file MSI too; docs/windows.md).
    assert!(m.home().join("conf/agent.toml").is_file(), "conf\\ is kept");
    let left = s.wait_row(&m, "the agent to have left", |r| {
        r["update_status"] == "LEFT"
    });
    assert_eq!(left["id"], row["id"], "{left}");
}

#[test]
fn the_launcher_runs_uninstall_and_goes_with_it() {
    let (s, b1) = setup();
    let m = WinMachine::new(&s.ctx, "win");
    assert_ok(
        "install",
        &install(&m, &win_path(&s.msi(&b1, "1.0.0")), &props(&s.server, &[])),
    );
    s.wait_row(&m, "the agent to register", |r| r["version"] == "1.0.0+1");
    // Typed as `agent uninstall`: the running launcher is in bin\, which goes.
    let said = stdout(&run_ok_wine(launcher(&m).args(["uninstall", "--yes"])));
    assert!(said.contains("left the fleet"), "{said}");
    assert!(said.contains("uninstalled"), "{said}");
    wait_until(WAIT, "bin\\ and every process to be gone", || {
        m.home().join("bin").symlink_metadata().is_err() && m.processes().is_empty()
    });
}

#[test]
fn a_newer_msi_replaces_the_older_one_and_updates_the_agent_through_its_updater() {
    let (s, b1) = setup();
    let m = WinMachine::new(&s.ctx, "win");
    assert_ok(
        "install 1.0.0",
        &install(&m, &win_path(&s.msi(&b1, "1.0.0")), &props(&s.server, &[])),
    );
    let first = s.wait_row(&m, "1.0.0 to register", |r| r["version"] == "1.0.0+1");
    // The fleet moves to 2.0.0 too; a lock holds the agent's own update off, so that the
    // MSI is what updates it.
    run_ok_wine(launcher(&m).args(["lock", "take", "msi-upgrade"]));
    let b2 = s.bundle("2.0.0", "2");
    s.ctx.republish(&s.server, &b2);
    let msi2 = s.msi(&b2, "2.0.0");
    let upgraded = install(&m, &win_path(&msi2), &[]);
    assert_ok("install 2.0.0 over 1.0.0", &upgraded);
    assert_eq!(read_file(&m.home().join("current")).trim(), "2.0.0+2");
    // Windows Installer's copy is 2.0.0's: the older product is gone.
    assert_eq!(
        fs::read(m.root.join("agent-setup/agent-bundle.exe")).unwrap(),
        fs::read(&b2).unwrap()
    );
    m.wait_agent_running(WAIT);
    let row = s.wait_row(&m, "the same agent to run 2.0.0", |r| {
        r["version"] == "2.0.0+2"
    });
    assert_eq!(
        row["id"], first["id"],
        "a new agent registered: {row}\n--- the MSI log:\n{}",
        upgraded.1
    );
    assert_eq!(s.rows().len(), 1);
    // One product: removing it removes the agent.
    assert_ok("msiexec /x 2.0.0", &m.msiexec(&["/x", &win_path(&msi2)]));
    let query = e2e::wine::output(m.cmd("sc").args(["query", &m.service]));
    assert!(!query.status.success(), "{}", stdout(&query));
}

#[test]
fn an_msi_older_than_the_running_agent_changes_nothing_and_succeeds() {
    let (s, b1) = setup();
    let m = WinMachine::new(&s.ctx, "win");
    // The agent runs 2.0.0 (it updated itself since the older MSI was made).
    let b2 = s.bundle("2.0.0", "2");
    s.ctx.republish(&s.server, &b2);
    m.install(
        &b2,
        &["--server-url", &s.server.url(""), "--enroll-token", ENROLL],
    );
    s.wait_row(&m, "2.0.0 to register", |r| r["version"] == "2.0.0+2");
    let pid = m.agent_pid().unwrap();
    let id = read_file(&m.home().join("data/agent-id"));
    let older = install(&m, &win_path(&s.msi(&b1, "1.0.0")), &props(&s.server, &[]));
    assert_ok("install the older MSI", &older);
    assert!(
        older.1.contains("which is not newer: nothing changed"),
        "{}",
        older.1
    );
    assert_eq!(read_file(&m.home().join("current")).trim(), "2.0.0+2");
    assert!(!m.home().join("versions/1.0.0+1").exists());
    assert_eq!(m.agent_pid(), Some(pid), "the agent was not touched");
    assert_eq!(read_file(&m.home().join("data/agent-id")), id);
}

#[test]
fn an_msi_with_a_wrong_enrollment_token_fails_with_the_servers_words_and_leaves_nothing() {
    let (s, b1) = setup();
    let m = WinMachine::new(&s.ctx, "win");
    let (out, log) = install(
        &m,
        &win_path(&s.msi(&b1, "1.0.0")),
        &[
            format!("SERVER_URL={}", s.server.url("")),
            "ENROLL_TOKEN=not-the-token".to_owned(),
        ],
    );
    assert!(!out.status.success(), "msiexec succeeded:\n{log}");
    assert!(
        log.contains("the enrollment token is wrong"),
        "the server's words are not in the MSI log:\n{log}"
    );
    assert!(!m.home().exists(), "the agent's home was left behind");
    assert!(
        !m.root.join("agent-setup").exists(),
        "the MSI's files were left"
    );
    let query = e2e::wine::output(m.cmd("sc").args(["query", &m.service]));
    assert!(!query.status.success(), "{}", stdout(&query));
    assert!(m.processes().is_empty());
    assert!(s.rows().is_empty(), "{:?}", s.rows());
}

#[test]
fn a_release_carries_its_msi_and_the_server_serves_it_with_its_signature() {
    let (s, b1) = setup();
    let answer = s.get("/agentupdate/agent.msi");
    assert_eq!(answer.status, 404, "{}", answer.text());
    assert!(
        answer
            .text()
            .contains("release 1.0.0+1 carries no Windows MSI"),
        "{}",
        answer.text()
    );
    let msi = s.release_msi(&b1, "1.0.0");
    let dir = b1.parent().unwrap();
    let signature = fs::read_to_string(format!("{}.minisig", msi.display())).unwrap();

    // A bad signature: refused, naming the file, and nothing changed.
    let (stranger, _) = s.ctx.keygen("stranger");
    let good = format!("{}.minisig", msi.display());
    fs::copy(&good, s.ctx.path("good.minisig")).unwrap();
    run_ok(
        s.ctx
            .cmd("agent-bundle")
            .args(["sign", "--key"])
            .arg(&stranger)
            .arg(&msi),
    );
    let said = run_fails(
        e2e::release_cmd(&s.ctx, &s.server, TOKEN, &["publish"]).arg(dir),
        1,
    );
    assert!(
        said.contains(&format!("agent-1.0.0-{WINDOWS}.msi: it is signed by key"))
            && said.contains("nothing changed"),
        "{said}"
    );
    assert_eq!(s.get("/agentupdate/agent.msi").status, 404);
    let listed = stdout(&run_ok(&mut e2e::release_cmd(
        &s.ctx,
        &s.server,
        TOKEN,
        &["list"],
    )));
    assert!(!listed.contains("its MSI"), "{listed}");
    fs::copy(s.ctx.path("good.minisig"), &good).unwrap();

    // The release with its MSI: served, its signature beside it.
    let said = stdout(&run_ok(
        e2e::release_cmd(&s.ctx, &s.server, TOKEN, &["publish"]).arg(dir),
    ));
    assert!(
        said.contains(&format!(
            "with its Windows MSI agent-1.0.0-{WINDOWS}.msi at "
        )) && said.contains("/agentupdate/agent.msi"),
        "{said}"
    );
    let bytes = fs::read(&msi).unwrap();
    let answer = s.get("/agentupdate/agent.msi");
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.header("content-type"), Some("application/x-msi"));
    assert_eq!(
        answer.header("content-length"),
        Some(bytes.len().to_string().as_str())
    );
    assert!(
        answer.body == bytes,
        "the MSI served is not the one published"
    );
    let sig = s.get("/agentupdate/agent.msi.minisig");
    assert_eq!(sig.status, 200);
    assert_eq!(sig.text(), signature);
    // What a Windows administrator checks it with.
    e2e::require_tool("minisign");
    let got = s.ctx.path("got/agent.msi");
    fs::create_dir_all(got.parent().unwrap()).unwrap();
    fs::write(&got, &answer.body).unwrap();
    fs::write(s.ctx.path("got/agent.msi.minisig"), sig.body).unwrap();
    let checked = run_ok(
        std::process::Command::new("minisign")
            .args(["-V", "-p"])
            .arg(&s.key_pub)
            .arg("-m")
            .arg(&got),
    );
    assert!(
        stdout(&checked).contains("version=1.0.0 build=1 platform=x86_64-pc-windows-gnu"),
        "{}",
        stdout(&checked)
    );
    // By name, as a deployment's release is asked for; another release is not here.
    let named = s.get("/agentupdate/agent.msi?release=1.0.0%2B1");
    assert!(named.status == 200 && named.body == bytes);
    let other = s.get("/agentupdate/agent.msi?release=9.9.9%2B9");
    assert_eq!(other.status, 404, "{}", other.text());
    // By deployment: what `msiexec /i …/agent.msi?deployment=prod` installs is the
    // release prod runs; a deployment that does not exist is named back.
    let (status, made) = e2e::admin_call(
        &s.server,
        TOKEN,
        "POST",
        "/admin/deployments",
        serde_json::json!({ "name": "prod", "selector": "env=prod", "release": "1.0.0+1" })
            .to_string(),
    );
    assert_eq!(status, 201, "{made}");
    let by_deployment = s.get("/agentupdate/agent.msi?deployment=prod");
    assert!(by_deployment.status == 200 && by_deployment.body == bytes);
    let sig_by_deployment = s.get("/agentupdate/agent.msi.minisig?deployment=prod");
    assert_eq!(sig_by_deployment.text(), signature);
    let nowhere = s.get("/agentupdate/agent.msi?deployment=nowhere");
    assert_eq!(nowhere.status, 404, "{}", nowhere.text());
    assert!(
        nowhere.text().contains("no deployment")
            && nowhere.text().contains("nowhere")
            && nowhere.text().contains("default, prod"),
        "{}",
        nowhere.text()
    );
    let listed = stdout(&run_ok(&mut e2e::release_cmd(
        &s.ctx,
        &s.server,
        TOKEN,
        &["list"],
    )));
    assert!(
        listed.contains("x86_64-pc-windows-gnu, and its MSI"),
        "{listed}"
    );
}

/// The release's MSI dropped into the download directory by hand is taken as a publish
/// is, and msiexec installs the agent from the server's own URL.
#[test]
fn msiexec_installs_the_agent_from_the_servers_agent_msi() {
    let (s, b1) = setup();
    let m = WinMachine::new(&s.ctx, "win");
    let msi = s.release_msi(&b1, "1.0.0");
    let downloads = s.server.download_dir();
    for file in [
        msi.clone(),
        PathBuf::from(format!("{}.minisig", msi.display())),
    ] {
        let name = file.file_name().unwrap();
        fs::copy(&file, downloads.join(".part")).unwrap();
        fs::rename(downloads.join(".part"), downloads.join(name)).unwrap();
    }
    wait_until(
        Duration::from_secs(30),
        "the dropped MSI to be served",
        || s.get("/agentupdate/agent.msi").status == 200,
    );
    let url = s.server.url("/agentupdate/agent.msi");
    assert_ok(
        "install from the server's URL",
        &install(&m, &url, &props(&s.server, &[])),
    );
    s.wait_row(&m, "the agent to register", |r| {
        r["platform"] == WINDOWS && r["version"] == "1.0.0+1"
    });
    m.wait_agent_running(WAIT);
}
