//! Test fault injection shared by the server's long operations (the one
//! mechanism of `knit_local::pause`, with an async form):
//! `KNIT_SERVER_PAUSE_AT=<point>` makes the task that reaches `<point>`
//! wait forever (the rest of the server keeps serving), so that a test can
//! kill the server there with SIGKILL and check what a restart does.
//! `KNIT_SERVER_DELAY_AT=<point>:<seconds>` holds the first task of the
//! process that reaches `<point>` for that long, then lets it go on, so
//! that a test can freeze the server (SIGSTOP) with that work in flight
//! and see what the work does when the server wakes.
//! Points are named `<feature>-<step>` (e.g. `snapshot-images`,
//! `attach-…`, `create-provider-returned`). Both only with the crate's
//! `fault-injection` feature (which turns on knit-local's), on in the test
//! build and off in the release build: there they return at once and the
//! variables are not read.

/// The environment variable naming the point to pause at.
pub const ENV: &str = "KNIT_SERVER_PAUSE_AT";

/// Whether `point` is the configured pause point (never without the
/// `fault-injection` feature).
pub fn is_set(point: &str) -> bool {
    cfg!(feature = "fault-injection") && knit_local::pause::is_set(ENV, point)
}

/// Waits forever at `point` when it is the configured one; returns at once
/// otherwise. Logs `paused at <point>` (stderr and tracing) first, which
/// tests wait for.
pub async fn pause_at(point: &str) {
    if is_set(point) {
        eprintln!("knit-server: paused at {point}");
        tracing::warn!(point, "paused at {point} ({ENV})");
        std::future::pending::<()>().await;
    }
}

/// The environment variable naming a point to hold at for a while.
pub const DELAY_ENV: &str = "KNIT_SERVER_DELAY_AT";

/// Holds the first task of this process that reaches `point` for the time
/// `KNIT_SERVER_DELAY_AT=<point>:<seconds>` gives (at most an hour); logs
/// `delayed at <point>` first, which tests wait for. Returns at once
/// otherwise, and for every later task.
pub async fn delay_at(point: &str) {
    static TAKEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !cfg!(feature = "fault-injection") {
        return;
    }
    let Some(seconds) = std::env::var(DELAY_ENV).ok().and_then(|v| {
        let (at, secs) = v.rsplit_once(':')?;
        (at == point).then(|| secs.parse::<u64>().ok())?
    }) else {
        return;
    };
    if TAKEN.swap(true, std::sync::atomic::Ordering::SeqCst) {
        return;
    }
    let seconds = seconds.min(3600);
    eprintln!("knit-server: delayed at {point} for {seconds} s");
    tracing::warn!(point, seconds, "delayed at {point} ({DELAY_ENV})");
    tokio::time::sleep(std::time::Duration::from_secs(seconds)).await;
}
