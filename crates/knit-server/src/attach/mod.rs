//! Adding existing instances to a pool (SPEC §2).
//!
//! Automatic mode (`POST /api/v1/pools/{pool}/attach`): preflight every
//! instance, then per instance stop it, re-image it with the pool's composed
//! user data (data disks kept; their new ids recorded), and let it initialize
//! exactly like a scaled-out node: same stub, same one-time join token, same
//! bootstrap endpoint, same reconciler (join timeout, readiness, user data).
//!
//! Manual mode (`POST /api/v1/pools/{pool}/attach-script`): a one-time attach
//! token bound to the pool and a command to paste on the machine. The
//! command checks the machine (swap, OS), downloads the agent from the
//! mirror (sha256 checked), redeems the token at `POST /attach/v1/manual`
//! (server-side preflight, manual mode), which answers a regular join token;
//! the agent then bootstraps like any node. The OS and the instance's own
//! user data stay as they are.
//!
//! What an attach decided (keep the instance name, format the data disk,
//! old → new disk ids) is kept in `<state>/attach/<instance>.json`, read by
//! the bootstrap endpoint when it makes the NodeConfig.

use crate::control::ControlPlane;
use crate::error::{Result, ServerError};
use crate::http::Peer;
use crate::preflight::{self, Context, InstanceFacts, Mode, Report};
use crate::reconcile::counts_toward_pool;
use crate::store::{now_ms, state, Enrollment, InstanceRecord, IntentRecord, Redeem};
use crate::{pki, userdata};
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use base64::Engine;
use knit_api::{ApiError, FieldError, NodeConfig, NodePool};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::path::PathBuf;
use std::sync::Arc;

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

type Cp = Arc<ControlPlane>;

/// What one attach decided, kept for the bootstrap endpoint and for users.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachRecord {
    /// knit's instance name (the store's key).
    pub instance: String,
    pub provider_id: String,
    pub pool: String,
    pub mode: Mode,
    /// The instance's own name at the provider.
    pub instance_name: String,
    pub keep_instance_name: bool,
    pub format_data_disk: bool,
    /// Data disk ids before and after the re-image (automatic mode).
    pub old_disks: Vec<String>,
    pub new_disks: Vec<String>,
    pub at_ms: i64,
    /// When the re-image finished (automatic mode): a resumed attach whose
    /// re-image is done only finishes the bookkeeping.
    #[serde(default)]
    pub reimaged_ms: Option<i64>,
    /// A new login password was given (automatic mode). It is never
    /// stored, so an attach interrupted before its re-image cannot resume.
    #[serde(default)]
    pub new_password: bool,
}

fn attach_dir(cp: &ControlPlane) -> PathBuf {
    cp.settings.state_dir.join("attach")
}

fn write_json(path: &std::path::Path, value: &impl Serialize) -> Result<()> {
    let text =
        serde_json::to_vec_pretty(value).map_err(|e| ServerError::Internal(e.to_string()))?;
    // Whole, fsynced, renamed, directory fsynced: after a crash the record
    // is there complete or not at all (a resumed attach relies on it).
    crate::durable::write(path, &text, 0o600)
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &std::path::Path) -> Result<Option<T>> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| ServerError::Internal(format!("{}: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ServerError::io(format!("read {}", path.display()), e)),
    }
}

/// The attach record of a knit instance, if it was added (not created).
pub fn record(cp: &ControlPlane, instance: &str) -> Result<Option<AttachRecord>> {
    read_json(&attach_dir(cp).join(format!("{instance}.json")))
}

fn save_record(cp: &ControlPlane, r: &AttachRecord) -> Result<()> {
    write_json(&attach_dir(cp).join(format!("{}.json", r.instance)), r)
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
    if !matches!(record(cp, instance), Ok(Some(_))) {
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
    let active: Vec<&InstanceRecord> = instances
        .iter()
        .filter(|i| counts_toward_pool(&i.state))
        .collect();
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

/// `POST /api/v1/pools/{pool}/attach`.
#[derive(Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AttachRequest {
    pub instances: Vec<String>,
    #[serde(default)]
    pub format_data_disk: bool,
    #[serde(default)]
    pub keep_instance_name: bool,
    /// New login password (password pools); never stored, never shown.
    #[serde(default)]
    pub password: Option<String>,
    #[serde(default)]
    pub dry_run: bool,
}

/// By hand: a request logged with `{:?}` must not show the password.
impl std::fmt::Debug for AttachRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttachRequest")
            .field("instances", &self.instances)
            .field("format_data_disk", &self.format_data_disk)
            .field("keep_instance_name", &self.keep_instance_name)
            .field("password", &self.password.as_ref().map(|_| "(redacted)"))
            .field("dry_run", &self.dry_run)
            .finish()
    }
}

