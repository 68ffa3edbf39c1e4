//! The system `Path`: `<home>\bin` on it, so that `agent status` is typed anywhere. Written
//! with `reg.exe` (HKLM, the machine's environment), which every Windows has; programs
//! started after it see it (a running shell keeps its own environment).

use std::path::Path;
use std::process::Command;

const ENVIRONMENT: &str = r"HKLM\SYSTEM\CurrentControlSet\Control\Session Manager\Environment";

/// The system `Path` as `reg query` shows it (unexpanded).
fn read() -> Result<String, String> {
    let out = Command::new("reg")
        .args(["query", ENVIRONMENT, "/v", "Path"])
        .output()
        .map_err(|e| format!("cannot run reg query ({e})"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|line| {
            let (_, value) = line
                .split_once("REG_EXPAND_SZ")
                .or_else(|| line.split_once("REG_SZ"))?;
            line.trim_start()
                .to_ascii_lowercase()
                .starts_with("path")
                .then(|| value.trim().to_owned())
        })
        .ok_or_else(|| format!("reg query {ENVIRONMENT} /v Path answered no value"))
}

fn write(value: &str) -> Result<(), String> {
    let out = Command::new("reg")
        .args([
            "add",
            ENVIRONMENT,
            "/v",
            "Path",
            "/t",
            "REG_EXPAND_SZ",
            "/d",
            value,
            "/f",
        ])
        .output()
        .map_err(|e| format!("cannot run reg add ({e})"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "reg add {ENVIRONMENT} /v Path failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Adds `dir` to the system `Path` unless it is there; true when it was added.
pub fn add_to_path(dir: &Path) -> Result<bool, String> {
    match super::path_with(&read()?, &dir.display().to_string()) {
        Some(value) => write(&value).map(|()| true),
        None => Ok(false),
    }
}

/// Removes `dir` from the system `Path`; true when it was there.
pub fn remove_from_path(dir: &Path) -> Result<bool, String> {
    match super::path_without(&read()?, &dir.display().to_string()) {
        Some(value) => write(&value).map(|()| true),
        None => Ok(false),
    }
}
