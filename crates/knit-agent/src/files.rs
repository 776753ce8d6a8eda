//! The floor under `Host`, the log and the undo ledger: where a node path
//! lives under `--root`, and the one durable file write.

use crate::error::{AgentError, Result};
use knit_api::ErrorCode;
use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// `root` + `abs`, where `abs` is an absolute path inside the node.
pub fn under(root: &Path, abs: &str) -> PathBuf {
    root.join(abs.trim_start_matches('/'))
}

/// Writes `path` atomically: a temporary file beside it, fsync, rename,
/// and the directory synced; parents created.
pub fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> Result<()> {
    let fail = |what: &str, e: std::io::Error| {
        AgentError::new(
            ErrorCode::FailCommand,
            format!("{what} {}: {e}", path.display()),
        )
    };
    let parent = path.parent().unwrap_or(Path::new("/"));
    fs::create_dir_all(parent).map_err(|e| fail("create directory for", e))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = parent.join(format!(".{name}.knit-tmp-{}", std::process::id()));
    {
        let mut file = fs::File::create(&tmp).map_err(|e| fail("create", e))?;
        file.write_all(contents).map_err(|e| fail("write", e))?;
        file.set_permissions(fs::Permissions::from_mode(mode))
            .map_err(|e| fail("chmod", e))?;
        file.sync_all().map_err(|e| fail("fsync", e))?;
    }
    fs::rename(&tmp, path).map_err(|e| fail("rename into", e))?;
    if let Ok(dir) = fs::File::open(parent) {
        let _ = dir.sync_all();
    }
    Ok(())
}
