//! Adding existing instances to a pool: pick a pool and instances (the
//! provider's instances in no pool), run the dry-run preflight and see
//! every check with its code, message and fix, start an automatic attach
//! and follow its instances to Ready, or get the manual command to copy.
//!
//! Each action is the REST API's own call: `crate::attach::automatic::attach`
//! (`POST /api/v1/pools/{pool}/attach`, with `dryRun` for the preflight) and
//! `crate::attach::manual::issue_script` (`POST …/attach-script`), so the
//! checks, refusals and messages are the API's.

use super::html::{self, esc, page, see_other, Section};
use super::session::Session;
use super::Cs;
use crate::attach::{automatic, manual};
use crate::error::ServerError;
use crate::provider::ProviderInstance;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::{Extension, Form};
use knit_api::state::InstanceState;
use knit_api::views::{
    preflight_table, AttachOutcome, AttachRequest, AttachResponse, AttachScriptRequest,
    AttachScriptResponse, PreflightReport, PreflightStatus,
};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};

/// Instances offered on the page at most (the rest: `knit attach`).
const MAX_CANDIDATES: usize = 200;
/// Added instances shown in the progress table, newest first.
const MAX_ADDED_SHOWN: usize = 50;
/// The longest notice carried in the page's address after an attach.
const MAX_NOTICE_CHARS: usize = 1500;

#[derive(Deserialize, Default)]
pub struct PageQuery {
    #[serde(default)]
    pool: Option<String>,
    #[serde(default)]
    done: Option<String>,
}

/// What one render of the page shows besides its forms.
#[derive(Default)]
struct Shown {
    /// The pool the forms have selected.
    pool: Option<String>,
    /// Instances ticked in the form.
    ticked: BTreeSet<String>,
    format_data_disk: bool,
    keep_instance_name: bool,
    /// A notice (`role=status`) at the top.
    done: Option<String>,
    /// A refused or failed action: where it is shown (`automatic` or
    /// `manual`) and the API's error.
    error: Option<(&'static str, ServerError)>,
    /// The preflight of a dry run or a refused attach.
    answer: Option<AttachResponse>,
    /// The manual command just issued.
    script: Option<AttachScriptResponse>,
    /// The token lifetime typed in the manual form.
    expires: Option<String>,
}

pub async fn show(
    State(console): State<Cs>,
    Extension(session): Extension<Session>,
    Query(q): Query<PageQuery>,
) -> Response {
    let shown = Shown {
        pool: q.pool.filter(|p| !p.is_empty()),
        done: q.done,
        ..Shown::default()
    };
    render(&console, &session, StatusCode::OK, shown).await
}

/// The form's fields; `instance` repeats, one per ticked box.
struct AttachForm {
    pool: String,
    instances: Vec<String>,
    format_data_disk: bool,
    keep_instance_name: bool,
    password: Option<String>,
    dry_run: bool,
    expires: String,
}

impl AttachForm {
    fn read(pairs: Vec<(String, String)>) -> AttachForm {
        let mut f = AttachForm {
            pool: String::new(),
            instances: Vec::new(),
            format_data_disk: false,
            keep_instance_name: false,
            password: None,
            dry_run: true,
            expires: String::new(),
        };
        for (k, v) in pairs {
            match k.as_str() {
                "pool" => f.pool = v,
                "instance" => f.instances.push(v),
                "format_data_disk" => f.format_data_disk = true,
                "keep_instance_name" => f.keep_instance_name = true,
                "password" if !v.is_empty() => f.password = Some(v),
                "action" => f.dry_run = v != "attach",
                "expires_seconds" => f.expires = v,
                _ => {}
            }
        }
        f
    }

