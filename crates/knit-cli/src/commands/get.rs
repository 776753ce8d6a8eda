//! `knit get KIND [NAME]`: the items of a list as a table, or as the
//! documents the server sent (`-o json|yaml`), their names (`-o name`) or a
//! JSONPath template (`-o jsonpath=…`); `-l` keeps the items whose labels
//! match, `--no-headers` drops the table's header, `-w` goes on printing
//! the items that change.

use crate::error::{CliError, Result};
use crate::jsonpath::Template;
use crate::output;
use crate::selector::Selector;
use knit_client::Document;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::process::ExitCode;
use std::time::Duration;

/// How often `-w` asks the server again.
const WATCH_INTERVAL: Duration = Duration::from_secs(2);

/// `-o` of `get`: kubectl's `wide|json|yaml|name|jsonpath=TEMPLATE`.
#[derive(Debug, Clone)]
pub enum GetFormat {
    Wide,
    Json,
    Yaml,
    Name,
    JsonPath(std::sync::Arc<Template>),
}

impl std::str::FromStr for GetFormat {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<GetFormat, String> {
        match s {
            "wide" => Ok(GetFormat::Wide),
            "json" => Ok(GetFormat::Json),
            "yaml" => Ok(GetFormat::Yaml),
            "name" => Ok(GetFormat::Name),
            _ => match s.strip_prefix("jsonpath=") {
                Some(t) => Template::parse(t)
                    .map(|t| GetFormat::JsonPath(std::sync::Arc::new(t)))
                    .map_err(|e| e.to_string()),
                None => Err(format!(
                    "{s:?} is not an output format: wide, json, yaml, name or jsonpath=TEMPLATE"
                )),
            },
        }
    }
}

/// What `knit get` was asked for besides the kind and name.
#[derive(Debug, Clone, Default)]
pub struct GetOpts {
    pub output: Option<GetFormat>,
    pub selector: Option<Selector>,
    pub no_headers: bool,
    pub watch: bool,
}

/// An item's labels, for `-l`.
pub type LabelsOf<'a, T> = Box<dyn Fn(&T) -> BTreeMap<String, String> + 'a>;

/// One kind's list: its name in messages (`pools`), in `-o name`
/// (`nodepool`), how an item is named, its labels (kinds that have them)
/// and its table.
pub struct Listing<'a, T> {
    /// The list's name, as in "pools \"x\" not found".
    pub what: &'a str,
    /// The kind as `-o name` and `knit apply` print it (`nodepool/x`).
    pub kind: &'a str,
    pub name_of: fn(&T) -> String,
    /// The item's labels; `None`: the kind has none (`-l` refused).
    pub labels: Option<LabelsOf<'a, T>>,
    /// The table of the items (`wide`: the extra columns).
    pub table: fn(&[&T], bool) -> String,
}

impl<T> Listing<'_, T> {
    /// The items named `name` (when given) whose labels match.
    fn keep(
        &self,
        mut items: Vec<Document<T>>,
        name: Option<&str>,
        opts: &GetOpts,
    ) -> Vec<Document<T>> {
        if let Some(n) = name {
            items.retain(|i| (self.name_of)(&i.view) == n);
        }
        if let (Some(selector), Some(labels)) = (&opts.selector, &self.labels) {
            items.retain(|i| selector.matches(&labels(&i.view)));
        }
        items
    }
}

/// Prints the items `fetch` gets (only the one named `name`, when given;
/// those `-l` selects) as `opts` asks; with `-w`, then every item that
/// changes, until interrupted.
pub fn show<T>(
    listing: Listing<'_, T>,
    fetch: impl Fn() -> Result<Vec<Document<T>>>,
    name: Option<&str>,
    opts: &GetOpts,
) -> Result<ExitCode> {
    if opts.selector.is_some() && listing.labels.is_none() {
        return Err(CliError::Usage(format!(
            "{} have no labels: -l/--selector applies to pools and nodes",
            listing.what
        )));
    }
    let items = listing.keep(fetch()?, name, opts);
    if let Some(n) = name {
        if items.is_empty() {
            return Err(CliError::Failed(format!(
                "{} {n:?} not found",
                listing.what
            )));
        }
    }
    print!("{}", render(&listing, &items, name.is_some(), opts, true));
    if items.is_empty() && !matches!(opts.output, Some(GetFormat::Json | GetFormat::Yaml)) {
        eprintln!("No resources found.");
    }
    if !opts.watch {
        return Ok(ExitCode::SUCCESS);
    }
    let mut seen = fingerprints(&listing, &items);
    let mut headers_shown = !items.is_empty();
    loop {
        std::thread::sleep(WATCH_INTERVAL);
        let items = listing.keep(fetch()?, name, opts);
        let changed = changes(&listing, &seen, &items);
        if !changed.is_empty() {
            print!(
                "{}",
                render_changes(&listing, &items, &changed, opts, !headers_shown)
            );
            headers_shown = true;
            use std::io::Write as _;
            let _ = std::io::stdout().flush();
        }
        seen = fingerprints(&listing, &items);
    }
}