pub async fn attach(
    State(cp): State<Cp>,
    Path(pool_name): Path<String>,
    body: Bytes,
) -> Result<Json<Value>> {
    let req: AttachRequest = serde_json::from_slice(&body).map_err(|e| ApiError::Parse {
        what: "attach request".into(),
        message: e.to_string(),
    })?;
    if req.instances.is_empty() {
        return Err(field_error(
            "instances",
            "[]".into(),
            "must name at least one instance",
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    if let Some(dup) = req.instances.iter().find(|i| !seen.insert(i.as_str())) {
        return Err(field_error(
            "instances",
            format!("{dup:?}"),
            "must not name an instance twice",
        ));
    }
    if let Some(p) = &req.password {
        knit_api::check_password(p).map_err(|rule| {
            field_error("password", format!("<{} chars>", p.chars().count()), &rule)
        })?;
    }
    let record = cp.store.live_pool(&pool_name)?;
    let provider = cp.provider()?.clone();
    // The re-image uses the pool's image: one the provider cannot use (an
    // image directory that does not exist) refuses the whole request here,
    // before any instance is touched.
    if let Err(e) = provider.check_image(&record.pool.spec.image).await {
        return Err(field_error(
            "pool.spec.image",
            format!("{:?}", record.pool.spec.image),
            &format!(
                "must be an image provider {} can re-image with: {e}",
                provider.name()
            ),
        ));
    }
    let cluster = cp.cluster_doc()?;
    let mut facts = Vec::new();
    for id in &req.instances {
        match provider.get(id).await? {
            Some(_) => facts.push(provider.facts(id).await?),
            None => {
                return Err(ServerError::NotFound {
                    kind: "instance",
                    name: id.clone(),
                })
            }
        }
    }
    let adding = req.instances.len() as i64;
    let mut reports = Vec::new();
    for f in &facts {
        let ctx = context(&cp, Mode::Automatic, adding, req.password.is_some(), &f.id)?;
        reports.push(preflight::check(&cluster, &record.pool, f, &ctx));
    }
    let passed = reports.iter().all(Report::passed);
    if req.dry_run || !passed {
        if !passed && !req.dry_run {
            let failed: Vec<String> = reports
                .iter()
                .filter(|r| !r.passed())
                .map(|r| {
                    format!(
                        "{}: {}",
                        r.instance,
                        r.errors()
                            .map(|e| e.code.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                })
                .collect();
            cp.store.add_event(
                "Warning",
                "NodePool",
                &pool_name,
                "AttachRefused",
                &format!("preflight failed: {}", failed.join("; ")),
            )?;
        }
        return Ok(Json(json!({
            "pool": pool_name, "mode": "automatic", "dryRun": req.dry_run,
            "passed": passed, "preflight": reports, "attached": [],
        })));
    }
    let mut attached = Vec::new();
    let mut all_ok = true;
    for f in &facts {
        match attach_one(&cp, &record.pool, f, &req).await {
            Ok(v) => attached.push(v),
            Err(e) => {
                all_ok = false;
                attached
                    .push(json!({"providerId": f.id, "error": e.to_string(), "code": e.code()}));
            }
        }
    }
    cp.wake();
    Ok(Json(json!({
        "pool": pool_name, "mode": "automatic", "dryRun": false,
        "passed": all_ok, "preflight": reports, "attached": attached,
    })))
}

/// Records an added instance in its pool: the instance row, the pool's
/// desired count + 1, the marker label and (automatic mode) the attach
/// intent, in one transaction under the planner's lock so the reconciler
/// never sees the count without the instance.
async fn enroll(
    cp: &ControlPlane,
    pool: &str,
    name: &str,
    f: &InstanceFacts,
    state_word: &str,
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
        },
        intent,
    )?;
    cp.store.add_event(
        "Normal",
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
            "Warning",
            "Instance",
            name,
            "AttachFailed",
            &format!("{message} (pool {pool}: replicas {from} -> {to})"),
        )?,
        None => cp.store.add_event(
            "Warning",
            "Instance",
            name,
            "AttachFailed",
            &format!("{reason}; the instance had already left its pool"),
        )?,
    }
    cp.wake();
    Ok(())
}

/// How long the undo inside a leaving machine may take (services are
/// stopped one by one, each with its own timeout inside the agent).
const UNDO_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// Whether an added instance keeps its own OS (manual mode): leaving its
/// pool, it is put back as before the attach and left running instead of
/// being stopped. `Err` says why that cannot be told.
pub fn added_manually(cp: &ControlPlane, instance: &str) -> std::result::Result<bool, String> {
    match record(cp, instance) {
        Ok(r) => Ok(r.is_some_and(|r| r.mode == Mode::Manual)),
        Err(e) => Err(format!("its attach record is unreadable: {e}")),
    }
}

/// What runs inside a manual-mode machine leaving its pool: the agent's
/// undo (`knit-agent reset --undo`: knit's services stopped, its mounts,
/// kernel settings and files undone from the ledger), then what the attach
/// command left (the agent, the CA, the NodeConfig) and the agent's state
/// directory when nothing else is in it. Safe to run twice (a server that
/// died half way runs it again): with the agent and its ledger gone there
/// is nothing left to undo.
fn leave_script() -> String {
    let state = knit_agent_state_dir();
    format!(
        r#"set -u
agent={dir}/knit-agent
if [ -x "$agent" ]; then
    "$agent" reset --undo || exit $?
elif [ -e {state}/undo/ledger.json ]; then
    echo "the agent's undo ledger is there but $agent is gone: nothing can undo its changes" >&2
    exit 3
fi
rm -rf {dir}
rmdir {state} 2>/dev/null || true
exit 0
"#,
        dir = userdata::BOOTSTRAP_DIR,
    )
}

/// Undoes knit's changes inside a running manual-mode instance through the
/// provider's exec. `Err` is the reason it could not (no exec, a failed or
/// partial undo, a timeout), for the event of the fallback.
pub(crate) async fn undo_inside(
    provider: &dyn crate::provider::Provider,
    id: &str,
) -> std::result::Result<(), String> {
    let argv = vec!["/bin/sh".to_string(), "-c".to_string(), leave_script()];
    match tokio::time::timeout(UNDO_TIMEOUT, provider.exec(id, &argv)).await {
        Err(_) => Err(format!(
            "the undo did not finish within {} s",
            UNDO_TIMEOUT.as_secs()
        )),
        Ok(Err(e)) => Err(format!("cannot run the undo inside it: {e}")),
        Ok(Ok((0, _, _))) => Ok(()),
        Ok(Ok((code, stdout, stderr))) => {
            let text = String::from_utf8_lossy(if stderr.is_empty() { &stdout } else { &stderr });
            let text = text.trim();
            // The end says what was not undone; keep events short.
            let tail: String = {
                let chars: Vec<char> = text.chars().collect();
                chars[chars.len().saturating_sub(800)..].iter().collect()
            };
            Err(format!(
                "the undo inside it (knit-agent reset --undo) exited with {code}: {tail}"
            ))
        }
    }
}

/// Claims an instance for this task: the dispatcher leaves its intents
/// alone meanwhile. Dropped (even by a cancelled request) → released, and a
/// pending attach intent left behind is resumed by the reconciler.
struct Claim<'a> {
    cp: &'a ControlPlane,
    name: String,
}

impl<'a> Claim<'a> {
    fn take(cp: &'a ControlPlane, name: &str) -> Claim<'a> {
        cp.in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_string());
        Claim {
            cp,
            name: name.to_string(),
        }
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        self.cp
            .in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.name);
        self.cp.wake();
    }
}

