//! Files the server keeps beside its database (attach records, secrets,
//! the CA): written whole to a temporary file in the same directory,
//! flushed to disk, renamed into place, and the directory flushed too, so
//! that after a crash or power loss the file is either the old one or the
//! new one, never empty or half written.

use crate::error::{Result, ServerError};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Replaces `path` with `data` durably; the file gets `mode` (e.g. 0o600
/// for secrets) before it appears under its name. The parent directory is
/// made when missing.
pub fn write(path: &Path, data: &[u8], mode: u32) -> Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)
        .map_err(|e| ServerError::io(format!("create {}", dir.display()), e))?;
    // tempfile makes the file 0600 from the start.
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .map_err(|e| ServerError::io(format!("create a temporary file in {}", dir.display()), e))?;
    tmp.write_all(data)
        .and_then(|_| {
            tmp.as_file()
                .set_permissions(std::fs::Permissions::from_mode(mode))
        })
        .and_then(|_| tmp.as_file().sync_all())
        .map_err(|e| ServerError::io(format!("write {}", tmp.path().display()), e))?;
    tmp.persist(path)
        .map_err(|e| ServerError::io(format!("rename into {}", path.display()), e.error))?;
    sync_dir(dir)
}

/// Flushes a directory's entries (a rename or removal in it) to disk.
pub fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| ServerError::io(format!("sync {}", dir.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_whole_with_the_mode_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/record.json");
        write(&path, b"{\"a\": 1}", 0o600).unwrap();
        write(&path, b"{\"a\": 2}", 0o644).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"{\"a\": 2}");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o644);
        let names: Vec<_> = std::fs::read_dir(dir.path().join("sub"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("record.json")]);
    }
}
