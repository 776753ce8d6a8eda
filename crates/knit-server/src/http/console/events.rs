//! The events page: newest first, filtered by kind, reason and object.

use super::html::{self, page, Section};
use super::session::Session;
use super::Cs;
use crate::store::EventRecord;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use maud::{html, Markup};
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
pub fn table(events: &[EventRecord], now_ms: i64) -> Markup {
    html! {
        @if events.is_empty() {
            p { "No events." }
        } @else {
            table.events {
                (html::thead(&["Last seen", "Type", "Object", "Reason", "Message", "Count"]))
                tbody {
                    @for e in events {
                        // The store's word for the type (the same as on the wire).
                        @let event_type = e.event_type.to_string();
                        @let class = if event_type == "Warning" { "warn" } else { "muted" };
                        @let last = if e.last_ms > 0 { e.last_ms } else { e.at_ms };
                        tr {
                            td title=(html::utc(last)) { (html::age(now_ms, last)) " ago" }
                            td { span class={ "badge " (class) } { (event_type) } }
                            td { (e.object_kind) "/" (e.object_name) }
                            td { (e.reason) }
                            td { (e.message) }
                            td { (e.count) }
                        }
                    }
                }
            }
        }
    }
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
                html::error_block("page-error", &e),
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
    let body = html! {
        form.filters method="get" action="/ui/events" {
            label for="filter-kind" { "Kind" }
            select #filter-kind name="kind" {
                option value="" { "every kind" }
                @for k in &kinds {
                    option value=(k) selected[kind.as_deref() == Some(k.as_str())] { (k) }
                }
            }
            label for="filter-reason" { "Reason" }
            input #filter-reason name="reason" value=(reason.as_deref().unwrap_or("")) size="14";
            label for="filter-object" { "Object" }
            input #filter-object name="object" value=(object.as_deref().unwrap_or("")) size="18";
            button type="submit" { "Filter" }
        }
        div #events-live data-live-region { (table(&events, crate::store::now_ms())) }
    };
    page(
        StatusCode::OK,
        Section::Events,
        "Events",
        Some(&session),
        body,
    )
}
