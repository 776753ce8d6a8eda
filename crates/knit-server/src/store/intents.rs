//! Intents: every create, delete or attach written before the reconciler
//! acts on it, so that a restarted server resumes it.

use super::{now_ms, opt_word, word, Store};
use crate::error::{Result, ServerError};
use crate::provider_error::ProviderErrorKind;
use knit_api::state::{InstanceState, IntentAction, IntentStatus};
use knit_db::{params, Row};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IntentRecord {
    pub id: i64,
    pub action: IntentAction,
    pub instance: String,
    pub pool: String,
    pub release: bool,
    pub status: IntentStatus,
    pub attempts: i64,
    pub next_attempt_ms: i64,
    pub last_error: Option<String>,
    /// The provider's kind of `last_error`, when it was a provider's error
    /// (what the autoscaler tells a create retried for capacity by).
    #[serde(skip)]
    pub last_error_kind: Option<ProviderErrorKind>,
}

fn intent_row(r: &Row) -> Result<IntentRecord> {
    Ok(IntentRecord {
        id: r.get(0)?,
        action: word(r, 1)?,
        instance: r.get(2)?,
        pool: r.get(3)?,
        release: r.get(4)?,
        status: word(r, 5)?,
        attempts: r.get(6)?,
        next_attempt_ms: r.get(7)?,
        last_error: r.get(8)?,
        last_error_kind: opt_word(r, 9)?,
    })
}

impl Store {
    /// Records new instances of a pool and their create intents in one
    /// transaction: either all exist or none. Each instance records the
    /// template hash its pool's spec has at this moment (what it will be
    /// made from).
    pub fn add_create_intents(&self, pool: &str, names: &[(String, String)]) -> Result<()> {
        let now = now_ms();
        self.write(|tx| {
            let hash = super::rollouts::current_hash(tx, pool)?;
            for (name, instance_type) in names {
                tx.execute(
                    "INSERT INTO instances (name, pool, state, instance_type, created_ms, updated_ms, template_hash) VALUES (?1, ?2, ?3, ?4, ?5, ?5, ?6)",
                    params![name, pool, InstanceState::Pending.as_str(), instance_type, now, &hash],
                )?;
                tx.execute(
                    "INSERT INTO intents (action, instance, pool, status, created_ms, updated_ms) VALUES (?4, ?1, ?2, ?5, ?3, ?3)",
                    params![
                        name,
                        pool,
                        now,
                        IntentAction::Create.as_str(),
                        IntentStatus::Pending.as_str()
                    ],
                )?;
            }
            Ok(())
        })
    }

    /// Marks instances for deletion and records their delete intents. An
    /// instance that already has a pending intent is left alone.
    pub fn add_delete_intents(&self, pool: &str, names: &[String], release: bool) -> Result<usize> {
        let now = now_ms();
        self.write(|tx| {
            let mut added = 0;
            for name in names {
                // A pending create of the same instance is superseded by the delete.
                tx.execute(
                    "UPDATE intents SET status = ?3, updated_ms = ?2 WHERE instance = ?1 AND action = ?4 AND status = ?5",
                    params![
                        name,
                        now,
                        IntentStatus::Cancelled.as_str(),
                        IntentAction::Create.as_str(),
                        IntentStatus::Pending.as_str()
                    ],
                )?;
                let exists = tx
                    .query_opt(
                        "SELECT 1 FROM intents WHERE instance = ?1 AND action = ?2 AND status = ?3",
                        params![
                            name,
                            IntentAction::Delete.as_str(),
                            IntentStatus::Pending.as_str()
                        ],
                    )?
                    .is_some();
                if exists {
                    continue;
                }
                tx.execute(
                    "UPDATE instances SET state = ?2, updated_ms = ?3 WHERE name = ?1",
                    params![name, InstanceState::Deleting.as_str(), now],
                )?;
                tx.execute(
                    "INSERT INTO intents (action, instance, pool, release, status, created_ms, updated_ms) VALUES (?5, ?1, ?2, ?3, ?6, ?4, ?4)",
                    params![
                        name,
                        pool,
                        release,
                        now,
                        IntentAction::Delete.as_str(),
                        IntentStatus::Pending.as_str()
                    ],
                )?;
                added += 1;
            }
            Ok(added)
        })
    }

