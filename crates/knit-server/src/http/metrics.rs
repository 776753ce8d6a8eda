//! `GET /metrics`: the Prometheus text, with each pool's desired, actual
//! and ready counts. Read with any API token (viewer and up) or the metrics
//! reader token (`<state dir>/metrics-token`, made at the server's first
//! start), which reads `/metrics` and nothing else (`auth::Access::Metrics`):
//! a Prometheus scrape config holds no other credential.

use super::Cp;
use crate::error::Result;
use crate::pki;
use crate::pools;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

/// The metrics reader token's file in the state directory.
pub const TOKEN_FILE: &str = "metrics-token";

/// Loads the metrics reader token (made, 0600, when missing) into the
/// control plane. Each server of a shared datastore has its own.
pub fn load_reader_token(cp: &crate::control::ControlPlane) -> Result<()> {
    let token = pki::load_or_create_token(&cp.settings.state_dir.join(TOKEN_FILE))?;
    cp.metrics.set_reader_token(token);
    Ok(())
}

pub async fn metrics(State(cp): State<Cp>) -> Result<Response> {
    let gauges = pools::gauges(&cp)?;
    Ok((
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        cp.metrics.render(&gauges),
    )
        .into_response())
}