    fn shown(&self) -> Shown {
        Shown {
            pool: Some(self.pool.clone()),
            ticked: self.instances.iter().cloned().collect(),
            format_data_disk: self.format_data_disk,
            keep_instance_name: self.keep_instance_name,
            ..Shown::default()
        }
    }
}

/// `POST /ui/attach`: the dry-run preflight (`action=preflight`) or an
/// automatic attach (`action=attach`), through the API's own call.
pub async fn attach(
    State(console): State<Cs>,
    Extension(session): Extension<Session>,
    Form(pairs): Form<Vec<(String, String)>>,
) -> Response {
    let form = AttachForm::read(pairs);
    let mut shown = form.shown();
    let request = AttachRequest {
        instances: form.instances.clone(),
        format_data_disk: form.format_data_disk,
        keep_instance_name: form.keep_instance_name,
        password: form.password.clone(),
        dry_run: form.dry_run,
    };
    if form.dry_run {
        return match automatic::attach(&console.cp, &form.pool, &request).await {
            Ok(answer) => {
                shown.answer = Some(answer);
                render(&console, &session, StatusCode::OK, shown).await
            }
            Err(e) => {
                let status = status_of(&e);
                shown.error = Some(("automatic", e));
                render(&console, &session, status, shown).await
            }
        };
    }
    // The attach itself stops and re-images each instance, which takes a
    // while: it runs as its own task and the page answers at once, then
    // follows it live (on the local cloud a re-image changes the host's
    // network links, and a browser aborts a page still loading then). It
    // goes on if the page is left, as after a dropped API request. The
    // dry run first: a refusal is shown here, from the API's own call
    // (which records it), and nothing is started.
    let check = AttachRequest {
        dry_run: true,
        ..request.clone()
    };
    match automatic::attach(&console.cp, &form.pool, &check).await {
        Err(e) => {
            let status = status_of(&e);
            shown.error = Some(("automatic", e));
            return render(&console, &session, status, shown).await;
        }
        Ok(answer) if !answer.passed => {
            return match automatic::attach(&console.cp, &form.pool, &request).await {
                Ok(answer) if !answer.attached.is_empty() => {
                    // It passed this time (something changed meanwhile).
                    notice_page(&form.pool, &outcome_notice(&answer))
                }
                Ok(answer) => {
                    shown.answer = Some(answer);
                    render(&console, &session, StatusCode::OK, shown).await
                }
                Err(e) => {
                    let status = status_of(&e);
                    shown.error = Some(("automatic", e));
                    render(&console, &session, status, shown).await
                }
            };
        }
        Ok(_) => {}
    }
    let cp = console.cp.clone();
    let pool = form.pool.clone();
    tokio::spawn(async move {
        // Each instance's outcome is in the store (its row, its node) and
        // its events (Attached, AttachFailed), which the page shows.
        if let Err(e) = automatic::attach(&cp, &pool, &request).await {
            tracing::warn!(pool = %pool, error = %e, "console: automatic attach failed");
            let _ = cp.store.add_event(
                knit_api::state::EventType::Warning,
                "NodePool",
                &pool,
                "AttachFailed",
                &format!(
                    "automatic attach from the console failed: {e} ({})",
                    e.code()
                ),
            );
        }
    });
    notice_page(
        &form.pool,
        &format!(
            "Automatic attach of {} to pool {} started: each instance is stopped, re-imaged with the pool's image and user data, and joins as a node. Follow it below.",
            form.instances.join(", "),
            form.pool
        ),
    )
}

/// A 303 back to the page for `pool`, with `notice` shown on it.
fn notice_page(pool: &str, notice: &str) -> Response {
    see_other(&format!(
        "/ui/attach?pool={}&done={}",
        html::query_value(pool),
        html::query_value(&clip(notice, MAX_NOTICE_CHARS))
    ))
}

/// `POST /ui/attach/manual`: a one-time attach command for the pool,
/// through the API's own call.
pub async fn manual(
    State(console): State<Cs>,
    Extension(session): Extension<Session>,
    Form(pairs): Form<Vec<(String, String)>>,
) -> Response {
    let form = AttachForm::read(pairs);
    let mut shown = form.shown();
    shown.ticked.clear();
    shown.expires = Some(form.expires.clone());
    let issued = match form.expires.trim().parse::<i64>() {
        // The API takes the lifetime as a JSON integer; a form sends text.
        Err(_) => Err(ServerError::from(knit_api::ApiError::Invalid(vec![
            knit_api::FieldError {
                field: "expiresSeconds".into(),
                value: format!("{:?}", form.expires),
                rule: "must be a whole number of seconds".into(),
            },
        ]))),
        Ok(seconds) => manual::issue_script(
            &console.cp,
            &form.pool,
            &AttachScriptRequest {
                format_data_disk: form.format_data_disk,
                keep_instance_name: form.keep_instance_name,
                expires_seconds: Some(seconds),
            },
        ),
    };
    match issued {
        Ok(script) => {
            shown.script = Some(script);
            render(&console, &session, StatusCode::OK, shown).await
        }
        Err(e) => {
            let status = status_of(&e);
            shown.error = Some(("manual", e));
            render(&console, &session, status, shown).await
        }
    }
}

fn status_of(e: &ServerError) -> StatusCode {
    StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// At most `max` characters of `text`, marked when cut.
fn clip(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut out: String = text.chars().take(max).collect();
    out.push('…');
    out
}

/// One line per instance of a finished attach.
fn outcome_notice(answer: &AttachResponse) -> String {
    let lines: Vec<String> = answer
        .attached
        .iter()
        .map(|o| match o {
            AttachOutcome::Attached(i) => {
                let disks: Vec<String> = i
                    .old_disks
                    .iter()
                    .zip(&i.new_disks)
                    .map(|(a, b)| format!("{a} -> {b}"))
                    .collect();
                format!(
                    "{} re-imaged and added to pool {} as {} (node {}); data disks: {}.",
                    i.provider_id,
                    answer.pool,
                    i.instance,
                    i.node_name,
                    if disks.is_empty() {
                        "none".to_string()
                    } else {
                        disks.join(", ")
                    }
                )
            }
            AttachOutcome::Failed(f) => {
                format!("{}: attach failed ({}): {}", f.provider_id, f.code, f.error)
            }
        })
        .collect();
    lines.join(" ")
}

/// The provider's instances that are in no pool: every one but those a
/// pool holds (any state but `Detached`: members, and instances being
/// released). At most [`MAX_CANDIDATES`], by name.
async fn candidates(console: &Cs) -> crate::error::Result<(Vec<ProviderInstance>, usize)> {
    let taken: BTreeSet<String> = console
        .cp
        .store
        .instances(None)?
        .into_iter()
        .filter(|i| i.state != InstanceState::Detached)
        .filter_map(|i| i.provider_id)
        .collect();
    let provider = console.cp.provider()?.clone();
    let mut free: Vec<ProviderInstance> = provider
        .list()
        .await?
        .into_iter()
        .filter(|i| !taken.contains(&i.id))
        .collect();
    free.sort_by(|a, b| (a.name.as_deref(), &a.id).cmp(&(b.name.as_deref(), &b.id)));
    let total = free.len();
    free.truncate(MAX_CANDIDATES);
    Ok((free, total))
}

fn checked(on: bool) -> &'static str {
    if on {
        " checked"
    } else {
        ""
    }
}

fn pool_options(pools: &[String], selected: Option<&str>) -> String {
    let mut out = String::new();
    for p in pools {
        let sel = if Some(p.as_str()) == selected {
            " selected"
        } else {
            ""
        };
        out.push_str(&format!(
            r#"<option value="{n}"{sel}>{n}</option>"#,
            n = esc(p)
        ));
    }
    out
}

async fn render(console: &Cs, session: &Session, status: StatusCode, shown: Shown) -> Response {
    let pools: Vec<String> = match crate::pools::list(&console.cp) {
        Ok(p) => p
            .into_iter()
            .filter(|p| !p.status.deleting)
            .map(|p| p.metadata.name)
            .collect(),
        Err(e) => {
            return page(
                status_of(&e),
                Section::Attach,
                "Add existing instances",
                Some(session),
                &html::error_block("page-error", &e),
            )
        }
    };
    let selected = shown.pool.as_deref().or(pools.first().map(String::as_str));
    let mut body = String::new();
    if let Some(done) = &shown.done {
        body.push_str(&format!(
            r#"<p class="notice" id="attach-notice" role="status">{}</p>"#,
            esc(done)
        ));
    }
    body.push_str(
        r#"<p>Add machines that already exist at the provider, in no pool, to a pool. <strong>Automatic</strong>: each instance is stopped and re-imaged with the pool's image and user data (data disks kept), then joins like a node the pool made. <strong>Manual</strong>: a one-time command to run on the machine, which keeps its OS and joins it. The same calls and checks as <code>knit attach</code> and <code>knit attach-script</code>.</p>"#,
    );
    if pools.is_empty() {
        body.push_str(r#"<p>No pools yet: <a href="/ui/pools/new">create one</a> first.</p>"#);
    } else {
        body.push_str(&automatic_form(console, session, &pools, selected, &shown).await);
        if let Some(answer) = &shown.answer {
            body.push_str(&preflight_section(answer));
        }
        body.push_str(&manual_form(session, &pools, selected, &shown));
    }
    body.push_str(&added_region(console));
    page(
        status,
        Section::Attach,
        "Add existing instances",
        Some(session),
        &body,
    )
}

async fn automatic_form(
    console: &Cs,
    session: &Session,
    pools: &[String],
    selected: Option<&str>,
    shown: &Shown,
) -> String {
    let error = match &shown.error {
        Some(("automatic", e)) => html::error_block("attach-error", e),
        _ => String::new(),
    };
    let described = if error.is_empty() {
        ""
    } else {
        r#" aria-describedby="attach-error""#
    };
    let list = match candidates(console).await {
        Err(e) => html::error_block("candidates-error", &e),
        Ok((free, _)) if free.is_empty() => {
            r#"<p id="no-candidates">The provider has no instance outside the pools.</p>"#
                .to_string()
        }
        Ok((free, total)) => {
            let mut out = String::from(
                r#"<table class="candidates"><thead><tr><th scope="col">Add</th><th scope="col">Name</th><th scope="col">Instance</th><th scope="col">State</th><th scope="col">Address</th></tr></thead><tbody>"#,
            );
            for i in &free {
                out.push_str(&format!(
                    r#"<tr data-instance="{id}"><td><input type="checkbox" id="instance-{id}" name="instance" value="{id}"{on}></td><th scope="row"><label for="instance-{id}">{name}</label></th><td><code>{id}</code></td><td>{state}</td><td>{ip}</td></tr>"#,
                    id = esc(&i.id),
                    on = checked(shown.ticked.contains(&i.id)),
                    name = esc(i.name.as_deref().unwrap_or(&i.id)),
                    state = esc(&i.state),
                    ip = esc(i.ip.as_deref().unwrap_or("—")),
                ));
            }
            out.push_str("</tbody></table>");
            if total > free.len() {
                out.push_str(&format!(
                    r#"<p class="help">{} more not shown: add them with <code>knit attach --instances</code>.</p>"#,
                    total - free.len()
                ));
            }
            out
        }
    };
    format!(
        r#"<h2 id="automatic-title">Pick a pool and instances</h2>
<form method="post" action="/ui/attach" class="attach" aria-labelledby="automatic-title"{described}>{csrf}
<p><label for="attach-pool">Pool</label><select id="attach-pool" name="pool">{options}</select></p>
<fieldset><legend>Instances in no pool</legend>{list}</fieldset>
<p><label class="inline"><input type="checkbox" name="format_data_disk" value="true"{format}> Use the last data disk for the runtime and kubelet (formatted when blank, mounted when it holds a filesystem)</label></p>
<p><label class="inline"><input type="checkbox" name="keep_instance_name" value="true"{keep}> Keep the instance's name as the node name (otherwise the pool's naming rule)</label></p>
<p><label for="attach-password">New login password</label><input id="attach-password" name="password" type="password" autocomplete="new-password" aria-describedby="attach-password-help">
<span id="attach-password-help" class="help">Only for pools that log in by password: the re-image resets it. Never stored.</span></p>
<p><button type="submit" name="action" value="preflight">Run preflight (dry run)</button>
<button type="submit" name="action" value="attach">Attach automatically</button></p>
{error}</form>"#,
        csrf = html::csrf_field(session),
        options = pool_options(pools, selected),
        format = checked(shown.format_data_disk),
        keep = checked(shown.keep_instance_name),
    )
}

fn status_badge(s: PreflightStatus) -> &'static str {
    match s {
        PreflightStatus::Pass => r#"<span class="badge ok">pass</span>"#,
        PreflightStatus::Error => r#"<span class="badge bad">error</span>"#,
        PreflightStatus::Warning => r#"<span class="badge warn">warning</span>"#,
        PreflightStatus::Skipped => r#"<span class="badge muted">skipped</span>"#,
    }
}

