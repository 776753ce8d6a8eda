//! The pools page: counts, scale, create or edit from YAML, delete with
//! its confirmation. Each action is the REST API's own call in
//! `crate::pools`, so it validates and words its errors the same way.

use super::html::{self, page, see_other, Section};
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
use maud::{html, Markup};
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
    // A viewer's page offers no change (the server refuses one anyway).
    let may_change = session.may(TokenRole::Operator);
    let body = html! {
        @if let Some(done) = done {
            p.notice role="status" { (done) }
        }
        @if may_change {
            p { a.button href="/ui/pools/new" { "Create a pool from YAML" } }
        }
        div #pools-live data-live-region {
            @if pools.is_empty() {
                p { "No pools yet." }
            } @else {
                table.pools {
                    caption { "Node pools" }
                    (html::thead(&["Pool", "Type", "Snapshot", "Desired", "Instances", "Initialized", "Ready", "Rollout", "Age", "Actions"]))
                    tbody {
                        @for pool in &pools { (row(pool, now, may_change)) }
                    }
                }
            }
        }
        // The forms stay out of the live region: a refresh never eats what
        // is being typed.
        @if !pools.is_empty() && may_change {
            h2 { "Scale" }
            div.scale-forms {
                @for pool in &pools { (scale_form(session, pool, failed.as_ref())) }
            }
        }
    };
    let status = match &failed {
        Some(f) => status_of(&f.error),
        None => StatusCode::OK,
    };
    page(status, Section::Pools, "Pools", Some(session), body)
}

fn row(pool: &PoolView, now: i64, may_change: bool) -> Markup {
    let name = &pool.metadata.name;
    let q = html::query_value(name);
    let s = &pool.status;
    let types = if pool.spec.spec.instance_types.is_empty() {
        "—".to_string()
    } else {
        pool.spec.spec.instance_types.join(", ")
    };
    html! {
        tr id={ "pool-" (name) } data-pool=(name) {
            th scope="row" {
                a href={ "/ui/nodes?pool=" (q) } { (name) }
                @if s.deleting {
                    " " span.badge.warn { "deleting" }
                }
                // Why its instances are not being made (what the reconciler logs).
                @if let Some(error) = &s.create_error {
                    " " span.badge.warn data-col="create-error" { "creates failing" }
                    p.create-error { (error) }
                }
            }
            td { (types) }
            td { (snapshot_of(pool)) }
            td data-col="desired" { (s.desired) (bounds_of(pool)) }
            td data-col="instances" { (s.instances) }
            td data-col="initialized" { (s.initialized) }
            td data-col="ready" { (s.ready) }
            td data-col="rollout" { (rollout_of(pool)) }
            td { (html::age(now, pool.metadata.creation_timestamp_ms)) }
            td.actions {
                @if may_change {
                    a href={ "/ui/pools/" (q) "/edit" } { "Edit" span.visually-hidden { " " (name) } }
                    " "
                    a href={ "/ui/pools/" (q) "/delete" } { "Delete" span.visually-hidden { " " (name) } }
                    " "
                    a href={ "/ui/attach?pool=" (q) } { "Add instances" span.visually-hidden { " to " (name) } }
                } @else {
                    "—"
                }
            }
        }
    }
}

