//! The attach tables: what each attach decided (one row per added
//! instance) and the options of each attach command (one row per attach
//! token).
//!
//! Whether an instance was added by the user is `instances.added`, written
//! by [`Store::enroll_attached`] and read through `InstanceRecord::added`:
//! that column is the one place every "may knit release it?" decision
//! reads. The record here says how it was added (mode, names, disks).
//!
//! Servers before these tables kept the same facts as JSON files under
//! `<state>/attach/`; the migration step that creates the tables imports
//! them once ([`import_legacy_files`]).

use super::{from_json, to_json, Store};
use crate::error::{Result, ServerError};
use crate::preflight::Mode;
use knit_db::{params, DbError, Row, Tx};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The migration step creating the attach tables; running it also imports
/// the JSON files of older servers (see `migrate`).
pub(super) const SCHEMA: &str = r#"
CREATE TABLE attach_records (
    instance TEXT PRIMARY KEY,
    provider_id TEXT NOT NULL,
    pool TEXT NOT NULL,
    mode TEXT NOT NULL,
    instance_name TEXT NOT NULL,
    keep_instance_name INTEGER NOT NULL,
    format_data_disk INTEGER NOT NULL,
    old_disks TEXT NOT NULL,
    new_disks TEXT NOT NULL,
    at_ms INTEGER NOT NULL,
    reimaged_ms INTEGER,
    new_password INTEGER NOT NULL
);
CREATE TABLE attach_tokens (
    token_id TEXT PRIMARY KEY,
    pool TEXT NOT NULL,
    keep_instance_name INTEGER NOT NULL,
    format_data_disk INTEGER NOT NULL,
    expires_ms INTEGER NOT NULL
);
"#;

/// What one attach decided, kept for the bootstrap endpoint and for users.
/// Its serde form is the JSON file older servers wrote (imported once).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachRecord {
    /// knit's instance name (the table's key).
    pub instance: String,
    pub provider_id: String,
    pub pool: String,
    pub mode: Mode,
    /// The instance's own name at the provider.
    pub instance_name: String,
    pub keep_instance_name: bool,
    pub format_data_disk: bool,
    /// Data disk ids before and after the re-image (automatic mode).
    pub old_disks: Vec<String>,
    pub new_disks: Vec<String>,
    pub at_ms: i64,
    /// When the re-image finished (automatic mode): a resumed attach whose
    /// re-image is done only finishes the bookkeeping.
    #[serde(default)]
    pub reimaged_ms: Option<i64>,
    /// A new login password was given (automatic mode). It is never
    /// stored, so an attach interrupted before its re-image cannot resume.
    #[serde(default)]
    pub new_password: bool,
}

/// The options of an attach command, kept beside its token (by token id).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachTokenOptions {
    pub pool: String,
    pub keep_instance_name: bool,
    pub format_data_disk: bool,
    pub expires_ms: i64,
}

fn mode_word(mode: Mode) -> &'static str {
    match mode {
        Mode::Automatic => "automatic",
        Mode::Manual => "manual",
    }
}

fn mode_from_word(word: &str) -> Result<Mode> {
    match word {
        "automatic" => Ok(Mode::Automatic),
        "manual" => Ok(Mode::Manual),
        other => Err(DbError::Column {
            index: 3,
            reason: format!("stored attach mode {other:?} is not one of automatic, manual"),
        }
        .into()),
    }
}

const RECORD_COLUMNS: &str = "instance, provider_id, pool, mode, instance_name, keep_instance_name, format_data_disk, old_disks, new_disks, at_ms, reimaged_ms, new_password";