/// Every check of every instance, with its code, message and fix; then
/// the same as text, as `knit attach` prints it.
fn preflight_section(answer: &AttachResponse) -> String {
    let verdict = match (answer.dry_run, answer.passed) {
        (true, true) => "Preflight passed: nothing was changed (dry run).",
        (true, false) => "Preflight found errors: nothing was changed (dry run).",
        (false, _) => "Not attached: the preflight found errors, and nothing was changed.",
    };
    let mut out = format!(
        r#"<section id="preflight" aria-labelledby="preflight-title" data-passed="{passed}"><h2 id="preflight-title">Preflight for pool {pool}</h2>
<p class="{class}" role="{role}">{verdict}</p>"#,
        passed = answer.passed,
        pool = esc(&answer.pool),
        class = if answer.passed { "notice" } else { "error" },
        role = if answer.passed { "status" } else { "alert" },
    );
    for report in &answer.preflight {
        out.push_str(&report_table(report));
    }
    out.push_str(&format!(
        r#"<details><summary>As text</summary><pre class="log">{}</pre></details></section>"#,
        esc(&preflight_table(&answer.preflight))
    ));
    out
}

fn report_table(report: &PreflightReport) -> String {
    let errors = report.errors().count();
    let mut out = format!(
        r#"<table class="preflight" data-instance="{id}"><caption>Instance <code>{id}</code>: {summary}</caption><thead><tr><th scope="col">Status</th><th scope="col">Check</th><th scope="col">Code</th><th scope="col">Message</th><th scope="col">Fix</th></tr></thead><tbody>"#,
        id = esc(&report.instance),
        summary = if errors == 0 {
            "passed".to_string()
        } else {
            format!("{errors} error(s)")
        },
    );
    for r in &report.results {
        out.push_str(&format!(
            r#"<tr data-code="{code}" data-status="{status}"><td>{badge}</td><td>{check}</td><td><code>{code}</code></td><td>{message}</td><td>{fix}</td></tr>"#,
            code = esc(&r.code),
            status = serde_json::to_value(r.status)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default(),
            badge = status_badge(r.status),
            check = esc(&r.check),
            message = esc(&r.message),
            fix = esc(&r.fix),
        ));
    }
    out.push_str("</tbody></table>");
    out
}

