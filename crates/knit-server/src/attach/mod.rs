//! Adding existing instances to a pool (docs/spec.md §2).
//!
//! Automatic mode ([`automatic`], `POST /api/v1/pools/{pool}/attach`):
//! preflight every instance, then per instance stop it, re-image it with the
//! pool's composed user data (data disks kept; their new ids recorded), and
//! let it initialize exactly like a scaled-out node: same stub, same
//! one-time join token, same bootstrap endpoint, same reconciler (join
//! timeout, readiness, user data).
//!
//! Manual mode ([`manual`], `POST /api/v1/pools/{pool}/attach-script`): a
//! one-time attach token bound to the pool and a command to paste on the
//! machine. The command checks the machine (swap, OS), downloads the agent
//! from the mirror (sha256 checked), redeems the token at
//! `POST /attach/v1/manual` (server-side preflight, manual mode), which
//! answers a regular join token; the agent then bootstraps like any node.
//! The OS and the instance's own user data stay as they are.
//!
//! What an attach decided (keep the instance name, format the data disk,
//! old → new disk ids) is its [`AttachRecord`] in the store, read by the
//! bootstrap endpoint when it makes the NodeConfig. Whether an instance was
//! added (knit never releases it on its own) is `InstanceRecord::added`.
//!
//! The HTTP side of both modes is `crate::http::attach`; nothing here knows
//! of HTTP.

pub mod automatic;
pub mod manual;

use crate::control::ControlPlane;
use crate::error::{Result, ServerError};
use crate::preflight::{self, Context, InstanceFacts, Mode};
use crate::store::{Enrollment, InstanceRecord};
use knit_api::state::EventType;
use knit_api::{ApiError, FieldError, NodeConfig, NodePool};

pub use crate::store::attach::{AttachRecord, AttachTokenOptions};
pub use automatic::resume;
pub use manual::added_manually;
pub(crate) use manual::undo_inside;

/// Pool label: the pool holds instances added to it. Auto-scaling cannot be
/// enabled on such a pool (the autoscaler would release the user's machines).
pub const ADDED_LABEL: &str = "knit.dev/added-instances";
/// Attach tokens start with this, so they are never confused with join tokens.
pub const ATTACH_TOKEN_PREFIX: &str = "knitattach.";
/// The `instance` of an attach token in the join-token table: none yet.
pub const ATTACH_SENTINEL: &str = "(attach)";
/// Default and bounds of an attach token's life.
pub const DEFAULT_EXPIRES_SECONDS: i64 = 3600;
const MAX_EXPIRES_SECONDS: i64 = 7 * 24 * 3600;

/// The attach record of a knit instance, if it was added (not created).
pub fn record(cp: &ControlPlane, instance: &str) -> Result<Option<AttachRecord>> {
    cp.store.attach_record(instance)
}

/// The node name of an added instance that keeps its name; `None` = the
/// pool's rule (custom node name, else `<region>.<instance id>`).
pub fn node_name(cp: &ControlPlane, instance: &InstanceRecord) -> Result<Option<String>> {
    Ok(record(cp, &instance.name)?
        .filter(|r| r.keep_instance_name)
        .map(|r| r.instance_name.to_lowercase()))
}

/// Adjusts the NodeConfig of an added instance: its name when kept, and the
/// data-disk option (the agent's own data-disk logic decides what to do:
/// blank → format, filesystem → mount, partition table → refuse).
pub fn adjust_config(
    cp: &ControlPlane,
    instance: &InstanceRecord,
    config: &mut NodeConfig,
) -> Result<()> {
    if let Some(r) = record(cp, &instance.name)? {
        if r.keep_instance_name {
            config.node.name = Some(r.instance_name.to_lowercase());
        }
        config.data_disk.enabled = r.format_data_disk;
    }
    Ok(())
}

/// Refuses enabling auto-scaling on a pool that holds added instances, and
/// keeps the marker label across updates.
pub fn check_pool_update(old: &NodePool, new: &mut NodePool) -> Result<()> {
    let Some(v) = old.metadata.labels.get(ADDED_LABEL) else {
        return Ok(());
    };
    if new.spec.pool_type == "auto-scaling" {
        return Err(ServerError::Conflict(format!(
            "pool {:?} holds instances added to it (knit attach): auto-scaling cannot be enabled, because the autoscaler would release machines you added; move them to another pool first",
            old.metadata.name
        )));
    }
    new.metadata.labels.insert(ADDED_LABEL.into(), v.clone());
    Ok(())
}

