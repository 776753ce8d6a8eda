//! `knit-agent reset --undo`: puts the machine back as the undo ledger
//! (`ledger.rs`) says it was, newest change first, then removes the
//! agent's own state.

use crate::error::Result;
use crate::files::write_atomic;
use crate::host::Host;
use crate::ledger::{Change, Ledger, LEDGER_DIR};
use knit_api::ErrorCode;

/// What an undo did and what it could not do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UndoReport {
    pub done: Vec<String>,
    pub failed: Vec<String>,
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
    let ledger = Ledger::load(host.root())?;
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
    use std::os::unix::fs::PermissionsExt;

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

        let ledger = Ledger::load(host.root()).unwrap();
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
