//! `knit get KIND [NAME]`: the items of a list as a table, or as the
//! documents the server sent (`-o json|yaml`).

use crate::error::{CliError, Result};
use crate::output::{self, Format};
use knit_client::Document;
use std::process::ExitCode;

/// One kind's list: its name in messages (`pools`), how an item is named,
/// and its table.
pub struct Listing<'a, T> {
    /// The list's name, as in "pools \"x\" not found".
    pub what: &'a str,
    pub name_of: fn(&T) -> String,
    /// The table of the items (`wide`: the extra columns).
    pub table: fn(&[&T], bool) -> String,
}

/// Prints `items` (only the one named `name`, when given) as `format` asks.
pub fn show<T>(
    listing: Listing<'_, T>,
    mut items: Vec<Document<T>>,
    name: Option<&str>,
    format: Option<Format>,
) -> Result<ExitCode> {
    if let Some(n) = name {
        items.retain(|i| (listing.name_of)(&i.view) == n);
        if items.is_empty() {
            return Err(CliError::Failed(format!(
                "{} {n:?} not found",
                listing.what
            )));
        }
    }
    match format {
        Some(f @ (Format::Json | Format::Yaml)) => {
            let doc = if name.is_some() && items.len() == 1 {
                items.swap_remove(0).raw
            } else {
                serde_json::json!({ "items": items.into_iter().map(|i| i.raw).collect::<Vec<_>>() })
            };
            print!("{}", output::document(f, &doc));
        }
        wide => {
            let views: Vec<&T> = items.iter().map(|i| &i.view).collect();
            print!(
                "{}",
                table_or_none(listing.table, &views, wide == Some(Format::Wide))
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The table, or kubectl's line for an empty list.
pub fn table_or_none<T>(table: fn(&[&T], bool) -> String, items: &[&T], wide: bool) -> String {
    if items.is_empty() {
        return "No resources found.\n".to_string();
    }
    table(items, wide)
}

/// `knit get servers`: the servers sharing the datastore, the leader
/// marked (one on SQLite; several with `knit up --ha`).
pub fn servers(
    c: &knit_client::Client,
    name: Option<&str>,
    format: Option<Format>,
) -> Result<ExitCode> {
    let items = c
        .servers()?
        .into_iter()
        .map(|view| {
            let raw = serde_json::to_value(&view)
                .map_err(|e| CliError::Failed(format!("server {}: {e}", view.id)))?;
            Ok(Document { view, raw })
        })
        .collect::<Result<Vec<_>>>()?;
    let listing = Listing {
        what: "servers",
        name_of: |s: &knit_api::views::ServerView| s.id.clone(),
        table: server_table,
    };
    show(listing, items, name, format)
}

fn server_table(items: &[&knit_api::views::ServerView], wide: bool) -> String {
    let now = super::now_ms();
    let mut headers = vec!["ID", "ADDRESS", "PID", "LEADER", "SINCE", "HEARTBEAT"];
    if wide {
        headers.extend(["HOSTNAME", "VERSION", "EPOCH", "STARTED"]);
    }
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|s| {
            let mut row = vec![
                s.id.clone(),
                s.address.clone(),
                s.pid.to_string(),
                if s.leader { "yes" } else { "no" }.to_string(),
                s.leader_since_ms
                    .map(|t| output::age(t, now))
                    .unwrap_or_else(|| "-".into()),
                format!(
                    "{} ago{}",
                    output::age(s.heartbeat_ms, now),
                    if s.stale { " (stale)" } else { "" }
                ),
            ];
            if wide {
                row.extend([
                    s.hostname.clone(),
                    s.version.clone(),
                    output::opt(&s.epoch),
                    output::age(s.started_ms, now),
                ]);
            }
            row
        })
        .collect();
    output::table(&headers, &rows)
}
