//! Test fault injection shared by the server's long operations (the one
//! mechanism of `knit_local::pause`, with an async form):
//! `KNIT_SERVER_PAUSE_AT=<point>` makes the task that reaches `<point>`
//! wait forever (the rest of the server keeps serving), so that a test can
//! kill the server there with SIGKILL and check what a restart does.
//! Points are named `<feature>-<step>` (e.g. `snapshot-images`,
//! `attach-…`). Unset in production.

/// The environment variable naming the point to pause at.
pub const ENV: &str = "KNIT_SERVER_PAUSE_AT";

/// Whether `point` is the configured pause point.
pub fn is_set(point: &str) -> bool {
    knit_local::pause::is_set(ENV, point)
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