    pub fn pending_intents(&self) -> Result<Vec<IntentRecord>> {
        self.read(|tx| {
            tx.query(
                "SELECT id, action, instance, pool, release, status, attempts, next_attempt_ms, last_error, last_error_kind FROM intents WHERE status = ?1 ORDER BY id",
                params![IntentStatus::Pending.as_str()],
            )?
            .iter()
            .map(intent_row)
            .collect()
        })
    }

    pub fn intent_status(&self, id: i64) -> Result<Option<IntentStatus>> {
        self.read(|tx| {
            tx.query_opt("SELECT status FROM intents WHERE id = ?1", params![id])?
                .map(|r| word(&r, 0))
                .transpose()
        })
    }

    pub fn finish_intent(&self, id: i64, status: IntentStatus, error: Option<&str>) -> Result<()> {
        let now = now_ms();
        self.write(|tx| {
            tx.execute(
                "UPDATE intents SET status = ?2, last_error = ?3, last_error_kind = NULL, updated_ms = ?4 WHERE id = ?1",
                params![id, status.as_str(), error, now],
            )?;
            Ok(())
        })
    }

    /// Runs a pending intent again at `next_attempt_ms`, its attempts
    /// unchanged: it is waiting (a drain), not failing.
    pub fn defer_intent(&self, id: i64, next_attempt_ms: i64) -> Result<()> {
        let now = now_ms();
        self.write(|tx| {
            tx.execute(
                "UPDATE intents SET next_attempt_ms = ?2, updated_ms = ?3 WHERE id = ?1",
                params![id, next_attempt_ms, now],
            )?;
            Ok(())
        })
    }

