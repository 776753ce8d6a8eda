//! `knit get|describe|delete node`, `knit logs node`, and the lists of
//! instances and join tokens.

use super::get::{show, Listing};
use super::{now_ms, snapshot};
use crate::error::Result;
use crate::output::{self, age, cell, duration, opt, table, Format};
use knit_api::views::{InstanceView, JoinTokenView, NodeView, TimelineEntryView};
use knit_api::PhaseOutcome;
use knit_client::Client;
use std::process::ExitCode;

pub fn get(c: &Client, name: Option<&str>, format: Option<Format>) -> Result<ExitCode> {
    let listing = Listing {
        what: "nodes",
        name_of: |n: &NodeView| n.name.clone(),
        table: node_table,
    };
    show(listing, c.list_nodes()?, name, format)
}

/// `phase/outcome` of a node's last report.
fn phase(n: &NodeView) -> String {
    format!("{}/{}", opt(&n.phase), opt(&n.phase_outcome))
}

fn node_table(items: &[&NodeView], wide: bool) -> String {
    let now = now_ms();
    let mut headers = vec!["NAME", "STATUS", "POOL", "PHASE", "INITIALIZED", "AGE"];
    if wide {
        headers.extend(["INSTANCE", "PROVIDER-ID", "INTERNAL-IP", "ERROR"]);
    }
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|n| {
            let mut r = vec![
                cell(&n.name),
                cell(n.status),
                cell(&n.pool),
                phase(n),
                cell(n.initialized),
                age(n.created_ms, now),
            ];
            if wide {
                r.extend([
                    cell(&n.instance),
                    opt(&n.provider_id),
                    opt(&n.ip),
                    opt(&n.error_code),
                ]);
            }
            r
        })
        .collect();
    table(&headers, &rows)
}

pub fn get_instances(c: &Client, name: Option<&str>, format: Option<Format>) -> Result<ExitCode> {
    let listing = Listing {
        what: "instances",
        name_of: |i: &InstanceView| i.name.clone(),
        table: instance_table,
    };
    show(listing, c.list_instances()?, name, format)
}

pub fn instance_table(items: &[&InstanceView], wide: bool) -> String {
    let now = now_ms();
    let mut headers = vec!["NAME", "POOL", "STATE", "PROVIDER-ID", "IP", "AGE"];
    if wide {
        headers.extend(["TYPE", "LAST-ERROR"]);
    }
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|i| {
            let mut r = vec![
                cell(&i.name),
                cell(&i.pool),
                cell(i.state),
                opt(&i.provider_id),
                opt(&i.ip),
                age(i.created_ms, now),
            ];
            if wide {
                r.extend([cell(&i.instance_type), opt(&i.last_error)]);
            }
            r
        })
        .collect();
    table(&headers, &rows)
}

pub fn get_join_tokens(c: &Client, name: Option<&str>, format: Option<Format>) -> Result<ExitCode> {
    let listing = Listing {
        what: "jointokens",
        name_of: |t: &JoinTokenView| t.token_id.clone(),
        table: join_token_table,
    };
    show(listing, c.join_tokens()?, name, format)
}

fn join_token_table(items: &[&JoinTokenView], _wide: bool) -> String {
    let now = now_ms();
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|t| {
            vec![
                cell(&t.token_id),
                cell(&t.instance),
                cell(&t.pool),
                if t.expires_ms > now {
                    format!("in {}", age(now, t.expires_ms))
                } else {
                    "expired".into()
                },
                match t.used_ms {
                    None => "no".into(),
                    Some(used) => format!("{} ago", age(used, now)),
                },
            ]
        })
        .collect();
    table(&["TOKEN-ID", "INSTANCE", "POOL", "EXPIRES", "USED"], &rows)
}

pub fn describe(c: &Client, name: &str, format: Option<Format>) -> Result<ExitCode> {
    let node = c.get_node(name)?;
    if let Some(f @ (Format::Json | Format::Yaml)) = format {
        // The node's document as the API gives it (timeline and caches included).
        print!("{}", output::document(f, &node.raw));
        return Ok(ExitCode::SUCCESS);
    }
    let n = &node.view;
    let now = now_ms();
    println!("Name:          {}", cell(&n.name));
    println!("Pool:          {}", cell(&n.pool));
    println!(
        "Instance:      {} ({})",
        cell(&n.instance),
        opt(&n.provider_id)
    );
    println!("Internal IP:   {}", opt(&n.ip));
    println!("Status:        {}", cell(n.status));
    println!("Initialized:   {}", cell(n.initialized));
    println!(
        "User data:     {}",
        n.user_data
            .as_deref()
            .unwrap_or("not finished (or not known yet)")
    );
    if let Some(code) = &n.error_code {
        println!("Error:         {} {}", cell(code), opt(&n.error));
    }
    println!("Age:           {}", age(n.created_ms, now));
    snapshot::describe_cache(n);
    println!("Phase timeline:");
    let timeline: &[TimelineEntryView] = n.timeline.as_deref().unwrap_or_default();
    let first = timeline.first().map_or(0, |t| t.at_ms);
    let rows: Vec<Vec<String>> = timeline
        .iter()
        .filter(|t| t.outcome != PhaseOutcome::Started)
        .map(|t| {
            vec![
                format!(
                    "+{}",
                    duration(t.at_ms - t.duration_ms.unwrap_or(0) - first)
                ),
                cell(t.phase),
                cell(t.outcome),
                t.duration_ms.map(duration).unwrap_or_else(|| "-".into()),
                match (&t.error_code, &t.reason) {
                    (None, None) => String::new(),
                    (None, Some(r)) => cell(r),
                    (Some(code), r) => format!(
                        "{} {}",
                        cell(code),
                        r.as_deref().map(cell).unwrap_or_default()
                    ),
                },
            ]
        })
        .collect();
    if rows.is_empty() {
        println!("  (no reports yet)");
    } else {
        for line in table(&["START", "PHASE", "OUTCOME", "DURATION", "DETAIL"], &rows).lines() {
            println!("  {line}");
        }
    }
    let running: Vec<String> = timeline
        .iter()
        .filter(|t| t.outcome == PhaseOutcome::Started)
        .filter(|s| {
            !timeline
                .iter()
                .any(|t| t.phase == s.phase && t.outcome != PhaseOutcome::Started)
        })
        .map(|s| {
            format!(
                "{} (running for {})",
                cell(s.phase),
                duration(now - s.at_ms)
            )
        })
        .collect();
    if !running.is_empty() {
        println!("In progress:   {}", running.join(", "));
    }
    Ok(ExitCode::SUCCESS)
}

pub fn delete(c: &Client, name: &str, release: Option<bool>) -> Result<ExitCode> {
    let answer = c.delete_node(name, release)?;
    println!(
        "node/{name} deleted ({})",
        if answer.release {
            "instance released"
        } else if answer.added {
            "instance kept: added by attach (--release to release it)"
        } else {
            "instance kept"
        }
    );
    Ok(ExitCode::SUCCESS)
}

pub fn logs(c: &Client, name: &str, file: &str) -> Result<ExitCode> {
    print!("{}", c.node_log(name, file)?);
    Ok(ExitCode::SUCCESS)
}
