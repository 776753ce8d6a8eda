//! `/api/v1/instances` and `/api/v1/nodes/*`: requests parsed into the
//! calls of `crate::nodes`.

use super::Cp;
use crate::error::Result;
use crate::nodes;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use knit_api::views::{
    DeleteNodeQuery, InstanceView, Items, NodeLogsQuery, NodeRemoving, NodeView,
};

pub async fn list_instances(State(cp): State<Cp>) -> Result<Json<Items<InstanceView>>> {
    Ok(Json(Items::new(nodes::instances(&cp)?)))
}

pub async fn list(State(cp): State<Cp>) -> Result<Json<Items<NodeView>>> {
    Ok(Json(Items::new(nodes::list(&cp)?)))
}

pub async fn get(State(cp): State<Cp>, Path(name): Path<String>) -> Result<Json<NodeView>> {
    Ok(Json(nodes::describe(&cp, &name).await?))
}

/// Removes one node from its pool (`?release=` chooses what becomes of
/// its instance).
pub async fn delete(
    State(cp): State<Cp>,
    Path(name): Path<String>,
    Query(q): Query<DeleteNodeQuery>,
) -> Result<(StatusCode, Json<NodeRemoving>)> {
    let removing = nodes::remove(&cp, &name, q.release).await?;
    Ok((StatusCode::ACCEPTED, Json(removing)))
}

/// One of the node's log files, as text.
pub async fn logs(
    State(cp): State<Cp>,
    Path(name): Path<String>,
    Query(q): Query<NodeLogsQuery>,
) -> Result<Response> {
    let bytes = nodes::read_log(&cp, &name, q.file.as_deref()).await?;
    Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], bytes).into_response())
}
