//! The pools page: counts, scale, create or edit from YAML, delete with
//! its confirmation. Each action is the REST API's own call in
//! `crate::pools`, so it validates and words its errors the same way.

use super::html::{self, esc, page, see_other, Section};
use super::session::Session;
use super::Cs;
use crate::error::ServerError;
use crate::names;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::{Extension, Form};
use knit_api::state::TokenRole;
use knit_api::views::PoolView;
use knit_api::{ApiError, FieldError, NodePool};
use serde::Deserialize;

/// A scale or write that failed, shown beside the pool it names.
struct Failed<'a> {
    pool: &'a str,
    error: ServerError,
}

#[derive(Deserialize, Default)]
pub struct Notice {
    #[serde(default)]
    done: Option<String>,
}

pub async fn list(
    State(console): State<Cs>,
    Extension(session): Extension<Session>,
    Query(notice): Query<Notice>,
) -> Response {
    render(&console, &session, notice.done.as_deref(), None)
}

fn render(console: &Cs, session: &Session, done: Option<&str>, failed: Option<Failed>) -> Response {
    let pools = match crate::pools::list(&console.cp) {
        Ok(p) => p,
        Err(e) => return error_page(session, &e),
    };
    let now = crate::store::now_ms();
    let mut body = String::new();
    if let Some(done) = done {
        body.push_str(&format!(
            r#"<p class="notice" role="status">{}</p>"#,
            esc(done)
        ));
    }
    // A viewer's page offers no change (the server refuses one anyway).
    let may_change = session.may(TokenRole::Operator);
    if may_change {
        body.push_str(
            r#"<p><a class="button" href="/ui/pools/new">Create a pool from YAML</a></p>"#,
        );
    }
    body.push_str(r#"<div id="pools-live" data-live-region>"#);
    if pools.is_empty() {
        body.push_str("<p>No pools yet.</p>");
    } else {
        body.push_str(
            r#"<table class="pools"><caption>Node pools</caption><thead><tr>
<th scope="col">Pool</th><th scope="col">Type</th><th scope="col">Snapshot</th>
<th scope="col">Desired</th><th scope="col">Instances</th><th scope="col">Initialized</th>
<th scope="col">Ready</th><th scope="col">Rollout</th><th scope="col">Age</th><th scope="col">Actions</th></tr></thead><tbody>"#,
        );
        for pool in &pools {
            body.push_str(&row(pool, now, may_change));
        }
        body.push_str("</tbody></table>");
    }
    body.push_str("</div>");
    // The forms stay out of the live region: a refresh never eats what is
    // being typed.
    if !pools.is_empty() && may_change {
        body.push_str(r#"<h2>Scale</h2><div class="scale-forms">"#);
        for pool in &pools {
            body.push_str(&scale_form(session, pool, failed.as_ref()));
        }
        body.push_str("</div>");
    }
    let status = match &failed {
        Some(f) => status_of(&f.error),
        None => StatusCode::OK,
    };
    page(status, Section::Pools, "Pools", Some(session), &body)
}

fn row(pool: &PoolView, now: i64, may_change: bool) -> String {
    let name = &pool.metadata.name;
    let s = &pool.status;
    let mut state = if s.deleting {
        r#" <span class="badge warn">deleting</span>"#.to_string()
    } else {
        String::new()
    };
    // Why its instances are not being made (what the reconciler logs).
    if let Some(error) = &s.create_error {
        state.push_str(&format!(
            r#" <span class="badge warn" data-col="create-error">creates failing</span><p class="create-error">{}</p>"#,
            esc(error)
        ));
    }
    let types = if pool.spec.spec.instance_types.is_empty() {
        "—".to_string()
    } else {
        pool.spec.spec.instance_types.join(", ")
    };
    let snapshot = snapshot_of(pool);
    format!(
        r#"<tr id="pool-{id}" data-pool="{n}"><th scope="row"><a href="/ui/nodes?pool={q}">{n}</a>{state}</th>
<td>{types}</td><td>{snapshot}</td>
<td data-col="desired">{desired}{bounds}</td><td data-col="instances">{instances}</td>
<td data-col="initialized">{initialized}</td><td data-col="ready">{ready}</td>
<td data-col="rollout">{rollout}</td>
<td>{age}</td>
<td class="actions">{actions}</td></tr>"#,
        actions = if may_change {
            format!(
                r#"<a href="/ui/pools/{q}/edit">Edit<span class="visually-hidden"> {n}</span></a>
<a href="/ui/pools/{q}/delete">Delete<span class="visually-hidden"> {n}</span></a>
<a href="/ui/attach?pool={q}">Add instances<span class="visually-hidden"> to {n}</span></a>"#,
                q = html::query_value(name),
                n = esc(name),
            )
        } else {
            "—".to_string()
        },
        id = esc(name),
        n = esc(name),
        q = html::query_value(name),
        types = esc(&types),
        snapshot = esc(&snapshot),
        desired = s.desired,
        bounds = bounds_of(pool),
        instances = s.instances,
        initialized = s.initialized,
        ready = s.ready,
        rollout = rollout_of(pool),
        age = html::age(now, pool.metadata.creation_timestamp_ms),
    )
}

/// A pool's rollout as `knit rollout status` tells it: up to date of
/// desired, its state, and why it stopped or waits (in the badge's title
/// and below it when stopped).
fn rollout_of(pool: &PoolView) -> String {
    let Some(r) = &pool.status.rollout else {
        return "—".to_string();
    };
    let class = match r.state.as_str() {
        knit_api::views::ROLLOUT_COMPLETE => "ok",
        knit_api::views::ROLLOUT_STOPPED => "bad",
        knit_api::views::ROLLOUT_PAUSED | knit_api::views::ROLLOUT_WAITING => "warn",
        _ => "muted",
    };
    let mut out = format!(
        r#"<span data-col="up-to-date">{updated}/{desired} up to date</span> <span class="badge {class}" data-rollout="{state}" title="{message}">{state}</span>"#,
        updated = r.updated,
        desired = pool.status.desired,
        state = esc(&r.state),
        message = esc(r.message.as_deref().unwrap_or("")),
    );
    if r.state == knit_api::views::ROLLOUT_STOPPED {
        out.push_str(&format!(
            r#"<p class="rollout-reason">{}: {}</p>"#,
            esc(r.reason.as_deref().unwrap_or("")),
            esc(r.message.as_deref().unwrap_or(""))
        ));
    }
    out
}

/// The snapshots the pool's data disks come from, or `—`.
fn snapshot_of(pool: &PoolView) -> String {
    let ids: Vec<&str> = pool
        .spec
        .spec
        .data_disks
        .iter()
        .filter_map(|d| d.snapshot_id.as_deref())
        .collect();
    if ids.is_empty() {
        "—".to_string()
    } else {
        ids.join(", ")
    }
}

fn scale_form(session: &Session, pool: &PoolView, failed: Option<&Failed>) -> String {
    let name = &pool.metadata.name;
    let error = failed
        .filter(|f| f.pool == name)
        .map(|f| html::error_block(&format!("scale-error-{name}"), &f.error))
        .unwrap_or_default();
    let described = if error.is_empty() {
        String::new()
    } else {
        format!(
            r#" aria-describedby="scale-error-{}" aria-invalid="true""#,
            esc(name)
        )
    };
    format!(
        r#"<form method="post" action="/ui/pools/{q}/scale" class="scale" data-pool="{n}">{csrf}
<label for="replicas-{n}">Replicas of {n}</label>
<input id="replicas-{n}" name="replicas" inputmode="numeric" value="{desired}" size="4"{described}>
<label class="inline"><input type="checkbox" name="release" value="true" checked> release removed instances</label>
<button type="submit">Scale {n}</button>{error}</form>"#,
        q = html::query_value(name),
        n = esc(name),
        csrf = html::csrf_field(session),
        desired = pool.status.desired,
    )
}

fn status_of(e: &ServerError) -> StatusCode {
    StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

fn error_page(session: &Session, e: &ServerError) -> Response {
    page(
        status_of(e),
        Section::Pools,
        "Pools",
        Some(session),
        &html::error_block("page-error", e),
    )
}

#[derive(Deserialize)]
pub struct ScaleForm {
    #[serde(default)]
    replicas: String,
    /// A checkbox: present when ticked.
    #[serde(default)]
    release: Option<String>,
}

pub async fn scale(
    State(console): State<Cs>,
    Extension(session): Extension<Session>,
    Path(name): Path<String>,
    Form(form): Form<ScaleForm>,
) -> Response {
    let result = match form.replicas.trim().parse::<i64>() {
        // The API takes the count as a JSON integer; a form sends text.
        Err(_) => Err(ApiError::Invalid(vec![FieldError {
            field: "replicas".into(),
            value: format!("{:?}", form.replicas),
            rule: "must be a whole number".into(),
        }])
        .into()),
        Ok(replicas) => {
            crate::pools::scale(&console.cp, &name, replicas, form.release.is_some()).await
        }
    };
    match result {
        Ok(view) => see_other(&format!(
            "/ui/pools?done={}",
            html::query_value(&format!(
                "Pool {} scaled to {}.",
                view.metadata.name, view.status.desired
            ))
        )),
        Err(error) => render(
            &console,
            &session,
            None,
            Some(Failed { pool: &name, error }),
        ),
    }
}

const NEW_POOL: &str = "apiVersion: knit.dev/v1alpha1
kind: NodePool
metadata:
  name: workers
spec:
  replicas: 1
";

fn yaml_form(
    session: &Session,
    title: &str,
    action: &str,
    yaml: &str,
    error: Option<&ServerError>,
) -> Response {
    let (block, described, status) = match error {
        Some(e) => (
            html::error_block("yaml-error", e),
            r#" aria-describedby="yaml-error" aria-invalid="true""#,
            status_of(e),
        ),
        None => (String::new(), "", StatusCode::OK),
    };
    let body = format!(
        r#"{block}<form method="post" action="{action}" class="yaml">{csrf}
<label for="yaml">Pool document (YAML)</label>
<textarea id="yaml" name="yaml" rows="24" cols="80" spellcheck="false"{described}>{yaml}</textarea>
<p class="help">The same document <code>knit create -f</code> / <code>knit apply -f</code> take; see docs/spec.md.</p>
<button type="submit">Save</button> <a href="/ui/pools">Cancel</a></form>"#,
        action = esc(action),
        csrf = html::csrf_field(session),
        yaml = esc(yaml),
    );
    page(status, Section::Pools, title, Some(session), &body)
}

pub async fn new_form(Extension(session): Extension<Session>) -> Response {
    yaml_form(&session, "Create a pool", "/ui/pools/new", NEW_POOL, None)
}

#[derive(Deserialize)]
pub struct YamlForm {
    #[serde(default)]
    yaml: String,
}

pub async fn create(
    State(console): State<Cs>,
    Extension(session): Extension<Session>,
    Form(form): Form<YamlForm>,
) -> Response {
    let created = match NodePool::from_yaml(&form.yaml).map_err(ServerError::from) {
        // The console shows no warnings after a write: only a refusal counts.
        Ok(pool) => match crate::pools::check_instance_types(&console.cp, &pool).await {
            Ok(_) => crate::pools::create(&console.cp, pool, false),
            Err(e) => Err(e),
        },
        Err(e) => Err(e),
    };
    match created {
        Ok(view) => see_other(&format!(
            "/ui/pools?done={}",
            html::query_value(&format!("Pool {} created.", view.metadata.name))
        )),
        Err(e) => yaml_form(
            &session,
            "Create a pool",
            "/ui/pools/new",
            &form.yaml,
            Some(&e),
        ),
    }
}

pub async fn edit_form(
    State(console): State<Cs>,
    Extension(session): Extension<Session>,
    Path(name): Path<String>,
) -> Response {
    let action = format!("/ui/pools/{}/edit", html::query_value(&name));
    match current_yaml(&console, &name) {
        Ok(yaml) => yaml_form(&session, &format!("Edit pool {name}"), &action, &yaml, None),
        Err(e) => error_page(&session, &e),
    }
}

/// The stored document as YAML, its password left out (the API never
/// shows it; a document without one keeps the stored one only if the
/// API's apply does).
fn current_yaml(console: &Cs, name: &str) -> crate::error::Result<String> {
    names::check_pool("metadata.name", name)?;
    let record = console
        .cp
        .store
        .pool(name)?
        .ok_or_else(|| ServerError::NotFound {
            kind: "pool",
            name: name.to_string(),
        })?;
    let mut pool = record.pool;
    pool.spec.login.password = None;
    serde_yaml_ng::to_string(&pool)
        .map_err(|e| ServerError::Internal(format!("pool {name} as YAML: {e}")))
}

pub async fn apply(
    State(console): State<Cs>,
    Extension(session): Extension<Session>,
    Path(name): Path<String>,
    Form(form): Form<YamlForm>,
) -> Response {
    let parsed = names::check_pool("metadata.name", &name)
        .and_then(|_| NodePool::from_yaml(&form.yaml).map_err(ServerError::from));
    let applied = match parsed {
        Ok(pool) => match crate::pools::check_instance_types(&console.cp, &pool).await {
            Ok(_) => crate::pools::apply(&console.cp, &name, pool, false),
            Err(e) => Err(e),
        },
        Err(e) => Err(e),
    };
    match applied {
        Ok((_, view)) => see_other(&format!(
            "/ui/pools?done={}",
            html::query_value(&format!("Pool {} saved.", view.metadata.name))
        )),
        Err(e) => {
            let action = format!("/ui/pools/{}/edit", html::query_value(&name));
            yaml_form(
                &session,
                &format!("Edit pool {name}"),
                &action,
                &form.yaml,
                Some(&e),
            )
        }
    }
}

pub async fn delete_form(
    State(console): State<Cs>,
    Extension(session): Extension<Session>,
    Path(name): Path<String>,
) -> Response {
    let pool = match crate::pools::get(&console.cp, &name) {
        Ok(p) => p,
        Err(e) => return error_page(&session, &e),
    };
    let instances = match crate::nodes::instances(&console.cp) {
        Ok(i) => i,
        Err(e) => return error_page(&session, &e),
    };
    let (added, made): (Vec<_>, Vec<_>) = instances
        .iter()
        .filter(|i| i.pool == name && i.state.is_member())
        .partition(|i| i.added);
    let added_names: Vec<&str> = added.iter().map(|i| i.name.as_str()).collect();
    let added_text = if added.is_empty() {
        "None of its instances was added by attach.".to_string()
    } else {
        format!(
            "{} instance(s) added by attach ({}) are kept, never released by knit: removed from the pool and the cluster, then stopped (automatic mode) or put back as before the attach and left running (manual mode).",
            added.len(),
            added_names.join(", ")
        )
    };
    let body = format!(
        r#"<div class="confirm" role="region" aria-labelledby="confirm-title">
<h2 id="confirm-title">Delete pool {n}?</h2>
<p>The pool is scaled to 0, then removed. Its {made} instance(s) made by knit are released: their machines and disks are deleted.</p>
<p id="added-instances">{added_text}</p>
<form method="post" action="/ui/pools/{q}/delete">{csrf}
<button type="submit" class="danger">Delete pool {n}</button> <a href="/ui/pools">Cancel</a></form></div>"#,
        n = esc(&pool.metadata.name),
        q = html::query_value(&name),
        made = made.len(),
        added_text = esc(&added_text),
        csrf = html::csrf_field(&session),
    );
    page(
        StatusCode::OK,
        Section::Pools,
        &format!("Delete pool {name}"),
        Some(&session),
        &body,
    )
}

pub async fn delete(
    State(console): State<Cs>,
    Extension(session): Extension<Session>,
    Path(name): Path<String>,
) -> Response {
    match crate::pools::delete(&console.cp, &name) {
        Ok(()) => see_other(&format!(
            "/ui/pools?done={}",
            html::query_value(&format!("Pool {name} is being deleted."))
        )),
        Err(e) => error_page(&session, &e),
    }
}

/// An auto-scaling pool's bounds beside its desired count (what
/// cluster-autoscaler keeps it within); nothing for a regular pool.
fn bounds_of(pool: &PoolView) -> String {
    match &pool.spec.spec.scaling {
        Some(b) => format!(
            r#" <span data-col="bounds" title="auto-scaling: min {min}, max {max}">(min {min}, max {max})</span>"#,
            min = b.min,
            max = b.max
        ),
        None => String::new(),
    }
}

#[cfg(test)]
mod bounds_tests {
    use super::*;
    use knit_api::views::PoolStatus;
    use knit_api::{NodePool, NodePoolSpec, ScalingSpec};

    #[test]
    fn an_auto_scaling_pool_row_shows_min_and_max() {
        let spec = NodePoolSpec {
            pool_type: "auto-scaling".into(),
            replicas: 1,
            scaling: Some(ScalingSpec {
                min: 0,
                max: 4,
                ..ScalingSpec::default()
            }),
            ..NodePoolSpec::default()
        };
        let status = PoolStatus {
            desired: 1,
            ..PoolStatus::default()
        };
        let html = row(&PoolView::new(NodePool::new("a", spec), 0, status), 0, true);
        assert!(
            html.contains(r#"<td data-col="desired">1 <span data-col="bounds""#)
                && html.contains("(min 0, max 4)"),
            "{html}"
        );
        let regular = PoolView::new(
            NodePool::new("r", NodePoolSpec::default()),
            0,
            PoolStatus::default(),
        );
        assert!(!row(&regular, 0, true).contains("data-col=\"bounds\""));
    }
}

#[cfg(test)]
mod rollout_tests {
    use super::*;
    use knit_api::views::{PoolStatus, RolloutView};
    use knit_api::{NodePool, NodePoolSpec};

    #[test]
    fn the_pool_row_shows_the_rollout_and_why_it_stopped() {
        let status = PoolStatus {
            desired: 3,
            rollout: Some(RolloutView {
                state: knit_api::views::ROLLOUT_STOPPED.into(),
                updated: 1,
                reason: Some("ProgressDeadlineExceeded".into()),
                message: Some("replacement w-x <did not> come up".into()),
                ..RolloutView::default()
            }),
            ..PoolStatus::default()
        };
        let pool = PoolView::new(NodePool::new("w", NodePoolSpec::default()), 0, status);
        let html = row(&pool, 0, true);
        assert!(html.contains("1/3 up to date"), "{html}");
        // A viewer's row offers no change.
        assert!(html.contains("/ui/pools/w/edit"), "{html}");
        let viewer = row(&pool, 0, false);
        assert!(
            !viewer.contains("/edit") && !viewer.contains("/delete"),
            "{viewer}"
        );
        assert!(html.contains(r#"data-rollout="Stopped""#), "{html}");
        assert!(
            html.contains("ProgressDeadlineExceeded: replacement w-x &lt;did not&gt; come up"),
            "{html}"
        );
    }
}