/// The destructive part of an automatic attach: a fresh join token and the
/// pool's composed user data, stop (when running), re-image (new system
/// disk, data disks kept under new ids, the new user data), which boots it.
/// Safe to run again: a resumed attach re-images once more.
async fn reimage_for_pool(
    cp: &ControlPlane,
    pool: &NodePool,
    name: &str,
    provider_id: &str,
    live: bool,
) -> Result<InstanceFacts> {
    let provider = cp.provider()?.clone();
    let pool_name = &pool.metadata.name;
    let agent_sha256 = cp.mirror_sha256("bin/knit-agent")?.ok_or_else(|| {
        ServerError::Package(format!(
            "the package mirror ({}) has no bin/knit-agent: run `knit package build`",
            cp.mirror_dir.display()
        ))
    })?;
    let token = cp.issue_join_token(name, pool_name)?;
    let stub = userdata::agent_stub(&userdata::StubParams {
        mirror_url: &format!("{}/mirror", cp.advertise_url),
        agent_sha256: &agent_sha256,
        bootstrap_url: &format!("{}/bootstrap/v1/config", cp.advertise_url),
        join_token: &token,
        ca_pem: &cp.ca_pem,
    });
    let user_data = userdata::compose(&pool.spec.pre_user_data, &stub, &pool.spec.user_data)?;
    // Before anything is stopped: the pool's image must be usable, and an
    // instance that does not keep its name takes its node name (the pool's
    // rule), so the new system boots with it as its hostname.
    provider.check_image(&pool.spec.image).await?;
    if let Some(node_name) = rename_target(cp, pool, name)? {
        provider.rename(provider_id, &node_name).await?;
    }
    let running = provider
        .get(provider_id)
        .await?
        .is_some_and(|i| i.state.eq_ignore_ascii_case("running"));
    if running {
        provider.stop(provider_id).await?;
    }
    if live {
        crate::pause::pause_at("attach-after-stop").await;
    }
    provider
        .reimage(provider_id, &pool.spec.image, &user_data)
        .await?;
    provider.facts(provider_id).await
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

/// Bookkeeping after the re-image: new disk ids, instance `Running`, the
/// intent done, event `Attached`.
fn finish_attach(
    cp: &ControlPlane,
    rec: &mut AttachRecord,
    after: &InstanceFacts,
    intent: Option<i64>,
    how: &str,
) -> Result<()> {
    rec.new_disks = after.data_disks.iter().map(|d| d.id.clone()).collect();
    rec.reimaged_ms.get_or_insert_with(now_ms);
    save_record(cp, rec)?;
    cp.store
        .set_attached_running(&rec.instance, after.ip.as_deref())?;
    if let Some(id) = intent {
        cp.store.finish_intent(id, "done", None)?;
    }
    let disks = rec
        .old_disks
        .iter()
        .zip(&rec.new_disks)
        .map(|(a, b)| format!("{a} -> {b}"))
        .collect::<Vec<_>>();
    cp.store.add_event(
        "Normal",
        "Instance",
        &rec.instance,
        "Attached",
        &format!(
            "{} re-imaged with pool {}'s image and user data{how}; data disks kept: {}",
            rec.provider_id,
            rec.pool,
            if disks.is_empty() {
                "none".to_string()
            } else {
                disks.join(", ")
            }
        ),
    )?;
    Ok(())
}

async fn attach_one(
    cp: &ControlPlane,
    pool: &NodePool,
    f: &InstanceFacts,
    req: &AttachRequest,
) -> Result<Value> {
    let pool_name = &pool.metadata.name;
    // Refused here, before anything changes, rather than half way.
    if cp.mirror_sha256("bin/knit-agent")?.is_none() {
        return Err(ServerError::Package(format!(
            "the package mirror ({}) has no bin/knit-agent: run `knit package build`",
            cp.mirror_dir.display()
        )));
    }
    userdata::compose(&pool.spec.pre_user_data, "", &pool.spec.user_data)?;
    let name = format!("{pool_name}-{}", pki::random_lower_alnum(5)?);
    // Held until this attach ends: the reconciler resumes the intent only
    // when nobody works on it (after a restart or a dropped request).
    let _claim = Claim::take(cp, &name);
    let mut rec = AttachRecord {
        instance: name.clone(),
        provider_id: f.id.clone(),
        pool: pool_name.clone(),
        mode: Mode::Automatic,
        instance_name: f.name.clone(),
        keep_instance_name: req.keep_instance_name,
        format_data_disk: req.format_data_disk,
        old_disks: f.data_disks.iter().map(|d| d.id.clone()).collect(),
        new_disks: Vec::new(),
        at_ms: now_ms(),
        reimaged_ms: None,
        new_password: req.password.is_some(),
    };
    // Before the intent: a resumed attach always finds its record.
    save_record(cp, &rec)?;
    // The intent is written with the instance row and the count, before the
    // first destructive step.
    let intent = enroll(cp, pool_name, &name, f, state::CREATING, true).await?;
    let outcome = async {
        let after = reimage_for_pool(cp, pool, &name, &f.id, true).await?;
        // The new system disk has the image's root password; the new one is
        // set inside now. It is never stored (see `resume`).
        if let Some(password) = &req.password {
            cp.provider()?.set_password(&f.id, password).await?;
        }
        Ok::<_, ServerError>(after)
    }
    .await;
    match outcome {
        Ok(after) => {
            finish_attach(cp, &mut rec, &after, intent, "")?;
            Ok(json!({
                "providerId": f.id, "instance": name, "ip": after.ip,
                // Kept, or renamed to the pool rule's node name.
                "nodeName": after.name.to_lowercase(),
                "oldDisks": rec.old_disks, "newDisks": rec.new_disks,
            }))
        }
        Err(e) => {
            undo(cp, &name, &format!("attach of {} failed: {e}", f.id)).await?;
            Err(e)
        }
    }
}

/// Resumes an automatic attach whose server stopped half way (its intent
/// is still pending): roll forward — re-image again unless the re-image
/// had finished, then it is an ordinary node (join timeout, readiness) —
/// or, when that cannot be done, undo the add with the reason. The desired
/// count was raised once, by the enrollment, and is not touched again
/// unless undone.
pub async fn resume(cp: &ControlPlane, intent: &IntentRecord) -> Result<()> {
    let Some(instance) = cp.store.instance(&intent.instance)? else {
        return cp
            .store
            .finish_intent(intent.id, "cancelled", Some("instance record gone"));
    };
    if instance.state != state::CREATING {
        // Removed (or finished) meanwhile: nothing to roll forward.
        return cp.store.finish_intent(
            intent.id,
            "cancelled",
            Some(&format!("instance is {}", instance.state)),
        );
    }
    let Some(mut rec) = record(cp, &instance.name)? else {
        return undo(
            cp,
            &instance.name,
            "the attach was interrupted and its record is missing, so it cannot resume",
        )
        .await;
    };
    let Some(pool) = cp.store.pool(&intent.pool)?.filter(|p| !p.deleting) else {
        return undo(
            cp,
            &instance.name,
            "the attach was interrupted and its pool is gone or being deleted",
        )
        .await;
    };
    let provider = cp.provider()?.clone();
    if rec.reimaged_ms.is_some() {
        // Re-imaged before the server stopped: only the bookkeeping is left.
        let after = provider.facts(&rec.provider_id).await?;
        return finish_attach(
            cp,
            &mut rec,
            &after,
            Some(intent.id),
            " (resumed after a server restart)",
        );
    }
    if rec.new_password {
        return undo(
            cp,
            &instance.name,
            "the attach was interrupted before its re-image and the new password is never stored, so it cannot resume; nothing more was changed (the instance may be stopped)",
        )
        .await;
    }
    if provider.get(&rec.provider_id).await?.is_none() {
        return undo(
            cp,
            &instance.name,
            &format!(
                "the attach was interrupted and instance {} no longer exists at provider {}",
                rec.provider_id,
                provider.name()
            ),
        )
        .await;
    }
    cp.store.add_event(
        "Normal",
        "Instance",
        &instance.name,
        "AttachResuming",
        &format!(
            "the server stopped during the attach of {}; resuming it (re-image with the pool's image and user data)",
            rec.provider_id
        ),
    )?;
    match reimage_for_pool(cp, &pool.pool, &instance.name, &rec.provider_id, false).await {
        Ok(after) => finish_attach(
            cp,
            &mut rec,
            &after,
            Some(intent.id),
            " (resumed after a server restart)",
        ),
        Err(e) => {
            let attempts = intent.attempts + 1;
            if attempts >= cp.settings.max_create_attempts {
                undo(
                    cp,
                    &instance.name,
                    &format!(
                        "resuming the attach of {} failed {attempts} time(s): {e}",
                        rec.provider_id
                    ),
                )
                .await?;
            } else {
                let delay = (1000i64 << attempts.clamp(0, 6)).min(60_000);
                cp.store
                    .retry_intent(intent.id, attempts, now_ms() + delay, &e.to_string())?;
                cp.store.add_event(
                    "Warning",
                    "Instance",
                    &instance.name,
                    "AttachRetry",
                    &format!(
                        "resume attempt {attempts} failed, retrying in {} s: {e}",
                        delay / 1000
                    ),
                )?;
            }
            Err(e)
        }
    }
}

/// Marks instances with an attach record as added (stores from before the
/// `added` column).
pub fn mark_added_from_records(cp: &ControlPlane) -> Result<()> {
    let dir = attach_dir(cp);
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(ServerError::io(format!("read {}", dir.display()), e)),
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|x| x == "json") {
            if let Some(r) = read_json::<AttachRecord>(&path)? {
                cp.store.mark_added(&r.instance)?;
            }
        }
    }
    Ok(())
}

