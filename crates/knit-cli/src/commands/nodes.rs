//! `knit get|describe|delete node`, `knit logs node`, and the lists of
//! instances and join tokens.

use super::get::{show, GetOpts, Listing};
use super::{now_ms, snapshot};
use crate::error::Result;
use crate::output::{self, age, cell, duration, opt, table, Format};
use knit_api::views::{InstanceView, JoinTokenView, NodeView, TimelineEntryView};
use knit_api::PhaseOutcome;
use knit_client::Client;
use std::collections::BTreeMap;
use std::process::ExitCode;

pub fn get(c: &Client, name: Option<&str>, opts: &GetOpts) -> Result<ExitCode> {
    // A node's labels are the ones knit gives it: its pool's `spec.labels`
    // and `knit.dev/pool` (read only when `-l` asks).
    let pools: BTreeMap<String, BTreeMap<String, String>> = match opts.selector {
        Some(_) => c
            .list_pools()?
            .into_iter()
            .map(|p| (p.view.metadata.name, p.view.spec.spec.labels))
            .collect(),
        None => BTreeMap::new(),
    };
    let listing = Listing {
        what: "nodes",
        kind: "node",
        name_of: |n: &NodeView| n.name.clone(),
        labels: Some(Box::new(move |n: &NodeView| node_labels(&pools, n))),
        table: node_table,
    };
    show(listing, || Ok(c.list_nodes()?), name, opts)
}

/// Label every node gets: the pool it came from (the server's
/// `bootstrap::POOL_LABEL`).
pub const POOL_LABEL: &str = "knit.dev/pool";

fn node_labels(
    pools: &BTreeMap<String, BTreeMap<String, String>>,
    n: &NodeView,
) -> BTreeMap<String, String> {
    let mut labels = pools.get(&n.pool).cloned().unwrap_or_default();
    labels.insert(POOL_LABEL.to_string(), n.pool.clone());
    labels
}

/// A node's status as `get nodes` shows it: its Ready condition, and
/// while it is drained before removal `,Draining`, with the
/// PodDisruptionBudget that blocks it (`Ready,Draining(default/web)`).
pub fn node_status(n: &NodeView) -> String {
    match &n.drain {
        None => cell(n.status),
        Some(d) => match d.blocking_budget.as_deref() {
            // The budget's `ns/name`, without what it asks (no spaces in a cell).
            Some(b) => format!(
                "{},Draining({})",
                n.status,
                b.split("; ")
                    .map(|one| one.split(' ').next().unwrap_or(one))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            None => format!("{},Draining", n.status),
        },
    }
}

/// `phase/outcome` of a node's last report.
fn phase(n: &NodeView) -> String {
    format!("{}/{}", opt(&n.phase), opt(&n.phase_outcome))
}

/// `yes` when a node's instance was made from its pool's current
/// template, `no` when a rollout will replace it, `-` when not known
/// (added by attach).
pub fn up_to_date(fresh: Option<bool>) -> String {
    match fresh {
        Some(true) => "yes".into(),
        Some(false) => "no".into(),
        None => "-".into(),
    }
}

fn node_table(items: &[&NodeView], wide: bool) -> String {
    let now = now_ms();
    let mut headers = vec![
        "NAME",
        "STATUS",
        "POOL",
        "PHASE",
        "INITIALIZED",
        "UP-TO-DATE",
        "AGE",
    ];
    if wide {
        headers.extend([
            "INSTANCE",
            "PROVIDER-ID",
            "INTERNAL-IP",
            "ERROR",
            "TEMPLATE-HASH",
        ]);
    }
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|n| {
            let mut r = vec![
                cell(&n.name),
                node_status(n),
                cell(&n.pool),
                phase(n),
                cell(n.initialized),
                up_to_date(n.up_to_date),
                age(n.created_ms, now),
            ];
            if wide {
                r.extend([
                    cell(&n.instance),
                    opt(&n.provider_id),
                    opt(&n.ip),
                    opt(&n.error_code),
                    opt(&n.template_hash),
                ]);
            }
            r
        })
        .collect();
    table(&headers, &rows)
}

