//! Adding existing instances to a pool: pick a pool and instances (the
//! provider's instances in no pool), run the dry-run preflight and see
//! every check with its code, message and fix, start an automatic attach
//! and follow its instances to Ready, or get the manual command to copy.
//!
//! Each action is the REST API's own call: `crate::attach::automatic::attach`
//! (`POST /api/v1/pools/{pool}/attach`, with `dryRun` for the preflight) and
//! `crate::attach::manual::issue_script` (`POST …/attach-script`), so the
//! checks, refusals and messages are the API's.

use super::html::{self, page, see_other, Section};
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
use maud::{html, Markup};
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

fn pool_options(pools: &[String], selected: Option<&str>) -> Markup {
    html! {
        @for p in pools {
            option value=(p) selected[Some(p.as_str()) == selected] { (p) }
        }
    }
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
                html::error_block("page-error", &e),
            )
        }
    };
    let selected = shown.pool.as_deref().or(pools.first().map(String::as_str));
    let automatic = match pools.is_empty() {
        true => html! {},
        false => automatic_form(console, session, &pools, selected, &shown).await,
    };
    let body = html! {
        @if let Some(done) = &shown.done {
            p.notice #attach-notice role="status" { (done) }
        }
        p {
            "Add machines that already exist at the provider, in no pool, to a pool. "
            strong { "Automatic" }
            ": each instance is stopped and re-imaged with the pool's image and user data (data disks kept), then joins like a node the pool made. "
            strong { "Manual" }
            ": a one-time command to run on the machine, which keeps its OS and joins it. The same calls and checks as "
            code { "knit attach" } " and " code { "knit attach-script" } "."
        }
        @if pools.is_empty() {
            p { "No pools yet: " a href="/ui/pools/new" { "create one" } " first." }
        } @else {
            (automatic)
            @if let Some(answer) = &shown.answer {
                (preflight_section(answer))
            }
            (manual_form(session, &pools, selected, &shown))
        }
        (added_region(console))
    };
    page(
        status,
        Section::Attach,
        "Add existing instances",
        Some(session),
        body,
    )
}

async fn automatic_form(
    console: &Cs,
    session: &Session,
    pools: &[String],
    selected: Option<&str>,
    shown: &Shown,
) -> Markup {
    let error = match &shown.error {
        Some(("automatic", e)) => Some(html::error_block("attach-error", e)),
        _ => None,
    };
    let list = match candidates(console).await {
        Err(e) => html::error_block("candidates-error", &e),
        Ok((free, _)) if free.is_empty() => html! {
            p #no-candidates { "The provider has no instance outside the pools." }
        },
        Ok((free, total)) => html! {
            table.candidates {
                (html::thead(&["Add", "Name", "Instance", "State", "Address"]))
                tbody {
                    @for i in &free {
                        @let box_id = format!("instance-{}", i.id);
                        tr data-instance=(i.id) {
                            td { input type="checkbox" id=(box_id) name="instance" value=(i.id) checked[shown.ticked.contains(&i.id)]; }
                            th scope="row" { label for=(box_id) { (i.name.as_deref().unwrap_or(&i.id)) } }
                            td { code { (i.id) } }
                            td { (i.state) }
                            td { (i.ip.as_deref().unwrap_or("—")) }
                        }
                    }
                }
            }
            @if total > free.len() {
                p.help {
                    (total - free.len()) " more not shown: add them with "
                    code { "knit attach --instances" } "."
                }
            }
        },
    };
    html! {
        h2 #automatic-title { "Pick a pool and instances" }
        form.attach method="post" action="/ui/attach" aria-labelledby="automatic-title"
            aria-describedby=[error.as_ref().map(|_| "attach-error")] {
            (html::csrf_field(session))
            p {
                label for="attach-pool" { "Pool" }
                select #attach-pool name="pool" { (pool_options(pools, selected)) }
            }
            fieldset { legend { "Instances in no pool" } (list) }
            p {
                label.inline {
                    input type="checkbox" name="format_data_disk" value="true" checked[shown.format_data_disk];
                    " Use the last data disk for the runtime and kubelet (formatted when blank, mounted when it holds a filesystem)"
                }
            }
            p {
                label.inline {
                    input type="checkbox" name="keep_instance_name" value="true" checked[shown.keep_instance_name];
                    " Keep the instance's name as the node name (otherwise the pool's naming rule)"
                }
            }
            p {
                label for="attach-password" { "New login password" }
                input #attach-password name="password" type="password" autocomplete="new-password" aria-describedby="attach-password-help";
                " "
                span #attach-password-help .help { "Only for pools that log in by password: the re-image resets it. Never stored." }
            }
            p {
                button type="submit" name="action" value="preflight" { "Run preflight (dry run)" }
                " "
                button type="submit" name="action" value="attach" { "Attach automatically" }
            }
            @if let Some(error) = error { (error) }
        }
    }
}