/// A pool's rollout as `knit rollout status` tells it: up to date of
/// desired, its state, and why it stopped or waits (in the badge's title
/// and below it when stopped).
fn rollout_of(pool: &PoolView) -> Markup {
    let Some(r) = &pool.status.rollout else {
        return html! { "—" };
    };
    let class = match r.state.as_str() {
        knit_api::views::ROLLOUT_COMPLETE => "ok",
        knit_api::views::ROLLOUT_STOPPED => "bad",
        knit_api::views::ROLLOUT_PAUSED | knit_api::views::ROLLOUT_WAITING => "warn",
        _ => "muted",
    };
    let message = r.message.as_deref().unwrap_or("");
    html! {
        span data-col="up-to-date" { (r.updated) "/" (pool.status.desired) " up to date" }
        " "
        span class={ "badge " (class) } data-rollout=(r.state) title=(message) { (r.state) }
        @if r.state == knit_api::views::ROLLOUT_STOPPED {
            p.rollout-reason { (r.reason.as_deref().unwrap_or("")) ": " (message) }
        }
    }
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

fn scale_form(session: &Session, pool: &PoolView, failed: Option<&Failed>) -> Markup {
    let name = &pool.metadata.name;
    let error_id = format!("scale-error-{name}");
    let error = failed
        .filter(|f| f.pool == name)
        .map(|f| html::error_block(&error_id, &f.error));
    let input_id = format!("replicas-{name}");
    html! {
        form.scale method="post" action={ "/ui/pools/" (html::query_value(name)) "/scale" } data-pool=(name) {
            (html::csrf_field(session))
            label for=(input_id) { "Replicas of " (name) }
            input id=(input_id) name="replicas" inputmode="numeric" value=(pool.status.desired) size="4"
                aria-describedby=[error.as_ref().map(|_| &error_id)]
                aria-invalid=[error.as_ref().map(|_| "true")];
            label.inline { input type="checkbox" name="release" value="true" checked; " release removed instances" }
            button type="submit" { "Scale " (name) }
            @if let Some(error) = error { (error) }
        }
    }
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
        html::error_block("page-error", e),
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
    let status = error.map(status_of).unwrap_or(StatusCode::OK);
    let body = html! {
        @if let Some(e) = error { (html::error_block("yaml-error", e)) }
        form.yaml method="post" action=(action) {
            (html::csrf_field(session))
            label for="yaml" { "Pool document (YAML)" }
            textarea #yaml name="yaml" rows="24" cols="80" spellcheck="false"
                aria-describedby=[error.map(|_| "yaml-error")]
                aria-invalid=[error.map(|_| "true")] { (yaml) }
            p.help {
                "The same document " code { "knit create -f" } " / " code { "knit apply -f" }
                " take; see docs/spec.md."
            }
            button type="submit" { "Save" } " " a href="/ui/pools" { "Cancel" }
        }
    };
    page(status, Section::Pools, title, Some(session), body)
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
    let body = html! {
        div.confirm role="region" aria-labelledby="confirm-title" {
            h2 #confirm-title { "Delete pool " (pool.metadata.name) "?" }
            p {
                "The pool is scaled to 0, then removed. Its " (made.len())
                " instance(s) made by knit are released: their machines and disks are deleted."
            }
            p #added-instances { (added_text) }
            form method="post" action={ "/ui/pools/" (html::query_value(&name)) "/delete" } {
                (html::csrf_field(&session))
                button.danger type="submit" { "Delete pool " (pool.metadata.name) }
                " " a href="/ui/pools" { "Cancel" }
            }
        }
    };
    page(
        StatusCode::OK,
        Section::Pools,
        &format!("Delete pool {name}"),
        Some(&session),
        body,
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
fn bounds_of(pool: &PoolView) -> Markup {
    html! {
        @if let Some(b) = &pool.spec.spec.scaling {
            " "
            span data-col="bounds" title={ "auto-scaling: min " (b.min) ", max " (b.max) } {
                "(min " (b.min) ", max " (b.max) ")"
            }
        }
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
        let html = row(&PoolView::new(NodePool::new("a", spec), 0, status), 0, true).into_string();
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
        assert!(!row(&regular, 0, true)
            .into_string()
            .contains("data-col=\"bounds\""));
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
        let html = row(&pool, 0, true).into_string();
        assert!(html.contains("1/3 up to date"), "{html}");
        // A viewer's row offers no change.
        assert!(html.contains("/ui/pools/w/edit"), "{html}");
        let viewer = row(&pool, 0, false).into_string();
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
