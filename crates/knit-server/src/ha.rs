//! Several knit servers on one datastore (PostgreSQL). Every server serves
//! the API; one, the leader, runs the work that must happen once: the
//! reconciler (creates, deletes, repair) and the recovery of snapshot
//! builds whose server is gone. Leadership is a lease in the datastore
//! (`store::leader`), renewed every third of its time; the leader's work
//! runs under a [`crate::store::Fence`] that every write of it checks. On
//! SQLite there is one server, which takes the lease at once and keeps it.

use crate::control::ControlPlane;
use crate::error::Result;
use crate::store::{now_ms, Lease, ServerRecord};
// The fence leader work runs under is the store's, which checks it in
// every write; here is where leader work is put under it.
pub use crate::store::fence::{fenced, spawn};
use std::sync::Arc;
use std::time::Duration;

impl ControlPlane {
    /// Heartbeat and lease: every third of the lease time, record this
    /// server alive and take or renew the lease. Becoming leader wakes the
    /// reconciler and recovers snapshot builds whose server is gone.
    pub async fn run_leadership(self: Arc<Self>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        let ttl = self.settings.lease_ttl;
        let exclusive = !self.settings.datastore.is_shared();
        let me = &self.leadership;
        let mut led = false;
        loop {
            match self.lead_once(ttl, exclusive) {
                Ok(Some(lease)) => {
                    if !led || me.fence().map(|f| f.epoch) != Some(lease.epoch) {
                        tracing::info!(server = %me.id, epoch = lease.epoch, "this server leads");
                        me.set(Some(lease.clone()));
                        led = true;
                        self.on_leading();
                    } else {
                        me.set(Some(lease));
                        // Builds of a server that ended since the last pass.
                        if let Err(e) = crate::snapshot::recover(&self) {
                            tracing::error!(error = %e, "recovering snapshot builds failed");
                        }
                    }
                }
                Ok(None) => {
                    if led {
                        tracing::warn!(server = %me.id, "another server took the lead");
                    }
                    me.set(None);
                    led = false;
                }
                // The lease stays as it was: it lapses by its time, and
                // `fence()` stops new leader work then.
                Err(e) => tracing::warn!(error = %e, "heartbeat or leader lease failed"),
            }
            tokio::select! {
                _ = shutdown.changed() => break,
                _ = tokio::time::sleep(ttl / 3) => {}
            }
        }
        // A clean stop hands the lead over at once.
        me.set(None);
        if let Err(e) = self
            .store
            .resign(&me.id)
            .and_then(|_| self.store.forget_servers(0, Some(&me.id)))
        {
            tracing::warn!(error = %e, "giving up the leader lease at shutdown failed");
        }
    }

