//! Snapshots (stale ones marked, with the pools using them) and snapshot
//! builds with their steps, which appear live while a build runs.

use super::html::{self, page, Section};
use super::session::Session;
use super::Cs;
use crate::error::ServerError;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use maud::{html, Markup};

fn error_page(session: &Session, title: &str, e: &ServerError) -> Response {
    page(
        StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        Section::Snapshots,
        title,
        Some(session),
        html::error_block("page-error", e),
    )
}

fn build_badge(status: &str) -> Markup {
    let class = match status {
        "Succeeded" => "ok",
        "Failed" => "warn",
        _ => "muted",
    };
    html! { span class={ "badge " (class) } { (status) } }
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
    let body = html! {
        div #snapshots-live data-live-region {
            h2 { "Snapshots" }
            @if snapshots.is_empty() {
                p { "No snapshots. Build one with " code { "knit snapshot build" } "." }
            } @else {
                table.snapshots {
                    (html::thead(&["Snapshot", "Pool", "Kubernetes", "Images", "Size", "Used by", "Age"]))
                    tbody {
                        @for s in &snapshots {
                            tr {
                                th scope="row" {
                                    (s.snapshot.id)
                                    @if s.stale {
                                        " "
                                        span.badge.warn title={ "made for Kubernetes " (s.snapshot.kubernetes_version) ", the cluster runs " (s.cluster_kubernetes_version) } { "stale" }
                                    }
                                }
                                td { (s.snapshot.pool) }
                                td { (s.snapshot.kubernetes_version) }
                                td { (s.snapshot.images.len()) }
                                td { (html::bytes(s.snapshot.size_bytes.max(0) as u64)) }
                                td { @if s.used_by.is_empty() { "—" } @else { (s.used_by.join(", ")) } }
                                td { (html::age(now, s.snapshot.created_ms)) }
                            }
                        }
                    }
                }
            }
            h2 { "Builds" }
            @if builds.is_empty() {
                p { "No builds." }
            } @else {
                table.builds {
                    (html::thead(&["Build", "Pool", "Status", "Step", "Started"]))
                    tbody {
                        // Newest first.
                        @for b in builds.iter().rev() {
                            tr {
                                th scope="row" { a href={ "/ui/snapshot-builds/" (html::query_value(&b.id)) } { (b.id) } }
                                td { (b.pool) }
                                td { (build_badge(b.status.as_str())) }
                                td { (b.step) }
                                td { (html::age(now, b.started_ms)) " ago" }
                            }
                        }
                    }
                }
            }
        }
    };
    page(
        StatusCode::OK,
        Section::Snapshots,
        "Snapshots",
        Some(&session),
        body,
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
    let body = html! {
        div #build-live data-live-region {
            dl.facts {
                dt { "Status" } dd { (build_badge(b.status.as_str())) }
                dt { "Pool" } dd { (b.pool) }
                dt { "Builder" } dd { (b.builder_instance.as_deref().unwrap_or("—")) }
                dt { "Step" } dd { (b.step) }
                dt { "Error" } dd.err { (b.error.as_deref().unwrap_or("")) }
                dt { "Snapshot" } dd { (b.snapshot_id.as_deref().unwrap_or("—")) }
            }
            h2 { "Steps" }
            ol.steps {
                @for s in &status.steps {
                    li { time { (html::utc(s.at_ms)) } " " strong { (s.step) } " " (s.message) }
                }
            }
        }
    };
    page(
        StatusCode::OK,
        Section::Snapshots,
        &title,
        Some(&session),
        body,
    )
}
