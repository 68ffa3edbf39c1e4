use super::*;

/// A workload that takes a set unless `config-dir` holds a file containing "bad".
struct Fake {
    config_dir: PathBuf,
    check: Vec<String>,
    reloads: usize,
    restarts: usize,
}

impl Workload for Fake {
    fn check_argv(&self, dir: &Path) -> Vec<String> {
        self.check
            .iter()
            .map(|w| w.replace("{config_dir}", &dir.display().to_string()))
            .collect()
    }
    async fn reload(&mut self) -> Result<(), String> {
        self.reloads += 1;
        Ok(())
    }
    async fn wait_healthy(&mut self) -> Result<(), String> {
        for entry in std::fs::read_dir(&self.config_dir).map_err(|e| e.to_string())? {
            let text = std::fs::read_to_string(entry.map_err(|e| e.to_string())?.path())
                .map_err(|e| e.to_string())?;
            if text.contains("bad") {
                return Err("workload exited with code 1: bad setting".into());
            }
        }
        Ok(())
    }
    async fn restart(&mut self) {
        self.restarts += 1;
    }
}

fn set(pairs: &[(&str, &str)]) -> ConfigPayload {
    let files: BTreeMap<String, String> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    ConfigPayload {
        hash: config_set::hash(&files),
        files,
    }
}

fn setup() -> (tempfile::TempDir, AgentHome, Dirs, Fake) {
    let tmp = tempfile::tempdir().unwrap();
    let home = AgentHome::new(tmp.path());
    std::fs::create_dir_all(home.conf()).unwrap();
    std::fs::write(home.agent_toml(), "# mine\n").unwrap();
    let dirs = Dirs::new(&home, "conf/workload").unwrap();
    let fake = Fake {
        config_dir: dirs.config_dir.clone(),
        check: Vec::new(),
        reloads: 0,
        restarts: 0,
    };
    (tmp, home, dirs, fake)
}

fn read(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap()
}

#[tokio::test]
async fn a_good_set_is_swapped_in_and_the_one_before_kept() {
    let (_tmp, home, dirs, mut fake) = setup();
    let one = set(&[("app.conf", "level=1\n")]);
    let st = apply(&home, Ok(&dirs), "a", &one, &mut fake).await;
    assert_eq!(st.status, ConfigOutcome::Applied, "{st:?}");
    assert_eq!(read(&dirs.config_dir, "app.conf"), "level=1\n");
    assert_eq!(running_hash(&home), one.hash);
    let two = set(&[("app.conf", "level=2\n"), ("extra.conf", "x\n")]);
    let st = apply(&home, Ok(&dirs), "a", &two, &mut fake).await;
    assert_eq!(st.status, ConfigOutcome::Applied, "{st:?}");
    assert_eq!(read(&dirs.config_dir, "app.conf"), "level=2\n");
    assert_eq!(read(&dirs.prev(), "app.conf"), "level=1\n");
    assert_eq!(fake.reloads, 2);
    assert_eq!(read(home.conf().as_path(), "agent.toml"), "# mine\n");
}

