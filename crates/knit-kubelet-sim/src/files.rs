//! Writing credentials and reports whole: a temporary file in the same
//! directory is written and fsynced, renamed into place, and the directory
//! fsynced, so a crash leaves the old file or the new one, never a torn one.

use std::path::Path;

use crate::error::SimError;

/// Credentials: readable by their owner only (0600).
pub fn write_private(path: &Path, contents: &[u8]) -> Result<(), SimError> {
    write_durable(path, contents, 0o600)
}

/// Replaces `path` with `contents` durably; the file has `mode` before it
/// appears under its name. The parent directory is made when missing.
pub fn write_durable(path: &Path, contents: &[u8], mode: u32) -> Result<(), SimError> {
    knit_os::durable::write(path, contents, mode).map_err(|e| match e {
        knit_os::OsError::Io { path, source, .. } => SimError::io(path, source),
        other => SimError::io(path, std::io::Error::other(other.to_string())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn replaces_whole_with_the_mode_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pki/kubelet.pem");
        write_private(&path, b"one").unwrap();
        write_durable(&path, b"two", 0o644).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o644);
        write_private(&path, b"three").unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let names: Vec<_> = std::fs::read_dir(dir.path().join("pki"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("kubelet.pem")]);
    }
}
