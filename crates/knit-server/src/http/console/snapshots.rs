//! Snapshots (stale ones marked, with the pools using them) and snapshot
//! builds with their steps, which appear live while a build runs.

use super::html::{self, esc, page, Section};
use super::session::Session;
use super::Cs;
use crate::error::ServerError;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;

fn error_page(session: &Session, title: &str, e: &ServerError) -> Response {
    page(
        StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        Section::Snapshots,
        title,
        Some(session),
        &html::error_block("page-error", e),
    )
}

fn build_badge(status: &str) -> String {
    let class = match status {
        "Succeeded" => "ok",
        "Failed" => "warn",
        _ => "muted",
    };
    format!(r#"<span class="badge {class}">{}</span>"#, esc(status))
}

pub async fn list(State(console): State<Cs>, Extension(session): Extension<Session>) -> Response {
    let (snapshots, builds) = match (
        crate::snapshot::list(&console.cp),
        crate::snapshot::builds(&console.cp),
    ) {
        (Ok(s), Ok(b)) => (s, b),
        (Err(e), _) | (_, Err(e)) => return error_page(&session, "Snapshots", &e),
    };
    let now = crate::store::now_ms();
    let mut body = String::from(r#"<div id="snapshots-live" data-live-region><h2>Snapshots</h2>"#);
    if snapshots.is_empty() {
        body.push_str("<p>No snapshots. Build one with <code>knit snapshot build</code>.</p>");
    } else {
        body.push_str(r#"<table class="snapshots"><thead><tr><th scope="col">Snapshot</th><th scope="col">Pool</th><th scope="col">Kubernetes</th><th scope="col">Images</th><th scope="col">Size</th><th scope="col">Used by</th><th scope="col">Age</th></tr></thead><tbody>"#);
        for s in &snapshots {
            let stale = if s.stale {
                format!(
                    r#" <span class="badge warn" title="made for Kubernetes {}, the cluster runs {}">stale</span>"#,
                    esc(&s.snapshot.kubernetes_version),
                    esc(&s.cluster_kubernetes_version)
                )
            } else {
                String::new()
            };
            body.push_str(&format!(
                "<tr><th scope=\"row\">{id}{stale}</th><td>{pool}</td><td>{k8s}</td><td>{images}</td><td>{size}</td><td>{used}</td><td>{age}</td></tr>",
                id = esc(&s.snapshot.id),
                pool = esc(&s.snapshot.pool),
                k8s = esc(&s.snapshot.kubernetes_version),
                images = s.snapshot.images.len(),
                size = html::bytes(s.snapshot.size_bytes.max(0) as u64),
                used = esc(&if s.used_by.is_empty() { "—".to_string() } else { s.used_by.join(", ") }),
                age = html::age(now, s.snapshot.created_ms),
            ));
        }
        body.push_str("</tbody></table>");
    }
    body.push_str("<h2>Builds</h2>");
    if builds.is_empty() {
        body.push_str("<p>No builds.</p>");
    } else {
        body.push_str(r#"<table class="builds"><thead><tr><th scope="col">Build</th><th scope="col">Pool</th><th scope="col">Status</th><th scope="col">Step</th><th scope="col">Started</th></tr></thead><tbody>"#);
        // Newest first.
        for b in builds.iter().rev() {
            body.push_str(&format!(
                r#"<tr><th scope="row"><a href="/ui/snapshot-builds/{q}">{id}</a></th><td>{pool}</td><td>{status}</td><td>{step}</td><td>{age} ago</td></tr>"#,
                q = html::query_value(&b.id),
                id = esc(&b.id),
                pool = esc(&b.pool),
                status = build_badge(b.status.as_str()),
                step = esc(&b.step),
                age = html::age(now, b.started_ms),
            ));
        }
        body.push_str("</tbody></table>");
    }
    body.push_str("</div>");
    page(
        StatusCode::OK,
        Section::Snapshots,
        "Snapshots",
        Some(&session),
        &body,
    )
}

pub async fn build(
    State(console): State<Cs>,
    Extension(session): Extension<Session>,
    Path(id): Path<String>,
) -> Response {
    let title = format!("Snapshot build {id}");
    let status = match crate::snapshot::build_status(&console.cp, id) {
        Ok(s) => s,
        Err(e) => return error_page(&session, &title, &e),
    };
    let b = &status.build;
    let mut steps = String::from(r#"<ol class="steps">"#);
    for s in &status.steps {
        steps.push_str(&format!(
            r#"<li><time>{at}</time> <strong>{step}</strong> {message}</li>"#,
            at = html::utc(s.at_ms),
            step = esc(&s.step),
            message = esc(&s.message),
        ));
    }
    steps.push_str("</ol>");
    let body = format!(
        r#"<div id="build-live" data-live-region><dl class="facts">
<dt>Status</dt><dd>{status}</dd><dt>Pool</dt><dd>{pool}</dd><dt>Builder</dt><dd>{builder}</dd>
<dt>Step</dt><dd>{step}</dd><dt>Error</dt><dd class="err">{error}</dd><dt>Snapshot</dt><dd>{snapshot}</dd></dl>
<h2>Steps</h2>{steps}</div>"#,
        status = build_badge(b.status.as_str()),
        pool = esc(&b.pool),
        builder = esc(b.builder_instance.as_deref().unwrap_or("—")),
        step = esc(&b.step),
        error = esc(b.error.as_deref().unwrap_or("")),
        snapshot = esc(b.snapshot_id.as_deref().unwrap_or("—")),
    );
    page(
        StatusCode::OK,
        Section::Snapshots,
        &title,
        Some(&session),
        &body,
    )
}
