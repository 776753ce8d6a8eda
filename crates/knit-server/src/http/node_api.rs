//! The endpoints the machines call with their own tokens:
//! `POST /bootstrap/v1/config` (join token → NodeConfig) and
//! `POST /report/v1/events` (the agent's phase events), handed to
//! `crate::join`.

use super::{bearer, Cp, Peer};
use crate::error::Result;
use crate::join;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use knit_api::{ApiError, PhaseEvent};

pub async fn bootstrap(
    State(cp): State<Cp>,
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    // Unused, but read so the connection can serve the next request.
    _body: Bytes,
) -> Result<Response> {
    let peer = peer.map(|Extension(Peer(p))| p);
    let config = join::bootstrap(&cp, bearer(&headers), peer).await?;
    Ok(([(header::CONTENT_TYPE, "application/yaml")], config).into_response())
}

pub async fn report(State(cp): State<Cp>, headers: HeaderMap, body: Bytes) -> Result<StatusCode> {
    let token = bearer(&headers);
    // Who is reporting before what: an unknown token is 401 whatever it sent.
    let instance = join::reporter(&cp, token)?;
    let event: PhaseEvent = serde_json::from_slice(&body).map_err(|e| ApiError::Parse {
        what: "PhaseEvent".into(),
        message: e.to_string(),
    })?;
    join::record_report(&cp, &instance, token.unwrap_or_default(), &event)?;
    Ok(StatusCode::NO_CONTENT)
}
