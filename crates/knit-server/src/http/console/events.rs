//! The events page: newest first, filtered by kind, reason and object.

use super::html::{self, esc, page, Section};
use super::session::Session;
use super::Cs;
use crate::store::EventRecord;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use serde::Deserialize;

/// How many of the newest events the page reads before filtering.
const READ: i64 = 2000;

#[derive(Deserialize, Default)]
pub struct EventFilter {
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    object: Option<String>,
}

/// Events as a table, in the order given.
pub fn table(events: &[EventRecord], now_ms: i64) -> String {
    if events.is_empty() {
        return "<p>No events.</p>".into();
    }
    let mut out = String::from(
        r#"<table class="events"><thead><tr><th scope="col">Last seen</th><th scope="col">Type</th><th scope="col">Object</th><th scope="col">Reason</th><th scope="col">Message</th><th scope="col">Count</th></tr></thead><tbody>"#,
    );
    for e in events {
        // The store's word for the type (the same as on the wire).
        let event_type = e.event_type.to_string();
        let class = if event_type == "Warning" {
            "warn"
        } else {
            "muted"
        };
        let last = if e.last_ms > 0 { e.last_ms } else { e.at_ms };
        out.push_str(&format!(
            r#"<tr><td title="{at}">{age} ago</td><td><span class="badge {class}">{t}</span></td><td>{kind}/{name}</td><td>{reason}</td><td>{message}</td><td>{count}</td></tr>"#,
            at = html::utc(last),
            age = html::age(now_ms, last),
            t = esc(&event_type),
            kind = esc(&e.object_kind),
            name = esc(&e.object_name),
            reason = esc(&e.reason),
            message = esc(&e.message),
            count = e.count,
        ));
    }
    out.push_str("</tbody></table>");
    out
}

pub async fn list(
    State(console): State<Cs>,
    Extension(session): Extension<Session>,
    Query(filter): Query<EventFilter>,
) -> Response {
    let kind = filter.kind.filter(|s| !s.is_empty());
    let reason = filter.reason.filter(|s| !s.is_empty());
    let object = filter.object.filter(|s| !s.is_empty());
    let mut events = match console.cp.store.events(READ) {
        Ok(e) => e,
        Err(e) => {
            return page(
                StatusCode::INTERNAL_SERVER_ERROR,
                Section::Events,
                "Events",
                Some(&session),
                &html::error_block("page-error", &e),
            )
        }
    };
    let mut kinds: Vec<String> = events.iter().map(|e| e.object_kind.clone()).collect();
    kinds.sort();
    kinds.dedup();
    events.retain(|e| {
        kind.as_ref().is_none_or(|k| &e.object_kind == k)
            && reason
                .as_ref()
                .is_none_or(|r| e.reason.to_lowercase().contains(&r.to_lowercase()))
            && object
                .as_ref()
                .is_none_or(|o| e.object_name.contains(o.as_str()))
    });
    // The store answers oldest first.
    events.reverse();
    let mut kind_options = String::from(r#"<option value="">every kind</option>"#);
    for k in &kinds {
        let selected = if kind.as_deref() == Some(k) {
            " selected"
        } else {
            ""
        };
        kind_options.push_str(&format!(
            r#"<option value="{k}"{selected}>{k}</option>"#,
            k = esc(k)
        ));
    }
    let body = format!(
        r#"<form method="get" action="/ui/events" class="filters">
<label for="filter-kind">Kind</label><select id="filter-kind" name="kind">{kind_options}</select>
<label for="filter-reason">Reason</label><input id="filter-reason" name="reason" value="{reason}" size="14">
<label for="filter-object">Object</label><input id="filter-object" name="object" value="{object}" size="18">
<button type="submit">Filter</button></form>
<div id="events-live" data-live-region>{table}</div>"#,
        reason = esc(reason.as_deref().unwrap_or("")),
        object = esc(object.as_deref().unwrap_or("")),
        table = table(&events, crate::store::now_ms()),
    );
    page(
        StatusCode::OK,
        Section::Events,
        "Events",
        Some(&session),
        &body,
    )
}
