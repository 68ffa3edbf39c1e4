//! Platforms (Rust target triples) and which bundle of a release a machine runs.
//!
//! A release is one version and build packed for several platforms. A machine runs the
//! bundle made for its own platform; failing that, the static musl bundle of its
//! architecture (it needs no C library, so it runs on any Linux of that architecture);
//! failing that, none: nothing is ever handed to a machine that cannot run it.

/// A plain target triple, as a query, a hello or a bundle's properties may name it:
/// ASCII letters, digits, `_`, `.` and `-`, at most 128 characters, two dashes at least.
pub fn is_target(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
        && s.split('-').filter(|p| !p.is_empty()).count() >= 3
}

/// The architecture of a target triple: its first part (`x86_64`, `aarch64`).
pub fn arch(target: &str) -> &str {
    target.split('-').next().unwrap_or(target)
}

/// The static musl target of `target`'s architecture, for a Linux target
/// (`aarch64-unknown-linux-gnu` → `aarch64-unknown-linux-musl`); `None` for others.
pub fn static_musl(target: &str) -> Option<String> {
    let mut parts = target.split('-');
    let arch = parts.next()?;
    if arch.is_empty() || !parts.any(|p| p == "linux") {
        return None;
    }
    Some(format!("{arch}-unknown-linux-musl"))
}

/// Whether a bundle made for `bundle` runs on a machine of platform `machine`: its own
/// platform, or the static musl platform of its architecture.
pub fn runs_on(bundle: &str, machine: &str) -> bool {
    bundle == machine || static_musl(machine).as_deref() == Some(bundle)
}

/// Which of the `available` platforms serves a machine of platform `machine`: the exact
/// one, else the static musl one of its architecture, else none.
pub fn choose<'a, S: AsRef<str>>(available: &'a [S], machine: &str) -> Option<&'a S> {
    available
        .iter()
        .find(|p| p.as_ref() == machine)
        .or_else(|| {
            let musl = static_musl(machine)?;
            available.iter().find(|p| p.as_ref() == musl)
        })
}

/// What a program's file name ends with on `target`: `.exe` on Windows, else nothing.
pub fn exe_suffix(target: &str) -> &'static str {
    if target.split('-').any(|p| p == "windows") {
        ".exe"
    } else {
        ""
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_programs_end_in_exe() {
        assert_eq!(exe_suffix("x86_64-pc-windows-gnu"), ".exe");
        assert_eq!(exe_suffix("x86_64-unknown-linux-gnu"), "");
    }

    const GNU: &str = "x86_64-unknown-linux-gnu";
    const MUSL: &str = "x86_64-unknown-linux-musl";
    const ARM: &str = "aarch64-unknown-linux-gnu";
    const ARM_MUSL: &str = "aarch64-unknown-linux-musl";

    #[test]
    fn the_exact_platform_first_then_static_musl_of_the_arch_else_none() {
        assert_eq!(choose(&[MUSL, GNU], GNU), Some(&GNU));
        assert_eq!(choose(&[MUSL, GNU], MUSL), Some(&MUSL));
        assert_eq!(choose(&[MUSL], GNU), Some(&MUSL));
        assert_eq!(choose(&[GNU], MUSL), None, "glibc never runs on musl");
        assert_eq!(choose(&[GNU, MUSL], ARM), None, "another architecture");
        assert_eq!(choose(&[GNU, ARM_MUSL], ARM), Some(&ARM_MUSL));
        assert_eq!(choose::<&str>(&[], GNU), None);
        assert_eq!(choose(&[GNU], "x86_64-apple-darwin"), None);
    }

    #[test]
    fn static_musl_is_per_architecture_and_linux_only() {
        assert_eq!(static_musl(GNU).as_deref(), Some(MUSL));
        assert_eq!(static_musl(MUSL).as_deref(), Some(MUSL));
        assert_eq!(static_musl(ARM).as_deref(), Some(ARM_MUSL));
        assert_eq!(static_musl("x86_64-apple-darwin"), None);
        assert_eq!(static_musl(""), None);
        assert_eq!(arch(ARM), "aarch64");
        assert!(runs_on(MUSL, GNU));
        assert!(runs_on(GNU, GNU));
        assert!(!runs_on(GNU, MUSL));
        assert!(!runs_on(ARM_MUSL, GNU));
    }

    #[test]
    fn targets_are_plain_triples() {
        for t in [GNU, MUSL, ARM, "armv7-unknown-linux-gnueabihf"] {
            assert!(is_target(t), "{t}");
        }
        for t in [
            "",
            "x86_64",
            "a b-c-d",
            "x86_64-unknown-linux-gnu&x=1",
            "../../etc",
        ] {
            assert!(!is_target(t), "{t}");
        }
        assert!(!is_target(&"a-b-c".repeat(50)));
    }
}
