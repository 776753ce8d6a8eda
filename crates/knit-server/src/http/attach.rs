//! The attach endpoints: requests parsed here into the typed calls of
//! `crate::attach`, their answers turned into responses.

use super::{bearer, Peer};
use crate::attach::{automatic, manual};
use crate::control::ControlPlane;
use crate::error::{Result, ServerError};
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use knit_api::views::{
    AttachRequest, AttachResponse, AttachScriptRequest, AttachScriptResponse, ErrorView,
    MachineFacts,
};
use knit_api::ApiError;
use std::sync::Arc;

type Cp = Arc<ControlPlane>;

/// `POST /api/v1/pools/{pool}/attach`.
pub async fn attach(
    State(cp): State<Cp>,
    Path(pool_name): Path<String>,
    body: Bytes,
) -> Result<Json<AttachResponse>> {
    let req: AttachRequest = serde_json::from_slice(&body).map_err(|e| ApiError::Parse {
        what: "attach request".into(),
        message: e.to_string(),
    })?;
    Ok(Json(automatic::attach(&cp, &pool_name, &req).await?))
}

/// `POST /api/v1/pools/{pool}/attach-script` (the body may be empty).
pub async fn script(
    State(cp): State<Cp>,
    Path(pool_name): Path<String>,
    body: Bytes,
) -> Result<Json<AttachScriptResponse>> {
    let req: AttachScriptRequest = if body.is_empty() {
        AttachScriptRequest::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| ApiError::Parse {
            what: "attach-script request".into(),
            message: e.to_string(),
        })?
    };
    Ok(Json(manual::issue_script(&cp, &pool_name, &req)?))
}

/// `POST /attach/v1/manual`: the pasted command redeems its attach token
/// with its machine's facts; the answer is a join token (text), or the
/// refusal of the server-side checks (422).
pub async fn manual(
    State(cp): State<Cp>,
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response> {
    let peer_ip = peer.map(|Extension(Peer(p))| p.ip().to_string());
    let token = bearer(&headers).unwrap_or_default();
    // The token is checked before the body is read: a refused token is
    // refused (and recorded) whatever the body.
    let grant = manual::check_token(&cp, token, peer_ip.as_deref())?;
    let machine: MachineFacts = serde_json::from_slice(&body).map_err(|e| ApiError::Parse {
        what: "machine facts".into(),
        message: e.to_string(),
    })?;
    Ok(
        match manual::redeem(&cp, grant, peer_ip.as_deref(), machine).await? {
            manual::Redeemed::Joined { join_token } => {
                ([(header::CONTENT_TYPE, "text/plain")], join_token).into_response()
            }
            manual::Redeemed::Refused {
                code,
                message,
                preflight,
            } => (
                StatusCode::UNPROCESSABLE_ENTITY,
                Json(ErrorView {
                    code: code.into(),
                    message,
                    errors: Vec::new(),
                    preflight,
                }),
            )
                .into_response(),
        },
    )
}

/// `POST /attach/v1/failed` (report token): the attach command's join
/// failed and it rolled the machine back; the answer is the diagnosis to
/// print (text).
pub async fn manual_failed(
    State(cp): State<Cp>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response> {
    let token =
        bearer(&headers).ok_or_else(|| ServerError::Unauthorized("no bearer token".into()))?;
    let text = String::from_utf8_lossy(&body);
    let diagnosis = manual::report_failure(&cp, token, &text).await?;
    Ok(([(header::CONTENT_TYPE, "text/plain")], diagnosis).into_response())
}
