//! `GET /api/v1/jointokens`: every join token, never the token itself.

use super::Cp;
use crate::error::Result;
use crate::nodes::as_view;
use axum::extract::State;
use axum::Json;
use knit_api::views::{Items, JoinTokenView};

pub async fn list(State(cp): State<Cp>) -> Result<Json<Items<JoinTokenView>>> {
    let items = cp
        .store
        .join_tokens()?
        .iter()
        .map(as_view)
        .collect::<Result<_>>()?;
    Ok(Json(Items::new(items)))
}