fn status_badge(s: PreflightStatus) -> Markup {
    let (class, word) = match s {
        PreflightStatus::Pass => ("ok", "pass"),
        PreflightStatus::Error => ("bad", "error"),
        PreflightStatus::Warning => ("warn", "warning"),
        PreflightStatus::Skipped => ("muted", "skipped"),
    };
    html! { span class={ "badge " (class) } { (word) } }
}

/// Every check of every instance, with its code, message and fix; then
/// the same as text, as `knit attach` prints it.
fn preflight_section(answer: &AttachResponse) -> Markup {
    let verdict = match (answer.dry_run, answer.passed) {
        (true, true) => "Preflight passed: nothing was changed (dry run).",
        (true, false) => "Preflight found errors: nothing was changed (dry run).",
        (false, _) => "Not attached: the preflight found errors, and nothing was changed.",
    };
    html! {
        section #preflight aria-labelledby="preflight-title" data-passed=(answer.passed) {
            h2 #preflight-title { "Preflight for pool " (answer.pool) }
            p class=(if answer.passed { "notice" } else { "error" })
                role=(if answer.passed { "status" } else { "alert" }) { (verdict) }
            @for report in &answer.preflight {
                (report_table(report))
            }
            details {
                summary { "As text" }
                pre.log { (preflight_table(&answer.preflight)) }
            }
        }
    }
}

fn report_table(report: &PreflightReport) -> Markup {
    let errors = report.errors().count();
    html! {
        table.preflight data-instance=(report.instance) {
            caption {
                "Instance " code { (report.instance) } ": "
                @if errors == 0 { "passed" } @else { (errors) " error(s)" }
            }
            (html::thead(&["Status", "Check", "Code", "Message", "Fix"]))
            tbody {
                @for r in &report.results {
                    // The status as the API spells it (`error`, `skipped`, …).
                    @let status = serde_json::to_value(r.status)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default();
                    tr data-code=(r.code) data-status=(status) {
                        td { (status_badge(r.status)) }
                        td { (r.check) }
                        td { code { (r.code) } }
                        td { (r.message) }
                        td { (r.fix) }
                    }
                }
            }
        }
    }
}

fn manual_form(
    session: &Session,
    pools: &[String],
    selected: Option<&str>,
    shown: &Shown,
) -> Markup {
    let error = match &shown.error {
        Some(("manual", e)) => Some(html::error_block("manual-error", e)),
        _ => None,
    };
    let expires = shown
        .expires
        .clone()
        .unwrap_or_else(|| crate::attach::DEFAULT_EXPIRES_SECONDS.to_string());
    html! {
        h2 #manual-title { "Or: the manual command" }
        form.attach-manual method="post" action="/ui/attach/manual" aria-labelledby="manual-title" {
            (html::csrf_field(session))
            p {
                label for="manual-pool" { "Pool" }
                select #manual-pool name="pool" { (pool_options(pools, selected)) }
                label for="manual-expires" { "Token lifetime (seconds)" }
                input #manual-expires name="expires_seconds" inputmode="numeric" size="7" value=(expires)
                    aria-describedby=[error.as_ref().map(|_| "manual-error")]
                    aria-invalid=[error.as_ref().map(|_| "true")];
            }
            p {
                label.inline { input type="checkbox" name="format_data_disk" value="true"; " Use the last data disk for the runtime and kubelet" }
                " "
                label.inline { input type="checkbox" name="keep_instance_name" value="true"; " Keep the machine's name as the node name" }
            }
            p { button type="submit" { "Get the attach command" } }
            @if let Some(error) = error { (error) }
        }
        @if let Some(script) = &shown.script { (command_block(script)) }
    }
}