fn record_row(r: &Row) -> Result<AttachRecord> {
    Ok(AttachRecord {
        instance: r.get(0)?,
        provider_id: r.get(1)?,
        pool: r.get(2)?,
        mode: mode_from_word(&r.get::<String>(3)?)?,
        instance_name: r.get(4)?,
        keep_instance_name: r.get(5)?,
        format_data_disk: r.get(6)?,
        old_disks: from_json(&r.get::<String>(7)?)?,
        new_disks: from_json(&r.get::<String>(8)?)?,
        at_ms: r.get(9)?,
        reimaged_ms: r.get(10)?,
        new_password: r.get(11)?,
    })
}

pub(super) fn put_record(tx: &mut Tx<'_>, r: &AttachRecord) -> Result<()> {
    tx.execute(
        &format!(
            "INSERT INTO attach_records ({RECORD_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)
             ON CONFLICT (instance) DO UPDATE SET provider_id = excluded.provider_id, pool = excluded.pool,
               mode = excluded.mode, instance_name = excluded.instance_name,
               keep_instance_name = excluded.keep_instance_name, format_data_disk = excluded.format_data_disk,
               old_disks = excluded.old_disks, new_disks = excluded.new_disks, at_ms = excluded.at_ms,
               reimaged_ms = excluded.reimaged_ms, new_password = excluded.new_password"
        ),
        params![
            &r.instance,
            &r.provider_id,
            &r.pool,
            mode_word(r.mode),
            &r.instance_name,
            r.keep_instance_name,
            r.format_data_disk,
            to_json(&r.old_disks)?,
            to_json(&r.new_disks)?,
            r.at_ms,
            r.reimaged_ms,
            r.new_password,
        ],
    )?;
    Ok(())
}

fn put_token_options(tx: &mut Tx<'_>, token_id: &str, o: &AttachTokenOptions) -> Result<()> {
    tx.execute(
        "INSERT INTO attach_tokens (token_id, pool, keep_instance_name, format_data_disk, expires_ms) VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (token_id) DO UPDATE SET pool = excluded.pool, keep_instance_name = excluded.keep_instance_name,
           format_data_disk = excluded.format_data_disk, expires_ms = excluded.expires_ms",
        params![
            token_id,
            &o.pool,
            o.keep_instance_name,
            o.format_data_disk,
            o.expires_ms
        ],
    )?;
    Ok(())
}

impl Store {
    /// The attach record of a knit instance, if it was added (not created).
    pub fn attach_record(&self, instance: &str) -> Result<Option<AttachRecord>> {
        let sql = format!("SELECT {RECORD_COLUMNS} FROM attach_records WHERE instance = ?1");
        self.read(|tx| {
            tx.query_opt(&sql, params![instance])?
                .as_ref()
                .map(record_row)
                .transpose()
        })
    }

    /// Writes (or replaces) the attach record of `record.instance`.
    pub fn put_attach_record(&self, record: &AttachRecord) -> Result<()> {
        self.write(|tx| put_record(tx, record))
    }

    /// Keeps the options of an attach command under its token id.
    pub fn put_attach_token_options(
        &self,
        token_id: &str,
        options: &AttachTokenOptions,
    ) -> Result<()> {
        self.write(|tx| put_token_options(tx, token_id, options))
    }

    /// The options of the attach command with token id `token_id`.
    pub fn attach_token_options(&self, token_id: &str) -> Result<Option<AttachTokenOptions>> {
        self.read(|tx| {
            tx.query_opt(
                "SELECT pool, keep_instance_name, format_data_disk, expires_ms FROM attach_tokens WHERE token_id = ?1",
                params![token_id],
            )?
            .map(|r| {
                Ok(AttachTokenOptions {
                    pool: r.get(0)?,
                    keep_instance_name: r.get(1)?,
                    format_data_disk: r.get(2)?,
                    expires_ms: r.get(3)?,
                })
            })
            .transpose()
        })
    }
}

/// Where older servers kept attach records: `attach/` beside their
/// SQLite file (a PostgreSQL datastore never had them).
pub(super) fn legacy_dir(db_file: &Path) -> std::path::PathBuf {
    db_file
        .parent()
        .unwrap_or_else(|| Path::new(""))
        .join("attach")
}

