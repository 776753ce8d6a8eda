//! The servers sharing the datastore, the one leader lease among them, and
//! the secrets they must share (the CA, the admin token). On SQLite there
//! is one server and it always leads; on PostgreSQL the lease decides.
//!
//! Fencing: every write of the leader's work runs with the lease it was
//! started under (`fence::Fence`), and `Store::write` first checks, in
//! the same transaction, that this lease is still the current one. A
//! leader paused past its lease (SIGSTOP, a long GC-like stall, a network
//! cut) that wakes up finds a newer epoch and its write is refused.

use super::{now_ms, Store};
use crate::error::{Result, ServerError};
use knit_db::{params, Backend, Row, Tx};

/// The tables of this module (one migration step).
pub const SCHEMA: &str = r#"
CREATE TABLE servers (
    id TEXT PRIMARY KEY,
    address TEXT NOT NULL,
    hostname TEXT NOT NULL,
    pid INTEGER NOT NULL,
    version TEXT NOT NULL,
    started_ms INTEGER NOT NULL,
    heartbeat_ms INTEGER NOT NULL
);
CREATE TABLE leader_lease (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    holder TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    acquired_ms INTEGER NOT NULL,
    expires_ms INTEGER NOT NULL
);
CREATE TABLE shared_secrets (
    name TEXT PRIMARY KEY,
    value TEXT NOT NULL,
    created_ms INTEGER NOT NULL
);
ALTER TABLE snapshot_builds ADD COLUMN owner TEXT;
"#;

/// The leader lease as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub holder: String,
    pub epoch: i64,
    pub acquired_ms: i64,
    pub expires_ms: i64,
}

/// One server's row: who it is and when it was last alive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerRecord {
    pub id: String,
    pub address: String,
    pub hostname: String,
    pub pid: u32,
    pub version: String,
    pub started_ms: i64,
    pub heartbeat_ms: i64,
}

fn lease_row(r: &Row) -> std::result::Result<Lease, knit_db::DbError> {
    Ok(Lease {
        holder: r.get(0)?,
        epoch: r.get(1)?,
        acquired_ms: r.get(2)?,
        expires_ms: r.get(3)?,
    })
}

const LEASE_COLUMNS: &str =
    "SELECT holder, epoch, acquired_ms, expires_ms FROM leader_lease WHERE id = 1";

impl Store {
    /// Records that server `s` is alive (its row is made at its first call).
    pub fn heartbeat_server(&self, s: &ServerRecord) -> Result<()> {
        self.write_unfenced(|tx| {
            tx.execute(
                "INSERT INTO servers (id, address, hostname, pid, version, started_ms, heartbeat_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) \
                 ON CONFLICT (id) DO UPDATE SET address = excluded.address, heartbeat_ms = excluded.heartbeat_ms",
                params![&s.id, &s.address, &s.hostname, s.pid, &s.version, s.started_ms, s.heartbeat_ms],
            )?;
            Ok(())
        })
    }

    /// Forgets server rows not heard of since `before_ms` (they are shown
    /// as stale until then), and this server's own row at a clean stop.
    pub fn forget_servers(&self, before_ms: i64, also: Option<&str>) -> Result<()> {
        self.write_unfenced(|tx| {
            tx.execute(
                "DELETE FROM servers WHERE heartbeat_ms < ?1 OR id = ?2",
                params![before_ms, also],
            )?;
            Ok(())
        })
    }

    pub fn servers(&self) -> Result<Vec<ServerRecord>> {
        self.read(|tx| {
            tx.query(
                "SELECT id, address, hostname, pid, version, started_ms, heartbeat_ms FROM servers ORDER BY started_ms, id",
                &[],
            )?
            .iter()
            .map(|r| {
                Ok(ServerRecord {
                    id: r.get(0)?,
                    address: r.get(1)?,
                    hostname: r.get(2)?,
                    pid: r.get(3)?,
                    version: r.get(4)?,
                    started_ms: r.get(5)?,
                    heartbeat_ms: r.get(6)?,
                })
            })
            .collect()
        })
    }

