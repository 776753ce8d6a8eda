//! `GET /metrics` (admin): the Prometheus text, with each pool's desired,
//! actual and ready counts.

use super::Cp;
use crate::error::Result;
use crate::pools;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

pub async fn metrics(State(cp): State<Cp>) -> Result<Response> {
    let gauges = pools::gauges(&cp)?;
    Ok((
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        cp.metrics.render(&gauges),
    )
        .into_response())
}