// ---- manual mode

/// What the command's options are, kept beside its token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ScriptOptions {
    pool: String,
    keep_instance_name: bool,
    format_data_disk: bool,
    expires_ms: i64,
}

/// `POST /api/v1/pools/{pool}/attach-script`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScriptRequest {
    #[serde(default)]
    pub format_data_disk: bool,
    #[serde(default)]
    pub keep_instance_name: bool,
    #[serde(default)]
    pub expires_seconds: Option<i64>,
}

/// `sha256:<hex>` of the CA certificate (DER): what the command checks the
/// CA it carries against before trusting it.
pub fn ca_pin(ca_pem: &str) -> Result<String> {
    let der = rustls_pemfile::certs(&mut ca_pem.as_bytes())
        .next()
        .ok_or_else(|| ServerError::Pki("the control-plane CA holds no certificate".into()))?
        .map_err(|e| ServerError::Pki(format!("the control-plane CA: {e}")))?;
    Ok(format!(
        "sha256:{}",
        hex::encode(Sha256::digest(der.as_ref()))
    ))
}

pub async fn script(
    State(cp): State<Cp>,
    Path(pool_name): Path<String>,
    body: Bytes,
) -> Result<Json<Value>> {
    let req: ScriptRequest = if body.is_empty() {
        ScriptRequest::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| ApiError::Parse {
            what: "attach-script request".into(),
            message: e.to_string(),
        })?
    };
    let expires = req.expires_seconds.unwrap_or(DEFAULT_EXPIRES_SECONDS);
    if !(1..=MAX_EXPIRES_SECONDS).contains(&expires) {
        return Err(field_error(
            "expiresSeconds",
            expires.to_string(),
            "must be in [1, 604800] (one week)",
        ));
    }
    cp.store.live_pool(&pool_name)?;
    let agent_sha256 = cp.mirror_sha256("bin/knit-agent")?.ok_or_else(|| {
        ServerError::Package(
            "the package mirror has no bin/knit-agent: run `knit package build`".into(),
        )
    })?;
    let token_id = pki::random_lower_alnum(6)?;
    let token = format!("{ATTACH_TOKEN_PREFIX}{token_id}{}", pki::random_hex(16)?);
    let expires_ms = now_ms() + expires * 1000;
    write_json(
        &attach_dir(&cp)
            .join("tokens")
            .join(format!("{token_id}.json")),
        &ScriptOptions {
            pool: pool_name.clone(),
            keep_instance_name: req.keep_instance_name,
            format_data_disk: req.format_data_disk,
            expires_ms,
        },
    )?;
    cp.store.add_join_token(
        &pki::token_hash(&token),
        &token_id,
        ATTACH_SENTINEL,
        &pool_name,
        expires * 1000,
    )?;
    let pin = ca_pin(&cp.ca_pem)?;
    let text = manual_script(&ManualScript {
        base_url: &cp.advertise_url,
        agent_sha256: &agent_sha256,
        token: &token,
        ca_pem: &cp.ca_pem,
        ca_pin: &pin,
    });
    let b64 = base64::engine::general_purpose::STANDARD.encode(text.as_bytes());
    let command = format!("echo {b64} | base64 -d | bash");
    cp.store.add_event(
        "Normal",
        "NodePool",
        &pool_name,
        "AttachScriptIssued",
        &format!("attach command with token {token_id} (single use, expires in {expires} s)"),
    )?;
    Ok(Json(json!({
        "pool": pool_name, "tokenId": token_id, "expiresMs": expires_ms,
        "caPin": pin, "command": command, "script": text,
    })))
}

