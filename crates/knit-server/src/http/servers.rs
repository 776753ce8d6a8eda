//! `GET /api/v1/servers`.

use super::Cp;
use crate::error::Result;
use axum::extract::State;
use axum::Json;
use knit_api::views::{Items, ServerView};

/// The servers sharing the datastore; the leader marked.
pub async fn list(State(cp): State<Cp>) -> Result<Json<Items<ServerView>>> {
    Ok(Json(Items::new(cp.server_views()?)))
}
