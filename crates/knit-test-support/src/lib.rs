//! What knit's tests share; a dev-dependency only, never linked into a
//! product binary.
//!
//! A test that needs a tool of the host (containerd, PostgreSQL, QEMU, …)
//! and does not find it calls [`missing`]: on a developer's machine the
//! test says `SKIPPED: …` and passes, but under `CI=true` (CI runs
//! scripts/test.sh, whose scripts/setup.sh --tests installs every such
//! tool) it fails, naming what is missing, so that CI never reports green
//! for a test that did not run.

/// Whether this process runs under CI: `CI` is `true` or `1` (any case),
/// as CI services set it and as scripts/test.sh does.
pub fn under_ci() -> bool {
    ci_value(std::env::var("CI").ok().as_deref())
}

fn ci_value(value: Option<&str>) -> bool {
    value.is_some_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

/// A prerequisite of the calling test is missing (`why` names it, and what
/// installs it). Under CI: panics with `why`. Elsewhere: prints
/// `SKIPPED: <why>` to stderr and returns, and the caller returns.
#[track_caller]
pub fn missing(why: impl std::fmt::Display) {
    if under_ci() {
        panic!(
            "{why} — under CI=true a missing prerequisite fails the test \
             (scripts/setup.sh --tests installs what the tests need)"
        );
    }
    eprintln!("SKIPPED: {why}");
}

/// A tool the calling test uses is missing, and scripts/setup.sh does not
/// install it (kubectl: Debian 12's kubernetes-client is 1.20, far behind
/// the API knit serves; the Python Kubernetes client), so CI may lack it
/// too: prints `SKIPPED: <why> (…)` to stderr and returns, under CI as
/// well. Kept apart from [`missing`] so that the list of such gaps is one grep away.
pub fn not_provided(why: impl std::fmt::Display) {
    eprintln!(
        "SKIPPED: {why} (not installed by scripts/setup.sh; the test runs where the host has it)"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ci_is_true_or_one() {
        assert!(ci_value(Some("true")));
        assert!(ci_value(Some("TRUE")));
        assert!(ci_value(Some("1")));
        assert!(!ci_value(Some("false")));
        assert!(!ci_value(Some("")));
        assert!(!ci_value(None));
    }

    #[test]
    fn missing_fails_under_ci_and_skips_elsewhere() {
        // Both outcomes, whatever this process's own CI says: the rule runs
        // in a child process with CI set each way.
        let exe = std::env::current_exe().expect("the test binary");
        for (ci, fails) in [("true", true), ("false", false)] {
            let out = std::process::Command::new(&exe)
                .args(["--exact", "tests::child_reports_missing", "--nocapture"])
                .env("CI", ci)
                .env("KNIT_TEST_SUPPORT_CHILD", "1")
                .output()
                .expect("run the test binary");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(!out.status.success(), fails, "CI={ci}: {stderr}");
            let wanted = if fails {
                "frobnicator is not installed — under CI=true"
            } else {
                "SKIPPED: frobnicator is not installed"
            };
            assert!(stderr.contains(wanted), "CI={ci}: {stderr}");
        }
    }

    /// The child of the test above (does nothing when run on its own).
    #[test]
    fn child_reports_missing() {
        if std::env::var("KNIT_TEST_SUPPORT_CHILD").is_ok() {
            missing("frobnicator is not installed");
        }
    }
}

pub mod layers;