fn manual_form(
    session: &Session,
    pools: &[String],
    selected: Option<&str>,
    shown: &Shown,
) -> String {
    let error = match &shown.error {
        Some(("manual", e)) => html::error_block("manual-error", e),
        _ => String::new(),
    };
    let expires_attrs = if error.is_empty() {
        ""
    } else {
        r#" aria-describedby="manual-error" aria-invalid="true""#
    };
    let expires = shown
        .expires
        .clone()
        .unwrap_or_else(|| crate::attach::DEFAULT_EXPIRES_SECONDS.to_string());
    let result = shown.script.as_ref().map(command_block).unwrap_or_default();
    format!(
        r#"<h2 id="manual-title">Or: the manual command</h2>
<form method="post" action="/ui/attach/manual" class="attach-manual" aria-labelledby="manual-title">{csrf}
<p><label for="manual-pool">Pool</label><select id="manual-pool" name="pool">{options}</select>
<label for="manual-expires">Token lifetime (seconds)</label><input id="manual-expires" name="expires_seconds" inputmode="numeric" size="7" value="{expires}"{expires_attrs}></p>
<p><label class="inline"><input type="checkbox" name="format_data_disk" value="true"> Use the last data disk for the runtime and kubelet</label>
<label class="inline"><input type="checkbox" name="keep_instance_name" value="true"> Keep the machine's name as the node name</label></p>
<p><button type="submit">Get the attach command</button></p>{error}</form>{result}"#,
        csrf = html::csrf_field(session),
        options = pool_options(pools, selected),
        expires = esc(&expires),
    )
}

