//! Each node's user-data outcome, read from the runner's result record
//! inside the instance, bounded in time and size.

use crate::control::ControlPlane;
use crate::error::Result;
use crate::store::{now_ms, NodeRecord};
use knit_api::state::{EventType, InstanceState};
use serde_json::Value;
use std::sync::Arc;

use super::{
    CLUSTER_CALL_TIMEOUT, USER_DATA_RESULT, USER_DATA_RESULT_MAX_BYTES, USER_DATA_RESULT_TIMEOUT,
};

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

/// The pool's user-data part (`03-user-data`) from a result record: knit's
/// runner lists each part's exit code; plain cloud-init lists errors.
pub fn user_data_outcome(result: &Value) -> std::result::Result<(), String> {
    if let Some(parts) = result["knit"]["parts"].as_array() {
        return match parts.iter().find(|p| p["filename"] == "03-user-data") {
            None => Ok(()),
            Some(p) if p["exitCode"] == 0 => Ok(()),
            Some(p) => Err(format!(
                "user data exited with {}{}",
                p["exitCode"]
                    .as_i64()
                    .map(|c| format!("code {c}"))
                    .unwrap_or_else(|| "no exit code".into()),
                p["error"]
                    .as_str()
                    .map(|e| format!(": {e}"))
                    .unwrap_or_default()
            )),
        };
    }
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
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

impl ControlPlane {
    /// Records each node's user-data outcome once its runner has finished,
    /// and lifts the pool's scheduling gate when it succeeded (SPEC §5). At
    /// most 20 nodes are looked at per pass: each look reads a file inside
    /// the instance through the provider, all at once, each bounded in time
    /// and size, so one instance (a FIFO, /dev/zero, a hung disk) holds up
    /// no other; it is skipped with an event and tried again later.
    pub async fn check_user_data(&self) -> Result<()> {
        let Some(provider) = &self.provider else {
            return Ok(());
        };
        let now = now_ms();
        let mut reads = tokio::task::JoinSet::new();
        let candidates: Vec<NodeRecord> = self
            .store
            .nodes()?
            .into_iter()
            .filter(|n| n.user_data.is_none() && n.initialized())
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
        Ok(())
    }

    async fn record_user_data(
        &self,
        node: &NodeRecord,
        pool: &crate::store::PoolRecord,
        result: &Value,
    ) -> Result<()> {
        let gate = pool.pool.spec.user_data_scheduling_gate && self.cluster.attached();
        match user_data_outcome(result) {
            Ok(()) => {
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
                            "user data succeeded: taint {} removed",
                            knit_api::USER_DATA_GATE_TAINT
                        ),
                    )?;
                }
                self.store.set_node_user_data(&node.name, "succeeded")?;
                self.store.add_event(
                    EventType::Normal,
                    "Node",
                    &node.name,
                    "UserDataSucceeded",
                    "the pool's user data ran successfully",
                )?;
            }
            Err(why) => {
                self.store
                    .set_node_user_data(&node.name, &format!("failed: {why}"))?;
                let kept = if gate {
                    "; the scheduling gate taint stays"
                } else {
                    ""
                };
                self.store.add_event(
                    EventType::Warning,
                    "Node",
                    &node.name,
                    "UserDataFailed",
                    &format!("{why}{kept}"),
                )?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_data_outcome_from_result_records() {
        let knit = |code: i64| {
            serde_json::json!({"v1": {"errors": []}, "knit": {"parts": [
                {"filename": "02-knit-init", "exitCode": 0},
                {"filename": "03-user-data", "exitCode": code, "error": null}
            ]}})
        };
        assert_eq!(user_data_outcome(&knit(0)), Ok(()));
        assert_eq!(
            user_data_outcome(&knit(3)),
            Err("user data exited with code 3".to_string())
        );
        let no_user_part =
            serde_json::json!({"knit": {"parts": [{"filename": "02-knit-init", "exitCode": 0}]}});
        assert_eq!(user_data_outcome(&no_user_part), Ok(()));
        let cloud_init = serde_json::json!({"v1": {"errors": ["script 03-user-data failed"]}});
        assert_eq!(
            user_data_outcome(&cloud_init),
            Err("script 03-user-data failed".to_string())
        );
        assert_eq!(
            user_data_outcome(&serde_json::json!({"v1": {"errors": []}})),
            Ok(())
        );
    }
}