    pub fn lease(&self) -> Result<Option<Lease>> {
        self.read(|tx| {
            Ok(tx
                .query_opt(LEASE_COLUMNS, &[])?
                .map(|r| lease_row(&r))
                .transpose()?)
        })
    }

    /// Takes or renews the leader lease for `holder` until `now + ttl` (for
    /// good on an `exclusive` datastore, below).
    /// Renewal keeps the epoch; taking it (free, expired, or `exclusive`:
    /// the datastore is ours alone, as SQLite in our state directory is)
    /// raises it, which fences every write made under an older one — also
    /// our own from before a lapse. `None`: another server holds it.
    pub fn try_lead(
        &self,
        holder: &str,
        now: i64,
        ttl_ms: i64,
        exclusive: bool,
    ) -> Result<Option<Lease>> {
        self.write_unfenced(|tx| {
            let current = tx
                .query_opt(LEASE_COLUMNS, &[])?
                .map(|r| lease_row(&r))
                .transpose()?;
            // On a datastore ours alone nobody can take the lease over, so
            // it does not lapse: a renewal a loaded host delays past the
            // lease time would otherwise raise the epoch and fail all leader
            // work in flight (measured at 1,000 nodes joining: seven lapses
            // in three minutes, thousands of intents failed and retried).
            let expires = if exclusive { i64::MAX } else { now + ttl_ms };
            let lease = match current {
                None => {
                    tx.execute(
                        "INSERT INTO leader_lease (id, holder, epoch, acquired_ms, expires_ms) VALUES (1, ?1, 1, ?2, ?3)",
                        params![holder, now, expires],
                    )?;
                    Lease {
                        holder: holder.into(),
                        epoch: 1,
                        acquired_ms: now,
                        expires_ms: expires,
                    }
                }
                Some(l) if l.holder == holder && l.expires_ms > now => {
                    tx.execute(
                        "UPDATE leader_lease SET expires_ms = ?1 WHERE id = 1",
                        params![expires],
                    )?;
                    Lease {
                        expires_ms: expires,
                        ..l
                    }
                }
                Some(l) if l.expires_ms <= now || exclusive => {
                    tx.execute(
                        "UPDATE leader_lease SET holder = ?1, epoch = ?2, acquired_ms = ?3, expires_ms = ?4 WHERE id = 1",
                        params![holder, l.epoch + 1, now, expires],
                    )?;
                    Lease {
                        holder: holder.into(),
                        epoch: l.epoch + 1,
                        acquired_ms: now,
                        expires_ms: expires,
                    }
                }
                Some(_) => return Ok(None),
            };
            Ok(Some(lease))
        })
    }

    /// Gives the lease up at a clean stop, so another server takes over at
    /// its next try instead of after the lease time.
    pub fn resign(&self, holder: &str) -> Result<()> {
        self.write_unfenced(|tx| {
            tx.execute(
                "UPDATE leader_lease SET expires_ms = 0 WHERE id = 1 AND holder = ?1",
                params![holder],
            )?;
            Ok(())
        })
    }

    /// The secret `name` all servers share: the one stored, or `offer`
    /// stored now if there is none yet (the first server to start wins).
    pub fn shared_secret(&self, name: &str, offer: &str) -> Result<String> {
        self.write_unfenced(|tx| {
            tx.execute(
                "INSERT INTO shared_secrets (name, value, created_ms) VALUES (?1, ?2, ?3) ON CONFLICT (name) DO NOTHING",
                params![name, offer, now_ms()],
            )?;
            Ok(tx
                .query_one(
                    "SELECT value FROM shared_secrets WHERE name = ?1",
                    params![name],
                )?
                .get(0)?)
        })
    }

