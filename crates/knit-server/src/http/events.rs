//! `GET /api/v1/events`.

use super::Cp;
use crate::error::Result;
use crate::nodes::as_view;
use axum::extract::{Query, State};
use axum::Json;
use knit_api::views::{EventView, EventsQuery, Items};

/// The newest events: `?limit=N` (1 to 10 000, default 500).
pub async fn list(
    State(cp): State<Cp>,
    Query(q): Query<EventsQuery>,
) -> Result<Json<Items<EventView>>> {
    let items = cp
        .store
        .events(q.limit.unwrap_or(500).clamp(1, 10_000))?
        .iter()
        .map(as_view)
        .collect::<Result<_>>()?;
    Ok(Json(Items::new(items)))
}