pub fn get_instances(c: &Client, name: Option<&str>, opts: &GetOpts) -> Result<ExitCode> {
    let listing = Listing {
        what: "instances",
        kind: "instance",
        name_of: |i: &InstanceView| i.name.clone(),
        labels: None,
        table: instance_table,
    };
    show(listing, || Ok(c.list_instances()?), name, opts)
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

pub fn get_join_tokens(c: &Client, name: Option<&str>, opts: &GetOpts) -> Result<ExitCode> {
    let listing = Listing {
        what: "jointokens",
        kind: "jointoken",
        name_of: |t: &JoinTokenView| t.token_id.clone(),
        labels: None,
        table: join_token_table,
    };
    show(listing, || Ok(c.join_tokens()?), name, opts)
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

/// The drain of a node being removed: where it stands, what blocks it, its
/// steps.
fn describe_drain(n: &NodeView, now: i64) {
    let Some(d) = &n.drain else {
        return;
    };
    println!(
        "Drain:         {} (started {} ago, {} pod(s) evicted, {} left)",
        cell(d.state),
        age(d.started_ms, now),
        d.evicted,
        d.pods_left
    );
    if let Some(b) = &d.blocking_budget {
        println!("  Blocked by:  PodDisruptionBudget {b}");
    }
    if let Some(r) = &d.reason {
        println!("  Reason:      {r}");
    }
    if let Some(t) = d.timed_out_ms {
        println!("  Timed out:   {} ago", age(t, now));
    }
    let steps = d.steps.as_deref().unwrap_or_default();
    let rows: Vec<Vec<String>> = steps
        .iter()
        .map(|s| {
            vec![
                format!("+{}", duration(s.at_ms - d.started_ms)),
                cell(s.state),
                s.message.clone(),
            ]
        })
        .collect();
    if !rows.is_empty() {
        println!("Drain timeline:");
        for line in table(&["AT", "STATE", "STEP"], &rows).lines() {
            println!("  {line}");
        }
    }
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
    describe_drain(n, now);
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

/// How often `knit logs -f` reads the log again.
const FOLLOW_INTERVAL: std::time::Duration = std::time::Duration::from_secs(2);

/// `knit logs node NAME -f`: the log, then what is appended to it, until
/// the node is done with it (`init`: the agent initialized the node or
/// failed; `user-data`: its outcome is known), the node is gone, or the
/// command is interrupted.
pub fn follow(c: &Client, name: &str, file: &str) -> Result<ExitCode> {
    use std::io::Write as _;
    let mut shown = String::new();
    loop {
        let node = match c.get_node(name) {
            Ok(n) => Some(n.view),
            Err(e) if e.status() == Some(404) && !shown.is_empty() => None,
            Err(e) => return Err(e.into()),
        };
        let text = match node {
            Some(_) => c.node_log(name, file)?,
            None => shown.clone(),
        };
        print!("{}", appended(&shown, &text));
        let _ = std::io::stdout().flush();
        shown = text;
        let done = match &node {
            None => true,
            Some(n) => match file {
                "init" => n.initialized || n.error_code.is_some(),
                "user-data" => n.user_data.is_some(),
                _ => false,
            },
        };
        if done {
            return Ok(ExitCode::SUCCESS);
        }
        std::thread::sleep(FOLLOW_INTERVAL);
    }
}

/// What `now` adds to `before`; all of `now` when it does not continue it
/// (the log was rewritten).
fn appended<'a>(before: &str, now: &'a str) -> &'a str {
    now.strip_prefix(before).unwrap_or(now)
}

#[cfg(test)]
mod follow_tests {
    use super::*;

    #[test]
    fn only_the_new_text_is_printed() {
        assert_eq!(appended("", "a\n"), "a\n");
        assert_eq!(appended("a\n", "a\nb\n"), "b\n");
        assert_eq!(appended("a\nb\n", "a\nb\n"), "");
        assert_eq!(appended("old\n", "new\n"), "new\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_draining_node_shows_the_budget_that_blocks_it() {
        let mut n: NodeView = serde_json::from_value(serde_json::json!({
            "name": "n-1", "instance": "w-1", "pool": "w", "status": "Ready",
            "createdMs": 0, "updatedMs": 0,
        }))
        .unwrap();
        assert_eq!(node_status(&n), "Ready");
        n.drain = Some(knit_api::views::DrainView {
            state: knit_api::state::DrainState::Blocked,
            started_ms: 0,
            updated_ms: 0,
            reason: None,
            blocking_budget: Some(
                "shop/web (minAvailable 2, 0 disruption(s) allowed); shop/db (maxUnavailable 0)"
                    .into(),
            ),
            pods_left: 2,
            evicted: 1,
            timed_out_ms: None,
            steps: None,
        });
        assert_eq!(node_status(&n), "Ready,Draining(shop/web,shop/db)");
        n.drain.as_mut().unwrap().blocking_budget = None;
        assert_eq!(node_status(&n), "Ready,Draining");
    }
}
