//! `knit get events`.

use super::get::{show, GetOpts, Listing};
use super::now_ms;
use crate::error::Result;
use crate::output::{age, cell, table};
use knit_api::views::EventView;
use knit_client::Client;
use std::process::ExitCode;

pub fn get(c: &Client, name: Option<&str>, opts: &GetOpts) -> Result<ExitCode> {
    let listing = Listing {
        what: "events",
        kind: "event",
        name_of: |e: &EventView| e.id.to_string(),
        labels: None,
        table: event_table,
    };
    show(listing, || Ok(c.events(None)?), name, opts)
}

/// When an event last happened: `lastMs`, or its first time when the
/// server sent none (an older server).
fn last_seen(e: &EventView) -> i64 {
    if e.last_ms > 0 {
        e.last_ms
    } else {
        e.at_ms
    }
}

pub fn event_table(items: &[&EventView], _wide: bool) -> String {
    let now = now_ms();
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|e| {
            vec![
                age(last_seen(e), now),
                cell(e.event_type),
                cell(&e.reason),
                format!(
                    "{}/{}",
                    cell(&e.object_kind).to_lowercase(),
                    cell(&e.object_name)
                ),
                cell(&e.message),
            ]
        })
        .collect();
    table(&["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"], &rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use knit_api::state::EventType;

    /// LAST SEEN is when the event last happened (before: its first time).
    #[test]
    fn last_seen_is_the_last_time() {
        let now = now_ms();
        let e = EventView {
            id: 1,
            at_ms: now - 3_600_000,
            count: 5,
            last_ms: now - 5_000,
            event_type: EventType::Normal,
            object_kind: "NodePool".into(),
            object_name: "w".into(),
            reason: "Updated".into(),
            message: "pool spec replaced".into(),
        };
        let out = event_table(&[&e], false);
        let row = out.lines().nth(1).unwrap();
        assert!(row.starts_with("5s ") || row.starts_with("6s "), "{out}");
        let old = EventView { last_ms: 0, ..e };
        let row = event_table(&[&old], false);
        assert!(row.lines().nth(1).unwrap().starts_with("60m "), "{row}");
    }
}
