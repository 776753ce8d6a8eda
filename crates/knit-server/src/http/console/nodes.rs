//! The nodes page (filter by pool and status) and one node's page: its
//! phase timeline as an SVG chart, cache report, events and logs. Read
//! through the REST API's own calls in `crate::nodes`.

use super::html::{self, page, Section};
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
use maud::{html, Markup};
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
        html::error_block("page-error", e),
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

    let now = crate::store::now_ms();
    let body = html! {
        form.filters method="get" action="/ui/nodes" {
            label for="filter-pool" { "Pool" }
            select #filter-pool name="pool" {
                option value="" { "every pool" }
                @for p in &pools {
                    @let name = &p.pool.metadata.name;
                    option value=(name) selected[pool.as_deref() == Some(name.as_str())] { (name) }
                }
            }
            label for="filter-status" { "Status" }
            select #filter-status name="status" {
                option value="" { "every status" }
                @for s in ["Ready", "NotReady", "Unknown"] {
                    option value=(s) selected[status.as_deref() == Some(s)] { (s) }
                }
            }
            button type="submit" { "Filter" }
        }
        div #nodes-live data-live-region {
            @if shown.is_empty() {
                p { "No nodes match." }
            } @else {
                table.nodes {
                    caption { "Nodes" }
                    (html::thead(&["Node", "Pool", "Status", "Phase", "Cache", "Error", "Age"]))
                    tbody {
                        @for (node, cache) in shown.iter().zip(&caches) {
                            (row(node, cache.as_ref(), now))
                        }
                    }
                }
            }
        }
    };
    page(
        StatusCode::OK,
        Section::Nodes,
        "Nodes",
        Some(&session),
        body,
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

fn status_badge(status: &str) -> Markup {
    let class = match status {
        "Ready" => "ok",
        "NotReady" => "warn",
        _ => "muted",
    };
    html! { span class={ "badge " (class) } data-status=(status) { (status) } }
}

/// A node's drain as a badge beside its status, as `knit get nodes` shows
/// it (`Draining (default/web)`: the budgets that block, by name), the
/// reason in its title; nothing when no drain is shown.
fn drain_badge(node: &NodeView) -> Markup {
    let Some(d) = &node.drain else {
        return html! {};
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
    html! {
        " "
        span class={ "badge " (class) } data-drain=(d.state) title=(d.reason.as_deref().unwrap_or("")) { (label) }
    }
}

/// The facts of a node's drain and its timeline, for the node's page
/// (what `knit describe node` prints).
fn drain_section(node: &NodeView) -> Markup {
    let Some(d) = &node.drain else {
        return html! {};
    };
    let steps = d.steps.as_deref().unwrap_or_default();
    html! {
        section aria-labelledby="drain-title" data-drain-section {
            h2 #drain-title { "Drain" }
            dl.facts {
                dt { "State" } dd { (drain_badge(node)) }
                dt { "Started" } dd { (html::utc(d.started_ms)) }
                dt { "Evicted" } dd { (d.evicted) }
                dt { "Pods left" } dd { (d.pods_left) }
                @if let Some(b) = &d.blocking_budget {
                    dt { "Blocked by" } dd.err data-blocking-budget { "PodDisruptionBudget " (b) }
                }
                @if let Some(r) = &d.reason {
                    dt { "Reason" } dd { (r) }
                }
                @if let Some(t) = d.timed_out_ms {
                    dt { "Timed out" } dd { (html::utc(t)) }
                }
            }
            @if !steps.is_empty() {
                table.drain-steps {
                    thead { tr { th scope="col" { "At" } th scope="col" { "State" } th scope="col" { "Step" } } }
                    tbody {
                        @for s in steps {
                            tr { td { (html::utc(s.at_ms)) } td { (s.state) } td { (s.message) } }
                        }
                    }
                }
            }
        }
    }
}

fn cache_text(cache: Option<&NodeCacheView>) -> String {
    let Some(cache) = cache else {
        return "—".to_string();
    };
    let mut parts = Vec::new();
    if let Some(p) = &cache.package {
        parts.push(if p.cache_hit {
            "package: hit".to_string()
        } else if p.preloaded {
            "package: preloaded".to_string()
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

fn row(node: &NodeView, cache: Option<&NodeCacheView>, now: i64) -> Markup {
    html! {
        tr data-node=(node.name) {
            th scope="row" { a href={ "/ui/nodes/" (html::query_value(&node.name)) } { (node.name) } }
            td { (node.pool) }
            td { (status_badge(node.status.as_str())) (drain_badge(node)) }
            td { (phase_text(node)) }
            td { (cache_text(cache)) }
            td.err { (error_text(node)) }
            td { (html::age(now, node.created_ms)) }
        }
    }
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
        let note = html! {
            p.help { "Node logs need an admin token; you signed in with a " (session.role) " token." }
        };
        (note.clone(), note)
    };
    let body = html! {
        div #node-live data-live-region {
            dl.facts {
                dt { "Status" } dd { (status_badge(node.status.as_str())) (drain_badge(&node)) }
                dt { "Pool" } dd { a href={ "/ui/nodes?pool=" (html::query_value(&node.pool)) } { (node.pool) } }
                dt { "Instance" } dd { (node.instance) }
                dt { "Address" } dd { (node.ip.as_deref().unwrap_or("—")) }
                dt { "Phase" } dd { (phase_text(&node)) }
                dt { "Initialized" } dd { @if node.initialized { "yes" } @else { "no" } }
                dt { "Error" } dd.err { (error_text(&node)) }
                dt { "Created" } dd { (html::utc(node.created_ms)) }
            }
            (drain_section(&node))
            section aria-labelledby="timeline-title" {
                h2 #timeline-title { "Phase timeline" }
                (timeline_chart(&timeline, now))
                (timeline_table(&timeline))
            }
            section aria-labelledby="cache-title" {
                h2 #cache-title { "Cache report" }
                (cache_report(node.cache.as_ref()))
            }
            section aria-labelledby="events-title" {
                h2 #events-title { "Events" }
                (events)
            }
        }
        section aria-labelledby="init-log-title" {
            h2 #init-log-title { "Init log" }
            (init_log)
        }
        section aria-labelledby="ud-log-title" {
            h2 #ud-log-title { "User-data log" }
            (user_data_log)
        }
    };
    page(StatusCode::OK, Section::Nodes, &title, Some(&session), body)
}

async fn log(console: &Cs, node: &str, file: &str) -> Markup {
    match crate::nodes::read_log(&console.cp, node, Some(file)).await {
        Ok(bytes) => {
            let start = bytes.len().saturating_sub(LOG_TAIL_BYTES);
            let text = String::from_utf8_lossy(&bytes[start..]);
            html! {
                @if start > 0 {
                    p.help { "The last " (html::bytes(LOG_TAIL_BYTES as u64)) " of the log." }
                }
                pre.log tabindex="0" aria-label={ (file) " log" } { (text) }
            }
        }
        Err(e) => html::error_block(&format!("{file}-log-error"), &e),
    }
}

fn cache_report(cache: Option<&NodeCacheView>) -> Markup {
    let Some(cache) = cache else {
        return html! { p { "No cache report." } };
    };
    html! {
        dl.facts.cache {
            dt { "Package" }
            @match &cache.package {
                Some(p) if p.cache_hit => dd { "hit (from the data-disk cache)" },
                Some(p) if p.preloaded => dd { "preloaded in the node image" },
                Some(p) => dd { "miss: " (html::bytes(p.bytes_downloaded)) " downloaded" },
                None => dd { "no report" },
            }
            dt { "System images" }
            @match &cache.images {
                Some(i) => dd {
                    (i.hit) " hit, " (i.miss) " miss, " (i.failed) " failed; "
                    (html::bytes(i.bytes_pulled)) " pulled (from the " (i.source) ")"
                },
                None => dd { "no report" },
            }
        }
    }
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
fn timeline_chart(timeline: &[TimelineEntryView], now_ms: i64) -> Markup {
    let bars = bars(timeline, now_ms);
    if bars.is_empty() {
        return html! { p { "No phase reported yet." } };
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
    let px = |v: f64| format!("{v:.1}");
    // SVG elements get explicit end tags (`{}`): in an HTML page `<rect>`
    // without one would hold everything after it.
    html! {
        p.legend {
            span.key.done { "done" } " " span.key.skipped { "skipped" } " "
            span.key.failed { "failed" } " " span.key.running { "running" }
        }
        svg.timeline role="group" aria-labelledby="timeline-title" viewBox={ "0 0 " (width) " " (height) }
            width=(width) height=(height) xmlns="http://www.w3.org/2000/svg" {
            // Five ticks along the top: seconds since the first phase started.
            @for i in 0..=4 {
                @let t = t0 + (t1 - t0) * i / 4;
                @let tx = px(x(t));
                line.tick x1=(tx) y1=(AXIS_H - 6.0) x2=(tx) y2=(height) {}
                text.axis x=(tx) y="14" text-anchor="middle" { (html::duration(t - t0)) }
            }
            @for (i, bar) in bars.iter().enumerate() {
                @let y = AXIS_H + ROW_H * i as f64;
                @let bx = x(bar.start_ms);
                @let bw = (x(bar.end_ms) - bx).max(3.0);
                @let label = bar_label(bar);
                @let ty = px(y + ROW_H * 0.65);
                g class={ "bar " (outcome_word(bar.outcome)) } data-phase=(bar.phase) tabindex="0" role="img" aria-label=(label) {
                    title { (label) }
                    text.phase x="6" y=(ty) { (bar.phase) }
                    rect x=(px(bx)) y=(px(y + 4.0)) width=(px(bw)) height=(px(ROW_H - 8.0)) rx="3" {}
                    text.dur x=(px(bx + bw + 6.0)) y=(ty) { (html::duration(bar.end_ms - bar.start_ms)) }
                }
            }
        }
    }
}

/// The same timeline as a table (every report, in order).
fn timeline_table(timeline: &[TimelineEntryView]) -> Markup {
    html! {
        @if !timeline.is_empty() {
            details {
                summary { "Every phase report" }
                table.timeline-table {
                    (html::thead(&["At", "Phase", "Outcome", "Duration", "Error code", "Reason"]))
                    tbody {
                        @for e in timeline {
                            tr {
                                td { (html::utc(e.at_ms)) }
                                td { (e.phase) }
                                td { (e.outcome) }
                                td { (e.duration_ms.map(html::duration).unwrap_or_default()) }
                                td { (e.error_code.map(|c| c.to_string()).unwrap_or_default()) }
                                td { (e.reason.as_deref().unwrap_or("")) }
                            }
                        }
                    }
                }
            }
        }
    }
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
        let cell = row(&n, None, 3_000).into_string();
        assert!(
            cell.contains(r#"data-drain="Blocked""#)
                && cell.contains(">Draining (default/web, default/db)</span>"),
            "{cell}"
        );
        assert!(
            cell.contains("&lt;a&gt;") && !cell.contains("<a>"),
            "{cell}"
        );
        let section = drain_section(&n).into_string();
        assert!(
            section.contains("PodDisruptionBudget default/web (minAvailable 2, 0 disruption(s) allowed); default/db (maxUnavailable 0)")
                && section.contains("blocked: eviction refused")
                && section.contains("<dt>Evicted</dt><dd>2</dd>"),
            "{section}"
        );
        let quiet = node_with(None);
        assert!(!row(&quiet, None, 3_000)
            .into_string()
            .contains("data-drain"));
        assert!(drain_section(&quiet).into_string().is_empty());
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
        let svg = timeline_chart(&timeline, 5_000).into_string();
        assert_eq!(svg.matches("<g class=\"bar ").count(), 3);
        assert!(
            svg.contains("because &lt;x&gt;") && !svg.contains("<x>"),
            "{svg}"
        );
    }
}
