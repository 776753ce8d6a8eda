//! Join tokens (single use, expiring) and the enrollment of an existing
//! instance into a pool (attach) and its undoing.

use super::attach::{put_record, AttachRecord};
use super::{from_json, now_ms, to_json, word, Store};
use crate::error::{Result, ServerError};
use knit_api::state::{InstanceState, IntentAction, IntentStatus};
use knit_api::NodePool;
use knit_db::params;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JoinTokenRecord {
    pub token_id: String,
    pub instance: String,
    pub pool: String,
    pub created_ms: i64,
    pub expires_ms: i64,
    pub used_ms: Option<i64>,
}

/// What redeeming a join token found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Redeem {
    Ok { instance: String, pool: String },
    Unknown,
    Used { instance: String, used_ms: i64 },
    Expired { instance: String, expires_ms: i64 },
}

/// An existing instance joining a pool (see [`Store::enroll_attached`]).
pub struct Enrollment<'a> {
    pub name: &'a str,
    /// The pool's document after the add (count + 1, marker label).
    pub pool: &'a NodePool,
    pub provider_id: &'a str,
    pub ip: Option<&'a str>,
    pub instance_type: &'a str,
    pub state: InstanceState,
    /// How it was added, written in the same transaction as the instance
    /// row: neither is ever stored without the other.
    pub record: Option<&'a AttachRecord>,
}

impl Store {
    pub fn add_join_token(
        &self,
        token_hash: &str,
        token_id: &str,
        instance: &str,
        pool: &str,
        ttl_ms: i64,
    ) -> Result<()> {
        let now = now_ms();
        self.write(|tx| {
            tx.execute(
                "INSERT INTO join_tokens (token_hash, token_id, instance, pool, created_ms, expires_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![token_hash, token_id, instance, pool, now, now + ttl_ms],
            )?;
            Ok(())
        })
    }

    /// The (instance, pool) of a live token — unused and unexpired —
    /// without using it (checks that must pass before the token is spent).
    pub fn live_join_token(&self, token_hash: &str, now: i64) -> Result<Option<(String, String)>> {
        self.read(|tx| {
            tx.query_opt(
                "SELECT instance, pool FROM join_tokens WHERE token_hash = ?1 AND used_ms IS NULL AND expires_ms > ?2",
                params![token_hash, now],
            )?
            .map(|r| Ok((r.get(0)?, r.get(1)?)))
            .transpose()
        })
    }