/// The issued command in a read-only field to copy (it holds the one-time
/// token, so it is shown once, never put in a URL).
fn command_block(s: &AttachScriptResponse) -> String {
    format!(
        r#"<section id="manual-result" aria-labelledby="manual-result-title"><h3 id="manual-result-title">Attach command for pool {pool}</h3>
<p class="notice" role="status">Run it as root on the machine to add: one machine, once. Token <code id="manual-token">{token}</code>, expires {expires}; it trusts the control plane's CA <code>{pin}</code>.</p>
<label for="manual-command">Command</label>
<textarea id="manual-command" readonly rows="4" cols="80" spellcheck="false" class="command">{command}</textarea>
<details><summary>The script the command runs</summary><pre class="log">{script}</pre></details></section>"#,
        pool = esc(&s.pool),
        token = esc(&s.token_id),
        expires = html::utc(s.expires_ms),
        pin = esc(&s.ca_pin),
        command = esc(&s.command),
        script = esc(&s.script),
    )
}

/// The instances added to pools, newest first, with their node: the live
/// region an attach is followed in.
fn added_region(console: &Cs) -> String {
    let mut out =
        String::from(r#"<div id="attach-live" data-live-region><h2>Added instances</h2>"#);
    let (instances, nodes) = match (
        console.cp.store.instances(None),
        crate::nodes::list(&console.cp),
    ) {
        (Ok(i), Ok(n)) => (i, n),
        (Err(e), _) | (_, Err(e)) => {
            out.push_str(&html::error_block("added-error", &e));
            out.push_str("</div>");
            return out;
        }
    };
    let mut added: Vec<_> = instances.into_iter().filter(|i| i.added).collect();
    added.sort_by_key(|i| std::cmp::Reverse(i.created_ms));
    added.truncate(MAX_ADDED_SHOWN);
    if added.is_empty() {
        out.push_str("<p>No instance was added to a pool yet.</p></div>");
        return out;
    }
    let node_of: BTreeMap<&str, &knit_api::views::NodeView> =
        nodes.iter().map(|n| (n.instance.as_str(), n)).collect();
    let now = crate::store::now_ms();
    out.push_str(
        r#"<table class="added"><thead><tr><th scope="col">Instance</th><th scope="col">Provider id</th><th scope="col">Pool</th><th scope="col">Mode</th><th scope="col">State</th><th scope="col">Node</th><th scope="col">Node status</th><th scope="col">Phase</th><th scope="col">Added</th></tr></thead><tbody>"#,
    );
    for i in &added {
        let mode = match crate::attach::record(&console.cp, &i.name) {
            Ok(Some(r)) => match r.mode {
                crate::preflight::Mode::Automatic => "automatic",
                crate::preflight::Mode::Manual => "manual",
            },
            _ => "—",
        };
        let node = node_of.get(i.name.as_str());
        let node_cell = node
            .map(|n| {
                format!(
                    r#"<a href="/ui/nodes/{q}">{n}</a>"#,
                    q = html::query_value(&n.name),
                    n = esc(&n.name)
                )
            })
            .unwrap_or_else(|| "not yet".to_string());
        let status = node.map(|n| n.status.as_str()).unwrap_or("—");
        let phase = node
            .and_then(|n| n.phase.as_ref())
            .map(|p| {
                let outcome = node
                    .and_then(|n| n.phase_outcome.as_ref())
                    .map(|o| format!(" ({})", o.as_str()))
                    .unwrap_or_default();
                format!("{}{outcome}", p.as_str())
            })
            .unwrap_or_default();
        let error = i
            .last_error
            .as_deref()
            .map(|e| format!(r#"<div class="err">{}</div>"#, esc(e)))
            .unwrap_or_default();
        out.push_str(&format!(
            r#"<tr id="added-{id}" data-provider-id="{pid}"><th scope="row">{name}</th><td><code>{pid}</code></td><td>{pool}</td><td>{mode}</td><td data-col="state">{state}{error}</td><td data-col="node">{node_cell}</td><td data-col="node-status">{status}</td><td>{phase}</td><td>{age} ago</td></tr>"#,
            id = esc(&i.name),
            name = esc(&i.name),
            pid = esc(i.provider_id.as_deref().unwrap_or("—")),
            pool = esc(&i.pool),
            state = esc(i.state.as_str()),
            status = esc(status),
            phase = esc(&phase),
            age = html::age(now, i.created_ms),
        ));
    }
    out.push_str("</tbody></table></div>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// Every ticked box is one `instance`; the button pressed decides the
    /// dry run; an empty password is none.
    #[test]
    fn the_form_reads_as_the_api_request() {
        let f = AttachForm::read(pairs(&[
            ("csrf", "x"),
            ("pool", "workers"),
            ("instance", "i-1"),
            ("instance", "i-2"),
            ("keep_instance_name", "true"),
            ("password", ""),
            ("action", "attach"),
        ]));
        assert_eq!(f.pool, "workers");
        assert_eq!(f.instances, ["i-1", "i-2"]);
        assert!(f.keep_instance_name && !f.format_data_disk);
        assert_eq!(f.password, None);
        assert!(!f.dry_run);
        let f = AttachForm::read(pairs(&[
            ("action", "preflight"),
            ("password", "N3w-pass!x7"),
        ]));
        assert!(f.dry_run && f.instances.is_empty());
        assert_eq!(f.password.as_deref(), Some("N3w-pass!x7"));
        // No button named (Enter in a field): the harmless dry run.
        assert!(AttachForm::read(Vec::new()).dry_run);
    }

    #[test]
    fn a_long_notice_is_cut_and_marked() {
        assert_eq!(clip("short", 10), "short");
        assert_eq!(clip("ééééé", 3), "ééé…");
    }

    /// Every check is a row with its code, status, message and fix, escaped.
    #[test]
    fn a_report_shows_every_check() {
        use knit_api::views::PreflightResult;
        let report = PreflightReport {
            instance: "i-1".into(),
            results: vec![
                PreflightResult {
                    check: "swap-off".into(),
                    code: "PreflightSwapOn".into(),
                    status: PreflightStatus::Error,
                    message: "instance i-1 has <swap>".into(),
                    fix: "turn swap off".into(),
                },
                PreflightResult {
                    check: "ipv6".into(),
                    code: "PreflightNoIpv6".into(),
                    status: PreflightStatus::Skipped,
                    message: "not dual-stack".into(),
                    fix: String::new(),
                },
            ],
        };
        let html = report_table(&report);
        assert!(
            html.contains(r#"data-code="PreflightSwapOn" data-status="error""#),
            "{html}"
        );
        assert!(
            html.contains(r#"data-code="PreflightNoIpv6" data-status="skipped""#),
            "{html}"
        );
        assert!(
            html.contains("has &lt;swap&gt;") && html.contains("turn swap off"),
            "{html}"
        );
        assert!(html.contains("1 error(s)"), "{html}");
    }
}