struct ManualScript<'a> {
    base_url: &'a str,
    agent_sha256: &'a str,
    token: &'a str,
    ca_pem: &'a str,
    ca_pin: &'a str,
}

/// The script the pasted command runs on the machine.
fn manual_script(p: &ManualScript<'_>) -> String {
    let ca = p.ca_pem.trim_end();
    let pin = p.ca_pin.trim_start_matches("sha256:");
    format!(
        r#"#!/bin/bash
# knit: add this machine to a node pool (manual mode). Its OS and its own
# user data stay as they are.
set -euo pipefail
dir={dir}
# Until the token is spent everything lives in a scratch directory; what
# this command adds to the machine goes again if it fails. A machine that
# already is a node (a second run) keeps its files.
state_existed=0
[ -e {state} ] && state_existed=1
dir_existed=0
[ -e "$dir" ] && dir_existed=1
work=$(mktemp -d)
chmod 700 "$work"
ok=0
cleanup() {{
    rm -rf "$work"
    [ "$ok" = 1 ] && return
    cd /
    [ "$dir_existed" = 1 ] || rm -rf "$dir"
    [ "$state_existed" = 1 ] || rm -rf {state}
}}
trap cleanup EXIT
cat > "$work/control-plane-ca.pem" <<'KNIT_CA_EOF'
{ca}
KNIT_CA_EOF
# The CA pin: the certificate carried above must be the control plane's.
got=$(sed '/-----/d' "$work/control-plane-ca.pem" | base64 -d | sha256sum | cut -d' ' -f1)
if [ "$got" != '{pin}' ]; then
    echo "knit: the control-plane CA in this command does not match its pin sha256:{pin} (damaged paste?)" >&2
    exit 1
fi
# Machine-side preflight.
fail=0
if [ -n "$(tail -n +2 /proc/swaps 2>/dev/null)" ]; then
    echo "knit preflight [PreflightSwapOn]: swap is on; the kubelet refuses to run with swap. Fix: swapoff -a and remove swap from /etc/fstab" >&2
    fail=1
fi
os_id=; os_version=; os_name=
if [ -r /etc/os-release ]; then
    os_id=$(. /etc/os-release; echo "${{ID:-}}")
    os_version=$(. /etc/os-release; echo "${{VERSION_ID:-}}")
    os_name=$(. /etc/os-release; echo "${{PRETTY_NAME:-}}")
fi
case "$os_id" in
    lifsea|*containeros*|*windows*)
        echo "knit preflight [PreflightOsNotAllowed]: $os_name cannot be added manually. Fix: use automatic mode (knit attach)" >&2
        fail=1;;
esac
[ "$fail" = 0 ] || exit 1
ca="$work/control-plane-ca.pem"
fetch() {{ curl -fsS --retry 10 --retry-delay 1 --retry-all-errors --connect-timeout 5 --cacert "$ca" "$@"; }}
fetch -o "$work/knit-agent.part" '{base}/mirror/bin/knit-agent'
if ! echo '{sha}  '"$work/knit-agent.part" | sha256sum -c --status -; then
    echo "knit: knit-agent from {base}/mirror/bin/knit-agent does not match sha256 {sha}" >&2
    exit 1
fi
chmod 755 "$work/knit-agent.part"
mv "$work/knit-agent.part" "$work/knit-agent"
umask 077
swap=false
esc() {{ printf '%s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g'; }}
facts="{{\"osId\":\"$(esc "$os_id")\",\"osVersion\":\"$(esc "$os_version")\",\"osName\":\"$(esc "$os_name")\",\"swap\":$swap}}"
# Bearer tokens reach curl in a mode-0600 file (umask 077 above), never on
# its command line, which every local user can read in /proc/*/cmdline;
# printf is a shell builtin, so no process carries the token either.
auth="$work/auth.header"
bearer() {{ printf 'Authorization: Bearer %s\n' "$1" > "$auth"; }}
bearer '{token}'
# Server-side preflight; the answer is a one-time join token for this machine.
code=$(curl -sS --connect-timeout 5 --cacert "$work/control-plane-ca.pem" -o "$work/attach-answer" -w '%{{http_code}}' \
    -X POST -H @"$auth" -H 'Content-Type: application/json' --data "$facts" '{base}/attach/v1/manual') || {{
    echo "knit: cannot reach the control plane at {base}: check connectivity and the security-group rules (egress TCP to that address)" >&2
    exit 1
}}
if [ "$code" != 200 ]; then
    echo "knit: the control plane refused (HTTP $code):" >&2
    cat "$work/attach-answer" >&2
    echo >&2
    exit 1
fi
join_token=$(cat "$work/attach-answer")
rm -f "$work/attach-answer"
mkdir -p "$dir"
chmod 700 "$dir"
mv -f "$work/control-plane-ca.pem" "$work/knit-agent" "$dir/"
ca="$dir/control-plane-ca.pem"
# From here the token is spent and the machine is in the pool: a failure
# undoes the agent's work, tells the control plane, and says how to retry.
rollback() {{
    why="$1"
    echo "knit: $why" >&2
    if [ -s {error_msg} ]; then
        why="$why: $(head -c 1500 {error_msg})"
    fi
    undone="this machine is back as it was before the command"
    if [ -x "$dir/knit-agent" ]; then
        echo "knit: undoing what the agent did here (services, mounts, files it wrote); the machine's own files are kept" >&2
        # On a partial undo the agent and its ledger stay, to run it again.
        "$dir/knit-agent" reset --undo >&2 \
            || {{ undone="some of the agent's changes could not be undone (listed above; run $dir/knit-agent reset --undo again)"; ok=1; }}
    fi
    report_token=$(sed -n 's/^  reportToken: *//p' "$dir/node-config.yaml" 2>/dev/null | tr -d "'\"" | head -n 1) \
        || report_token=
    diag=
    if [ -n "$report_token" ]; then
        bearer "$report_token"
        diag=$(curl -sS --connect-timeout 5 --max-time 30 --cacert "$dir/control-plane-ca.pem" -X POST \
            -H @"$auth" -H 'Content-Type: text/plain' --data-binary "$why" \
            '{base}/attach/v1/failed' 2>/dev/null) || diag=
    fi
    if [ -n "$diag" ]; then
        echo "knit: $diag" >&2
    else
        echo "knit: the control plane ({base}) could not be told. Check connectivity between this machine and the control plane and the API server, and its security-group rules (egress TCP 7443 and 6443 to that address)" >&2
    fi
    echo "knit: $undone. The command's token is spent: to retry, fix the cause, make a new command (knit attach-script --pool POOL) and run it here" >&2
    exit 1
}}
bearer "$join_token"
fetch -X POST -H @"$auth" -o "$dir/node-config.yaml" '{base}/bootstrap/v1/config' \
    || rollback "cannot fetch this machine's NodeConfig from {base}"
if "$dir/knit-agent" init --config "$dir/node-config.yaml"; then
    ok=1
    exit 0
fi
rollback "the agent could not join this machine to the cluster"
"#,
        dir = userdata::BOOTSTRAP_DIR,
        state = knit_agent_state_dir(),
        error_msg = "/var/log/knit-deploy-error-msg.log",
        base = p.base_url,
        sha = p.agent_sha256,
        token = p.token,
    )
}

