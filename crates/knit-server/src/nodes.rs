//! Instances and nodes as the API shows and changes them: their views,
//! removing one node from its pool, reading its log files and running a
//! command on its machine (`knit exec`). The HTTP handlers
//! (`crate::http::nodes`, `crate::http::exec`) parse requests into these
//! calls.

use crate::control::ControlPlane;
use crate::error::{Result, ServerError};
use crate::names;
use crate::pool_state::counts_toward_pool;
use crate::store::{DrainRecord, InstanceRecord, NodeRecord, TimelineEntry};
use knit_api::state::{DrainState, EventType};
use knit_api::views::{
    DrainStepView, DrainView, ExecRequest, ExecResponse, InstanceView, NodeRemoving, NodeView,
    TimelineEntryView, EXEC_API_OUTPUT_MAX_BYTES, EXEC_DEFAULT_TIMEOUT_SECONDS,
    EXEC_MAX_TIMEOUT_SECONDS, LOG_FILES,
};
use knit_api::{ApiError, FieldError};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::HashMap;

/// A stored record as its API view: the record's JSON is the view's (the
/// view adds fields, never renames one), so the two cannot drift apart
/// silently.
pub fn as_view<T: DeserializeOwned>(record: &impl Serialize) -> Result<T> {
    serde_json::to_value(record)
        .and_then(serde_json::from_value)
        .map_err(|e| ServerError::Internal(format!("a stored record as its view: {e}")))
}

fn invalid(field: &str, value: String, rule: String) -> ServerError {
    ApiError::Invalid(vec![FieldError {
        field: field.into(),
        value,
        rule,
    }])
    .into()
}

/// Every instance.
pub fn instances(cp: &ControlPlane) -> Result<Vec<InstanceView>> {
    let currency = crate::pools::rollout::instance_currency(cp)?;
    cp.store
        .instances(None)?
        .iter()
        .map(|i| {
            let mut view: InstanceView = as_view(i)?;
            view.template_hash = currency.get(&i.name).and_then(|c| c.0.clone());
            Ok(view)
        })
        .collect()
}

/// A node's template hash and whether it is its pool's current one.
fn with_currency(
    mut view: NodeView,
    currency: &HashMap<String, crate::pools::rollout::Currency>,
) -> NodeView {
    if let Some((hash, fresh)) = currency.get(&view.instance) {
        view.template_hash.clone_from(hash);
        view.up_to_date = *fresh;
    }
    view
}

fn node_view(
    cp: &ControlPlane,
    node: &NodeRecord,
    instance: Option<&InstanceRecord>,
    drain: Option<&DrainRecord>,
    with_timeline: bool,
) -> Result<NodeView> {
    let timeline = if with_timeline {
        let entries = cp.store.timeline(&node.name)?;
        Some(entries.into_iter().map(timeline_entry_view).collect())
    } else {
        None
    };
    // A list shows a drain while it lasts; one node's answer shows it
    // (with its steps) once started.
    let drain = match drain.filter(|d| d.node == node.name) {
        Some(d) if with_timeline => {
            let steps = cp
                .store
                .drain_steps(&d.instance)?
                .into_iter()
                .map(|s| DrainStepView {
                    at_ms: s.at_ms,
                    state: s.state,
                    message: s.message,
                })
                .collect();
            Some(drain_view(d, Some(steps)))
        }
        Some(d) if d.state != DrainState::Drained => Some(drain_view(d, None)),
        _ => None,
    };
    Ok(NodeView {
        name: node.name.clone(),
        instance: node.instance.clone(),
        pool: node.pool.clone(),
        status: node.status,
        phase: node.phase,
        phase_outcome: node.phase_outcome,
        error_code: node.error_code,
        error: node.error.clone(),
        created_ms: node.created_ms,
        updated_ms: node.updated_ms,
        user_data: node.user_data.clone(),
        initialized: node.initialized(),
        provider_id: instance.and_then(|i| i.provider_id.clone()),
        ip: instance.and_then(|i| i.ip.clone()),
        timeline,
        cache: None,
        drain,
        template_hash: None,
        up_to_date: None,
    })
}

fn drain_view(d: &DrainRecord, steps: Option<Vec<DrainStepView>>) -> DrainView {
    DrainView {
        state: d.state,
        started_ms: d.started_ms,
        updated_ms: d.updated_ms,
        reason: d.reason.clone(),
        blocking_budget: d.budget.clone(),
        pods_left: d.pods_left,
        evicted: d.evicted,
        timed_out_ms: d.timed_out_ms,
        steps,
    }
}

