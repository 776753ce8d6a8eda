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