/// The agent's state directory on a machine (`/var/lib/knit`): the command
/// removes it on failure when it was not there before.
fn knit_agent_state_dir() -> &'static str {
    userdata::BOOTSTRAP_DIR
        .strip_suffix("/bootstrap")
        .unwrap_or(userdata::BOOTSTRAP_DIR)
}

/// `POST /attach/v1/failed` (report token): the attach command says its
/// join failed and it rolled the machine back. The add is undone (instance
/// `Detached` with the reason, the pool's count back, its Node object
/// removed if it had registered); the answer is the diagnosis to print.
pub async fn manual_failed(
    State(cp): State<Cp>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .ok_or_else(|| ServerError::Unauthorized("no bearer token".into()))?;
    let instance = cp
        .store
        .instance_by_report_token(&pki::token_hash(token))?
        .ok_or_else(|| ServerError::Unauthorized("unknown report token".into()))?;
    if !record(&cp, &instance.name)?.is_some_and(|r| r.mode == Mode::Manual) {
        return Err(ServerError::Conflict(format!(
            "{} was not added by an attach command (manual mode): nothing to roll back",
            instance.name
        )));
    }
    let text = String::from_utf8_lossy(&body);
    let reason: String = text.trim().chars().take(2000).collect();
    let reason = if reason.is_empty() {
        "no reason given".to_string()
    } else {
        reason
    };
    // Its kubelet was stopped by the rollback: a Node it registered goes.
    for node in cp
        .store
        .nodes()?
        .into_iter()
        .filter(|n| n.instance == instance.name)
    {
        if let Err(e) = cp.cluster.remove_node(&node.name).await {
            tracing::warn!(node = %node.name, error = %e, "removing the Node of a rolled-back attach failed");
        }
    }
    let message = diagnose(
        &cp,
        &instance.name,
        format!("the attach command failed on the machine: {reason}"),
    );
    undo(
        &cp,
        &instance.name,
        &format!("{message}; the command rolled the machine back"),
    )
    .await?;
    Ok((
        [(header::CONTENT_TYPE, "text/plain")],
        format!("{message}\nThe control plane recorded the failure: {} left pool {} and the pool's count is back.\n", instance.name, instance.pool),
    )
        .into_response())
}

