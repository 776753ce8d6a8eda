//! `knit scale … --wait`: one line per instance of the pool (state, node,
//! current phase, elapsed), redrawn in place on a terminal, until every node
//! is initialized or Ready, or something failed.

use super::now_ms;
use crate::error::{CliError, Result};
use crate::output::{cell, duration, opt, table};
use knit_api::state::{InstanceState, NodeStatus};
use knit_api::views::{InstanceView, NodeView};
use knit_api::PhaseOutcome;
use knit_client::Client;
use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

struct Snapshot {
    lines: String,
    /// The header line and the rows, for output without a terminal.
    header: String,
    rows: Vec<Vec<String>>,
    done: bool,
    failures: Vec<String>,
}

/// Without a terminal, a log gets one line per change: the header when the
/// count changes, and an instance's row when anything but its elapsed time
/// (the last column, which changes every second) changed.
#[derive(Default)]
struct ChangeLog {
    header: String,
    rows: std::collections::HashMap<String, Vec<String>>,
}

impl ChangeLog {
    fn changes(&mut self, header: &str, rows: &[Vec<String>]) -> Vec<String> {
        let mut out = Vec::new();
        if header != self.header {
            self.header = header.to_string();
            out.push(header.trim_end().to_string());
        }
        for row in rows {
            let Some((name, _)) = row.split_first() else {
                continue;
            };
            let key = &row[..row.len().saturating_sub(1)];
            if self.rows.get(name).map(Vec::as_slice) != Some(key) {
                self.rows.insert(name.clone(), key.to_vec());
                out.push(row.join("  "));
            }
        }
        out
    }
}

fn look(c: &Client, pool: &str) -> Result<Snapshot> {
    let p = c.get_pool(pool)?.view;
    let desired = p.spec.spec.replicas.max(0) as usize;
    // Nodes that join a cluster are done when also Ready.
    let needs_ready = p.status.cluster_attached;
    let instances = c.list_instances()?;
    let nodes = c.list_nodes()?;
    let now = now_ms();
    let mine: Vec<&InstanceView> = instances
        .iter()
        .map(|i| &i.view)
        .filter(|i| i.pool == pool)
        .collect();
    let node_of = |name: &str| -> Option<&NodeView> {
        nodes.iter().map(|n| &n.view).find(|n| n.instance == name)
    };
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    let mut settled = 0;
    for i in &mine {
        // Instances on their way out do not fail a wait.
        let counted = i.state.is_member();
        let node = node_of(&i.name);
        let (node_name, phase, status, finished) = match node {
            Some(n) => {
                // The agent finished every phase, and, joining a cluster,
                // the node is Ready (the two may come in either order).
                let finished = n.initialized && (!needs_ready || n.status == NodeStatus::Ready);
                if counted && n.phase_outcome == Some(PhaseOutcome::Failed) {
                    failures.push(format!(
                        "{}: phase {} failed: {} {}",
                        cell(&n.name),
                        opt(&n.phase),
                        opt(&n.error_code),
                        opt(&n.error)
                    ));
                }
                (
                    cell(&n.name),
                    format!("{}/{}", opt(&n.phase), opt(&n.phase_outcome)),
                    cell(n.status),
                    finished,
                )
            }
            None => ("-".into(), "-".into(), "-".into(), false),
        };
        if i.state == InstanceState::Failed {
            failures.push(format!("{}: {}", cell(&i.name), opt(&i.last_error)));
        }
        let end = match node {
            Some(n) if finished => n.updated_ms,
            _ => now,
        };
        if i.state == InstanceState::Running && finished {
            settled += 1;
        }
        rows.push(vec![
            cell(&i.name),
            cell(i.state),
            node_name,
            phase,
            status,
            duration(end - i.created_ms),
        ]);
    }
    let counted = mine.iter().filter(|i| i.state.is_member()).count();
    let leaving = mine.iter().any(|i| i.state == InstanceState::Deleting);
    let done = counted == desired && settled == desired && !leaving;
    let header = format!(
        "nodepool/{pool}: {settled}/{desired} {}\n",
        if needs_ready {
            "initialized and Ready"
        } else {
            "initialized"
        }
    );
    let lines = if rows.is_empty() {
        header.clone()
    } else {
        header.clone()
            + &table(
                &["INSTANCE", "STATE", "NODE", "PHASE", "STATUS", "ELAPSED"],
                &rows,
            )
    };
    Ok(Snapshot {
        lines,
        header,
        rows,
        done,
        failures,
    })
}

