//! `GET /metrics`: the Prometheus text, with each pool's desired, actual
//! and ready counts. Read with the admin token or the metrics reader token
//! (`<state dir>/metrics-token`, made at the server's first start), which
//! reads `/metrics` and nothing else: a Prometheus scrape config holds no
//! admin credential.

use super::Cp;
use crate::error::{Result, ServerError};
use crate::pki;
use crate::pools;
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
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

/// `/metrics` takes the admin token or the metrics reader token.
pub async fn require_reader(State(cp): State<Cp>, request: Request, next: Next) -> Response {
    let why = match super::bearer(request.headers()) {
        Some(token)
            if pki::secrets_equal(token, &cp.admin_token)
                || cp
                    .metrics
                    .reader_token()
                    .is_some_and(|r| pki::secrets_equal(token, r)) =>
        {
            return next.run(request).await
        }
        Some(_) => "the bearer token is neither this server's metrics reader token nor its admin token",
        None => "send the metrics reader token (the server's state directory, metrics-token) or the admin token as `Authorization: Bearer <token>`",
    };
    ServerError::Unauthorized(why.into()).into_response()
}