/// The machine's own view, sent by the command.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct MachineFacts {
    os_id: String,
    os_version: String,
    os_name: String,
    swap: bool,
}

fn refused(status: StatusCode, code: &str, message: String, extra: Value) -> Response {
    let mut body = json!({"code": code, "message": message, "errors": []});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            b.insert(k.clone(), v.clone());
        }
    }
    (status, Json(body)).into_response()
}

/// `POST /attach/v1/manual`: the pasted command redeems its attach token.
pub async fn manual(
    State(cp): State<Cp>,
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response> {
    let peer_ip = peer.map(|Extension(Peer(p))| p.ip().to_string());
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .unwrap_or_default();
    let refuse = |why: String| -> Result<Response> {
        cp.metrics.bootstrap_refused();
        cp.store.add_event(
            "Warning",
            "NodePool",
            "-",
            "AttachRefused",
            &format!("{why} (from {})", peer_ip.as_deref().unwrap_or("unknown")),
        )?;
        Err(ServerError::TokenRefused(why))
    };
    let Some(rest) = token.strip_prefix(ATTACH_TOKEN_PREFIX) else {
        return refuse("not an attach token".into());
    };
    let token_id: String = rest.chars().take(6).collect();
    let now = now_ms();
    let hash = pki::token_hash(token);
    // Looked at, not spent: a machine refused by the preflight below keeps
    // the command usable once the problem is fixed.
    let pool_name = match cp.store.live_join_token(&hash, now)? {
        Some((instance, pool)) if instance == ATTACH_SENTINEL => pool,
        Some(_) => return refuse("unknown attach token".into()),
        // Not live: redeem only explains why (it changes nothing then).
        None => match cp.store.redeem_join_token(&hash, now)? {
            Redeem::Used { used_ms, .. } => {
                return refuse(format!(
                    "attach token {token_id} already used {} s ago: one command adds one instance; make a new one with knit attach-script",
                    (now - used_ms) / 1000
                ))
            }
            Redeem::Expired { expires_ms, .. } => {
                return refuse(format!(
                    "attach token {token_id} expired {} s ago",
                    (now - expires_ms) / 1000
                ))
            }
            Redeem::Ok { .. } | Redeem::Unknown => {
                return refuse("unknown attach token".into())
            }
        },
    };
    let options: ScriptOptions = read_json(
        &attach_dir(&cp)
            .join("tokens")
            .join(format!("{token_id}.json")),
    )?
    .ok_or_else(|| {
        ServerError::Internal(format!(
            "the options of attach token {token_id} are missing"
        ))
    })?;
    let machine: MachineFacts = serde_json::from_slice(&body).map_err(|e| ApiError::Parse {
        what: "machine facts".into(),
        message: e.to_string(),
    })?;
    let record = cp
        .store
        .pool(&pool_name)?
        .ok_or_else(|| ServerError::Conflict(format!("pool {pool_name} was removed")))?;
    let provider = cp.provider()?.clone();
    // The caller is identified by its address: the instance whose private
    // IP the request came from.
    let Some(ip) = peer_ip.clone() else {
        return refuse("the caller's address is unknown".into());
    };
    let Some(found) = provider
        .list()
        .await?
        .into_iter()
        .find(|i| i.ip.as_deref() == Some(ip.as_str()))
    else {
        return Ok(refused(
            StatusCode::UNPROCESSABLE_ENTITY,
            "PreflightUnknownInstance",
            format!(
                "no instance of provider {} has the address {ip}",
                provider.name()
            ),
            json!({}),
        ));
    };
    let mut facts = provider.facts(&found.id).await?;
    // The machine's own view wins for what the machine itself decides.
    facts.swap = facts.swap || machine.swap;
    if !machine.os_id.is_empty() {
        facts.os_id = machine.os_id;
        facts.os_version = machine.os_version;
        facts.os_name = machine.os_name;
    }
    let cluster = cp.cluster_doc()?;
    let ctx = context(&cp, Mode::Manual, 1, false, &facts.id)?;
    let report = preflight::check(&cluster, &record.pool, &facts, &ctx);
    if !report.passed() {
        let text = preflight::render_table(std::slice::from_ref(&report));
        cp.store.add_event(
            "Warning",
            "NodePool",
            &pool_name,
            "AttachRefused",
            &format!("preflight failed for {}", facts.id),
        )?;
        return Ok(refused(
            StatusCode::UNPROCESSABLE_ENTITY,
            "PreflightFailed",
            format!("preflight failed for {}:\n{text}", facts.id),
            json!({"preflight": [report]}),
        ));
    }
    // Spent now: of two machines racing with one command, one wins.
    if !matches!(
        cp.store.redeem_join_token(&hash, now_ms())?,
        Redeem::Ok { .. }
    ) {
        return refuse(format!("attach token {token_id} was used meanwhile"));
    }
    let name = format!("{pool_name}-{}", pki::random_lower_alnum(5)?);
    save_record(
        &cp,
        &AttachRecord {
            instance: name.clone(),
            provider_id: facts.id.clone(),
            pool: pool_name.clone(),
            mode: Mode::Manual,
            instance_name: facts.name.clone(),
            keep_instance_name: options.keep_instance_name,
            format_data_disk: options.format_data_disk,
            old_disks: facts.data_disks.iter().map(|d| d.id.clone()).collect(),
            new_disks: facts.data_disks.iter().map(|d| d.id.clone()).collect(),
            at_ms: now,
            reimaged_ms: None,
            new_password: false,
        },
    )?;
    enroll(&cp, &pool_name, &name, &facts, state::RUNNING, false).await?;
    // Not keeping its name: the instance takes its node name at once
    // (hostname included). A provider that cannot rename leaves the
    // instance's name as it was; the node still takes the pool's rule.
    if let Some(node_name) = rename_target(&cp, &record.pool, &name)? {
        if let Err(e) = provider.rename(&facts.id, &node_name).await {
            cp.store.add_event(
                "Warning",
                "Instance",
                &name,
                "RenameFailed",
                &format!(
                    "{} keeps its name {:?}: renaming it to its node name {node_name} failed: {e}",
                    facts.id, facts.name
                ),
            )?;
        }
    }
    let join_token = cp.issue_join_token(&name, &pool_name)?;
    cp.store.add_event(
        "Normal",
        "Instance",
        &name,
        "Attached",
        &format!(
            "{} ({ip}) added by its attach command (manual mode, OS kept)",
            facts.id
        ),
    )?;
    cp.wake();
    Ok(([(header::CONTENT_TYPE, "text/plain")], join_token).into_response())
}

#[cfg(test)]
mod tests {
    #[test]
    fn host_port_reads_the_api_server_url() {
        use super::host_port;
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

    use super::*;

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

    #[test]
    fn an_attach_request_never_shows_its_password() {
        let req: AttachRequest =
            serde_json::from_str(r#"{"instances": ["i-1"], "password": "N3w-pass!x7"}"#).unwrap();
        let shown = format!("{req:?}");
        assert!(!shown.contains("N3w-pass!x7"), "{shown}");
        assert!(shown.contains("(redacted)"), "{shown}");
    }

    /// Every command of the script that talks to the control plane reads
    /// its bearer token from a file: the token is only in the `bearer`
    /// builtin call (printf), never in a program's argv.
    #[test]
    fn the_manual_script_keeps_tokens_off_command_lines() {
        let token = "knitattach.abcdef0123456789";
        let s = manual_script(&ManualScript {
            base_url: "https://10.219.1.1:7443",
            agent_sha256: &"ab".repeat(32),
            token,
            ca_pem: "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
            ca_pin: "sha256:00",
        });
        // Commands as the shell sees them: continuation lines joined.
        let joined = s.replace("\\\n", " ");
        let lines: Vec<&str> = joined.lines().map(str::trim).collect();
        let with_token: Vec<&&str> = lines.iter().filter(|l| l.contains(token)).collect();
        assert_eq!(with_token, vec![&&*format!("bearer '{token}'")]);
        assert!(lines.iter().any(|l| l.starts_with("bearer() { printf ")));
        let talkers: Vec<&&str> = lines
            .iter()
            .filter(|l| {
                !l.starts_with('#')
                    && (l.contains("curl ") || l.starts_with("fetch "))
                    && !l.starts_with("fetch() {")
            })
            .collect();
        assert!(talkers.len() >= 4, "{talkers:#?}");
        for l in talkers {
            assert!(!l.contains("Bearer"), "a token on a command line: {l}");
        }
        assert_eq!(
            lines.iter().filter(|l| l.contains("-H @\"$auth\"")).count(),
            3,
            "the attach, bootstrap and failure calls read the header file"
        );
    }

    #[test]
    fn the_manual_script_is_valid_bash_and_carries_pin_token_and_checksum() {
        let s = manual_script(&ManualScript {
            base_url: "https://10.213.0.1:7443",
            agent_sha256: &"ab".repeat(32),
            token: "knitattach.abcdef0123",
            ca_pem: "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
            ca_pin: "sha256:00",
        });
        for needle in [
            "knitattach.abcdef0123",
            &"ab".repeat(32),
            "'00'",
            "/attach/v1/manual",
            "sha256sum -c",
            "/attach/v1/failed",
            "reset --undo",
            "trap cleanup EXIT",
        ] {
            assert!(s.contains(needle), "{needle} missing");
        }
        let out = std::process::Command::new("bash")
            .args(["-n", "-c", &s])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
