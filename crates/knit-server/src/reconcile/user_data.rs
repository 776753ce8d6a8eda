//! Each node's user-data outcome, read from the runner's result record
//! inside the instance, bounded in time and size.

use crate::control::ControlPlane;
use crate::error::Result;
use crate::store::{now_ms, NodeRecord};
use knit_api::state::{EventType, InstanceState};
use serde_json::Value;
use std::sync::Arc;

use super::{USER_DATA_RESULT, USER_DATA_RESULT_MAX_BYTES, USER_DATA_RESULT_TIMEOUT};
use crate::cluster::seam::CLUSTER_CALL_TIMEOUT;

/// Nodes whose result record could not be read (too slow or too large),
/// with failures so far and when to try again: such a node is not read on
/// every pass. In memory: after a restart each is tried once more.
static UNREADABLE: std::sync::LazyLock<
    std::sync::Mutex<std::collections::HashMap<String, (u32, i64)>>,
> = std::sync::LazyLock::new(Default::default);

fn unreadable_due(node: &str, now: i64) -> bool {
    UNREADABLE
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(node)
        .is_none_or(|(_, next)| *next <= now)
}

/// Records one more failed read; returns the seconds until the next try
/// (30 s, longer than a read may take, doubling to at most 10 min).
fn note_unreadable(node: &str, now: i64) -> i64 {
    let mut all = UNREADABLE.lock().unwrap_or_else(|p| p.into_inner());
    let entry = all.entry(node.to_string()).or_insert((0, now));
    entry.0 += 1;
    let delay_s = (30i64 << (entry.0 - 1).min(5)).min(600);
    entry.1 = now + delay_s * 1000;
    delay_s
}

fn forget_unreadable(node: &str) {
    UNREADABLE
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(node);
}

/// The parts knit composes into an instance's user data (userdata::compose),
/// in order, with the words a status uses for each.
const PARTS: &[(&str, &str)] = &[
    ("01-pre-user-data", "pre-user data"),
    ("02-knit-init", "knit's initialization stub"),
    ("03-user-data", "user data"),
];

/// A node's user-data status, as `knit describe node` and the API show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UserDataOutcome {
    /// Every part the pool gave ran and exited 0.
    Succeeded,
    /// The pool has neither pre-user data nor user data.
    None,
    /// A part failed (the text says which, and any part not run).
    Failed(String),
    /// No part failed, but one was not run (the text says which and why).
    NotRun(String),
}

impl UserDataOutcome {
    /// The words stored and shown (`userData` of a node).
    pub fn text(&self) -> String {
        match self {
            UserDataOutcome::Succeeded => "succeeded".into(),
            UserDataOutcome::None => "none: the pool has no pre-user data or user data".into(),
            UserDataOutcome::Failed(why) => format!("failed: {why}"),
            UserDataOutcome::NotRun(why) => format!("not run: {why}"),
        }
    }

    /// Whether the scheduling gate may be lifted.
    pub fn ok(&self) -> bool {
        matches!(self, UserDataOutcome::Succeeded | UserDataOutcome::None)
    }
}

/// The user-data status from a result record and the pool's spec: every
/// part counts (pre-user data, knit's stub, user data). knit's runner lists
/// each part's status (`succeeded`, `failed`, `not-run`) and exit code; a
/// part the pool gave that the record does not list was not run. Plain
/// cloud-init lists errors only.
pub fn user_data_outcome(result: &Value, pool: &knit_api::NodePoolSpec) -> UserDataOutcome {
    let has = |script: &str| !script.trim().is_empty();
    let any_user_data = has(&pool.pre_user_data) || has(&pool.user_data);
    let expected: Vec<&str> = PARTS
        .iter()
        .map(|(f, _)| *f)
        .filter(|f| match *f {
            "01-pre-user-data" => has(&pool.pre_user_data),
            "03-user-data" => has(&pool.user_data),
            _ => true,
        })
        .collect();
    let label = |filename: &str| {
        PARTS
            .iter()
            .find(|(f, _)| *f == filename)
            .map_or_else(|| format!("part {filename}"), |(_, l)| l.to_string())
    };
    let errors: Vec<String> = result["v1"]["errors"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            e.as_str()
                .map(str::to_string)
                .unwrap_or_else(|| e.to_string())
        })
        .collect();
    let Some(parts) = result["knit"]["parts"].as_array() else {
        // Plain cloud-init: its errors, else every part ran.
        return if !errors.is_empty() {
            UserDataOutcome::Failed(errors.join("; "))
        } else if any_user_data {
            UserDataOutcome::Succeeded
        } else {
            UserDataOutcome::None
        };
    };
    let (mut failed, mut not_run) = (Vec::new(), Vec::new());
    for p in parts {
        let filename = p["filename"].as_str().unwrap_or("?");
        let error = p["error"].as_str().map(str::to_string);
        let code = p["exitCode"].as_i64();
        // Records written before `status` existed: the exit code.
        let status = p["status"].as_str().unwrap_or(match code {
            Some(0) if error.is_none() => "succeeded",
            _ => "failed",
        });
        match status {
            "succeeded" => {}
            "not-run" => not_run.push(format!(
                "{} ({filename}): {}",
                label(filename),
                error
                    .as_deref()
                    .map(|e| e.trim_start_matches("not run: "))
                    .unwrap_or("not run")
            )),
            _ => failed.push(format!(
                "{} exited with {}{}",
                label(filename),
                code.map(|c| format!("code {c}"))
                    .unwrap_or_else(|| "no exit code".into()),
                error.map(|e| format!(": {e}")).unwrap_or_default()
            )),
        }
    }
    let listed = |f: &str| parts.iter().any(|p| p["filename"] == f);
    let skipped: Vec<&str> = result["knit"]["skipped"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    for f in expected.iter().filter(|f| !listed(f)) {
        let why = if !skipped.is_empty() {
            skipped.join("; ")
        } else if !errors.is_empty() {
            errors.join("; ")
        } else {
            "the runner's record does not list it".to_string()
        };
        not_run.push(format!("{} ({f}): {why}", label(f)));
    }
    if !failed.is_empty() {
        failed.extend(not_run.into_iter().map(|n| format!("not run: {n}")));
        UserDataOutcome::Failed(failed.join("; "))
    } else if !not_run.is_empty() {
        UserDataOutcome::NotRun(not_run.join("; "))
    } else if any_user_data {
        UserDataOutcome::Succeeded
    } else {
        UserDataOutcome::None
    }
}

