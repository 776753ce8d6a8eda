//! Test fault injection, one mechanism for knit's crash tests: an
//! environment variable names a point (`KNIT_LOCAL_PAUSE_AFTER`,
//! `KNIT_QEMU_PAUSE_AFTER`, `KNIT_SERVER_PAUSE_AT`); what reaches that
//! point says so on stderr and waits until the test kills the process with
//! SIGKILL, so the test can check what a restart does. Built only with the
//! crate's `fault-injection` feature, which the test build turns on (the
//! crates' dev-dependencies) and the release build does not: without it no
//! point is ever set and the variables are not even read.

use std::time::Duration;

/// Whether the environment variable `env` names `point` (always false
/// without the `fault-injection` feature).
pub fn is_set(env: &str, point: &str) -> bool {
    cfg!(feature = "fault-injection") && std::env::var(env).is_ok_and(|v| v == point)
}

/// When `env` names `point`: prints `<announce> <point>` to stderr (tests
/// wait for that line) and blocks this thread forever. Returns at once
/// otherwise.
pub fn hold_if_set(env: &str, point: &str, announce: &str) {
    if is_set(env, point) {
        eprintln!("{announce} {point}");
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
}

/// When `env` names `point`: sleeps `for_how_long`, so a test can widen a
/// race window; returns at once otherwise.
pub fn delay_if_set(env: &str, point: &str, for_how_long: Duration) {
    if is_set(env, point) {
        std::thread::sleep(for_how_long);
    }
}

/// The local cloud's crash-test points: `KNIT_LOCAL_PAUSE_AFTER=step`
/// stops here until killed.
pub(crate) fn checkpoint(step: &str) {
    hold_if_set("KNIT_LOCAL_PAUSE_AFTER", step, "knit-local: paused after");
}

#[cfg(all(test, feature = "fault-injection"))]
mod tests {
    use super::*;

    #[test]
    fn only_the_named_point_holds() {
        let env = "KNIT_LOCAL_PAUSE_TEST_ONLY";
        std::env::set_var(env, "here");
        assert!(is_set(env, "here"));
        assert!(!is_set(env, "there"));
        assert!(!is_set("KNIT_LOCAL_PAUSE_TEST_UNSET", "here"));
        hold_if_set(env, "there", "paused at");
    }
}