/// Appends the connectivity diagnosis to a join timeout of an added instance.
pub fn diagnose(cp: &ControlPlane, instance: &str, message: String) -> String {
    let added = cp
        .store
        .instance(instance)
        .is_ok_and(|i| i.is_some_and(|i| i.added));
    if !added {
        return message;
    }
    let api = cp
        .cluster
        .api_endpoint()
        .and_then(|url| host_port(&url))
        .unwrap_or_else(|| (advertise_host(cp), preflight::API_SERVER_PORT));
    format!(
        "{message}. The added instance most likely cannot reach the control plane ({}) or the API server ({}:{}): check connectivity between the instance and the API server and the instance's security-group rules (egress TCP to both addresses)",
        cp.advertise_url, api.0, api.1
    )
}

/// Host and port of an `https://host:port/…` URL (port 443 when absent).
fn host_port(url: &str) -> Option<(String, u16)> {
    let authority = url.strip_prefix("https://")?.split('/').next()?;
    let (host, port) = match authority.strip_prefix('[') {
        // [v6]:port
        Some(v6) => {
            let (host, rest) = v6.split_once(']')?;
            (host, rest.strip_prefix(':'))
        }
        None => match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        },
    };
    let port = port.map_or(Some(443), |p| p.parse().ok())?;
    Some((host.to_string(), port))
}

fn advertise_host(cp: &ControlPlane) -> String {
    let rest = cp.advertise_url.trim_start_matches("https://");
    match rest.rsplit_once(':') {
        Some((host, _)) => host.trim_matches(['[', ']']).to_string(),
        None => rest.to_string(),
    }
}

/// The context the checks need, read from the store.
fn context(
    cp: &ControlPlane,
    mode: Mode,
    adding: i64,
    new_password: bool,
    provider_id: &str,
) -> Result<Context> {
    let pools = cp.store.pools()?;
    let cluster_nodes = pools
        .iter()
        .filter(|p| !p.deleting)
        .map(|p| p.pool.spec.max_nodes())
        .sum();
    let instances = cp.store.instances(None)?;
    let active: Vec<&InstanceRecord> = instances.iter().filter(|i| i.state.is_member()).collect();
    Ok(Context {
        mode,
        cluster_nodes,
        adding,
        api_server_ip: advertise_host(cp),
        // Flannel: one custom route entry per node in the VPC's table.
        route_entries_used: active.len() as u32,
        new_password,
        member_of_pool: active
            .iter()
            .find(|i| i.provider_id.as_deref() == Some(provider_id))
            .map(|i| i.pool.clone()),
        ..Context::default()
    })
}

fn field_error(field: &str, value: String, rule: &str) -> ServerError {
    ApiError::Invalid(vec![FieldError {
        field: field.into(),
        value,
        rule: rule.into(),
    }])
    .into()
}

/// Records an added instance in its pool: the instance row, its attach
/// record, the pool's desired count + 1, the marker label and (automatic
/// mode) the attach intent, in one transaction under the planner's lock so the reconciler
/// never sees the count without the instance.
async fn enroll(
    cp: &ControlPlane,
    pool: &str,
    name: &str,
    f: &InstanceFacts,
    state_word: knit_api::state::InstanceState,
    rec: &AttachRecord,
    intent: bool,
) -> Result<Option<i64>> {
    let _guard = cp.plan_lock.lock().await;
    let record = cp.store.pool(pool)?.ok_or_else(|| ServerError::NotFound {
        kind: "pool",
        name: pool.to_string(),
    })?;
    let mut p = record.pool;
    let from = p.spec.replicas;
    p.spec.replicas += 1;
    p.metadata.labels.insert(ADDED_LABEL.into(), "true".into());
    // A removed node coming back (drain, keep instance, attach again): its
    // old record goes in the same step, so the node name it takes again is
    // its new one's.
    let id = cp.store.enroll_attached(
        &Enrollment {
            name,
            pool: &p,
            provider_id: &f.id,
            ip: f.ip.as_deref(),
            instance_type: &f.instance_type,
            state: state_word,
            record: Some(rec),
        },
        intent,
    )?;
    cp.store.add_event(
        EventType::Normal,
        "NodePool",
        pool,
        "InstanceAdded",
        &format!(
            "{} added as {name}; replicas {from} -> {}",
            f.id, p.spec.replicas
        ),
    )?;
    Ok(id)
}

/// Undoes the add of an instance whose attach failed before its node could
/// run: it leaves the pool (`Detached`, kept, with the reason) and the
/// pool's count goes back, once. The instance can be attached again.
pub(crate) async fn undo(cp: &ControlPlane, name: &str, reason: &str) -> Result<()> {
    let _guard = cp.plan_lock.lock().await;
    let message = format!(
        "{reason}; the add was undone: the instance left the pool (Detached, kept) and the pool's count is back; attach it again once the cause is fixed"
    );
    match cp.store.undo_attach(name, &message)? {
        Some((pool, from, to)) => cp.store.add_event(
            EventType::Warning,
            "Instance",
            name,
            "AttachFailed",
            &format!("{message} (pool {pool}: replicas {from} -> {to})"),
        )?,
        None => cp.store.add_event(
            EventType::Warning,
            "Instance",
            name,
            "AttachFailed",
            &format!("{reason}; the instance had already left its pool"),
        )?,
    }
    cp.wake();
    Ok(())
}