impl ControlPlane {
    /// Records each node's user-data outcome once its runner has finished,
    /// and lifts the pool's scheduling gate when it succeeded (docs/spec.md §5.4). At
    /// most 20 nodes are looked at per pass: each look reads a file inside
    /// the instance through the provider, all at once, each bounded in time
    /// and size, so one instance (a FIFO, /dev/zero, a hung disk) holds up
    /// no other; it is skipped with an event and tried again later.
    /// True while some initialized node's outcome is still to be read.
    pub async fn check_user_data(&self) -> Result<bool> {
        let Some(provider) = &self.provider else {
            return Ok(false);
        };
        let now = now_ms();
        let mut reads = tokio::task::JoinSet::new();
        let waiting: Vec<NodeRecord> = self
            .store
            .nodes_without_user_data()?
            .into_iter()
            .filter(|n| n.initialized())
            .collect();
        let pending = !waiting.is_empty();
        let candidates: Vec<NodeRecord> = waiting
            .into_iter()
            .filter(|n| unreadable_due(&n.name, now))
            .take(20)
            .collect();
        for node in candidates {
            let Some(instance) = self.store.instance(&node.instance)? else {
                continue;
            };
            let (Some(id), true) = (
                instance.provider_id.clone(),
                instance.state == InstanceState::Running,
            ) else {
                continue;
            };
            let Some(pool) = self.store.pool(&node.pool)? else {
                continue;
            };
            let provider = Arc::clone(provider);
            reads.spawn(async move {
                let raw = provider
                    .read_file_limited(
                        &id,
                        USER_DATA_RESULT,
                        USER_DATA_RESULT_MAX_BYTES,
                        USER_DATA_RESULT_TIMEOUT,
                    )
                    .await;
                (node, pool, raw)
            });
        }
        while let Some(done) = reads.join_next().await {
            let Ok((node, pool, raw)) = done else {
                continue;
            };
            let raw = match raw {
                Ok(raw) => {
                    forget_unreadable(&node.name);
                    raw
                }
                Err(e) if crate::provider::is_limit_error(&e) => {
                    // From now, not the pass's start: the read took its time.
                    let retry_s = note_unreadable(&node.name, now_ms());
                    self.store.add_event(
                        EventType::Warning,
                        "Node",
                        &node.name,
                        "UserDataUnreadable",
                        &format!("{e}; skipped, tried again in {retry_s} s"),
                    )?;
                    continue;
                }
                // Absent until the runner has run every part.
                Err(_) => continue,
            };
            let Ok(result) = serde_json::from_slice::<Value>(&raw) else {
                continue;
            };
            self.record_user_data(&node, &pool, &result).await?;
        }
        Ok(pending)
    }

