//! Writing credentials: private (0600), atomically (temp file + rename).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::error::SimError;

pub fn write_private(path: &Path, contents: &[u8]) -> Result<(), SimError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| SimError::io(dir, e))?;
    }
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| SimError::io(&tmp, e))?;
    f.write_all(contents).map_err(|e| SimError::io(&tmp, e))?;
    f.sync_all().map_err(|e| SimError::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| SimError::io(path, e))
}
