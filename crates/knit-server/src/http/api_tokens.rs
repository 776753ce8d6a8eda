//! `/api/v1/tokens`: API tokens (admin only): list, create (the secret
//! answered once), revoke.

use super::auth::Caller;
use super::Cp;
use crate::api_tokens;
use crate::error::{Result, ServerError};
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use knit_api::views::{ApiTokenView, Items, TokenCreateRequest, TokenCreated, TokenRevoked};

pub async fn list(
    State(cp): State<Cp>,
    caller: Option<Extension<Caller>>,
) -> Result<Json<Items<ApiTokenView>>> {
    let current = caller.as_ref().map(|c| c.token_id.as_str());
    Ok(Json(Items::new(api_tokens::list(&cp, current)?)))
}

pub async fn create(State(cp): State<Cp>, body: Bytes) -> Result<(StatusCode, Json<TokenCreated>)> {
    let req: TokenCreateRequest = serde_json::from_slice(&body)
        .map_err(|e| ServerError::BadRequest(format!("token request (JSON): {e}")))?;
    Ok((StatusCode::CREATED, Json(api_tokens::create(&cp, &req)?)))
}

pub async fn revoke(State(cp): State<Cp>, Path(id): Path<String>) -> Result<Json<TokenRevoked>> {
    Ok(Json(api_tokens::revoke(&cp, &id)?))
}
