//! The endpoints the machines call with their own tokens:
//! `POST /bootstrap/v1/config` (join token → NodeConfig) and
//! `POST /report/v1/events` (the agent's phase events: at most the node's
//! allowance, 429 with `Retry-After` beyond it; a reason over 4 KiB cut),
//! handed to `crate::join`.

use super::{bearer, Cp, Peer};
use crate::error::{Result, ServerError};
use crate::join;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
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

pub async fn report(State(cp): State<Cp>, headers: HeaderMap, body: Bytes) -> Result<Response> {
    let token = bearer(&headers);
    // Who is reporting before what: an unknown token is 401 whatever it sent.
    let instance = join::reporter(&cp, token)?;
    // Then whether this node may report now: a flood from one node is
    // refused before it is parsed or written.
    if let Err(e) = join::allow_report(&cp, token.unwrap_or_default()) {
        let retry = match &e {
            ServerError::RateLimited {
                retry_after_secs, ..
            } => *retry_after_secs,
            _ => 1,
        };
        let mut response = e.into_response();
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(retry));
        return Ok(response);
    }
    let event: PhaseEvent = serde_json::from_slice(&body).map_err(|e| ApiError::Parse {
        what: "PhaseEvent".into(),
        message: e.to_string(),
    })?;
    join::record_report(&cp, &instance, token.unwrap_or_default(), &event)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
