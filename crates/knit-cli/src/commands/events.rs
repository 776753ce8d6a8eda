//! `knit get events`.

use super::get::{show, Listing};
use super::now_ms;
use crate::error::Result;
use crate::output::{age, cell, table, Format};
use knit_api::views::EventView;
use knit_client::Client;
use std::process::ExitCode;

pub fn get(c: &Client, name: Option<&str>, format: Option<Format>) -> Result<ExitCode> {
    let listing = Listing {
        what: "events",
        name_of: |e: &EventView| e.id.to_string(),
        table: event_table,
    };
    show(listing, c.events(None)?, name, format)
}

pub fn event_table(items: &[&EventView], _wide: bool) -> String {
    let now = now_ms();
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|e| {
            vec![
                age(e.at_ms, now),
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