/// Each item's name and document, to tell what changed between two polls.
fn fingerprints<T>(listing: &Listing<'_, T>, items: &[Document<T>]) -> HashMap<String, Value> {
    items
        .iter()
        .map(|i| ((listing.name_of)(&i.view), i.raw.clone()))
        .collect()
}

/// The positions in `items` of the items new or changed since `seen`.
fn changes<T>(
    listing: &Listing<'_, T>,
    seen: &HashMap<String, Value>,
    items: &[Document<T>],
) -> Vec<usize> {
    items
        .iter()
        .enumerate()
        .filter(|(_, i)| seen.get(&(listing.name_of)(&i.view)) != Some(&i.raw))
        .map(|(at, _)| at)
        .collect()
}

/// The whole answer of one `get`: `one` when a name was given.
fn render<T>(
    listing: &Listing<'_, T>,
    items: &[Document<T>],
    one: bool,
    opts: &GetOpts,
    headers: bool,
) -> String {
    let list = || {
        Value::Object(
            [(
                "items".to_string(),
                Value::Array(items.iter().map(|i| i.raw.clone()).collect()),
            )]
            .into_iter()
            .collect(),
        )
    };
    let doc = || match items {
        [only] if one => only.raw.clone(),
        _ => list(),
    };
    match &opts.output {
        Some(GetFormat::Json) => output::json(&doc()),
        Some(GetFormat::Yaml) => output::yaml(&doc()),
        Some(GetFormat::JsonPath(t)) => with_newline(t.render(&doc())),
        Some(GetFormat::Name) => items
            .iter()
            .map(|i| format!("{}/{}\n", listing.kind, (listing.name_of)(&i.view)))
            .collect(),
        Some(GetFormat::Wide) | None => {
            if items.is_empty() {
                return String::new();
            }
            let wide = matches!(opts.output, Some(GetFormat::Wide));
            let views: Vec<&T> = items.iter().map(|i| &i.view).collect();
            let table = (listing.table)(&views, wide);
            if headers && !opts.no_headers {
                table
            } else {
                table.lines().skip(1).map(|l| format!("{l}\n")).collect()
            }
        }
    }
}

/// What `-w` prints of the items at `changed`: their table rows (laid out
/// with the others), names, documents or template output.
fn render_changes<T>(
    listing: &Listing<'_, T>,
    items: &[Document<T>],
    changed: &[usize],
    opts: &GetOpts,
    headers: bool,
) -> String {
    match &opts.output {
        Some(GetFormat::Wide) | None => {
            let wide = matches!(opts.output, Some(GetFormat::Wide));
            let views: Vec<&T> = items.iter().map(|i| &i.view).collect();
            let table = (listing.table)(&views, wide);
            let lines: Vec<&str> = table.lines().collect();
            let mut out = String::new();
            if headers && !opts.no_headers {
                out.push_str(lines.first().copied().unwrap_or_default());
                out.push('\n');
            }
            for at in changed {
                if let Some(line) = lines.get(at + 1) {
                    out.push_str(line);
                    out.push('\n');
                }
            }
            out
        }
        Some(GetFormat::Yaml) => changed
            .iter()
            .filter_map(|at| items.get(*at))
            .map(|i| format!("---\n{}", output::yaml(&i.raw)))
            .collect(),
        _ => changed
            .iter()
            .filter_map(|at| items.get(*at))
            .map(|i| render(listing, std::slice::from_ref(i), true, opts, false))
            .collect(),
    }
}

/// Template output ends with a newline, as a shell prompt wants.
fn with_newline(mut text: String) -> String {
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text
}

/// `knit get servers`: the servers sharing the datastore, the leader
/// marked (one on SQLite; several with `knit up --ha`).
pub fn servers(c: &knit_client::Client, name: Option<&str>, opts: &GetOpts) -> Result<ExitCode> {
    let fetch = || {
        c.servers()?
            .into_iter()
            .map(|view| {
                let raw = serde_json::to_value(&view)
                    .map_err(|e| CliError::Failed(format!("server {}: {e}", view.id)))?;
                Ok(Document { view, raw })
            })
            .collect::<Result<Vec<_>>>()
    };
    let listing = Listing {
        what: "servers",
        kind: "server",
        name_of: |s: &knit_api::views::ServerView| s.id.clone(),
        labels: None,
        table: server_table,
    };
    show(listing, fetch, name, opts)
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

/// The table, or kubectl's line for an empty list (`describe`'s parts).
pub fn table_or_none<T>(table: fn(&[&T], bool) -> String, items: &[&T], wide: bool) -> String {
    if items.is_empty() {
        return "No resources found.\n".to_string();
    }
    table(items, wide)
}