    /// Replaces `name`'s stored value when it is still `old` (sealing a row
    /// stored in clear: of two servers doing it at once, one wins and the
    /// other's equal secret is left unwritten); whether it was replaced.
    pub fn replace_secret(&self, name: &str, old: &str, new: &str) -> Result<bool> {
        self.write_unfenced(|tx| {
            Ok(tx.execute(
                "UPDATE shared_secrets SET value = ?3 WHERE name = ?1 AND value = ?2",
                params![name, old, new],
            )? == 1)
        })
    }

    /// The stored secret `name`, if any.
    pub fn stored_secret(&self, name: &str) -> Result<Option<String>> {
        self.read(|tx| {
            Ok(tx
                .query_opt(
                    "SELECT value FROM shared_secrets WHERE name = ?1",
                    params![name],
                )?
                .map(|r| r.get(0))
                .transpose()?)
        })
    }

    /// Which server runs snapshot build `id` (the one that accepted it).
    pub fn set_build_owner(&self, id: &str, owner: &str) -> Result<()> {
        self.write_unfenced(|tx| {
            tx.execute(
                "UPDATE snapshot_builds SET owner = ?2 WHERE id = ?1",
                params![id, owner],
            )?;
            Ok(())
        })
    }

    /// The server running build `id`, if recorded.
    pub fn build_owner(&self, id: &str) -> Result<Option<String>> {
        self.read(|tx| {
            Ok(tx
                .query_opt(
                    "SELECT owner FROM snapshot_builds WHERE id = ?1",
                    params![id],
                )?
                .map(|r| r.get::<Option<String>>(0))
                .transpose()?
                .flatten())
        })
    }
}

