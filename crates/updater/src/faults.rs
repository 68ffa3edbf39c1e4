//! The crash tests' fault points (`--features failpoints` only; no shipped build has
//! them). They are set from `FAILPOINTS`, as the `fail` crate reads it, and also from
//! `<home>/conf/failpoints` in the same `name=action;…` form, taken by the first updater
//! that reads it: a Windows service manager starts the service, and so the agent and its
//! updater, with an environment of its own, so a test cannot hand them a variable.

#[cfg(feature = "failpoints")]
use std::{fs, path::Path};

/// Sets the fault points; they stay set while the returned scenario lives.
#[cfg(feature = "failpoints")]
pub(crate) fn setup(home: &Path) -> fail::FailScenario<'static> {
    let scenario = fail::FailScenario::setup();
    let file = home.join("conf").join("failpoints");
    let Ok(text) = fs::read_to_string(&file) else {
        return scenario;
    };
    // Taken by one updater only: the recovery after the crash runs without them, as it
    // would after a real one.
    let _ = fs::rename(&file, file.with_extension("taken"));
    for (name, action) in parse(&text) {
        if let Err(e) = fail::cfg(name, action) {
            eprintln!("conf/failpoints: {name}={action}: {e}");
        }
    }
    scenario
}

/// `name=action` pairs separated by `;` or new lines; blanks and lines without `=` are
/// skipped.
fn parse(text: &str) -> impl Iterator<Item = (&str, &str)> {
    text.split([';', '\n'])
        .filter_map(|item| item.trim().split_once('='))
        .map(|(name, action)| (name.trim(), action.trim()))
        .filter(|(name, action)| !name.is_empty() && !action.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_are_read_from_lines_and_semicolons() {
        let got: Vec<_> = parse("updater-switched=return\n\n a = b ;junk;c=\n").collect();
        assert_eq!(got, vec![("updater-switched", "return"), ("a", "b")]);
    }
}
