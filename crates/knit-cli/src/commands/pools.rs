//! `knit get|describe|scale|delete pool`.

use super::get::{show, table_or_none, GetOpts, Listing};
use super::{events, nodes, now_ms, wait};
use crate::error::Result;
use crate::output::{self, age, cell, table, Format};
use knit_api::views::{EventView, InstanceView, PoolView, ScaleRequest};
use knit_client::{Client, Document};
use serde_json::Value;
use std::process::ExitCode;
use std::time::Duration;

pub fn get(c: &Client, name: Option<&str>, opts: &GetOpts) -> Result<ExitCode> {
    let listing = Listing {
        what: "pools",
        kind: "nodepool",
        name_of: |p: &PoolView| p.metadata.name.clone(),
        labels: Some(Box::new(|p: &PoolView| p.metadata.labels.clone())),
        table: pool_table,
    };
    show(listing, || Ok(c.list_pools()?), name, opts)
}

fn pool_table(items: &[&PoolView], wide: bool) -> String {
    let now = now_ms();
    let mut headers = vec![
        "NAME",
        "TYPE",
        "DESIRED",
        "MIN",
        "MAX",
        "INSTANCES",
        "RUNNING",
        "INITIALIZED",
        "READY",
        "UP-TO-DATE",
        "DRAINING",
        "AGE",
    ];
    if wide {
        headers.extend([
            "FAILED",
            "INSTANCE-TYPES",
            "IMAGE",
            "DELETING",
            "ROLLOUT",
            "GENERATION",
        ]);
    }
    // Why creates fail, when they do for a listed pool (the reconciler's
    // last error; `knit describe pool` shows it whole).
    let failing = items.iter().any(|p| p.status.create_error.is_some());
    if failing {
        headers.push("MESSAGE");
    }
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|p| {
            let st = &p.status;
            let spec = &p.spec.spec;
            let mut r = vec![
                cell(&p.metadata.name),
                cell(&spec.pool_type),
                cell(st.desired),
                // An auto-scaling pool's bounds (cluster-autoscaler keeps
                // DESIRED within them).
                spec.scaling
                    .as_ref()
                    .map_or_else(|| "-".to_string(), |b| b.min.to_string()),
                spec.scaling
                    .as_ref()
                    .map_or_else(|| "-".to_string(), |b| b.max.to_string()),
                cell(st.instances),
                cell(st.running),
                cell(st.initialized),
                cell(st.ready),
                cell(st.updated_replicas),
                cell(st.draining),
                age(p.metadata.creation_timestamp_ms, now),
            ];
            if wide {
                r.extend([
                    cell(st.failed),
                    spec.instance_types.join(","),
                    cell(&spec.image),
                    cell(st.deleting),
                    st.rollout
                        .as_ref()
                        .map_or_else(|| "-".to_string(), |r| r.state.clone()),
                    format!("{}/{}", st.observed_generation, p.metadata.generation),
                ]);
            }
            if failing {
                r.push(match &st.create_error {
                    Some(e) => short(e, 100),
                    None => String::new(),
                });
            }
            r
        })
        .collect();
    table(&headers, &rows)
}

/// `text` on one line, cut to `max` characters (marked with `…`).
fn short(text: &str, max: usize) -> String {
    let one_line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() <= max {
        return one_line;
    }
    let mut cut: String = one_line.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// A pool's instances and the last events about it.
struct Related {
    instances: Vec<Document<InstanceView>>,
    events: Vec<Document<EventView>>,
}

/// A pool's instances and the last 20 events of the pool, its instances
/// and its nodes (what `describe pool` shows).
fn related(c: &Client, name: &str) -> Result<Related> {
    let mine: Vec<Document<InstanceView>> = c
        .list_instances()?
        .into_iter()
        .filter(|i| i.view.pool == name)
        .collect();
    let events = c.events(Some(1000))?;
    let mut related_names: Vec<String> = mine.iter().map(|i| i.view.name.clone()).collect();
    related_names.extend(
        c.list_nodes()?
            .into_iter()
            .filter(|n| n.view.pool == name)
            .map(|n| n.view.name),
    );
    let related: Vec<Document<EventView>> = events
        .into_iter()
        .filter(|e| e.view.object_name == name || related_names.contains(&e.view.object_name))
        .collect();
    let last = related[related.len().saturating_sub(20)..].to_vec();
    Ok(Related {
        instances: mine,
        events: last,
    })
}

pub fn describe(c: &Client, name: &str, format: Option<Format>) -> Result<ExitCode> {
    let pool = c.get_pool(name)?;
    let Related { instances, events } = related(c, name)?;
    if let Some(f @ (Format::Json | Format::Yaml)) = format {
        // The pool's document as sent, with its `instances` and last `events`.
        let mut doc = pool.raw;
        if let Value::Object(fields) = &mut doc {
            let raw = |docs: Vec<Value>| Value::Array(docs);
            fields.insert(
                "instances".into(),
                raw(instances.into_iter().map(|i| i.raw).collect()),
            );
            fields.insert(
                "events".into(),
                raw(events.into_iter().map(|e| e.raw).collect()),
            );
        }
        print!("{}", output::document(f, &doc));
        return Ok(ExitCode::SUCCESS);
    }
    // The document without its status, then the status one line a field.
    let mut spec = pool.raw;
    if let Value::Object(fields) = &mut spec {
        fields.remove("status");
    }
    print!("{}", output::yaml(&spec));
    println!("status:");
    if let Ok(Value::Object(status)) = serde_json::to_value(&pool.view.status) {
        for (k, v) in status {
            println!("  {k}: {v}");
        }
    }
    let instances: Vec<&InstanceView> = instances.iter().map(|i| &i.view).collect();
    let events: Vec<&EventView> = events.iter().map(|e| &e.view).collect();
    println!("Instances:");
    print!("{}", table_or_none(nodes::instance_table, &instances, true));
    println!("Events:");
    print!("{}", table_or_none(events::event_table, &events, false));
    Ok(ExitCode::SUCCESS)
}

pub fn scale(
    c: &Client,
    name: &str,
    replicas: i64,
    release: bool,
    wait: Option<Duration>,
) -> Result<ExitCode> {
    c.scale_pool(name, &ScaleRequest { replicas, release })?;
    println!("nodepool/{name} scaled to {replicas}");
    match wait {
        Some(timeout) => wait::scale(c, name, timeout),
        None => Ok(ExitCode::SUCCESS),
    }
}

pub fn delete(c: &Client, name: &str) -> Result<ExitCode> {
    c.delete_pool(name)?;
    println!("nodepool/{name} deleted (scaling to 0, then removed)");
    Ok(ExitCode::SUCCESS)
}