/// The issued command in a read-only field to copy (it holds the one-time
/// token, so it is shown once, never put in a URL).
fn command_block(s: &AttachScriptResponse) -> Markup {
    html! {
        section #manual-result aria-labelledby="manual-result-title" {
            h3 #manual-result-title { "Attach command for pool " (s.pool) }
            p.notice role="status" {
                "Run it as root on the machine to add: one machine, once. Token "
                code #manual-token { (s.token_id) } ", expires " (html::utc(s.expires_ms))
                "; it trusts the control plane's CA " code { (s.ca_pin) } "."
            }
            label for="manual-command" { "Command" }
            textarea #manual-command .command readonly rows="4" cols="80" spellcheck="false" { (s.command) }
            details {
                summary { "The script the command runs" }
                pre.log { (s.script) }
            }
        }
    }
}

/// The instances added to pools, newest first, with their node: the live
/// region an attach is followed in.
fn added_region(console: &Cs) -> Markup {
    html! {
        div #attach-live data-live-region {
            h2 { "Added instances" }
            (added_table(console))
        }
    }
}

fn added_table(console: &Cs) -> Markup {
    let (instances, nodes) = match (
        console.cp.store.instances(None),
        crate::nodes::list(&console.cp),
    ) {
        (Ok(i), Ok(n)) => (i, n),
        (Err(e), _) | (_, Err(e)) => return html::error_block("added-error", &e),
    };
    let mut added: Vec<_> = instances.into_iter().filter(|i| i.added).collect();
    added.sort_by_key(|i| std::cmp::Reverse(i.created_ms));
    added.truncate(MAX_ADDED_SHOWN);
    if added.is_empty() {
        return html! { p { "No instance was added to a pool yet." } };
    }
    let node_of: BTreeMap<&str, &knit_api::views::NodeView> =
        nodes.iter().map(|n| (n.instance.as_str(), n)).collect();
    let now = crate::store::now_ms();
    html! {
        table.added {
            (html::thead(&["Instance", "Provider id", "Pool", "Mode", "State", "Node", "Node status", "Phase", "Added"]))
            tbody {
                @for i in &added {
                    @let mode = match crate::attach::record(&console.cp, &i.name) {
                        Ok(Some(r)) => match r.mode {
                            crate::preflight::Mode::Automatic => "automatic",
                            crate::preflight::Mode::Manual => "manual",
                        },
                        _ => "—",
                    };
                    @let node = node_of.get(i.name.as_str());
                    @let phase = node
                        .and_then(|n| n.phase.as_ref())
                        .map(|p| {
                            let outcome = node
                                .and_then(|n| n.phase_outcome.as_ref())
                                .map(|o| format!(" ({})", o.as_str()))
                                .unwrap_or_default();
                            format!("{}{outcome}", p.as_str())
                        })
                        .unwrap_or_default();
                    @let pid = i.provider_id.as_deref().unwrap_or("—");
                    tr id={ "added-" (i.name) } data-provider-id=(pid) {
                        th scope="row" { (i.name) }
                        td { code { (pid) } }
                        td { (i.pool) }
                        td { (mode) }
                        td data-col="state" {
                            (i.state.as_str())
                            @if let Some(e) = &i.last_error { div.err { (e) } }
                        }
                        td data-col="node" {
                            @match node {
                                Some(n) => a href={ "/ui/nodes/" (html::query_value(&n.name)) } { (n.name) },
                                None => "not yet",
                            }
                        }
                        td data-col="node-status" { (node.map(|n| n.status.as_str()).unwrap_or("—")) }
                        td { (phase) }
                        td { (html::age(now, i.created_ms)) " ago" }
                    }
                }
            }
        }
    }
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
        let html = report_table(&report).into_string();
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
