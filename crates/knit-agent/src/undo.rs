//! The undo ledger: each change `init` makes to the machine outside the
//! agent's own state directory (`/var/lib/knit`) is written down here
//! before it is made, so that `knit-agent reset --undo` can put the machine
//! back as it was — what a manual attach whose join failed does.
//!
//! Recorded: files written (with a copy of what was there before, if
//! anything), directories that did not exist (removed with their content:
//! everything in them came after), mounts, services started, kernel
//! settings written live (with their previous value). Not recorded, and
//! so not undone: packages installed by the OS package manager, kernel
//! modules loaded, a blank data disk the agent formatted (its filesystem
//! stays; it held no data), the agent's own log files under `/var/log`
//! (kept for diagnosis).

use crate::error::{AgentError, Context, Result};
use crate::host::{write_atomic, Host};
use knit_api::ErrorCode;
use serde::{Deserialize, Serialize};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

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

/// What an undo did and what it could not do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UndoReport {
    pub done: Vec<String>,
    pub failed: Vec<String>,
}

fn is_own(abs: &str) -> bool {
    abs == STATE_DIR || abs.starts_with(&format!("{STATE_DIR}/"))
}

impl Ledger {
    pub fn load(host: &Host) -> Result<Ledger> {
        let path = host.path(LEDGER_FILE);
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

    fn save(&self, host: &Host) -> Result<()> {
        let text = serde_json::to_vec_pretty(self).context(ErrorCode::FailJournal, || {
            "encode the undo ledger".to_string()
        })?;
        write_atomic(&host.path(LEDGER_FILE), &text, 0o600)
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
fn topmost_missing(host: &Host, abs: &str) -> Option<String> {
    let mut missing = None;
    let mut current = Path::new(abs);
    while current != Path::new("/") {
        if host.path(&current.to_string_lossy()).exists() {
            break;
        }
        missing = Some(current.to_string_lossy().into_owned());
        current = current.parent()?;
    }
    missing
}

/// Records that `abs` (a file) is about to be written.
pub fn note_file(host: &Host, abs: &str) -> Result<()> {
    if is_own(abs) {
        return Ok(());
    }
    let _lock = host.undo_lock();
    let mut ledger = Ledger::load(host)?;
    if ledger.covered(abs)
        || ledger.has(&Change::File {
            path: abs.to_string(),
            backup: None,
            mode: None,
        })
    {
        return Ok(());
    }
    let path = host.path(abs);
    let change = match std::fs::symlink_metadata(&path) {
        Ok(meta) if meta.is_file() => {
            let name = format!("files/{}", ledger.changes.len());
            let bytes = std::fs::read(&path)
                .context(ErrorCode::FailJournal, || format!("back up {abs}"))?;
            write_atomic(&host.path(&format!("{LEDGER_DIR}/{name}")), &bytes, 0o600)?;
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
                if let Some(dir) = topmost_missing(host, &parent.to_string_lossy()) {
                    ledger.changes.push(Change::Dir { path: dir });
                    ledger.save(host)?;
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
    ledger.save(host)
}

/// Records that directory `abs` (and missing parents) is about to be made.
pub fn note_dir(host: &Host, abs: &str) -> Result<()> {
    if is_own(abs) {
        return Ok(());
    }
    let _lock = host.undo_lock();
    let mut ledger = Ledger::load(host)?;
    if ledger.covered(abs) {
        return Ok(());
    }
    if let Some(dir) = topmost_missing(host, abs) {
        ledger.changes.push(Change::Dir { path: dir });
        ledger.save(host)?;
    }
    Ok(())
}

fn note(host: &Host, change: Change) -> Result<()> {
    let _lock = host.undo_lock();
    let mut ledger = Ledger::load(host)?;
    if ledger.has(&change) {
        return Ok(());
    }
    ledger.changes.push(change);
    ledger.save(host)
}

pub fn note_mount(host: &Host, target_abs: &str) -> Result<()> {
    note(
        host,
        Change::Mount {
            target: target_abs.to_string(),
        },
    )
}

pub fn note_service(host: &Host, name: &str) -> Result<()> {
    note(
        host,
        Change::Service {
            name: name.to_string(),
        },
    )
}

/// A live kernel setting at `path` (a real path, not under `--root`)
/// about to change from `previous`.
pub fn note_kernel(host: &Host, path: &str, previous: &str) -> Result<()> {
    note(
        host,
        Change::Kernel {
            path: path.to_string(),
            previous: previous.trim().to_string(),
        },
    )
}

/// Mount points at or under `dir` (host paths), deepest first.
fn mounts_under(dir: &str) -> Vec<String> {
    let prefix = format!("{}/", dir.trim_end_matches('/'));
    let mut found: Vec<String> = crate::disk::mounts::mounts()
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|m| m == dir || m.starts_with(&prefix))
        .collect();
    found.sort_by_key(|m| std::cmp::Reverse(m.len()));
    found
}

fn unmount(target: &str) -> std::result::Result<(), String> {
    use nix::mount::{umount2, MntFlags};
    match umount2(target, MntFlags::empty()) {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EINVAL) => Ok(()), // not a mount point (any more)
        Err(nix::errno::Errno::ENOENT) => Ok(()),
        // Busy: detach now, the kernel finishes when the last user goes.
        Err(_) => umount2(target, MntFlags::MNT_DETACH).map_err(|e| e.to_string()),
    }
}

/// A kernel setting's value as written: whitespace collapsed, and for a
/// choice file (`always [madvise] never`) the chosen word.
fn kernel_value(text: &str) -> String {
    let text = text.trim();
    if let (Some(open), Some(close)) = (text.find('['), text.find(']')) {
        if open < close {
            return text[open + 1..close].to_string();
        }
    }
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Puts the machine back as the ledger says it was, newest change first:
/// services stopped, mounts undone, kernel settings, files restored or
/// removed, directories the agent made removed; then the agent's own
/// files in `/var/lib/knit` (journal, install stamp, staging; not
/// `bootstrap`, which the attach command removes itself) and the services'
/// run directory.
pub fn undo(host: &Host) -> Result<UndoReport> {
    let ledger = Ledger::load(host)?;
    let mut report = UndoReport::default();
    for change in ledger.changes.iter().rev() {
        if let Change::Service { name } = change {
            match crate::services::stop(host, name) {
                Ok(()) => report.done.push(format!("service {name} stopped")),
                Err(e) => report.failed.push(format!("stop service {name}: {e}")),
            }
            if crate::services::uses_systemd(host) {
                let _ = host.run(
                    ErrorCode::FailCommand,
                    "systemctl",
                    &["disable", name],
                    std::time::Duration::from_secs(60),
                );
            }
        }
    }
    for change in ledger.changes.iter().rev() {
        if let Change::Mount { target } = change {
            let real = host.host_path(target);
            match unmount(&real) {
                Ok(()) => report.done.push(format!("{target} unmounted")),
                Err(e) => report.failed.push(format!("unmount {target}: {e}")),
            }
        }
    }
    for change in ledger.changes.iter().rev() {
        match change {
            Change::Kernel { path, previous } if host.is_live() => {
                // Noted before the write, which the kernel may have refused
                // (a read-only /proc/sys in a container, a sysctl that is
                // not namespaced): nothing to set back then.
                let unchanged = std::fs::read_to_string(path)
                    .is_ok_and(|current| kernel_value(&current) == kernel_value(previous));
                if unchanged {
                    continue;
                }
                match std::fs::write(path, previous) {
                    Ok(()) => report.done.push(format!("{path} set back to {previous}")),
                    Err(e) => report.failed.push(format!("set {path} back: {e}")),
                }
            }
            Change::File {
                path,
                backup: Some(backup),
                mode,
            } => {
                let restored = std::fs::read(host.path(&format!("{LEDGER_DIR}/{backup}")))
                    .map_err(|e| e.to_string())
                    .and_then(|bytes| {
                        write_atomic(&host.path(path), &bytes, mode.unwrap_or(0o644))
                            .map_err(|e| e.message)
                    });
                match restored {
                    Ok(()) => report.done.push(format!("{path} restored")),
                    Err(e) => report.failed.push(format!("restore {path}: {e}")),
                }
            }
            Change::File {
                path, backup: None, ..
            } => match std::fs::remove_file(host.path(path)) {
                Ok(()) => report.done.push(format!("{path} removed")),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => report.failed.push(format!("remove {path}: {e}")),
            },
            Change::Dir { path } => {
                let real = host.host_path(path);
                // Never delete through a mount that is still there (a data
                // disk whose unmount failed): its content is not ours.
                let mounted = mounts_under(&real);
                if !mounted.is_empty() {
                    report.failed.push(format!(
                        "{path} kept: still holds mount(s) {}",
                        mounted.join(", ")
                    ));
                    continue;
                }
                match std::fs::remove_dir_all(&real) {
                    Ok(()) => report
                        .done
                        .push(format!("{path} removed (made by the agent)")),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => report.failed.push(format!("remove {path}: {e}")),
                }
            }
            _ => {}
        }
    }
    // The agent's own state (only what the agent writes there: the
    // directory may hold others'), the ledger last (an undo cut short can
    // run again).
    let _ = std::fs::remove_dir_all(host.path(crate::services::RUN_DIR));
    for own in [
        crate::journal::JOURNAL_FILE,
        crate::phases::components::STAMP_FILE,
    ] {
        match std::fs::remove_file(host.path(own)) {
            Ok(()) => report.done.push(format!("{own} removed")),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => report.failed.push(format!("remove {own}: {e}")),
        }
    }
    if let Err(e) = std::fs::remove_dir_all(host.path(crate::package::STAGING_DIR)) {
        if e.kind() != std::io::ErrorKind::NotFound {
            report
                .failed
                .push(format!("remove {}: {e}", crate::package::STAGING_DIR));
        }
    }
    if report.failed.is_empty() {
        let _ = std::fs::remove_dir_all(host.path(LEDGER_DIR));
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> (tempfile::TempDir, Host) {
        let dir = tempfile::tempdir().unwrap();
        let host = Host::without_log(dir.path());
        (dir, host)
    }

    #[test]
    fn kernel_values_compare_as_written() {
        assert_eq!(kernel_value("4096\t87380\t6291456\n"), "4096 87380 6291456");
        assert_eq!(kernel_value("always [madvise] never\n"), "madvise");
        assert_eq!(kernel_value("madvise"), "madvise");
        assert_eq!(kernel_value("262144\n"), "262144");
    }

    #[test]
    fn undo_restores_overwritten_files_and_removes_what_the_agent_made() {
        let (dir, host) = tree();
        let root = dir.path();
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::fs::write(root.join("etc/fstab"), "# mine\n").unwrap();
        std::fs::set_permissions(
            root.join("etc/fstab"),
            std::fs::Permissions::from_mode(0o640),
        )
        .unwrap();
        std::fs::create_dir_all(root.join("usr/local/bin")).unwrap();
        std::fs::write(root.join("usr/local/bin/own-tool"), "mine").unwrap();

        host.write_file("/etc/fstab", b"# mine\nknit line\n", 0o644)
            .unwrap();
        host.write_file("/etc/fstab", b"# written twice\n", 0o644)
            .unwrap();
        host.write_file("/usr/local/bin/kubelet", b"bin", 0o755)
            .unwrap();
        host.write_file("/etc/kubernetes/pki/ca.crt", b"ca", 0o644)
            .unwrap();
        host.create_dir("/var/lib/kubelet/pki").unwrap();
        std::fs::write(root.join("var/lib/kubelet/pki/made-by-kubelet"), "x").unwrap();
        host.write_file("/var/lib/knit/journal.json", b"{}", 0o600)
            .unwrap();

        let ledger = Ledger::load(&host).unwrap();
        assert_eq!(
            ledger.changes.len(),
            4,
            "fstab once, kubelet, /etc/kubernetes, /var/lib/kubelet; own state not recorded: {ledger:?}"
        );
        let report = undo(&host).unwrap();
        assert!(report.failed.is_empty(), "{report:?}");
        assert_eq!(
            std::fs::read_to_string(root.join("etc/fstab")).unwrap(),
            "# mine\n"
        );
        let mode = std::fs::metadata(root.join("etc/fstab"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o640, "mode restored");
        assert!(!root.join("usr/local/bin/kubelet").exists());
        assert_eq!(
            std::fs::read_to_string(root.join("usr/local/bin/own-tool")).unwrap(),
            "mine"
        );
        assert!(root.join("usr/local/bin").is_dir(), "existing dirs stay");
        assert!(!root.join("etc/kubernetes").exists());
        assert!(!root.join("var/lib/kubelet").exists());
        assert!(root.join("var/lib").is_dir());
        assert!(!root.join("var/lib/knit/journal.json").exists());
        assert!(!root.join(LEDGER_DIR.trim_start_matches('/')).exists());
        // Nothing left to undo: a second run changes nothing.
        assert_eq!(undo(&host).unwrap(), UndoReport::default());
    }
}