/// Refuses the transaction unless `holder` still holds the lease at
/// `epoch`. On PostgreSQL the row is read FOR SHARE: a takeover waits for
/// this transaction, and this transaction sees any takeover committed
/// before it (or is re-run after a serialization conflict).
pub(super) fn check_fence(tx: &mut Tx<'_>, holder: &str, epoch: i64) -> Result<()> {
    let sql = match tx.backend() {
        Backend::Postgres => "SELECT 1 FROM leader_lease WHERE id = 1 AND holder = ?1 AND epoch = ?2 AND expires_ms > ?3 FOR SHARE",
        Backend::Sqlite => "SELECT 1 FROM leader_lease WHERE id = 1 AND holder = ?1 AND epoch = ?2 AND expires_ms > ?3",
    };
    if tx
        .query_opt(sql, params![holder, epoch, now_ms()])?
        .is_none()
    {
        return Err(ServerError::Fenced { epoch });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::testing::on_both_backends;
    use super::*;
    use crate::ha::fenced;
    use crate::store::Fence;
    use knit_api::state::EventType;

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(f)
    }

    /// A write of leader work under `fence`.
    fn leader_write(store: &Store, fence: &Fence) -> Result<()> {
        block_on(fenced(fence.clone(), async {
            store.add_event(EventType::Normal, "Pool", "p", "Work", "by the leader")
        }))
        .map(|_| ())
    }

    #[test]
    fn one_leader_at_a_time_and_a_lapsed_one_is_fenced() {
        on_both_backends(|backend| {
            let a = backend.open();
            let b = backend.open();
            let lease_a = a
                .try_lead("a", now_ms(), 400, false)
                .unwrap()
                .expect("a free lease is taken");
            assert_eq!(lease_a.epoch, 1);
            assert_eq!(b.try_lead("b", now_ms(), 400, false).unwrap(), None);
            // Renewal keeps the epoch.
            let renewed = a.try_lead("a", now_ms(), 400, false).unwrap().unwrap();
            assert_eq!(renewed.epoch, 1);
            let fence_a = Fence {
                holder: "a".into(),
                epoch: 1,
            };
            leader_write(&a, &fence_a).expect("the leader writes");

            // a stalls past its lease (as under SIGSTOP); b takes the lead.
            std::thread::sleep(std::time::Duration::from_millis(500));
            let lease_b = b
                .try_lead("b", now_ms(), 60_000, false)
                .unwrap()
                .expect("an expired lease is taken");
            assert_eq!(lease_b.epoch, 2);
            let err = leader_write(&a, &fence_a).unwrap_err();
            assert!(
                matches!(err, ServerError::Fenced { epoch: 1 }),
                "{}: {err}",
                backend.name
            );
            assert_eq!(err.code(), "NotLeader");
            // a waking up does not get the lease back while b holds it.
            assert_eq!(a.try_lead("a", now_ms(), 400, false).unwrap(), None);
            leader_write(
                &b,
                &Fence {
                    holder: "b".into(),
                    epoch: 2,
                },
            )
            .expect("the new leader writes");
            // Work that is no leader's (API writes, heartbeats) is not fenced.
            a.add_event(EventType::Normal, "Pool", "p", "Api", "any server")
                .unwrap();
            // A clean stop hands over at once.
            b.resign("b").unwrap();
            assert_eq!(
                a.try_lead("a", now_ms(), 400, false)
                    .unwrap()
                    .unwrap()
                    .epoch,
                3
            );
        });
    }

    #[test]
    fn an_exclusive_datastore_is_led_at_once() {
        on_both_backends(|backend| {
            let store = backend.open();
            store
                .try_lead("old", now_ms(), 60_000, false)
                .unwrap()
                .unwrap();
            let lease = store
                .try_lead("new", now_ms(), 60_000, true)
                .unwrap()
                .expect("exclusive: taken over");
            assert_eq!(lease.epoch, 2);
        });
    }

    #[test]
    fn an_exclusive_lease_does_not_lapse() {
        on_both_backends(|backend| {
            let store = backend.open();
            let now = now_ms();
            let lease = store.try_lead("me", now, 400, true).unwrap().unwrap();
            assert_eq!(lease.expires_ms, i64::MAX);
            // A renewal an hour late keeps the epoch: the work in flight
            // under it is not fenced.
            let later = store
                .try_lead("me", now + 3_600_000, 400, true)
                .unwrap()
                .unwrap();
            assert_eq!(later.epoch, lease.epoch);
            // A shared datastore's lease still lapses by its time.
            let other = backend.open();
            other.resign("me").unwrap();
            let shared = other.try_lead("a", now, 400, false).unwrap().unwrap();
            assert_eq!(shared.expires_ms, now + 400);
        });
    }

    #[test]
    fn racing_servers_get_one_lease() {
        on_both_backends(|backend| {
            let winners: Vec<bool> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..4)
                    .map(|i| {
                        let store = backend.open();
                        s.spawn(move || {
                            store
                                .try_lead(&format!("s{i}"), now_ms(), 60_000, false)
                                .unwrap()
                                .is_some()
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            assert_eq!(
                winners.iter().filter(|w| **w).count(),
                1,
                "{}: {winners:?}",
                backend.name
            );
        });
    }

    #[test]
    fn the_first_secret_offered_is_everyones() {
        on_both_backends(|backend| {
            let store = backend.open();
            assert_eq!(store.stored_secret("admin-token").unwrap(), None);
            assert_eq!(store.shared_secret("admin-token", "one").unwrap(), "one");
            assert_eq!(store.shared_secret("admin-token", "two").unwrap(), "one");
            let rec = ServerRecord {
                id: "s1".into(),
                address: "https://10.0.0.1:7443".into(),
                hostname: "h".into(),
                pid: 42,
                version: "0.1.0".into(),
                started_ms: 1,
                heartbeat_ms: 5,
            };
            store.heartbeat_server(&rec).unwrap();
            store
                .heartbeat_server(&ServerRecord {
                    heartbeat_ms: 9,
                    ..rec.clone()
                })
                .unwrap();
            assert_eq!(store.servers().unwrap()[0].heartbeat_ms, 9);
            store.forget_servers(10, None).unwrap();
            assert!(store.servers().unwrap().is_empty());
        });
    }
}
