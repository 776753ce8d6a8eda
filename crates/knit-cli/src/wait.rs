//! `knit scale … --wait`: one line per instance of the pool (state, node,
//! current phase, elapsed), redrawn in place on a terminal, until every node
//! is initialized or Ready, or something failed.

use crate::output::{cell, duration, table};
use crate::{CliError, Result};
use knit_client::Client;
use serde_json::Value;
use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

const COUNTED: &[&str] = &["Pending", "Creating", "Running", "Failed"];

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
    let p = c.get(&format!("/api/v1/pools/{pool}"))?;
    let desired = p["spec"]["replicas"].as_u64().unwrap_or(0) as usize;
    // Nodes that join a cluster are done when also Ready.
    let needs_ready = p["status"]["clusterAttached"] == true;
    let instances = c.get("/api/v1/instances")?;
    let nodes = c.get("/api/v1/nodes")?;
    let now = knit_server::store::now_ms();
    let mine: Vec<&Value> = instances["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|i| i["pool"] == pool)
        .collect();
    let node_of = |name: &Value| {
        nodes["items"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|n| &n["instance"] == name)
            .cloned()
    };
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    let mut settled = 0;
    for i in &mine {
        let state = cell(&i["state"]);
        // Instances on their way out do not fail a wait.
        let counted = COUNTED.contains(&state.as_str());
        let node = node_of(&i["name"]);
        let (node_name, phase, status, finished) = match &node {
            Some(n) => {
                // The agent finished every phase, and, joining a cluster,
                // the node is Ready (the two may come in either order).
                let finished = n["initialized"] == true && (!needs_ready || n["status"] == "Ready");
                if counted && n["phaseOutcome"] == "failed" {
                    failures.push(format!(
                        "{}: phase {} failed: {} {}",
                        cell(&n["name"]),
                        cell(&n["phase"]),
                        cell(&n["errorCode"]),
                        cell(&n["error"])
                    ));
                }
                (
                    cell(&n["name"]),
                    format!("{}/{}", cell(&n["phase"]), cell(&n["phaseOutcome"])),
                    cell(&n["status"]),
                    finished,
                )
            }
            None => ("-".into(), "-".into(), "-".into(), false),
        };
        if state == "Failed" {
            failures.push(format!("{}: {}", cell(&i["name"]), cell(&i["lastError"])));
        }
        let end = if finished {
            node.as_ref()
                .and_then(|n| n["updatedMs"].as_i64())
                .unwrap_or(now)
        } else {
            now
        };
        if state == "Running" && finished {
            settled += 1;
        }
        rows.push(vec![
            cell(&i["name"]),
            state,
            node_name,
            phase,
            status,
            duration(end - i["createdMs"].as_i64().unwrap_or(now)),
        ]);
    }
    let counted = mine
        .iter()
        .filter(|i| COUNTED.contains(&i["state"].as_str().unwrap_or("")))
        .count();
    let leaving = mine.iter().any(|i| i["state"] == "Deleting");
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

pub fn scale(c: &Client, pool: &str, timeout: Duration) -> Result<ExitCode> {
    // SAFETY: isatty only inspects the descriptor.
    let tty = unsafe { libc::isatty(1) } == 1;
    let deadline = Instant::now() + timeout;
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
        std::thread::sleep(Duration::from_millis(500));
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