/// The name an added instance is renamed to when it does not keep its own:
/// its node name by the pool's rule (custom node name from its IP, else
/// `<region>.<instance id>`), as the bootstrap endpoint will give it.
/// `None`: it keeps its name (or knows none yet).
fn rename_target(cp: &ControlPlane, pool: &NodePool, instance: &str) -> Result<Option<String>> {
    if record(cp, instance)?.is_none_or(|r| r.keep_instance_name) {
        return Ok(None);
    }
    let Some(row) = cp.store.instance(instance)? else {
        return Ok(None);
    };
    let region = cp.cluster_doc()?.spec.region;
    Ok(crate::bootstrap::expected_node_name(&region, &row, pool))
}

/// A script from one of the `.sh` templates beside this file: each
/// `@NAME@` placeholder replaced, in one pass, by its value as one
/// single-quoted shell word, so that no value is ever read as shell. A
/// placeholder without a value is a bug, refused.
fn fill_script(template: &str, values: &[(&str, &str)]) -> Result<String> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(at) = rest.find('@') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let name_len = after
            .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(after.len());
        if name_len > 0 && after[name_len..].starts_with('@') {
            let name = &after[..name_len];
            let value = values
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| *v)
                .ok_or_else(|| {
                    ServerError::Internal(format!("script placeholder @{name}@ has no value"))
                })?;
            out.push_str(&knit_api::shell::quote(value));
            rest = &after[name_len + 1..];
        } else {
            // An `@` that is not a placeholder (`-H @"$auth"`).
            out.push('@');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_reads_the_api_server_url() {
        let hp = |u: &str| host_port(u);
        assert_eq!(hp("https://10.0.0.1:6443"), Some(("10.0.0.1".into(), 6443)));
        assert_eq!(
            hp("https://api.example:41234/"),
            Some(("api.example".into(), 41234))
        );
        assert_eq!(hp("https://api.example"), Some(("api.example".into(), 443)));
        assert_eq!(hp("https://[fd00::1]:6443"), Some(("fd00::1".into(), 6443)));
        assert_eq!(hp("https://10.0.0.1:notaport"), None);
        assert_eq!(hp("http://10.0.0.1:6443"), None);
    }

    #[test]
    fn auto_scaling_is_refused_on_a_pool_with_added_instances() {
        let mut old = NodePool::new("workers", knit_api::NodePoolSpec::default());
        let mut new = old.clone();
        check_pool_update(&old, &mut new).unwrap();
        old.metadata
            .labels
            .insert(ADDED_LABEL.into(), "true".into());
        let mut new = NodePool::new("workers", knit_api::NodePoolSpec::default());
        check_pool_update(&old, &mut new).unwrap();
        assert_eq!(
            new.metadata.labels[ADDED_LABEL], "true",
            "the marker is kept"
        );
        new.spec.pool_type = "auto-scaling".into();
        let e = check_pool_update(&old, &mut new).unwrap_err().to_string();
        assert!(
            e.contains("holds instances added") && e.contains("autoscaler would release"),
            "{e}"
        );
    }

    /// A value reaches the script as itself, whatever shell it holds.
    #[test]
    fn script_values_are_quoted_words() {
        let nasty = "it's $(exit 9) `id` \"q\" \\ @V@\nline2";
        let s = fill_script(
            "#!/bin/sh\nv=@V@\nw=@W@\n# -H @\"$v\"\nprintf '%s|%s' \"$v\" \"$w\"\n",
            &[("V", nasty), ("W", "")],
        )
        .unwrap();
        assert!(s.contains("-H @\"$v\""), "{s}");
        let out = std::process::Command::new("sh")
            .args(["-c", &s])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{nasty}|"));
        let e = fill_script("x=@MISSING@", &[]).unwrap_err().to_string();
        assert!(e.contains("@MISSING@"), "{e}");
    }

    /// The checks' report is the API's: the JSON the server sends.
    #[test]
    fn a_preflight_report_keeps_its_json() {
        use knit_api::views::{PreflightReport, PreflightResult, PreflightStatus};
        let report = PreflightReport {
            instance: "i-1".into(),
            results: vec![PreflightResult {
                check: "same-vpc".into(),
                code: "PreflightVpcMismatch".into(),
                status: PreflightStatus::Warning,
                message: "m".into(),
                fix: "f".into(),
            }],
        };
        assert_eq!(
            serde_json::to_value(&report).unwrap(),
            serde_json::json!({"instance": "i-1", "results": [{
                "check": "same-vpc", "code": "PreflightVpcMismatch",
                "status": "warning", "message": "m", "fix": "f"
            }]})
        );
    }
}