    /// Runs a pending intent again at `next_attempt_ms` after `error`: its
    /// text is the intent's last error, kept with the provider's kind when
    /// it is a provider's.
    pub fn retry_intent(
        &self,
        id: i64,
        attempts: i64,
        next_attempt_ms: i64,
        error: &ServerError,
    ) -> Result<()> {
        let now = now_ms();
        let text = error.to_string();
        let kind = error.provider_kind().map(ProviderErrorKind::as_str);
        self.write(|tx| {
            tx.execute(
                "UPDATE intents SET attempts = ?2, next_attempt_ms = ?3, last_error = ?4, last_error_kind = ?6, updated_ms = ?5 WHERE id = ?1",
                params![id, attempts, next_attempt_ms, &text, now, kind],
            )?;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use knit_api::{PhaseEvent, PhaseName, PhaseOutcome};

    #[test]
    fn intents_and_timeline() {
        crate::store::testing::each_store(|store| {
            store
                .add_create_intents(
                    "p",
                    &[("p-a".into(), "t".into()), ("p-b".into(), "t".into())],
                )
                .unwrap();
            assert_eq!(store.pending_intents().unwrap().len(), 2);
            // Deleting a not-yet-created instance cancels its create.
            assert_eq!(
                store
                    .add_delete_intents("p", &["p-b".into()], true)
                    .unwrap(),
                1
            );
            assert_eq!(
                store
                    .add_delete_intents("p", &["p-b".into()], true)
                    .unwrap(),
                0
            );
            let pending = store.pending_intents().unwrap();
            let actions: Vec<(&str, &str)> = pending
                .iter()
                .map(|i| (i.action.as_str(), i.instance.as_str()))
                .collect();
            assert_eq!(actions, vec![("create", "p-a"), ("delete", "p-b")]);

            let instance = store.instance("p-a").unwrap().unwrap();
            let event = PhaseEvent {
                node: "local.i-1".into(),
                instance_id: "i-1".into(),
                phase: PhaseName::DataDisk,
                outcome: PhaseOutcome::Failed,
                reason: Some("no disk".into()),
                error_code: Some(knit_api::ErrorCode::FailDataDiskNotFound),
                at_ms: 5,
                duration_ms: Some(3),
            };
            store.record_phase_event(&instance, &event).unwrap();
            let node = store.node("local.i-1").unwrap().unwrap();
            assert_eq!(
                node.error_code,
                Some(knit_api::ErrorCode::FailDataDiskNotFound)
            );
            assert_eq!(node.phase_outcome, Some(PhaseOutcome::Failed));
            assert_eq!(store.timeline("local.i-1").unwrap().len(), 1);
            store.remove_instance("p-a").unwrap();
            assert!(store.node("local.i-1").unwrap().is_none());
        });
    }

    #[test]
    fn a_create_is_recorded_with_its_intent_and_event_together() {
        crate::store::testing::each_store(|store| {
            store
                .add_create_intents("p", &[("p-a".into(), "t".into())])
                .unwrap();
            let intent = store.pending_intents().unwrap().remove(0);
            store
                .record_instance_created(
                    "p-a",
                    "i-9",
                    Some("10.0.0.9"),
                    intent.id,
                    "Created",
                    "made",
                )
                .unwrap();
            let instance = store.instance("p-a").unwrap().unwrap();
            assert_eq!(instance.provider_id.as_deref(), Some("i-9"));
            assert_eq!(instance.state, knit_api::state::InstanceState::Running);
            assert!(store.pending_intents().unwrap().is_empty());
            let events = store.events(10).unwrap();
            assert!(
                events.iter().any(|e| e.object_name == "p-a"
                    && e.reason == "Created"
                    && e.message == "made"),
                "{events:?}"
            );
        });
    }

    /// A create's failure is kept with the provider's kind beside its
    /// text, on the intent and on the instance, across a reopen; an error
    /// that is no provider's, a text-only state and a success clear it.
    #[test]
    fn a_failure_keeps_the_providers_kind_beside_its_text() {
        use crate::error::ServerError;
        use crate::provider_error::{ProviderError, ProviderErrorKind};
        use knit_api::state::InstanceState;
        crate::store::testing::on_both_backends(|backend| {
            let no_room: ServerError = ProviderError::new(
                "ecs",
                ProviderErrorKind::Capacity,
                "OperationDenied.NoStock",
                "RunInstances: sold out",
            )
            .into();
            {
                let store = backend.open();
                store
                    .add_create_intents("p", &[("p-a".into(), "t".into())])
                    .unwrap();
                let intent = store.pending_intents().unwrap().remove(0);
                assert_eq!(intent.last_error_kind, None);
                store.retry_intent(intent.id, 1, 0, &no_room).unwrap();
                store
                    .set_instance_failure("p-a", InstanceState::Pending, &no_room)
                    .unwrap();
            }
            let store = backend.open();
            let intent = store.pending_intents().unwrap().remove(0);
            assert_eq!(
                (intent.last_error.as_deref(), intent.last_error_kind),
                (
                    Some("provider ecs: RunInstances: sold out"),
                    Some(ProviderErrorKind::Capacity)
                )
            );
            let instance = store.instance("p-a").unwrap().unwrap();
            assert_eq!(
                (instance.last_error.as_deref(), instance.last_error_kind),
                (
                    Some("provider ecs: RunInstances: sold out"),
                    Some(ProviderErrorKind::Capacity)
                )
            );

            // The next failure is no provider's: no kind is left behind.
            let other = ServerError::Internal("NoStock in the words only".into());
            store.retry_intent(intent.id, 2, 0, &other).unwrap();
            let intent = store.pending_intents().unwrap().remove(0);
            assert_eq!(intent.last_error_kind, None);
            store
                .set_instance_state("p-a", InstanceState::Pending, Some("not initialized"))
                .unwrap();
            assert_eq!(
                store.instance("p-a").unwrap().unwrap().last_error_kind,
                None
            );

            // A success clears both.
            store
                .set_instance_failure("p-a", InstanceState::Pending, &no_room)
                .unwrap();
            store.retry_intent(intent.id, 3, 0, &no_room).unwrap();
            store
                .record_instance_created("p-a", "i-1", None, intent.id, "Created", "made")
                .unwrap();
            let instance = store.instance("p-a").unwrap().unwrap();
            assert_eq!(
                (instance.last_error, instance.last_error_kind),
                (None, None)
            );
        });
    }
}
