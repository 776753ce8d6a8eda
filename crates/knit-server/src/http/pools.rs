//! `/api/v1/cluster` and `/api/v1/pools/*`: requests parsed into the calls
//! of `crate::pools`.

use super::Cp;
use crate::error::Result;
use crate::names;
use crate::pools::{self, Applied};
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use knit_api::views::{
    DryRun, Items, PoolDeleting, PoolRevisionView, PoolView, PoolWriteQuery, RolloutUndoRequest,
    ScaleRequest,
};
use knit_api::{ApiError, Cluster, FieldError, NodePool};

pub async fn get_cluster(State(cp): State<Cp>) -> Result<Json<Cluster>> {
    Ok(Json(cp.cluster_doc()?))
}

pub async fn put_cluster(State(cp): State<Cp>, body: String) -> Result<Json<Cluster>> {
    let cluster = Cluster::from_yaml(&body)?;
    pools::replace_cluster(&cp, &cluster)?;
    Ok(Json(cluster))
}

pub async fn list(State(cp): State<Cp>) -> Result<Json<Items<PoolView>>> {
    Ok(Json(Items::new(pools::list(&cp)?)))
}

pub async fn get(State(cp): State<Cp>, Path(name): Path<String>) -> Result<Json<PoolView>> {
    Ok(Json(pools::get(&cp, &name)?))
}

pub async fn create(
    State(cp): State<Cp>,
    Query(q): Query<PoolWriteQuery>,
    body: String,
) -> Result<(StatusCode, Json<PoolView>)> {
    let (pool, facts) = NodePool::from_input(&body)?;
    if facts.password_set
        && pool.spec.login.password.is_none()
        && pool.spec.login.key_pair.is_none()
    {
        return Err(password_unknown().into());
    }
    pools::check_image(&cp, &pool).await?;
    let type_warnings = pools::check_instance_types(&cp, &pool).await?;
    let mut view = match q.dry_run {
        Some(DryRun::All) => pools::create_dry_run(&cp, pool, q.strict)?,
        None => pools::create(&cp, pool, q.strict)?,
    };
    with_warnings(&mut view, type_warnings);
    Ok((StatusCode::CREATED, Json(view)))
}

/// Adds the checks' warnings made before the write to the view's.
fn with_warnings(view: &mut PoolView, warnings: Vec<String>) {
    if !warnings.is_empty() {
        view.warnings.get_or_insert_with(Vec::new).extend(warnings);
    }
}

/// `spec.login.passwordSet: true` without a password on a new pool: the
/// password a view stood for is not known.
fn password_unknown() -> ApiError {
    ApiError::Invalid(vec![FieldError {
        field: "spec.login.passwordSet".into(),
        value: "true".into(),
        rule: "stands for the password of an existing pool (a view never shows it): for a new pool give spec.login.password, or remove passwordSet".into(),
    }])
}

/// Create or replace (`knit apply`).
pub async fn apply(
    State(cp): State<Cp>,
    Path(name): Path<String>,
    Query(q): Query<PoolWriteQuery>,
    body: String,
) -> Result<(StatusCode, Json<PoolView>)> {
    // The name in the URL before the document: a bad one is named first.
    names::check_pool("metadata.name", &name)?;
    let (mut pool, facts) = NodePool::from_input(&body)?;
    if facts.password_set
        && pool.spec.login.password.is_none()
        && pool.spec.login.key_pair.is_none()
    {
        // A document `knit get` printed: the stored password is kept.
        match cp.store.pool(&name)? {
            Some(old) if old.pool.spec.login.password.is_some() => {
                pool.spec.login.password = old.pool.spec.login.password;
            }
            _ => return Err(password_unknown().into()),
        }
    }
    pools::check_image(&cp, &pool).await?;
    let type_warnings = pools::check_instance_types(&cp, &pool).await?;
    let (applied, mut view) = match q.dry_run {
        Some(DryRun::All) => pools::apply_dry_run(&cp, &name, pool, q.strict)?,
        None => pools::apply(&cp, &name, pool, q.strict)?,
    };
    let status = match applied {
        Applied::Created => StatusCode::CREATED,
        Applied::Updated => StatusCode::OK,
    };
    with_warnings(&mut view, type_warnings);
    Ok((status, Json(view)))
}

pub async fn delete(
    State(cp): State<Cp>,
    Path(name): Path<String>,
) -> Result<(StatusCode, Json<PoolDeleting>)> {
    pools::delete(&cp, &name)?;
    Ok((
        StatusCode::ACCEPTED,
        Json(PoolDeleting {
            name,
            deleting: true,
        }),
    ))
}

pub async fn scale(
    State(cp): State<Cp>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Json<PoolView>> {
    names::check_pool("metadata.name", &name)?;
    let request: ScaleRequest = serde_json::from_slice(&body).map_err(|e| ApiError::Parse {
        what: "scale request".into(),
        message: e.to_string(),
    })?;
    Ok(Json(
        pools::scale(&cp, &name, request.replicas, request.release).await?,
    ))
}

/// `POST /api/v1/pools/{name}/rollout/{pause|resume|restart}`.
pub async fn rollout(
    State(cp): State<Cp>,
    Path((name, verb)): Path<(String, String)>,
) -> Result<Json<PoolView>> {
    use crate::pools::rollout;
    let view = match verb.as_str() {
        "pause" => rollout::set_paused(&cp, &name, true).await?,
        "resume" => rollout::set_paused(&cp, &name, false).await?,
        "restart" => rollout::restart(&cp, &name).await?,
        other => {
            return Err(ApiError::Invalid(vec![FieldError {
                field: "verb".into(),
                value: format!("{other:?}"),
                rule: "must be pause, resume, restart or undo".into(),
            }])
            .into())
        }
    };
    Ok(Json(view))
}

/// `POST /api/v1/pools/{name}/rollout/undo` (`{"toRevision": N}`, or empty).
pub async fn rollout_undo(
    State(cp): State<Cp>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Json<PoolView>> {
    names::check_pool("metadata.name", &name)?;
    let request: RolloutUndoRequest = if body.iter().all(u8::is_ascii_whitespace) {
        RolloutUndoRequest::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| ApiError::Parse {
            what: "rollout undo request".into(),
            message: e.to_string(),
        })?
    };
    Ok(Json(
        crate::pools::rollout::undo(&cp, &name, request.to_revision).await?,
    ))
}

/// `GET /api/v1/pools/{name}/revisions`.
pub async fn revisions(
    State(cp): State<Cp>,
    Path(name): Path<String>,
) -> Result<Json<Items<PoolRevisionView>>> {
    Ok(Json(Items::new(crate::pools::rollout::revisions(
        &cp, &name,
    )?)))
}
