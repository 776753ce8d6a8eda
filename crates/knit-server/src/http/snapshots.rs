//! Snapshot and snapshot-build handlers: parse the request, call the typed
//! functions of [`crate::snapshot`], answer.

use crate::control::ControlPlane;
use crate::error::Result;
use crate::snapshot;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use knit_api::views::{
    Items, SnapshotBuildRequest, SnapshotBuildStatus, SnapshotBuildView, SnapshotDeleted,
    SnapshotView,
};
use std::sync::Arc;

type Cp = Arc<ControlPlane>;

/// `GET /api/v1/snapshots`.
pub async fn list(State(cp): State<Cp>) -> Result<Json<Items<SnapshotView>>> {
    Ok(Json(Items::new(snapshot::list(&cp)?)))
}

/// `DELETE /api/v1/snapshots/{id}`.
pub async fn delete(
    State(cp): State<Cp>,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<SnapshotDeleted>)> {
    Ok((StatusCode::OK, Json(snapshot::delete(&cp, id).await?)))
}

/// `GET /api/v1/snapshot-builds`: every build, newest last, without their
/// messages.
pub async fn builds(State(cp): State<Cp>) -> Result<Json<Items<SnapshotBuildView>>> {
    Ok(Json(Items::new(snapshot::builds(&cp)?)))
}

/// `GET /api/v1/snapshot-builds/{id}`: one build with its messages.
pub async fn build_status(
    State(cp): State<Cp>,
    Path(id): Path<String>,
) -> Result<Json<SnapshotBuildStatus>> {
    Ok(Json(snapshot::build_status(&cp, id)?))
}

/// `POST /api/v1/snapshots`: starts a build (202 with the build).
pub async fn create(
    State(cp): State<Cp>,
    body: axum::body::Bytes,
) -> Result<(StatusCode, Json<SnapshotBuildStatus>)> {
    let req: SnapshotBuildRequest =
        serde_json::from_slice(&body).map_err(|e| knit_api::ApiError::Parse {
            what: "snapshot request".into(),
            message: e.to_string(),
        })?;
    Ok((StatusCode::ACCEPTED, Json(snapshot::start(&cp, req)?)))
}