#[tokio::test]
async fn a_set_the_workload_refuses_is_undone_and_remembered() {
    let (_tmp, home, dirs, mut fake) = setup();
    let good = set(&[("app.conf", "good\n")]);
    apply(&home, Ok(&dirs), "a", &good, &mut fake).await;
    let bad = set(&[("app.conf", "bad\n")]);
    let st = apply(&home, Ok(&dirs), "a", &bad, &mut fake).await;
    assert_eq!(st.status, ConfigOutcome::Failed);
    assert!(
        st.error.as_deref().unwrap().contains("bad setting"),
        "{st:?}"
    );
    assert_eq!(read(&dirs.config_dir, "app.conf"), "good\n");
    assert_eq!(fake.restarts, 1);
    assert_eq!(running_hash(&home), good.hash);
    assert_eq!(failed_hash(&home).as_deref(), Some(bad.hash.as_str()));
    let leftovers: Vec<_> = std::fs::read_dir(home.conf())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[tokio::test]
async fn a_check_that_fails_changes_nothing() {
    let (_tmp, home, dirs, mut fake) = setup();
    let good = set(&[("app.conf", "good\n")]);
    apply(&home, Ok(&dirs), "a", &good, &mut fake).await;
    fake.check = vec![
        "/bin/sh".into(),
        "-c".into(),
        "echo checking; grep -q ok {config_dir}/app.conf || { echo 'app.conf: no ok' >&2; exit 3; }".into(),
    ];
    let refused = set(&[("app.conf", "nope\n")]);
    let st = apply(&home, Ok(&dirs), "a", &refused, &mut fake).await;
    assert_eq!(st.status, ConfigOutcome::Failed);
    let error = st.error.unwrap();
    assert!(
        error.contains("exit code 3") && error.contains("app.conf: no ok"),
        "{error}"
    );
    assert_eq!(read(&dirs.config_dir, "app.conf"), "good\n");
    assert_eq!(fake.reloads, 1);
    assert_eq!(fake.restarts, 0);
    let ok = set(&[("app.conf", "ok\n")]);
    let st = apply(&home, Ok(&dirs), "a", &ok, &mut fake).await;
    assert_eq!(st.status, ConfigOutcome::Applied, "{st:?}");
    assert!(failed_hash(&home).is_none());
}

#[tokio::test]
async fn a_damaged_or_unsafe_set_writes_nothing() {
    let (_tmp, home, dirs, mut fake) = setup();
    let mut damaged = set(&[("app.conf", "x\n")]);
    damaged.files.insert("app.conf".into(), "y\n".into());
    let st = apply(&home, Ok(&dirs), "a", &damaged, &mut fake).await;
    assert_eq!(st.status, ConfigOutcome::Failed);
    assert!(st.error.unwrap().contains("damaged"));
    let escaping = set(&[("../agent.toml", "owned\n")]);
    let st = apply(&home, Ok(&dirs), "a", &escaping, &mut fake).await;
    assert_eq!(st.status, ConfigOutcome::Failed);
    assert_eq!(read(home.conf().as_path(), "agent.toml"), "# mine\n");
    assert!(!dirs.config_dir.exists());
    assert_eq!(fake.reloads, 0);
}

#[test]
fn a_config_dir_holding_what_the_agent_needs_is_refused() {
    let home = AgentHome::new("/h");
    for bad in ["conf", ".", "", "/etc/x", "conf/../data", "data/x/.."] {
        assert!(Dirs::new(&home, bad).is_err(), "{bad}");
    }
    assert!(Dirs::new(&home, "conf/workload").is_ok());
}

#[test]
fn a_crash_half_way_is_mended_at_start() {
    let (_tmp, home, dirs, _fake) = setup();
    let staging = dirs.staging("abcdef0123456789");
    std::fs::create_dir_all(&staging).unwrap();
    std::fs::create_dir_all(dirs.prev()).unwrap();
    std::fs::write(dirs.prev().join("app.conf"), "old\n").unwrap();
    dirs.recover(&home);
    assert!(!staging.exists());
    assert_eq!(read(&dirs.config_dir, "app.conf"), "old\n");
    assert!(home.agent_toml().exists());
}

#[tokio::test]
async fn a_set_swapped_in_when_the_agent_died_is_swapped_out_at_start() {
    let (_tmp, home, dirs, mut fake) = setup();
    let good = set(&[("app.conf", "good\n")]);
    apply(&home, Ok(&dirs), "a", &good, &mut fake).await;
    // As if the agent died after the swap, before the verdict.
    let new = set(&[("app.conf", "new\n")]);
    std::fs::create_dir_all(home.data()).unwrap();
    std::fs::write(applying_file(&home), &new.hash).unwrap();
    write_set(&dirs.staging(&new.hash), &new.files).unwrap();
    swap_in(&dirs, &dirs.staging(&new.hash)).unwrap();
    assert_eq!(read(&dirs.config_dir, "app.conf"), "new\n");
    dirs.recover(&home);
    assert_eq!(read(&dirs.config_dir, "app.conf"), "good\n");
    assert!(!applying_file(&home).exists());
    assert_eq!(running_hash(&home), good.hash);
}

/// Regression: the agent died after the exchange, before the set of before was kept as
/// `prev`. Recovery used to remove the staging directory (holding the set of before) as
/// half made and swap in whatever `prev` held: the set before that, or half of it.
#[tokio::test]
async fn an_agent_killed_between_the_exchange_and_keeping_prev_comes_back_on_the_set_before() {
    let (_tmp, home, dirs, mut fake) = setup();
    let older = set(&[("app.conf", "older\n")]);
    let good = set(&[("app.conf", "good\n"), ("extra.conf", "x\n")]);
    apply(&home, Ok(&dirs), "a", &older, &mut fake).await;
    apply(&home, Ok(&dirs), "a", &good, &mut fake).await;
    assert_eq!(read(&dirs.prev(), "app.conf"), "older\n");
    // swap_in's steps, stopped after the exchange.
    let new = set(&[("app.conf", "new\n")]);
    std::fs::write(applying_file(&home), &new.hash).unwrap();
    let staging = dirs.staging(&new.hash);
    write_set(&staging, &new.files).unwrap();
    std::fs::remove_dir_all(dirs.prev()).unwrap();
    crate::os::exchange(&staging, &dirs.config_dir).unwrap();
    dirs.recover(&home);
    assert_eq!(read_set(&dirs.config_dir), Some(good.files.clone()));
    assert!(!staging.exists());
    assert!(!applying_file(&home).exists());
}

/// Regression: the agent died after the workload took the set, between removing the
/// marker and recording the set: at its next start it ran an unrecorded set, was offered
/// it again and applied it over itself, its `prev` lost.
#[tokio::test]
async fn an_agent_killed_as_it_records_the_verdict_keeps_the_set_and_its_prev() {
    let (_tmp, home, dirs, mut fake) = setup();
    let good = set(&[("app.conf", "good\n")]);
    let new = set(&[("app.conf", "new\n")]);
    apply(&home, Ok(&dirs), "a", &good, &mut fake).await;
    apply(&home, Ok(&dirs), "a", &new, &mut fake).await;
    // Recorded, the marker not yet removed.
    std::fs::write(applying_file(&home), &new.hash).unwrap();
    dirs.recover(&home);
    assert_eq!(read(&dirs.config_dir, "app.conf"), "new\n");
    assert_eq!(read(&dirs.prev(), "app.conf"), "good\n");
    assert_eq!(running_hash(&home), new.hash);
    assert!(!applying_file(&home).exists());
}

#[tokio::test]
async fn the_set_before_the_previous_one_leaves_before_the_swap() {
    let (_tmp, home, dirs, mut fake) = setup();
    for n in 0..3 {
        let s = set(&[("app.conf", &format!("level={n}\n"))]);
        apply(&home, Ok(&dirs), "a", &s, &mut fake).await;
    }
    assert_eq!(read(&dirs.config_dir, "app.conf"), "level=2\n");
    assert_eq!(read(&dirs.prev(), "app.conf"), "level=1\n");
    let leftovers: Vec<_> = std::fs::read_dir(home.conf())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn an_outcome_waits_until_sent() {
    let (_tmp, home, _dirs, _fake) = setup();
    let st = ConfigStatus {
        id: "a".into(),
        hash: "h".into(),
        status: ConfigOutcome::Failed,
        error: Some("why".into()),
    };
    keep_status(&home, &st);
    assert_eq!(pending_status(&home).as_ref(), Some(&st));
    status_sent(&home, &st);
    assert!(pending_status(&home).is_none());
}
