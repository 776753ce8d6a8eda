//! `POST /api/v1/exec`: the request parsed into `crate::nodes::exec`.

use super::Cp;
use crate::error::{Result, ServerError};
use crate::nodes;
use axum::body::Bytes;
use axum::extract::State;
use axum::Json;
use knit_api::views::{ExecRequest, ExecResponse};

/// Runs a command on one machine through its provider (`knit exec`).
/// Admin only (its route declares `Role(Admin)` in `http::routes`).
pub async fn exec(State(cp): State<Cp>, body: Bytes) -> Result<Json<ExecResponse>> {
    let req: ExecRequest = serde_json::from_slice(&body)
        .map_err(|e| ServerError::BadRequest(format!("exec request (JSON): {e}")))?;
    Ok(Json(nodes::exec(&cp, req).await?))
}