    fn lead_once(&self, ttl: Duration, exclusive: bool) -> Result<Option<Lease>> {
        let me = &self.leadership;
        let now = now_ms();
        self.store.heartbeat_server(&ServerRecord {
            id: me.id.clone(),
            address: self.advertise_url.clone(),
            hostname: me.hostname.clone(),
            pid: std::process::id(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            started_ms: me.started_ms,
            heartbeat_ms: now,
        })?;
        // Rows of servers silent for ten lease times are dropped.
        self.store
            .forget_servers(now - 10 * ttl.as_millis() as i64, None)?;
        self.store
            .try_lead(&me.id, now, ttl.as_millis() as i64, exclusive)
    }

    fn on_leading(self: &Arc<Self>) {
        let _ = self.store.add_event(
            knit_api::state::EventType::Normal,
            "Server",
            &self.leadership.id,
            "LeaderElected",
            &format!("{} leads ({})", self.leadership.id, self.advertise_url),
        );
        if let Err(e) = crate::snapshot::recover(self) {
            tracing::error!(error = %e, "recovering snapshot builds failed");
        }
        self.wake();
    }

    /// `GET /api/v1/servers`: every server row, the lease holder marked.
    pub fn server_views(&self) -> Result<Vec<knit_api::views::ServerView>> {
        let lease = self.store.lease()?;
        let horizon = now_ms() - self.settings.lease_ttl.as_millis() as i64;
        Ok(self
            .store
            .servers()?
            .into_iter()
            .map(|s| {
                let held = lease
                    .as_ref()
                    .filter(|l| l.holder == s.id && l.expires_ms > now_ms());
                knit_api::views::ServerView {
                    leader: held.is_some(),
                    leader_since_ms: held.map(|l| l.acquired_ms),
                    epoch: held.map(|l| l.epoch),
                    stale: s.heartbeat_ms < horizon,
                    id: s.id,
                    address: s.address,
                    hostname: s.hostname,
                    pid: s.pid,
                    version: s.version,
                    started_ms: s.started_ms,
                    heartbeat_ms: s.heartbeat_ms,
                }
            })
            .collect())
    }

    /// Servers that heartbeated within the lease time (this one included;
    /// on SQLite only this one: the state directory is its alone).
    pub fn live_servers(&self) -> Result<Vec<String>> {
        if !self.settings.datastore.is_shared() {
            return Ok(vec![self.leadership.id.clone()]);
        }
        let horizon = now_ms() - self.settings.lease_ttl.as_millis() as i64;
        Ok(self
            .store
            .servers()?
            .into_iter()
            .filter(|s| s.heartbeat_ms >= horizon || s.id == self.leadership.id)
            .map(|s| s.id)
            .collect())
    }
}

/// The files every server must share, by their name in the datastore:
/// (name, path, mode, secret). Secrets are stored sealed; the CA
/// certificate is public and stays readable.
fn shared_files(
    settings: &crate::control::Settings,
) -> [(&'static str, std::path::PathBuf, u32, bool); 3] {
    [
        ("ca.pem", settings.pki_dir().join("ca.pem"), 0o644, false),
        ("ca.key", settings.pki_dir().join("ca.key"), 0o600, true),
        ("admin-token", settings.admin_token_path(), 0o600, true),
    ]
}

/// The key that seals the shared secrets: on a shared datastore a server
/// without one refuses to start (it could neither read the secrets the
/// others sealed nor store its own but in clear).
fn sealing_key(
    store: &crate::store::Store,
    settings: &crate::control::Settings,
) -> Result<crate::sealed::SecretsKey> {
    use crate::sealed::{SealError, SecretsKey};
    match &settings.secrets_key_file {
        Some(path) => Ok(SecretsKey::load(path)?),
        None => {
            let stored: Vec<&str> = shared_files(settings)
                .iter()
                .filter(|(_, _, _, secret)| *secret)
                .map(|(name, ..)| *name)
                .collect();
            let mut names = Vec::new();
            for name in stored {
                if store.stored_secret(name)?.is_some() {
                    names.push(name);
                }
            }
            let names = if names.is_empty() {
                "none yet".to_string()
            } else {
                names.join(", ")
            };
            Err(SealError::KeyMissing { names }.into())
        }
    }
}

/// Before the CA and admin token are loaded: the ones other servers of
/// this datastore already use replace any local copy. Only on a shared
/// datastore (SQLite's state is this directory's own), where the secrets
/// are sealed with the key of `--secrets-key-file`: a server without the
/// key, or with another, refuses to start here, before it writes anything
/// (locally or to the datastore). Rows stored in clear by a release
/// before sealing are sealed now. Returns the key for [`publish_secrets`].
pub fn adopt_shared_secrets(
    store: &crate::store::Store,
    settings: &crate::control::Settings,
) -> Result<Option<crate::sealed::SecretsKey>> {
    if !settings.datastore.is_shared() {
        return Ok(None);
    }
    let key = sealing_key(store, settings)?;
    // Every value opened first: a wrong key changes nothing.
    let mut found = Vec::new();
    for (name, path, mode, secret) in shared_files(settings) {
        if let Some(stored) = store.stored_secret(name)? {
            let opened = if secret {
                key.open(name, &stored)?
            } else {
                crate::sealed::Opened {
                    value: stored.clone(),
                    was_clear: false,
                }
            };
            found.push((name, path, mode, stored, opened));
        }
    }
    for (name, path, mode, stored, opened) in found {
        write_if_different(&path, &opened.value, mode)?;
        if opened.was_clear {
            let sealed = key.seal(name, &opened.value)?;
            if store.replace_secret(name, &stored, &sealed)? {
                tracing::info!(
                    secret = name,
                    key = key.id(),
                    "shared secret stored in clear: sealed"
                );
            }
        }
    }
    Ok(Some(key))
}

/// After they are loaded (or made): offers this server's to the datastore
/// (sealed with `key`); `true` when another server's were there first and
/// were written here instead (the caller loads them again).
pub fn publish_secrets(
    store: &crate::store::Store,
    settings: &crate::control::Settings,
    key: Option<&crate::sealed::SecretsKey>,
) -> Result<bool> {
    if !settings.datastore.is_shared() {
        return Ok(false);
    }
    let owned;
    let key = match key {
        Some(k) => k,
        None => {
            owned = sealing_key(store, settings)?;
            &owned
        }
    };
    let mut replaced = false;
    for (name, path, mode, secret) in shared_files(settings) {
        let local = std::fs::read_to_string(&path)
            .map_err(|e| crate::error::ServerError::io(format!("read {}", path.display()), e))?;
        let offer = if secret {
            key.seal(name, &local)?
        } else {
            local
        };
        let stored = store.shared_secret(name, &offer)?;
        let value = if secret {
            key.open(name, &stored)?.value
        } else {
            stored
        };
        replaced |= write_if_different(&path, &value, mode)?;
    }
    Ok(replaced)
}

fn write_if_different(path: &std::path::Path, value: &str, mode: u32) -> Result<bool> {
    if std::fs::read_to_string(path).is_ok_and(|v| v == value) {
        return Ok(false);
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| crate::error::ServerError::io(format!("create {}", dir.display()), e))?;
    }
    knit_os::durable::write(path, value.as_bytes(), mode)?;
    Ok(true)
}