    /// Single use: the first redeem of a live token wins, atomically.
    pub fn redeem_join_token(&self, token_hash: &str, now: i64) -> Result<Redeem> {
        self.write(|tx| {
            let row = tx.query_opt(
                "SELECT instance, pool, expires_ms, used_ms FROM join_tokens WHERE token_hash = ?1",
                params![token_hash],
            )?;
            let row: Option<(String, String, i64, Option<i64>)> = row
                .map(|r| -> Result<_> { Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)) })
                .transpose()?;
            Ok(match row {
                None => Redeem::Unknown,
                Some((instance, _, _, Some(used_ms))) => Redeem::Used { instance, used_ms },
                Some((instance, _, expires_ms, None)) if expires_ms <= now => Redeem::Expired {
                    instance,
                    expires_ms,
                },
                Some((instance, pool, _, None)) => {
                    tx.execute(
                        "UPDATE join_tokens SET used_ms = ?2 WHERE token_hash = ?1",
                        params![token_hash, now],
                    )?;
                    Redeem::Ok { instance, pool }
                }
            })
        })
    }

    pub fn join_tokens(&self) -> Result<Vec<JoinTokenRecord>> {
        let mut rows = self.read(|tx| {
            tx.query(
                "SELECT token_id, instance, pool, created_ms, expires_ms, used_ms FROM join_tokens ORDER BY created_ms",
                &[],
            )?
            .iter()
            .map(|r| {
                Ok(JoinTokenRecord {
                    token_id: r.get(0)?,
                    instance: r.get(1)?,
                    pool: r.get(2)?,
                    created_ms: r.get(3)?,
                    expires_ms: r.get(4)?,
                    used_ms: r.get(5)?,
                })
            })
            .collect::<Result<Vec<_>>>()
        })?;
        // Ties in the same order on both backends.
        rows.sort_by(|a, b| (a.created_ms, &a.token_id).cmp(&(b.created_ms, &b.token_id)));
        Ok(rows)
    }

    /// Records an existing instance added to a pool (attach), in one
    /// transaction: records of the same machine left Detached by an earlier
    /// removal go, the instance row (`added`), the pool's new document (its
    /// count one higher) and, when `intent` is set, a pending `attach` intent
    /// that a restarted server resumes. Returns the intent's id.
    pub fn enroll_attached(&self, e: &Enrollment<'_>, intent: bool) -> Result<Option<i64>> {
        let now = now_ms();
        let doc = to_json(e.pool)?;
        self.write(|tx| {
            let old = tx
                .query(
                    "SELECT name FROM instances WHERE provider_id = ?1 AND state = ?2",
                    params![e.provider_id, InstanceState::Detached.as_str()],
                )?
                .iter()
                .map(|r| r.get::<String>(0))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            for name in &old {
                tx.execute("DELETE FROM timeline WHERE instance = ?1", params![name])?;
                tx.execute("DELETE FROM nodes WHERE instance = ?1", params![name])?;
                tx.execute("DELETE FROM instances WHERE name = ?1", params![name])?;
            }
            tx.execute(
                "INSERT INTO instances (name, pool, provider_id, state, ip, instance_type, created_ms, updated_ms, added) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7, 1)",
                params![e.name, &e.pool.metadata.name, e.provider_id, e.state.as_str(), e.ip, e.instance_type, now],
            )?;
            if let Some(record) = e.record {
                put_record(tx, record)?;
            }
            let changed = tx.execute(
                "UPDATE pools SET doc = ?2, updated_ms = ?3 WHERE name = ?1 AND deleting = 0",
                params![&e.pool.metadata.name, &doc, now],
            )?;
            if changed == 0 {
                return Err(ServerError::NotFound {
                    kind: "pool",
                    name: e.pool.metadata.name.clone(),
                });
            }
            if !intent {
                return Ok(None);
            }
            let id: i64 = tx
                .query_one(
                    "INSERT INTO intents (action, instance, pool, release, status, created_ms, updated_ms) VALUES (?4, ?1, ?2, 0, ?5, ?3, ?3) RETURNING id",
                    params![
                        e.name,
                        &e.pool.metadata.name,
                        now,
                        IntentAction::Attach.as_str(),
                        IntentStatus::Pending.as_str()
                    ],
                )?
                .get(0)?;
            Ok(Some(id))
        })
    }

    /// Undoes an attach that failed before its node could run, in one
    /// transaction: the instance leaves the pool (`Detached`, kept, with the
    /// reason), the pool's count drops by one, pending attach intents of it
    /// end `failed`. Only an instance still counted in its pool is undone, so
    /// the count drops once: `(pool, from, to)`, or `None` when it had left.
    pub fn undo_attach(&self, name: &str, reason: &str) -> Result<Option<(String, i64, i64)>> {
        let now = now_ms();
        self.write(|tx| {
            let row: Option<(String, InstanceState)> = tx
                .query_opt(
                    "SELECT pool, state FROM instances WHERE name = ?1",
                    params![name],
                )?
                .map(|r| -> Result<_> { Ok((r.get(0)?, word(&r, 1)?)) })
                .transpose()?;
            tx.execute(
                "UPDATE intents SET status = ?4, last_error = ?2, last_error_kind = NULL, updated_ms = ?3 WHERE instance = ?1 AND action = ?5 AND status = ?6",
                params![
                    name,
                    reason,
                    now,
                    IntentStatus::Failed.as_str(),
                    IntentAction::Attach.as_str(),
                    IntentStatus::Pending.as_str()
                ],
            )?;
            let Some((pool, _)) = row.filter(|(_, st)| st.is_member()) else {
                return Ok(None);
            };
            tx.execute(
                "UPDATE instances SET state = ?2, last_error = ?3, last_error_kind = NULL, updated_ms = ?4 WHERE name = ?1",
                params![name, InstanceState::Detached.as_str(), reason, now],
            )?;
            super::instances::forget_join_credentials(tx, name)?;
            let doc: Option<String> = tx
                .query_opt("SELECT doc FROM pools WHERE name = ?1", params![&pool])?
                .map(|r| r.get(0))
                .transpose()?;
            let counts = match doc {
                Some(doc) => {
                    let mut p: NodePool = from_json(&doc)?;
                    let from = p.spec.replicas;
                    p.spec.replicas = (from - 1).max(0);
                    tx.execute(
                        "UPDATE pools SET doc = ?2, updated_ms = ?3 WHERE name = ?1",
                        params![&pool, to_json(&p)?, now],
                    )?;
                    (from, p.spec.replicas)
                }
                None => (0, 0),
            };
            Ok(Some((pool, counts.0, counts.1)))
        })
    }

    /// An added instance re-imaged and booting: `Running`, and its join
    /// timeout counts from now (not from when the attach began). Only from
    /// `Creating`: a removal decided meanwhile wins.
    pub fn set_attached_running(&self, name: &str, ip: Option<&str>) -> Result<()> {
        let now = now_ms();
        self.write(|tx| {
            tx.execute(
                "UPDATE instances SET ip = COALESCE(?2, ip), state = ?3, last_error = NULL, last_error_kind = NULL, created_ms = ?4, updated_ms = ?4 WHERE name = ?1 AND state = ?5",
                params![name, ip, InstanceState::Running.as_str(), now, InstanceState::Creating.as_str()],
            )?;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_tokens_are_single_use_and_expire() {
        crate::store::testing::each_store(|store| {
            store
                .add_join_token("h1", "abcdef", "i-1", "p", 60_000)
                .unwrap();
            store
                .add_join_token("h2", "ghijkl", "i-2", "p", -1)
                .unwrap();
            let now = now_ms();
            assert_eq!(
                store.redeem_join_token("h1", now).unwrap(),
                Redeem::Ok {
                    instance: "i-1".into(),
                    pool: "p".into()
                }
            );
            assert!(matches!(
                store.redeem_join_token("h1", now).unwrap(),
                Redeem::Used { .. }
            ));
            assert!(matches!(
                store.redeem_join_token("h2", now).unwrap(),
                Redeem::Expired { .. }
            ));
            assert_eq!(
                store.redeem_join_token("nope", now).unwrap(),
                Redeem::Unknown
            );
        });
    }

    /// Join credentials end with their instance (issue 30): a detached
    /// instance's unused join token and its report token are refused, and
    /// a released instance's join tokens are deleted with it.
    #[test]
    fn an_instance_that_left_keeps_no_join_or_report_token() {
        crate::store::testing::each_store(|store| {
            store
                .add_create_intents(
                    "p",
                    &[("p-a".into(), "t".into()), ("p-b".into(), "t".into())],
                )
                .unwrap();
            for (i, name) in ["p-a", "p-b"].iter().enumerate() {
                store
                    .add_join_token(&format!("h{i}"), &format!("id{i}"), name, "p", 60_000)
                    .unwrap();
                store
                    .set_report_token_hash(name, &format!("report-{name}"))
                    .unwrap();
                assert!(store
                    .instance_by_report_token(&format!("report-{name}"))
                    .unwrap()
                    .is_some());
            }
            let now = now_ms();
            assert!(store.live_join_token("h0", now).unwrap().is_some());

            store
                .set_instance_state("p-a", InstanceState::Detached, None)
                .unwrap();
            assert_eq!(store.redeem_join_token("h0", now).unwrap(), Redeem::Unknown);
            assert!(store
                .instance_by_report_token("report-p-a")
                .unwrap()
                .is_none());
            assert_eq!(
                store.instance("p-a").unwrap().unwrap().report_token_hash,
                None
            );

            store.remove_instance("p-b").unwrap();
            assert_eq!(store.redeem_join_token("h1", now).unwrap(), Redeem::Unknown);
            assert!(store
                .instance_by_report_token("report-p-b")
                .unwrap()
                .is_none());
            assert!(store.join_tokens().unwrap().is_empty());
        });
    }

    /// Servers sharing one PostgreSQL database redeem the same token at
    /// once: exactly one gets it (the write transactions are serializable,
    /// and a conflicting one re-runs and then sees the token used).
    #[test]
    fn a_join_token_is_redeemed_once_across_servers() {
        let backend = crate::store::testing::TestStore::postgres();
        let first = backend.open();
        let now = now_ms();
        for i in 0..5 {
            first
                .add_join_token(&format!("h{i}"), &format!("id{i}"), "i-1", "p", 60_000)
                .unwrap();
        }
        let servers: Vec<Store> = (0..4).map(|_| backend.open()).collect();
        let outcomes: Vec<Vec<Redeem>> = std::thread::scope(|scope| {
            let handles: Vec<_> = servers
                .iter()
                .map(|store| {
                    scope.spawn(move || {
                        (0..5)
                            .map(|i| store.redeem_join_token(&format!("h{i}"), now).unwrap())
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for i in 0..5 {
            let won = outcomes
                .iter()
                .filter(|o| matches!(o[i], Redeem::Ok { .. }))
                .count();
            assert_eq!(won, 1, "token h{i}: {outcomes:?}");
            assert!(outcomes
                .iter()
                .all(|o| matches!(o[i], Redeem::Ok { .. } | Redeem::Used { .. })));
        }
    }
}