fn read_legacy<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T> {
    let bytes =
        std::fs::read(path).map_err(|e| ServerError::io(format!("read {}", path.display()), e))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ServerError::Internal(format!("{}: {e}", path.display())))
}

/// The `*.json` files of a directory (none when it does not exist).
fn json_files(dir: &Path) -> Result<Vec<std::path::PathBuf>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(ServerError::io(format!("read {}", dir.display()), e)),
    };
    let mut files = Vec::new();
    for entry in entries {
        let path = entry
            .map_err(|e| ServerError::io(format!("read {}", dir.display()), e))?
            .path();
        if path.is_file() && path.extension().is_some_and(|x| x == "json") {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// Imports the JSON files of older servers (`<state>/attach/<instance>.json`
/// and `<state>/attach/tokens/<token id>.json`) into the attach tables,
/// inside the migration's transaction, and marks their instances added
/// (the oldest stores had no `added` column). An unreadable file fails the
/// open rather than losing which machines are the user's. Returns the
/// directory imported, for [`retire_legacy_dir`] once the transaction is
/// committed.
pub(super) fn import_legacy_files(
    tx: &mut Tx<'_>,
    dir: Option<&Path>,
) -> Result<Option<std::path::PathBuf>> {
    let Some(dir) = dir else {
        return Ok(None);
    };
    if !dir.is_dir() {
        return Ok(None);
    }
    for path in json_files(dir)? {
        let record: AttachRecord = read_legacy(&path)?;
        put_record(tx, &record)?;
        tx.execute(
            "UPDATE instances SET added = 1 WHERE name = ?1",
            params![record.instance],
        )?;
    }
    for path in json_files(&dir.join("tokens"))? {
        let Some(token_id) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        let options: AttachTokenOptions = read_legacy(&path)?;
        put_token_options(tx, token_id, &options)?;
    }
    Ok(Some(dir.to_path_buf()))
}

/// After the import is committed the directory is renamed to
/// `attach.imported` (kept, not removed: the user's records stay readable
/// by hand), so nothing reads the files again. A failed rename is harmless
/// (the migration does not run twice), so it is only logged.
pub(super) fn retire_legacy_dir(dir: &Path) {
    let to = dir.with_file_name("attach.imported");
    if let Err(e) = std::fs::rename(dir, &to) {
        tracing::warn!(from = %dir.display(), to = %to.display(), error = %e, "renaming the imported attach records failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(instance: &str, mode: Mode) -> AttachRecord {
        AttachRecord {
            instance: instance.into(),
            provider_id: "i-1".into(),
            pool: "workers".into(),
            mode,
            instance_name: "own-db".into(),
            keep_instance_name: true,
            format_data_disk: false,
            old_disks: vec!["d-1".into(), "d-2".into()],
            new_disks: vec!["d-3".into()],
            at_ms: 7,
            reimaged_ms: Some(9),
            new_password: true,
        }
    }

    /// The attach record is written with the instance row or not at all
    /// (an enrollment into a missing pool leaves neither).
    #[test]
    fn the_record_is_enrolled_with_its_instance() {
        use crate::store::Enrollment;
        use knit_api::state::InstanceState;
        use knit_api::{NodePool, NodePoolSpec};
        crate::store::testing::each_store(|store| {
            let pool = NodePool::new("workers", NodePoolSpec::default());
            let r = record("workers-abcde", Mode::Manual);
            let enrollment = Enrollment {
                name: "workers-abcde",
                pool: &pool,
                provider_id: "i-1",
                ip: None,
                instance_type: "t",
                state: InstanceState::Running,
                record: Some(&r),
            };
            assert!(store.enroll_attached(&enrollment, false).is_err());
            assert_eq!(store.attach_record("workers-abcde").unwrap(), None);
            assert!(store.instance("workers-abcde").unwrap().is_none());
            store.insert_pool(&pool).unwrap();
            store.enroll_attached(&enrollment, false).unwrap();
            assert_eq!(store.attach_record("workers-abcde").unwrap(), Some(r));
            assert!(store.instance("workers-abcde").unwrap().unwrap().added);
        });
    }

    #[test]
    fn records_and_token_options_round_trip() {
        crate::store::testing::each_store(|store| {
            assert_eq!(store.attach_record("workers-abcde").unwrap(), None);
            let mut r = record("workers-abcde", Mode::Manual);
            store.put_attach_record(&r).unwrap();
            assert_eq!(
                store.attach_record("workers-abcde").unwrap(),
                Some(r.clone())
            );
            r.reimaged_ms = None;
            r.mode = Mode::Automatic;
            store.put_attach_record(&r).unwrap();
            assert_eq!(store.attach_record("workers-abcde").unwrap(), Some(r));
            let o = AttachTokenOptions {
                pool: "workers".into(),
                keep_instance_name: false,
                format_data_disk: true,
                expires_ms: 42,
            };
            store.put_attach_token_options("abc123", &o).unwrap();
            assert_eq!(store.attach_token_options("abc123").unwrap(), Some(o));
            assert_eq!(store.attach_token_options("zzz999").unwrap(), None);
        });
    }

    /// The JSON older servers wrote: the import reads exactly this form.
    #[test]
    fn the_legacy_json_form_is_kept() {
        let r = record("workers-abcde", Mode::Manual);
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            serde_json::json!({
                "instance": "workers-abcde", "providerId": "i-1", "pool": "workers",
                "mode": "manual", "instanceName": "own-db", "keepInstanceName": true,
                "formatDataDisk": false, "oldDisks": ["d-1", "d-2"], "newDisks": ["d-3"],
                "atMs": 7, "reimagedMs": 9, "newPassword": true,
            })
        );
    }

    /// A store from before the attach tables, with the files its server
    /// wrote: opened, the records and token options are in the tables, the
    /// instances marked added, and the directory renamed.
    #[test]
    fn the_files_of_older_servers_are_imported_once() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("knit.db");
        let version = super::super::MIGRATIONS
            .iter()
            .position(|sql| *sql == SCHEMA)
            .unwrap();
        {
            // The database as an older server left it, before this step.
            let old = knit_db::Db::open(
                &knit_db::Datastore::Sqlite(db.clone()),
                knit_db::Limits::default(),
            )
            .unwrap();
            old.migrate(
                super::super::COMPONENT,
                &super::super::MIGRATIONS[..version],
                |_, _| Ok::<_, DbError>(()),
            )
            .unwrap();
            old.write(|tx| {
                tx.execute(
                    "INSERT INTO instances (name, pool, provider_id, state, instance_type, created_ms, updated_ms) VALUES ('workers-abcde', 'workers', 'i-1', 'Running', 't', 0, 0)",
                    &[],
                )
            })
            .unwrap();
        }
        let attach = dir.path().join("attach");
        std::fs::create_dir_all(attach.join("tokens")).unwrap();
        let r = record("workers-abcde", Mode::Manual);
        std::fs::write(
            attach.join("workers-abcde.json"),
            serde_json::to_vec_pretty(&r).unwrap(),
        )
        .unwrap();
        std::fs::write(
            attach.join("tokens").join("abc123.json"),
            r#"{"pool":"workers","keepInstanceName":true,"formatDataDisk":false,"expiresMs":5}"#,
        )
        .unwrap();
        let store = Store::open(&db).unwrap();
        assert_eq!(store.attach_record("workers-abcde").unwrap(), Some(r));
        assert!(store.instance("workers-abcde").unwrap().unwrap().added);
        assert_eq!(
            store.attach_token_options("abc123").unwrap().unwrap().pool,
            "workers"
        );
        assert!(!attach.exists());
        assert!(dir
            .path()
            .join("attach.imported/workers-abcde.json")
            .exists());
    }
}
