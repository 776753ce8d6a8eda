//! Files written whole or not at all: the data goes to a temporary file in
//! the target's own directory (so the rename cannot cross file systems),
//! is flushed to disk, given its mode, renamed over the target, and the
//! directory is flushed too. After a crash or power loss the file is the
//! old one or the new one, never empty or half written; a leftover
//! temporary file is hidden (`.NAME.XXXXXX.tmp`) beside it.

use crate::error::{OsError, Result};
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Replaces `path` with `data` durably; the file has `mode` (0o600 for
/// secrets) before it appears under its name. Missing parent directories
/// are made.
pub fn write(path: &Path, data: &[u8], mode: u32) -> Result<()> {
    write_with(path, mode, |f| f.write_all(data))
}

/// As [`write`], the content written by `fill` (a stream, a copy): when
/// `fill` fails, `path` is left as it was and the temporary file removed.
pub fn write_with(
    path: &Path,
    mode: u32,
    fill: impl FnOnce(&mut File) -> std::io::Result<()>,
) -> Result<()> {
    let dir = parent(path);
    std::fs::create_dir_all(dir).map_err(OsError::io("create", dir))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // tempfile makes the file 0600 from the start, with a random name
    // that never collides with a concurrent writer's.
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        .tempfile_in(dir)
        .map_err(OsError::io("create a temporary file in", dir))?;
    fill(tmp.as_file_mut())
        .and_then(|()| {
            tmp.as_file()
                .set_permissions(std::fs::Permissions::from_mode(mode))
        })
        .map_err(OsError::io("write", tmp.path()))?;
    persist(tmp, path)
}

/// Puts a whole temporary file under its name for good: flushes it to
/// disk, renames it to `path` and flushes the directory. For content whose
/// name is known only once written (a blob named by its digest); `tmp`
/// must be in `path`'s directory, so the rename cannot cross file systems.
pub fn persist(tmp: tempfile::NamedTempFile, path: &Path) -> Result<()> {
    tmp.as_file()
        .sync_all()
        .map_err(OsError::io("write", tmp.path()))?;
    tmp.persist(path)
        .map_err(|e| OsError::io("rename into", path)(e.error))?;
    sync_dir(parent(path))
}

/// Flushes a directory's entries (a rename, a removal or a new file in
/// it) to disk.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(OsError::io("sync", dir))
}

/// Removes `path` (gone already is fine) and flushes its directory, so the
/// removal is on disk when this returns.
pub fn remove(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => sync_dir(parent(path)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(OsError::io("remove", path)(e)),
    }
}

/// The secret token kept in `path` (trimmed), made when the file is
/// missing or empty: 32 random bytes as hex, written durably with mode
/// 0600.
pub fn read_or_create_token(path: &Path) -> Result<String> {
    match std::fs::read_to_string(path) {
        Ok(text) if !text.trim().is_empty() => return Ok(text.trim().to_string()),
        Ok(_) => {}
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(OsError::io("read", path)(e))
        }
        Err(_) => {}
    }
    let mut buf = [0u8; 32];
    getrandom::getrandom(&mut buf)
        .map_err(|e| OsError::io("make a token for", path)(std::io::Error::other(e.to_string())))?;
    let token = hex::encode(buf);
    write(path, format!("{token}\n").as_bytes(), 0o600)?;
    Ok(token)
}

fn parent(path: &Path) -> &Path {
    path.parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn replaces_an_existing_file_whole_with_its_mode_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/record.json");
        write(&path, b"{\"a\": 1}", 0o600).unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        write(&path, b"{\"a\": 2}", 0o644).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"{\"a\": 2}");
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o644
        );
        assert_eq!(names(&dir.path().join("sub")), vec!["record.json"]);
    }

    #[test]
    fn the_temporary_file_is_hidden_beside_the_target_and_a_failed_write_keeps_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("index");
        write(&path, b"old", 0o644).unwrap();
        let mut seen = Vec::new();
        let err = write_with(&path, 0o644, |f| {
            f.write_all(b"half")?;
            // What a crash at this moment would leave: the old file whole
            // and a hidden temporary file in the same directory.
            seen = names(dir.path());
            assert_eq!(std::fs::read(&path)?, b"old");
            Err(std::io::Error::other("disk went away"))
        })
        .unwrap_err();
        assert_eq!(seen.len(), 2, "{seen:?}");
        let tmp = seen.iter().find(|n| *n != "index").unwrap();
        assert!(tmp.starts_with(".index.") && tmp.ends_with(".tmp"), "{tmp}");
        assert_eq!(err.code(), "IoError");
        assert!(err.to_string().contains("disk went away"), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        assert_eq!(names(dir.path()), vec!["index"]);
    }

    #[test]
    fn a_write_into_a_file_that_is_a_directory_fails_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("taken");
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("inside"), b"x").unwrap();
        let err = write(&path, b"data", 0o600).unwrap_err();
        assert!(err.to_string().starts_with("rename into "), "{err}");
        assert!(err.to_string().contains("taken"), "{err}");
        assert_eq!(names(dir.path()), vec!["taken"]);
    }

    #[test]
    fn a_temporary_file_named_once_written_replaces_the_target_and_leaves_nothing_beside_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sha256-abc");
        std::fs::write(&path, b"old").unwrap();
        let mut tmp = tempfile::NamedTempFile::new_in(dir.path()).unwrap();
        tmp.write_all(b"whole blob").unwrap();
        persist(tmp, &path).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"whole blob");
        assert_eq!(names(dir.path()), vec!["sha256-abc"]);
        // A target that cannot be replaced is an error naming it, and the
        // temporary file is removed with its handle.
        let taken = dir.path().join("taken");
        std::fs::create_dir(&taken).unwrap();
        std::fs::write(taken.join("inside"), b"x").unwrap();
        let tmp = tempfile::NamedTempFile::new_in(dir.path()).unwrap();
        let err = persist(tmp, &taken).unwrap_err();
        assert_eq!(err.code(), "IoError");
        assert!(err.to_string().starts_with("rename into "), "{err}");
        assert_eq!(names(dir.path()), vec!["sha256-abc", "taken"]);
    }

    #[test]
    fn remove_flushes_and_takes_a_missing_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gone");
        write(&path, b"x", 0o600).unwrap();
        remove(&path).unwrap();
        assert!(!path.exists());
        remove(&path).unwrap();
    }

    #[test]
    fn a_token_is_made_once_with_mode_0600_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("admin-token");
        let made = read_or_create_token(&path).unwrap();
        assert_eq!(made.len(), 64);
        assert!(made.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(read_or_create_token(&path).unwrap(), made);
        let other = dir.path().join("other-token");
        assert_ne!(read_or_create_token(&other).unwrap(), made);
        // An empty file (never a valid token) gets a new one.
        std::fs::write(&other, "\n").unwrap();
        assert_eq!(read_or_create_token(&other).unwrap().len(), 64);
    }
}
