//! The floor under `Host`, the log and the undo ledger: where a node path
//! lives under `--root`, and the one durable file write.

use crate::error::{AgentError, Result};
use knit_api::ErrorCode;
use std::path::{Path, PathBuf};

/// `root` + `abs`, where `abs` is an absolute path inside the node.
pub fn under(root: &Path, abs: &str) -> PathBuf {
    root.join(abs.trim_start_matches('/'))
}

/// Writes `path` atomically: a temporary file beside it, fsync, rename,
/// and the directory synced; parents created (knit-os's durable write, the
/// one every knit binary uses).
pub fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> Result<()> {
    knit_os::durable::write(path, contents, mode).map_err(|e| {
        AgentError::new(
            ErrorCode::FailCommand,
            format!("write {}: {e}", path.display()),
        )
    })
}