fn timeline_entry_view(entry: TimelineEntry) -> TimelineEntryView {
    TimelineEntryView {
        phase: entry.phase,
        outcome: entry.outcome,
        reason: entry.reason,
        error_code: entry.error_code,
        at_ms: entry.at_ms,
        duration_ms: entry.duration_ms,
    }
}

/// Every node, with its instance's provider id and address.
pub fn list(cp: &ControlPlane) -> Result<Vec<NodeView>> {
    // One read of each table, joined here: no query per node.
    let instances: HashMap<String, InstanceRecord> = cp
        .store
        .instances(None)?
        .into_iter()
        .map(|i| (i.name.clone(), i))
        .collect();
    let drains: HashMap<String, DrainRecord> = cp
        .store
        .drains()?
        .into_iter()
        .map(|d| (d.instance.clone(), d))
        .collect();
    let currency = crate::pools::rollout::instance_currency(cp)?;
    cp.store
        .nodes()?
        .iter()
        .map(|n| {
            node_view(
                cp,
                n,
                instances.get(&n.instance),
                drains.get(&n.instance),
                false,
            )
            .map(|v| with_currency(v, &currency))
        })
        .collect()
}

/// One node with its phase timeline and what it took from caches.
pub async fn describe(cp: &ControlPlane, name: &str) -> Result<NodeView> {
    names::check_node("metadata.name", name)?;
    let node = cp.store.node(name)?.ok_or_else(|| ServerError::NotFound {
        kind: "node",
        name: name.to_string(),
    })?;
    let instance = cp.store.instance(&node.instance)?;
    let drain = cp.store.drain(&node.instance)?;
    let currency = crate::pools::rollout::instance_currency(cp)?;
    let mut view = with_currency(
        node_view(cp, &node, instance.as_ref(), drain.as_ref(), true)?,
        &currency,
    );
    view.cache = Some(crate::snapshot::node_cache(cp, &node, instance.as_ref()).await);
    Ok(view)
}

/// Removes one node (by node or instance name) from its pool; the pool's
/// desired count drops by one so it is not replaced, unless the pool's
/// `updateStrategy` is `OnDelete` and the node is out of date: then
/// removing it is how it is rolled, and its replacement is made from the
/// current template. `release` absent:
/// release an instance knit created, keep one added by attach (released
/// only when the caller says so).
pub async fn remove(cp: &ControlPlane, name: &str, release: Option<bool>) -> Result<NodeRemoving> {
    names::check_node("metadata.name", name)?;
    let not_found = || ServerError::NotFound {
        kind: "node",
        name: name.to_string(),
    };
    let instance_name = match cp.store.node(name)? {
        Some(node) => node.instance,
        None => match cp.store.instance(name)? {
            Some(i) => i.name,
            None => return Err(not_found()),
        },
    };
    let instance = cp
        .store
        .instance(&instance_name)?
        .ok_or_else(|| ServerError::NotFound {
            kind: "instance",
            name: instance_name.clone(),
        })?;
    if !counts_toward_pool(&instance.state) {
        return Err(ServerError::Conflict(format!(
            "{name:?} is already {}",
            instance.state
        )));
    }
    let release = release.unwrap_or(!instance.added);
    let mut replaced = false;
    {
        let _guard = cp.plan_lock.lock().await;
        if let Some(record) = cp.store.pool(&instance.pool)? {
            let mut pool = record.pool;
            replaced = replaced_on_delete(cp, &pool, &instance)?;
            if !replaced {
                pool.spec.replicas = (pool.spec.replicas - 1).max(0);
                cp.store.update_pool(&pool)?;
            }
        }
        cp.store.add_delete_intents(
            &instance.pool,
            std::slice::from_ref(&instance.name),
            release,
        )?;
    }
    cp.store.add_event(
        EventType::Normal,
        "Node",
        name,
        "Removing",
        &format!(
            "removing {} from pool {} ({}){}",
            instance.name,
            instance.pool,
            match (release, instance.added) {
                (true, true) => "release, asked for explicitly: added by attach",
                (true, false) => "release",
                (false, true) =>
                    "keep instance: added by attach, knit does not release it unless asked",
                (false, false) => "keep instance",
            },
            if replaced {
                "; out of date under updateStrategy OnDelete: replaced from the pool's current template"
            } else {
                ""
            }
        ),
    )?;
    cp.wake();
    Ok(NodeRemoving {
        instance: instance.name,
        release,
        added: instance.added,
    })
}

