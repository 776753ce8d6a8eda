//! The human initialization log (`/var/log/knit-deploy.log`, linked as ACK's
//! `ack-deploy.log`) and the error-code / error-message files.

use crate::error::AgentError;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

pub const LOG_FILE: &str = "/var/log/knit-deploy.log";
pub const ERROR_CODE_FILE: &str = "/var/log/knit-deploy-error-code.log";
pub const ERROR_MSG_FILE: &str = "/var/log/knit-deploy-error-msg.log";
/// ACK's names, kept as symlinks so existing tooling finds them.
const ACK_LINKS: &[(&str, &str)] = &[
    ("/var/log/ack-deploy.log", "knit-deploy.log"),
    (
        "/var/log/ack-deploy-error-code.log",
        "knit-deploy-error-code.log",
    ),
    (
        "/var/log/ack-deploy-error-msg.log",
        "knit-deploy-error-msg.log",
    ),
];

pub struct DeployLog {
    path: PathBuf,
    log_dir: PathBuf,
    file: Mutex<Option<fs::File>>,
    enabled: bool,
}

impl DeployLog {
    /// Opens (appends to) the log under `root`. If the log cannot be opened
    /// the agent still runs and logs to stderr only.
    pub fn open(root: &Path) -> DeployLog {
        let path = crate::files::under(root, LOG_FILE);
        let log_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let _ = fs::create_dir_all(&log_dir);
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .ok();
        for (link, target) in ACK_LINKS {
            let link = crate::files::under(root, link);
            if fs::symlink_metadata(&link).is_err() {
                let _ = std::os::unix::fs::symlink(target, &link);
            }
        }
        DeployLog {
            path,
            log_dir,
            file: Mutex::new(file),
            enabled: true,
        }
    }

    /// Logs to stderr only; writes no file (for read-only commands).
    pub fn disabled() -> DeployLog {
        DeployLog {
            path: PathBuf::new(),
            log_dir: PathBuf::new(),
            file: Mutex::new(None),
            enabled: false,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn line(&self, scope: &str, message: &str) {
        tracing::info!(scope, "{message}");
        let text = format!("{} [{scope}] {message}\n", rfc3339_now());
        if let Ok(mut guard) = self.file.lock() {
            if let Some(file) = guard.as_mut() {
                let _ = file.write_all(text.as_bytes());
            }
        }
    }

    /// Records a failure in ACK's error files (code, then message).
    pub fn record_error(&self, error: &AgentError) {
        if !self.enabled {
            return;
        }
        let _ = fs::write(
            self.log_dir.join("knit-deploy-error-code.log"),
            format!("{}\n", error.code),
        );
        let _ = fs::write(
            self.log_dir.join("knit-deploy-error-msg.log"),
            format!("{}\n", error.message),
        );
    }

    /// A successful run removes the error files of an earlier failed one.
    pub fn clear_error(&self) {
        if !self.enabled {
            return;
        }
        let _ = fs::remove_file(self.log_dir.join("knit-deploy-error-code.log"));
        let _ = fs::remove_file(self.log_dir.join("knit-deploy-error-msg.log"));
    }
}

/// UTC timestamp with milliseconds, e.g. `2026-11-30T10:20:00.123Z`.
pub fn rfc3339_now() -> String {
    knit_os::time::rfc3339_millis(knit_os::time::now_ms())
}
