//! The undo ledger: each change `init` makes to the machine outside the
//! agent's own state directory (`/var/lib/knit`) is written down here
//! before it is made, so that `knit-agent reset --undo` (`undo.rs`) can put
//! the machine back as it was — what a manual attach whose join failed does.
//!
//! Recorded: files written (with a copy of what was there before, if
//! anything), directories that did not exist (removed with their content:
//! everything in them came after), mounts, services started, kernel
//! settings written live (with their previous value). Not recorded, and
//! so not undone: packages installed by the OS package manager, kernel
//! modules loaded, a blank data disk the agent formatted (its filesystem
//! stays; it held no data), the agent's own log files under `/var/log`
//! (kept for diagnosis).
//!
//! Below `Host`, which notes every file and directory it writes here
//! first: the ledger knows only the tree's root and its own lock.

use crate::error::{AgentError, Context, Result};
use crate::files::{under, write_atomic};
use knit_api::ErrorCode;
use serde::{Deserialize, Serialize};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

/// The agent's own state directory: never recorded, removed by the undo.
pub const STATE_DIR: &str = "/var/lib/knit";
pub const LEDGER_DIR: &str = "/var/lib/knit/undo";
pub const LEDGER_FILE: &str = "/var/lib/knit/undo/ledger.json";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Change {
    /// A file written. `backup`: the file (under `LEDGER_DIR`) holding what
    /// was there before, with its mode; `None`: there was no file.
    File {
        path: String,
        backup: Option<String>,
        mode: Option<u32>,
    },
    /// A directory that did not exist before the agent made it.
    Dir {
        path: String,
    },
    Mount {
        target: String,
    },
    Service {
        name: String,
    },
    /// A live kernel setting (`/proc/sys/…`, sysfs) and its previous value.
    Kernel {
        path: String,
        previous: String,
    },
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ledger {
    pub changes: Vec<Change>,
}

fn is_own(abs: &str) -> bool {
    abs == STATE_DIR || abs.starts_with(&format!("{STATE_DIR}/"))
}

impl Ledger {
    /// The ledger of the tree at `root` (empty when there is none).
    pub fn load(root: &Path) -> Result<Ledger> {
        let path = under(root, LEDGER_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).context(ErrorCode::FailJournal, || {
                format!("undo ledger {} is unreadable", path.display())
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Ledger::default()),
            Err(e) => Err(AgentError::new(
                ErrorCode::FailJournal,
                format!("read {}: {e}", path.display()),
            )),
        }
    }

    fn save(&self, root: &Path) -> Result<()> {
        let text = serde_json::to_vec_pretty(self).context(ErrorCode::FailJournal, || {
            "encode the undo ledger".to_string()
        })?;
        write_atomic(&under(root, LEDGER_FILE), &text, 0o600)
    }

    fn has(&self, change: &Change) -> bool {
        self.changes.iter().any(|c| match (c, change) {
            (Change::File { path: a, .. }, Change::File { path: b, .. }) => a == b,
            (Change::Kernel { path: a, .. }, Change::Kernel { path: b, .. }) => a == b,
            (a, b) => a == b,
        })
    }

    /// Inside a directory the agent made: removing that removes this too.
    fn covered(&self, abs: &str) -> bool {
        self.changes.iter().any(|c| match c {
            Change::Dir { path } => abs == path || abs.starts_with(&format!("{path}/")),
            _ => false,
        })
    }
}

/// The topmost missing directory on the way to `abs` (itself included).
fn topmost_missing(root: &Path, abs: &str) -> Option<String> {
    let mut missing = None;
    let mut current = Path::new(abs);
    while current != Path::new("/") {
        if under(root, &current.to_string_lossy()).exists() {
            break;
        }
        missing = Some(current.to_string_lossy().into_owned());
        current = current.parent()?;
    }
    missing
}

/// The ledger of one tree (`--root`): where it lives, and the lock that
/// serializes its updates.
pub struct UndoLedger {
    root: PathBuf,
    lock: Mutex<()>,
}

impl UndoLedger {
    pub fn new(root: &Path) -> UndoLedger {
        UndoLedger {
            root: root.to_path_buf(),
            lock: Mutex::new(()),
        }
    }

    /// Held while the ledger is read and rewritten.
    fn lock(&self) -> MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn path(&self, abs: &str) -> PathBuf {
        under(&self.root, abs)
    }

    /// Records that `abs` (a file) is about to be written.
    pub fn note_file(&self, abs: &str) -> Result<()> {
        if is_own(abs) {
            return Ok(());
        }
        let _lock = self.lock();
        let mut ledger = Ledger::load(&self.root)?;
        if ledger.covered(abs)
            || ledger.has(&Change::File {
                path: abs.to_string(),
                backup: None,
                mode: None,
            })
        {
            return Ok(());
        }
        let path = self.path(abs);
        let change = match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_file() => {
                let name = format!("files/{}", ledger.changes.len());
                let bytes = std::fs::read(&path)
                    .context(ErrorCode::FailJournal, || format!("back up {abs}"))?;
                write_atomic(&self.path(&format!("{LEDGER_DIR}/{name}")), &bytes, 0o600)?;
                Change::File {
                    path: abs.to_string(),
                    backup: Some(name),
                    mode: Some(meta.permissions().mode() & 0o7777),
                }
            }
            // A symlink or something else: not ours to replace blindly; keep
            // what it was by recording no backup only when nothing was there.
            Ok(_) => return Ok(()),
            Err(_) => {
                if let Some(parent) = Path::new(abs).parent() {
                    if let Some(dir) = topmost_missing(&self.root, &parent.to_string_lossy()) {
                        ledger.changes.push(Change::Dir { path: dir });
                        ledger.save(&self.root)?;
                        return Ok(());
                    }
                }
                Change::File {
                    path: abs.to_string(),
                    backup: None,
                    mode: None,
                }
            }
        };
        ledger.changes.push(change);
        ledger.save(&self.root)
    }

    /// Records that directory `abs` (and missing parents) is about to be made.
    pub fn note_dir(&self, abs: &str) -> Result<()> {
        if is_own(abs) {
            return Ok(());
        }
        let _lock = self.lock();
        let mut ledger = Ledger::load(&self.root)?;
        if ledger.covered(abs) {
            return Ok(());
        }
        if let Some(dir) = topmost_missing(&self.root, abs) {
            ledger.changes.push(Change::Dir { path: dir });
            ledger.save(&self.root)?;
        }
        Ok(())
    }

    fn note(&self, change: Change) -> Result<()> {
        let _lock = self.lock();
        let mut ledger = Ledger::load(&self.root)?;
        if ledger.has(&change) {
            return Ok(());
        }
        ledger.changes.push(change);
        ledger.save(&self.root)
    }

    pub fn note_mount(&self, target_abs: &str) -> Result<()> {
        self.note(Change::Mount {
            target: target_abs.to_string(),
        })
    }

    pub fn note_service(&self, name: &str) -> Result<()> {
        self.note(Change::Service {
            name: name.to_string(),
        })
    }

    /// A live kernel setting at `path` (a real path, not under `--root`)
    /// about to change from `previous`.
    pub fn note_kernel(&self, path: &str, previous: &str) -> Result<()> {
        self.note(Change::Kernel {
            path: path.to_string(),
            previous: previous.trim().to_string(),
        })
    }
}