/// Whether removing `instance` is how its pool rolls it: `updateStrategy:
/// OnDelete` and the instance out of date (made from another template).
/// Then the pool keeps its size and the planner makes the replacement
/// from the current template; otherwise a removed node is not replaced.
fn replaced_on_delete(
    cp: &ControlPlane,
    pool: &knit_api::NodePool,
    instance: &InstanceRecord,
) -> Result<bool> {
    if !pool.spec.update_strategy.on_delete() || instance.added {
        return Ok(false);
    }
    let current = crate::pools::rollout::current_hash(cp, &pool.spec)?;
    let hashes = cp.store.instance_hashes(Some(&pool.metadata.name))?;
    Ok(!crate::pool_state::up_to_date(instance, &hashes, &current))
}

/// One of a node's log files (by node or instance name; `file` one of
/// [`LOG_FILES`], default `init`), read through the provider.
pub async fn read_log(cp: &ControlPlane, name: &str, file: Option<&str>) -> Result<Vec<u8>> {
    names::check_node("metadata.name", name)?;
    let which = file.unwrap_or("init");
    let Some((_, path)) = LOG_FILES.iter().find(|(k, _)| *k == which) else {
        let names: Vec<&str> = LOG_FILES.iter().map(|(k, _)| *k).collect();
        return Err(invalid(
            "file",
            format!("{which:?}"),
            format!("must be one of {}", names.join("|")),
        ));
    };
    let instance_name = match cp.store.node(name)? {
        Some(node) => node.instance,
        None => name.to_string(),
    };
    let instance = cp
        .store
        .instance(&instance_name)?
        .ok_or_else(|| ServerError::NotFound {
            kind: "node",
            name: name.to_string(),
        })?;
    let id = instance.provider_id.ok_or_else(|| {
        ServerError::Conflict(format!("instance {} is not created yet", instance.name))
    })?;
    cp.provider()?.read_file(&id, path).await
}

/// Runs a command on one machine through its provider (`knit exec`); each
/// run is an event naming the command, the instance and the exit code or
/// error, never the output.
pub async fn exec(cp: &ControlPlane, req: ExecRequest) -> Result<ExecResponse> {
    use base64::Engine;
    names::check_node("name", &req.name)?;
    let instance_name = match req.kind.as_str() {
        "node" => {
            let node = cp.store.node(&req.name)?;
            node.ok_or_else(|| ServerError::NotFound {
                kind: "node",
                name: req.name.clone(),
            })?
            .instance
        }
        "instance" => req.name.clone(),
        other => {
            let rule = "must be node or instance".to_string();
            return Err(invalid("kind", format!("{other:?}"), rule));
        }
    };
    if req.argv.first().is_none_or(|c| c.is_empty()) {
        let rule = "must start with a command (a non-empty first element)".to_string();
        return Err(invalid("argv", format!("{:?}", req.argv), rule));
    }
    let secs = req.timeout_seconds.unwrap_or(EXEC_DEFAULT_TIMEOUT_SECONDS);
    if !(1..=EXEC_MAX_TIMEOUT_SECONDS).contains(&secs) {
        let rule = format!("must be 1 to {EXEC_MAX_TIMEOUT_SECONDS} (seconds)");
        return Err(invalid("timeoutSeconds", secs.to_string(), rule));
    }
    let instance = cp
        .store
        .instance(&instance_name)?
        .ok_or_else(|| ServerError::NotFound {
            kind: "instance",
            name: instance_name.clone(),
        })?;
    let id = instance.provider_id.clone().ok_or_else(|| {
        ServerError::Conflict(format!("instance {} is not created yet", instance.name))
    })?;
    let limit = std::time::Duration::from_secs(secs);
    let outcome = cp
        .provider()?
        .exec_limited(&id, &req.argv, limit, EXEC_API_OUTPUT_MAX_BYTES)
        .await;
    // The command as run (cut: an event is a line), never its output.
    let command: String = format!("{:?}", req.argv).chars().take(300).collect();
    let ran = format!("admin ran {command} on {} ({id})", instance.name);
    match &outcome {
        Ok(out) => cp.store.add_event(
            EventType::Normal,
            "Instance",
            &instance.name,
            "Exec",
            &format!("{ran}: exit code {}", out.code),
        )?,
        Err(e) => cp.store.add_event(
            EventType::Warning,
            "Instance",
            &instance.name,
            "ExecFailed",
            &format!("{ran}: {e}"),
        )?,
    };
    let out = outcome?;
    let b64 = base64::engine::general_purpose::STANDARD;
    Ok(ExecResponse {
        instance: instance.name,
        provider_id: id,
        exit_code: out.code,
        stdout: b64.encode(&out.stdout),
        stderr: b64.encode(&out.stderr),
        stdout_cut: out.stdout_cut,
        stderr_cut: out.stderr_cut,
    })
}