    async fn record_user_data(
        &self,
        node: &NodeRecord,
        pool: &crate::store::PoolRecord,
        result: &Value,
    ) -> Result<()> {
        let gate = pool.pool.spec.user_data_scheduling_gate && self.cluster.attached();
        let outcome = user_data_outcome(result, &pool.pool.spec);
        if outcome.ok() {
            if gate {
                let removed = crate::provider::within(
                    "cluster",
                    "removing the scheduling gate taint",
                    CLUSTER_CALL_TIMEOUT,
                    self.cluster
                        .remove_taint(&node.name, knit_api::USER_DATA_GATE_TAINT),
                )
                .await?;
                if !removed {
                    return Ok(()); // not registered yet: next pass
                }
                self.store.add_event(
                    EventType::Normal,
                    "Node",
                    &node.name,
                    "SchedulingGateRemoved",
                    &format!(
                        "{}: taint {} removed",
                        if outcome == UserDataOutcome::None {
                            "no user data to wait for"
                        } else {
                            "user data succeeded"
                        },
                        knit_api::USER_DATA_GATE_TAINT
                    ),
                )?;
            }
            self.store.set_node_user_data(&node.name, &outcome.text())?;
            if outcome == UserDataOutcome::Succeeded {
                self.store.add_event(
                    EventType::Normal,
                    "Node",
                    &node.name,
                    "UserDataSucceeded",
                    "every user-data part ran successfully",
                )?;
            }
            return Ok(());
        }
        self.store.set_node_user_data(&node.name, &outcome.text())?;
        let kept = if gate {
            "; the scheduling gate taint stays"
        } else {
            ""
        };
        let reason = match outcome {
            UserDataOutcome::NotRun(_) => "UserDataNotRun",
            _ => "UserDataFailed",
        };
        self.store.add_event(
            EventType::Warning,
            "Node",
            &node.name,
            reason,
            &format!("{}{kept}", outcome.text()),
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use knit_api::NodePoolSpec;
    use serde_json::json;

    fn spec(pre: &str, user: &str) -> NodePoolSpec {
        NodePoolSpec {
            pre_user_data: pre.into(),
            user_data: user.into(),
            ..NodePoolSpec::default()
        }
    }

    fn part(filename: &str, status: &str, code: Option<i64>) -> Value {
        json!({"filename": filename, "status": status, "exitCode": code, "error": null})
    }

    fn knit(parts: Vec<Value>) -> Value {
        json!({"v1": {"errors": []}, "knit": {"parts": parts, "skipped": []}})
    }

    #[test]
    fn every_part_counts() {
        let both = spec("echo pre", "echo user");
        let ok = |f| part(f, "succeeded", Some(0));
        assert_eq!(
            user_data_outcome(
                &knit(vec![
                    ok("01-pre-user-data"),
                    ok("02-knit-init"),
                    ok("03-user-data")
                ]),
                &both
            ),
            UserDataOutcome::Succeeded
        );
        // Issue 27 (3): a failed pre-user-data part shows on the node,
        // though the pool's user data succeeded.
        let pre_failed = user_data_outcome(
            &knit(vec![
                part("01-pre-user-data", "failed", Some(2)),
                ok("02-knit-init"),
                ok("03-user-data"),
            ]),
            &both,
        );
        assert_eq!(
            pre_failed.text(),
            "failed: pre-user data exited with code 2"
        );
        assert!(!pre_failed.ok());
        // The pool's user data failing keeps its words.
        assert_eq!(
            user_data_outcome(
                &knit(vec![
                    ok("01-pre-user-data"),
                    ok("02-knit-init"),
                    part("03-user-data", "failed", Some(3))
                ]),
                &both
            )
            .text(),
            "failed: user data exited with code 3"
        );
        // A part not run is shown as such, never as succeeded.
        let mut not_run = part("01-pre-user-data", "not-run", None);
        not_run["error"] =
            json!("not run: knit's user-data runner does not handle text/x-include-url");
        let shown = user_data_outcome(
            &knit(vec![not_run, ok("02-knit-init"), ok("03-user-data")]),
            &both,
        );
        assert_eq!(
            shown,
            UserDataOutcome::NotRun(
                "pre-user data (01-pre-user-data): knit's user-data runner does not handle text/x-include-url".into()
            )
        );
        assert!(shown.text().starts_with("not run: "));
        assert!(!shown.ok());
        // A part the pool gave that the record does not list did not run.
        let missing = user_data_outcome(&knit(vec![ok("02-knit-init"), ok("03-user-data")]), &both);
        assert!(
            matches!(&missing, UserDataOutcome::NotRun(w) if w.starts_with("pre-user data (01-pre-user-data)")),
            "{missing:?}"
        );
    }

    #[test]
    fn a_pool_without_user_data_shows_none() {
        let none = spec("", "  \n");
        let stub_only = knit(vec![part("02-knit-init", "succeeded", Some(0))]);
        let out = user_data_outcome(&stub_only, &none);
        assert_eq!(out, UserDataOutcome::None);
        assert!(out.text().starts_with("none"));
        assert!(out.ok(), "nothing to wait for: the gate may go");
        let cloud_init = json!({"v1": {"errors": []}});
        assert_eq!(user_data_outcome(&cloud_init, &none), UserDataOutcome::None);
    }

    #[test]
    fn plain_cloud_init_records_and_old_knit_records() {
        let user = spec("", "echo hi");
        let cloud_init = json!({"v1": {"errors": ["script 03-user-data failed"]}});
        assert_eq!(
            user_data_outcome(&cloud_init, &user).text(),
            "failed: script 03-user-data failed"
        );
        assert_eq!(
            user_data_outcome(&json!({"v1": {"errors": []}}), &user),
            UserDataOutcome::Succeeded
        );
        // Written before parts had a status: the exit code decides.
        let old = json!({"knit": {"parts": [
            {"filename": "02-knit-init", "exitCode": 0},
            {"filename": "03-user-data", "exitCode": 3, "error": null}
        ]}});
        assert_eq!(
            user_data_outcome(&old, &user).text(),
            "failed: user data exited with code 3"
        );
    }
}
