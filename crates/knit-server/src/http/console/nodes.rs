//! The nodes page (filter by pool and status) and one node's page: its
//! phase timeline as an SVG chart, cache report, events and logs. Read
//! through the REST API's own calls in `crate::nodes`.

use super::html::{self, esc, page, Section};
use super::session::Session;
use super::Cs;
use crate::error::ServerError;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use knit_api::state::DrainState;
use knit_api::state::TokenRole;
use knit_api::views::{NodeCacheView, NodeView, TimelineEntryView};
use knit_api::{PhaseName, PhaseOutcome};
use serde::Deserialize;

/// Nodes whose cache report the list reads (each is a read of the cluster
/// and the provider); past it the column points to the node's page.
const LIST_CACHE_LIMIT: usize = 50;

/// The most of a log shown on the page (its end).
const LOG_TAIL_BYTES: usize = 64 * 1024;

#[derive(Deserialize, Default)]
pub struct NodeFilter {
    #[serde(default)]
    pool: Option<String>,
    #[serde(default)]
    status: Option<String>,
}

fn error_page(session: &Session, title: &str, e: &ServerError) -> Response {
    page(
        StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        Section::Nodes,
        title,
        Some(session),
        &html::error_block("page-error", e),
    )
}

pub async fn list(
    State(console): State<Cs>,
    Extension(session): Extension<Session>,
    Query(filter): Query<NodeFilter>,
) -> Response {
    let pool = filter.pool.filter(|p| !p.is_empty());
    let status = filter.status.filter(|s| !s.is_empty());
    let (nodes, pools) = match (crate::nodes::list(&console.cp), console.cp.store.pools()) {
        (Ok(n), Ok(p)) => (n, p),
        (Err(e), _) | (_, Err(e)) => return error_page(&session, "Nodes", &e),
    };
    let shown: Vec<&NodeView> = nodes
        .iter()
        .filter(|n| pool.as_ref().is_none_or(|p| &n.pool == p))
        .filter(|n| status.as_ref().is_none_or(|s| n.status.as_str() == s))
        .collect();
    let caches = node_caches(&console, &shown).await;

    let mut pool_options = String::from(r#"<option value="">every pool</option>"#);
    for p in &pools {
        let name = &p.pool.metadata.name;
        let selected = if pool.as_deref() == Some(name) {
            " selected"
        } else {
            ""
        };
        pool_options.push_str(&format!(
            r#"<option value="{n}"{selected}>{n}</option>"#,
            n = esc(name)
        ));
    }
    let mut status_options = String::from(r#"<option value="">every status</option>"#);
    for s in ["Ready", "NotReady", "Unknown"] {
        let selected = if status.as_deref() == Some(s) {
            " selected"
        } else {
            ""
        };
        status_options.push_str(&format!(r#"<option value="{s}"{selected}>{s}</option>"#));
    }
    let mut body = format!(
        r#"<form method="get" action="/ui/nodes" class="filters">
<label for="filter-pool">Pool</label><select id="filter-pool" name="pool">{pool_options}</select>
<label for="filter-status">Status</label><select id="filter-status" name="status">{status_options}</select>
<button type="submit">Filter</button></form>
<div id="nodes-live" data-live-region>"#
    );
    if shown.is_empty() {
        body.push_str("<p>No nodes match.</p>");
    } else {
        body.push_str(
            r#"<table class="nodes"><caption>Nodes</caption><thead><tr>
<th scope="col">Node</th><th scope="col">Pool</th><th scope="col">Status</th><th scope="col">Phase</th>
<th scope="col">Cache</th><th scope="col">Error</th><th scope="col">Age</th></tr></thead><tbody>"#,
        );
        let now = crate::store::now_ms();
        for (node, cache) in shown.iter().zip(&caches) {
            body.push_str(&row(node, cache.as_ref(), now));
        }
        body.push_str("</tbody></table>");
    }
    body.push_str("</div>");
    page(
        StatusCode::OK,
        Section::Nodes,
        "Nodes",
        Some(&session),
        &body,
    )
}

/// The cache report of each node (the first [`LIST_CACHE_LIMIT`]), read at
/// once.
async fn node_caches(console: &Cs, nodes: &[&NodeView]) -> Vec<Option<NodeCacheView>> {
    let reads = nodes.iter().enumerate().map(|(i, n)| async move {
        if i >= LIST_CACHE_LIMIT {
            return None;
        }
        crate::nodes::describe(&console.cp, &n.name)
            .await
            .ok()
            .and_then(|v| v.cache)
    });
    futures_util::future::join_all(reads).await
}

fn status_badge(status: &str) -> String {
    let class = match status {
        "Ready" => "ok",
        "NotReady" => "warn",
        _ => "muted",
    };
    format!(
        r#"<span class="badge {class}" data-status="{s}">{s}</span>"#,
        s = esc(status)
    )
}

/// A node's drain as a badge beside its status, as `knit get nodes` shows
/// it (`Draining (default/web)`: the budgets that block, by name), the
/// reason in its title; nothing when no drain is shown.
fn drain_badge(node: &NodeView) -> String {
    let Some(d) = &node.drain else {
        return String::new();
    };
    let budgets: Vec<&str> = d
        .blocking_budget
        .as_deref()
        .map(|b| {
            b.split("; ")
                .map(|one| one.split(' ').next().unwrap_or(one))
                .collect()
        })
        .unwrap_or_default();
    let (class, word) = match d.state {
        DrainState::Drained => ("ok", "Drained"),
        DrainState::Blocked => ("warn", "Draining"),
        DrainState::Forcing => ("warn", "Draining, forced"),
        DrainState::Draining => ("muted", "Draining"),
    };
    let label = if budgets.is_empty() {
        word.to_string()
    } else {
        format!("{word} ({})", budgets.join(", "))
    };
    format!(
        r#" <span class="badge {class}" data-drain="{state}" title="{reason}">{label}</span>"#,
        state = esc(&d.state.to_string()),
        reason = esc(d.reason.as_deref().unwrap_or("")),
        label = esc(&label),
    )
}

/// The facts of a node's drain and its timeline, for the node's page
/// (what `knit describe node` prints).
fn drain_section(node: &NodeView) -> String {
    let Some(d) = &node.drain else {
        return String::new();
    };
    let mut facts = format!(
        r#"<dt>State</dt><dd>{badge}</dd><dt>Started</dt><dd>{started}</dd><dt>Evicted</dt><dd>{evicted}</dd><dt>Pods left</dt><dd>{left}</dd>"#,
        badge = drain_badge(node),
        started = html::utc(d.started_ms),
        evicted = d.evicted,
        left = d.pods_left,
    );
    if let Some(b) = &d.blocking_budget {
        facts.push_str(&format!(
            r#"<dt>Blocked by</dt><dd class="err" data-blocking-budget>PodDisruptionBudget {}</dd>"#,
            esc(b)
        ));
    }
    if let Some(r) = &d.reason {
        facts.push_str(&format!("<dt>Reason</dt><dd>{}</dd>", esc(r)));
    }
    if let Some(t) = d.timed_out_ms {
        facts.push_str(&format!("<dt>Timed out</dt><dd>{}</dd>", html::utc(t)));
    }
    let steps: String = d
        .steps
        .iter()
        .flatten()
        .map(|s| {
            format!(
                "<tr><td>{at}</td><td>{state}</td><td>{message}</td></tr>",
                at = html::utc(s.at_ms),
                state = esc(&s.state.to_string()),
                message = esc(&s.message),
            )
        })
        .collect();
    let table = if steps.is_empty() {
        String::new()
    } else {
        format!(
            r#"<table class="drain-steps"><thead><tr><th scope="col">At</th><th scope="col">State</th><th scope="col">Step</th></tr></thead><tbody>{steps}</tbody></table>"#
        )
    };
    format!(
        r#"<section aria-labelledby="drain-title" data-drain-section><h2 id="drain-title">Drain</h2><dl class="facts">{facts}</dl>{table}</section>"#
    )
}

fn cache_text(cache: Option<&NodeCacheView>) -> String {
    let Some(cache) = cache else {
        return "—".to_string();
    };
    let mut parts = Vec::new();
    if let Some(p) = &cache.package {
        parts.push(if p.cache_hit {
            "package: hit".to_string()
        } else {
            format!("package: miss, {}", html::bytes(p.bytes_downloaded))
        });
    }
    // The failed count as `knit get nodes` and the node's page show it: a
    // node whose system images could not be pulled says so in the list.
    if let Some(i) = &cache.images {
        parts.push(format!(
            "images: {} hit / {} miss / {} failed, {}",
            i.hit,
            i.miss,
            i.failed,
            html::bytes(i.bytes_pulled)
        ));
    }
    if parts.is_empty() {
        "—".to_string()
    } else {
        parts.join("; ")
    }
}

fn phase_text(node: &NodeView) -> String {
    match (node.phase, node.phase_outcome) {
        (Some(p), Some(o)) => format!("{p} ({o})"),
        (Some(p), None) => p.to_string(),
        _ => "—".to_string(),
    }
}

fn error_text(node: &NodeView) -> String {
    match (&node.error_code, &node.error) {
        (Some(c), Some(m)) => format!("{c}: {m}"),
        (Some(c), None) => c.to_string(),
        (None, Some(m)) => m.clone(),
        (None, None) => String::new(),
    }
}

fn row(node: &NodeView, cache: Option<&NodeCacheView>, now: i64) -> String {
    format!(
        r#"<tr data-node="{n}"><th scope="row"><a href="/ui/nodes/{q}">{n}</a></th><td>{pool}</td>
<td>{status}</td><td>{phase}</td><td>{cache}</td><td class="err">{error}</td><td>{age}</td></tr>"#,
        n = esc(&node.name),
        q = html::query_value(&node.name),
        pool = esc(&node.pool),
        status = status_badge(node.status.as_str()) + &drain_badge(node),
        phase = esc(&phase_text(node)),
        cache = esc(&cache_text(cache)),
        error = esc(&error_text(node)),
        age = html::age(now, node.created_ms),
    )
}

pub async fn node(
    State(console): State<Cs>,
    Extension(session): Extension<Session>,
    Path(name): Path<String>,
) -> Response {
    let title = format!("Node {name}");
    let node = match crate::nodes::describe(&console.cp, &name).await {
        Ok(n) => n,
        Err(e) => return error_page(&session, &title, &e),
    };
    let now = crate::store::now_ms();
    let timeline = node.timeline.clone().unwrap_or_default();
    let events = match console.cp.store.events(2000) {
        Ok(mut list) => {
            list.retain(|e| e.object_name == node.name || e.object_name == node.instance);
            list.reverse();
            super::events::table(&list, now)
        }
        Err(e) => html::error_block("events-error", &e),
    };
    // Node logs are an admin's (as `GET /api/v1/nodes/{name}/logs`).
    let (init_log, user_data_log) = if session.may(TokenRole::Admin) {
        (
            log(&console, &node.name, "init").await,
            log(&console, &node.name, "user-data").await,
        )
    } else {
        let note = format!(
            r#"<p class="help">Node logs need an admin token; you signed in with a {} token.</p>"#,
            session.role
        );
        (note.clone(), note)
    };
    let summary = format!(
        r#"<dl class="facts">
<dt>Status</dt><dd>{status}</dd><dt>Pool</dt><dd><a href="/ui/nodes?pool={pq}">{pool}</a></dd>
<dt>Instance</dt><dd>{instance}</dd><dt>Address</dt><dd>{ip}</dd>
<dt>Phase</dt><dd>{phase}</dd><dt>Initialized</dt><dd>{init}</dd>
<dt>Error</dt><dd class="err">{error}</dd><dt>Created</dt><dd>{created}</dd></dl>"#,
        status = status_badge(node.status.as_str()) + &drain_badge(&node),
        pq = html::query_value(&node.pool),
        pool = esc(&node.pool),
        instance = esc(&node.instance),
        ip = esc(node.ip.as_deref().unwrap_or("—")),
        phase = esc(&phase_text(&node)),
        init = if node.initialized { "yes" } else { "no" },
        error = esc(&error_text(&node)).to_string() + "",
        created = html::utc(node.created_ms),
    );
    let body = format!(
        r#"<div id="node-live" data-live-region>{summary}{drain}
<section aria-labelledby="timeline-title"><h2 id="timeline-title">Phase timeline</h2>{chart}{table}</section>
<section aria-labelledby="cache-title"><h2 id="cache-title">Cache report</h2>{cache}</section>
<section aria-labelledby="events-title"><h2 id="events-title">Events</h2>{events}</section></div>
<section aria-labelledby="init-log-title"><h2 id="init-log-title">Init log</h2>{init_log}</section>
<section aria-labelledby="ud-log-title"><h2 id="ud-log-title">User-data log</h2>{user_data_log}</section>"#,
        drain = drain_section(&node),
        chart = timeline_chart(&timeline, now),
        table = timeline_table(&timeline),
        cache = cache_report(node.cache.as_ref()),
    );
    page(
        StatusCode::OK,
        Section::Nodes,
        &title,
        Some(&session),
        &body,
    )
}

async fn log(console: &Cs, node: &str, file: &str) -> String {
    match crate::nodes::read_log(&console.cp, node, Some(file)).await {
        Ok(bytes) => {
            let start = bytes.len().saturating_sub(LOG_TAIL_BYTES);
            let text = String::from_utf8_lossy(&bytes[start..]);
            let cut = if start > 0 {
                format!(
                    "<p class=\"help\">The last {} of the log.</p>",
                    html::bytes(LOG_TAIL_BYTES as u64)
                )
            } else {
                String::new()
            };
            format!(
                r#"{cut}<pre class="log" tabindex="0" aria-label="{file} log">{}</pre>"#,
                esc(&text)
            )
        }
        Err(e) => html::error_block(&format!("{file}-log-error"), &e),
    }
}

fn cache_report(cache: Option<&NodeCacheView>) -> String {
    let Some(cache) = cache else {
        return "<p>No cache report.</p>".into();
    };
    let mut out = String::from(r#"<dl class="facts cache">"#);
    match &cache.package {
        Some(p) => out.push_str(&format!(
            "<dt>Package</dt><dd>{}</dd>",
            if p.cache_hit {
                "hit (from the data-disk cache)".to_string()
            } else {
                format!("miss: {} downloaded", html::bytes(p.bytes_downloaded))
            }
        )),
        None => out.push_str("<dt>Package</dt><dd>no report</dd>"),
    }
    match &cache.images {
        Some(i) => out.push_str(&format!(
            "<dt>System images</dt><dd>{} hit, {} miss, {} failed; {} pulled (from the {})</dd>",
            i.hit,
            i.miss,
            i.failed,
            html::bytes(i.bytes_pulled),
            esc(&i.source)
        )),
        None => out.push_str("<dt>System images</dt><dd>no report</dd>"),
    }
    out.push_str("</dl>");
    out
}

/// One phase as drawn: where its bar starts and ends and how it ended.
struct Bar {
    phase: PhaseName,
    start_ms: i64,
    end_ms: i64,
    /// `None`: still running.
    outcome: Option<PhaseOutcome>,
    reason: Option<String>,
    error_code: Option<String>,
}

/// One bar per phase that reported, in the agent's order: from its
/// `started` report (or its duration back from its end) to its end (now,
/// while it runs).
fn bars(timeline: &[TimelineEntryView], now_ms: i64) -> Vec<Bar> {
    PhaseName::ALL
        .iter()
        .filter_map(|phase| {
            let entries: Vec<&TimelineEntryView> =
                timeline.iter().filter(|e| e.phase == *phase).collect();
            let last = entries.last()?;
            let started = entries
                .iter()
                .find(|e| e.outcome == PhaseOutcome::Started)
                .map(|e| e.at_ms);
            let ended = entries
                .iter()
                .rev()
                .find(|e| e.outcome != PhaseOutcome::Started)
                .copied();
            let (start_ms, end_ms, outcome) = match ended {
                Some(end) => {
                    let start = started
                        .or(end.duration_ms.map(|d| end.at_ms - d))
                        .unwrap_or(end.at_ms);
                    let stop = end.duration_ms.map(|d| start + d).unwrap_or(end.at_ms);
                    (start, stop.max(start), Some(end.outcome))
                }
                None => (last.at_ms, now_ms.max(last.at_ms), None),
            };
            let source = ended.unwrap_or(last);
            Some(Bar {
                phase: *phase,
                start_ms,
                end_ms,
                outcome,
                reason: source.reason.clone(),
                error_code: source.error_code.map(|c| c.to_string()),
            })
        })
        .collect()
}

fn outcome_word(outcome: Option<PhaseOutcome>) -> &'static str {
    match outcome {
        Some(PhaseOutcome::Done) => "done",
        Some(PhaseOutcome::Skipped) => "skipped",
        Some(PhaseOutcome::Failed) => "failed",
        Some(PhaseOutcome::Started) | None => "running",
    }
}

fn bar_label(bar: &Bar) -> String {
    let mut label = format!(
        "{}: {} in {}",
        bar.phase,
        outcome_word(bar.outcome),
        html::duration(bar.end_ms - bar.start_ms)
    );
    if let Some(code) = &bar.error_code {
        label.push_str(&format!(" ({code})"));
    }
    if let Some(reason) = &bar.reason {
        label.push_str(&format!(" — {reason}"));
    }
    label
}

const LABEL_W: f64 = 190.0;
const PLOT_W: f64 = 600.0;
const ROW_H: f64 = 26.0;
const AXIS_H: f64 = 26.0;

/// The timeline as an SVG chart: one focusable bar per phase on a shared
/// time axis, colored by outcome (CSS classes), its duration beside it and
/// its full account (outcome, duration, error code, reason) in a `<title>`
/// and `aria-label`.
fn timeline_chart(timeline: &[TimelineEntryView], now_ms: i64) -> String {
    let bars = bars(timeline, now_ms);
    if bars.is_empty() {
        return "<p>No phase reported yet.</p>".into();
    }
    let t0 = bars.iter().map(|b| b.start_ms).min().unwrap_or(0);
    let t1 = bars
        .iter()
        .map(|b| b.end_ms)
        .max()
        .unwrap_or(t0)
        .max(t0 + 1);
    let span = (t1 - t0) as f64;
    let x = |t: i64| LABEL_W + (t - t0) as f64 / span * PLOT_W;
    let width = LABEL_W + PLOT_W + 90.0;
    let height = AXIS_H + ROW_H * bars.len() as f64 + 6.0;
    let mut svg = format!(
        r#"<svg class="timeline" role="group" aria-labelledby="timeline-title" viewBox="0 0 {width} {height}" width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg">"#
    );
    // Five ticks along the top: seconds since the first phase started.
    for i in 0..=4 {
        let t = t0 + (t1 - t0) * i / 4;
        let tx = x(t);
        svg.push_str(&format!(
            r#"<line class="tick" x1="{tx:.1}" y1="{y0}" x2="{tx:.1}" y2="{height}"/><text class="axis" x="{tx:.1}" y="14" text-anchor="middle">{label}</text>"#,
            y0 = AXIS_H - 6.0,
            label = esc(&html::duration(t - t0)),
        ));
    }
    for (i, bar) in bars.iter().enumerate() {
        let y = AXIS_H + ROW_H * i as f64;
        let bx = x(bar.start_ms);
        let bw = (x(bar.end_ms) - bx).max(3.0);
        let label = bar_label(bar);
        svg.push_str(&format!(
            r#"<g class="bar {class}" data-phase="{phase}" tabindex="0" role="img" aria-label="{label}"><title>{label}</title><text class="phase" x="{lx}" y="{ty:.1}">{phase}</text><rect x="{bx:.1}" y="{ry:.1}" width="{bw:.1}" height="{rh:.1}" rx="3"/><text class="dur" x="{dx:.1}" y="{ty:.1}">{dur}</text></g>"#,
            class = outcome_word(bar.outcome),
            phase = bar.phase,
            label = esc(&label),
            lx = 6.0,
            ty = y + ROW_H * 0.65,
            ry = y + 4.0,
            rh = ROW_H - 8.0,
            dx = bx + bw + 6.0,
            dur = esc(&html::duration(bar.end_ms - bar.start_ms)),
        ));
    }
    svg.push_str("</svg>");
    format!(
        r#"<p class="legend"><span class="key done">done</span> <span class="key skipped">skipped</span> <span class="key failed">failed</span> <span class="key running">running</span></p>{svg}"#
    )
}

/// The same timeline as a table (every report, in order).
fn timeline_table(timeline: &[TimelineEntryView]) -> String {
    if timeline.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        r#"<details><summary>Every phase report</summary><table class="timeline-table"><thead><tr><th scope="col">At</th><th scope="col">Phase</th><th scope="col">Outcome</th><th scope="col">Duration</th><th scope="col">Error code</th><th scope="col">Reason</th></tr></thead><tbody>"#,
    );
    for e in timeline {
        out.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            html::utc(e.at_ms),
            e.phase,
            e.outcome,
            e.duration_ms.map(html::duration).unwrap_or_default(),
            e.error_code.map(|c| c.to_string()).unwrap_or_default(),
            esc(e.reason.as_deref().unwrap_or("")),
        ));
    }
    out.push_str("</tbody></table></details>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use knit_api::views::{DrainStepView, DrainView};

    fn entry(
        phase: PhaseName,
        outcome: PhaseOutcome,
        at_ms: i64,
        d: Option<i64>,
    ) -> TimelineEntryView {
        TimelineEntryView {
            phase,
            outcome,
            reason: Some("because <x>".into()),
            error_code: None,
            at_ms,
            duration_ms: d,
        }
    }

    fn node_with(drain: Option<DrainView>) -> NodeView {
        NodeView {
            name: "local.i-1".into(),
            instance: "workers-a".into(),
            pool: "workers".into(),
            status: knit_api::state::NodeStatus::Ready,
            phase: None,
            phase_outcome: None,
            error_code: None,
            error: None,
            created_ms: 0,
            updated_ms: 0,
            user_data: None,
            initialized: true,
            provider_id: None,
            ip: None,
            timeline: None,
            cache: None,
            drain,
            template_hash: None,
            up_to_date: None,
        }
    }

    /// The list's status cell and the node's page show a draining node
    /// as `knit get nodes` and `knit describe node` do: the budgets that
    /// block by name, the full budget, the reason and the drain's steps.
    #[test]
    fn a_draining_node_shows_the_budgets_that_block_it() {
        let drain = DrainView {
            state: DrainState::Blocked,
            started_ms: 1_000,
            updated_ms: 2_000,
            reason: Some("eviction of default/web-1 refused by PodDisruptionBudgets <a>".into()),
            blocking_budget: Some(
                "default/web (minAvailable 2, 0 disruption(s) allowed); default/db (maxUnavailable 0)"
                    .into(),
            ),
            pods_left: 1,
            evicted: 2,
            timed_out_ms: None,
            steps: Some(vec![DrainStepView {
                at_ms: 1_500,
                state: DrainState::Blocked,
                message: "blocked: eviction refused".into(),
            }]),
        };
        let n = node_with(Some(drain));
        let cell = row(&n, None, 3_000);
        assert!(
            cell.contains(r#"data-drain="Blocked""#)
                && cell.contains(">Draining (default/web, default/db)</span>"),
            "{cell}"
        );
        assert!(
            cell.contains("&lt;a&gt;") && !cell.contains("<a>"),
            "{cell}"
        );
        let section = drain_section(&n);
        assert!(
            section.contains("PodDisruptionBudget default/web (minAvailable 2, 0 disruption(s) allowed); default/db (maxUnavailable 0)")
                && section.contains("blocked: eviction refused")
                && section.contains("<dt>Evicted</dt><dd>2</dd>"),
            "{section}"
        );
        let quiet = node_with(None);
        assert!(!row(&quiet, None, 3_000).contains("data-drain"));
        assert!(drain_section(&quiet).is_empty());
    }

    /// The list's cache cell counts failed image pulls (issue 28: the
    /// list said nothing of them while the node's page did).
    #[test]
    fn the_list_counts_failed_image_pulls() {
        let cache = NodeCacheView {
            package: None,
            images: Some(knit_api::views::ImageCacheView {
                hit: 1,
                miss: 0,
                failed: 2,
                ..Default::default()
            }),
        };
        let cell = cache_text(Some(&cache));
        assert!(
            cell.starts_with("images: 1 hit / 0 miss / 2 failed, "),
            "{cell}"
        );
        assert_eq!(cache_text(None), "—");
    }

    #[test]
    fn one_bar_per_phase_in_the_agents_order_and_a_running_one_reaches_now() {
        let timeline = vec![
            entry(PhaseName::NodeIdentity, PhaseOutcome::Started, 2_000, None),
            entry(PhaseName::TimeSync, PhaseOutcome::Started, 1_000, None),
            entry(PhaseName::TimeSync, PhaseOutcome::Done, 1_500, Some(500)),
            entry(
                PhaseName::NodeIdentity,
                PhaseOutcome::Failed,
                2_600,
                Some(600),
            ),
            entry(PhaseName::DataDisk, PhaseOutcome::Started, 3_000, None),
        ];
        let bars = bars(&timeline, 5_000);
        let phases: Vec<_> = bars.iter().map(|b| b.phase).collect();
        assert_eq!(
            phases,
            [
                PhaseName::TimeSync,
                PhaseName::NodeIdentity,
                PhaseName::DataDisk
            ]
        );
        assert_eq!((bars[0].start_ms, bars[0].end_ms), (1_000, 1_500));
        assert_eq!(bars[1].outcome, Some(PhaseOutcome::Failed));
        assert_eq!((bars[2].end_ms, bars[2].outcome), (5_000, None));
        let svg = timeline_chart(&timeline, 5_000);
        assert_eq!(svg.matches("<g class=\"bar ").count(), 3);
        assert!(
            svg.contains("because &lt;x&gt;") && !svg.contains("<x>"),
            "{svg}"
        );
    }
}