const POLL: Duration = Duration::from_millis(500);
const FAST_POLL: Duration = Duration::from_millis(100);
const FAST_POLL_FOR: Duration = Duration::from_secs(10);

pub fn scale(c: &Client, pool: &str, timeout: Duration) -> Result<ExitCode> {
    // SAFETY: isatty only inspects the descriptor.
    let tty = unsafe { libc::isatty(1) } == 1;
    let started = Instant::now();
    let deadline = started + timeout;
    let mut shown_lines = 0;
    let mut log = ChangeLog::default();
    let mut stdout = std::io::stdout();
    loop {
        let s = look(c, pool)?;
        if tty {
            if shown_lines > 0 {
                // Move up over the previous block and clear it.
                let _ = write!(stdout, "\x1b[{shown_lines}A\x1b[J");
            }
            let _ = write!(stdout, "{}", s.lines);
            shown_lines = s.lines.lines().count();
        } else {
            for line in log.changes(&s.header, &s.rows) {
                let _ = writeln!(stdout, "{line}");
            }
        }
        let _ = stdout.flush();
        if !s.failures.is_empty() {
            return Err(CliError::Failed(format!(
                "pool {pool}:\n  {}",
                s.failures.join("\n  ")
            )));
        }
        if s.done {
            println!("nodepool/{pool} reached its desired count");
            return Ok(ExitCode::SUCCESS);
        }
        if Instant::now() > deadline {
            return Err(CliError::Failed(format!(
                "pool {pool} not settled after {} s",
                timeout.as_secs()
            )));
        }
        // A node is usually done within seconds of the request: asked often
        // at first, the command returns when it is, not up to 500 ms later.
        let poll = if started.elapsed() < FAST_POLL_FOR {
            FAST_POLL
        } else {
            POLL
        };
        std::thread::sleep(poll);
    }
}

#[cfg(test)]
mod tests {
    use super::ChangeLog;

    fn row(cells: &[&str]) -> Vec<String> {
        cells.iter().map(|c| c.to_string()).collect()
    }

    #[test]
    fn without_a_terminal_only_changes_are_printed() {
        let mut log = ChangeLog::default();
        let h = "nodepool/w: 0/2 initialized\n";
        let a = row(&["w-1", "Creating", "-", "-", "-", "1s"]);
        let b = row(&["w-2", "Creating", "-", "-", "-", "1s"]);
        assert_eq!(log.changes(h, &[a.clone(), b.clone()]).len(), 3);
        // Only the elapsed time moved: nothing to print.
        let a2 = row(&["w-1", "Creating", "-", "-", "-", "2s"]);
        let b2 = row(&["w-2", "Creating", "-", "-", "-", "2s"]);
        assert!(log.changes(h, &[a2, b2.clone()]).is_empty());
        // One instance moved on: its line alone.
        let a3 = row(&["w-1", "Running", "w-1", "join/started", "-", "3s"]);
        assert_eq!(
            log.changes(h, &[a3, b2]),
            vec!["w-1  Running  w-1  join/started  -  3s".to_string()]
        );
        // The count changed: the header line.
        let out = log.changes("nodepool/w: 1/2 initialized\n", &[]);
        assert_eq!(out, vec!["nodepool/w: 1/2 initialized".to_string()]);
    }
}
