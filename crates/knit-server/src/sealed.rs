//! The secrets servers share through a datastore (the API's CA key, the
//! admin token), sealed at rest with a key the servers get out of band:
//! a root-only key file (`knit server --secrets-key-file`), never the
//! datastore. ChaCha20-Poly1305 (ring's AEAD), a random 96-bit nonce per
//! sealing and the secret's name as associated data, so a sealed row
//! cannot be moved to another name. The key's id (a hash of the key, not
//! the key) is kept beside each sealed value so a wrong key is named as
//! such instead of reported as corrupt data.

use base64::Engine;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};
use sha2::Digest;
use std::path::{Path, PathBuf};

/// Every sealed value starts with this; anything else is clear text (a
/// row written before sealing existed, sealed at the next start).
const PREFIX: &str = "knit-sealed:v1:chacha20-poly1305:";
/// The key: 32 bytes (256 bits), base64 in the file.
pub const KEY_BYTES: usize = 32;
/// Largest key file read (44 bytes of base64 and a newline in practice).
const MAX_KEY_FILE: u64 = 1024;

/// Why the shared secrets could not be sealed or opened.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error("--secrets-key-file {path}: {reason}")]
    KeyFile { path: PathBuf, reason: String },
    #[error("the datastore is shared by several servers, which keep the secrets they share sealed in it (stored now: {names}), and this server has no key: start it with --secrets-key-file PATH, the deployment's key file, the same for every server (the first time, make one: umask 077; openssl rand -base64 32 > PATH; docs/security.md)")]
    KeyMissing { names: String },
    #[error("shared secret {name:?} in the datastore was sealed with key {sealed_with}, not with this server's key {key_id} (--secrets-key-file {path}): give this server the key the other servers use; nothing was overwritten")]
    WrongKey {
        name: String,
        sealed_with: String,
        key_id: String,
        path: PathBuf,
    },
    #[error("shared secret {name:?} in the datastore: {reason}; nothing was overwritten")]
    Corrupt { name: String, reason: String },
}

impl SealError {
    /// Stable code shown to users. Never rename one.
    pub fn code(&self) -> &'static str {
        match self {
            SealError::KeyFile { .. } => "SecretsKeyFile",
            SealError::KeyMissing { .. } => "SecretsKeyMissing",
            SealError::WrongKey { .. } => "SecretsKeyWrong",
            SealError::Corrupt { .. } => "SecretsCorrupt",
        }
    }
}

/// The deployment's sealing key, read from its file. Never printed.
pub struct SecretsKey {
    key: LessSafeKey,
    id: String,
    path: PathBuf,
}

impl std::fmt::Debug for SecretsKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretsKey(id {}, {})", self.id, self.path.display())
    }
}

/// A new key as its file holds it: 32 random bytes, base64, a newline.
pub fn new_key_text() -> Result<String, SealError> {
    let mut raw = [0u8; KEY_BYTES];
    getrandom::getrandom(&mut raw).map_err(|e| SealError::KeyFile {
        path: PathBuf::new(),
        reason: format!("random bytes for a new key: {e}"),
    })?;
    Ok(format!(
        "{}\n",
        base64::engine::general_purpose::STANDARD.encode(raw)
    ))
}

impl SecretsKey {
    /// Reads the key file: a regular file owned by this process's user
    /// (or root) that neither group nor others may read (0600 or 0400),
    /// holding 32 bytes in base64.
    pub fn load(path: &Path) -> Result<SecretsKey, SealError> {
        use std::io::Read;
        use std::os::unix::fs::MetadataExt;
        let bad = |reason: String| SealError::KeyFile {
            path: path.to_path_buf(),
            reason,
        };
        let file = std::fs::File::open(path).map_err(|e| bad(format!("cannot open: {e}")))?;
        let meta = file.metadata().map_err(|e| bad(format!("stat: {e}")))?;
        if !meta.is_file() {
            return Err(bad("not a regular file".into()));
        }
        let mode = meta.mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(bad(format!(
                "mode {mode:04o} lets group or others read it; the key file must be readable by its owner only (chmod 600 {})",
                path.display()
            )));
        }
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        if meta.uid() != me && meta.uid() != 0 {
            return Err(bad(format!(
                "owned by uid {}, not by this server's user (uid {me}) or root",
                meta.uid()
            )));
        }
        let mut text = String::new();
        file.take(MAX_KEY_FILE + 1)
            .read_to_string(&mut text)
            .map_err(|e| bad(format!("read: {e}")))?;
        if text.len() as u64 > MAX_KEY_FILE {
            return Err(bad(format!(
                "larger than {MAX_KEY_FILE} bytes; it must hold {KEY_BYTES} random bytes in base64 (openssl rand -base64 32)"
            )));
        }
        let raw = base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .map_err(|_| {
                bad(format!(
                    "not base64; it must hold {KEY_BYTES} random bytes in base64 (openssl rand -base64 32)"
                ))
            })?;
        if raw.len() != KEY_BYTES {
            return Err(bad(format!(
                "holds {} bytes; it must hold {KEY_BYTES} random bytes in base64 (openssl rand -base64 32)",
                raw.len()
            )));
        }
        SecretsKey::from_bytes(&raw, path)
    }

    fn from_bytes(raw: &[u8], path: &Path) -> Result<SecretsKey, SealError> {
        let unbound = UnboundKey::new(&CHACHA20_POLY1305, raw).map_err(|_| SealError::KeyFile {
            path: path.to_path_buf(),
            reason: format!("not a {KEY_BYTES}-byte key"),
        })?;
        let mut h = sha2::Sha256::new();
        h.update(b"knit secrets key id\0");
        h.update(raw);
        Ok(SecretsKey {
            key: LessSafeKey::new(unbound),
            id: hex::encode(&h.finalize()[..8]),
            path: path.to_path_buf(),
        })
    }

    /// The key's id: a hash of it, safe to show (names the key in errors).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// `value` sealed under `name`.
    pub fn seal(&self, name: &str, value: &str) -> Result<String, SealError> {
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::getrandom(&mut nonce).map_err(|e| SealError::Corrupt {
            name: name.to_string(),
            reason: format!("random nonce: {e}"),
        })?;
        let mut buf = value.as_bytes().to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(name.as_bytes()),
                &mut buf,
            )
            .map_err(|_| SealError::Corrupt {
                name: name.to_string(),
                reason: "sealing failed".into(),
            })?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&buf);
        Ok(format!(
            "{PREFIX}{}:{}",
            self.id,
            base64::engine::general_purpose::STANDARD.encode(out)
        ))
    }

    /// The clear value of a stored `name`: opened when sealed, as it is
    /// when clear text (a row of a release before sealing; the caller
    /// seals it). A value sealed with another key is [`SealError::WrongKey`].
    pub fn open(&self, name: &str, stored: &str) -> Result<Opened, SealError> {
        let Some(rest) = stored.strip_prefix(PREFIX) else {
            return Ok(Opened {
                value: stored.to_string(),
                was_clear: true,
            });
        };
        let corrupt = |reason: &str| SealError::Corrupt {
            name: name.to_string(),
            reason: reason.to_string(),
        };
        let (sealed_with, b64) = rest
            .split_once(':')
            .ok_or_else(|| corrupt("a sealed value without its key id"))?;
        if sealed_with != self.id {
            return Err(SealError::WrongKey {
                name: name.to_string(),
                sealed_with: sealed_with.to_string(),
                key_id: self.id.clone(),
                path: self.path.clone(),
            });
        }
        let raw = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|_| corrupt("a sealed value that is not base64"))?;
        if raw.len() < NONCE_LEN + CHACHA20_POLY1305.tag_len() {
            return Err(corrupt("a sealed value too short to hold a nonce and tag"));
        }
        let (nonce, body) = raw.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| corrupt("bad nonce"))?;
        let mut buf = body.to_vec();
        let clear = self
            .key
            .open_in_place(nonce, Aad::from(name.as_bytes()), &mut buf)
            .map_err(|_| {
                corrupt("the sealed value does not authenticate under this key (altered, or moved from another name)")
            })?;
        let value = String::from_utf8(clear.to_vec()).map_err(|_| corrupt("not UTF-8"))?;
        Ok(Opened {
            value,
            was_clear: false,
        })
    }
}

/// Whether a stored value is sealed (as opposed to clear text).
pub fn is_sealed(stored: &str) -> bool {
    stored.starts_with(PREFIX)
}

/// A stored secret's clear value.
#[derive(Debug)]
pub struct Opened {
    pub value: String,
    /// Stored in clear: to be sealed now.
    pub was_clear: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn key_file(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    #[test]
    fn a_sealed_value_opens_with_its_key_only_and_under_its_name_only() {
        let dir = tempfile::tempdir().unwrap();
        let a =
            SecretsKey::load(&key_file(dir.path(), "a", &new_key_text().unwrap(), 0o600)).unwrap();
        let b =
            SecretsKey::load(&key_file(dir.path(), "b", &new_key_text().unwrap(), 0o400)).unwrap();
        let secret = "-----BEGIN PRIVATE KEY-----\nabc\n-----END PRIVATE KEY-----\n";
        let sealed = a.seal("ca.key", secret).unwrap();
        assert!(is_sealed(&sealed));
        assert!(!sealed.contains("PRIVATE KEY"), "{sealed}");
        assert_ne!(
            sealed,
            a.seal("ca.key", secret).unwrap(),
            "a nonce per sealing"
        );
        let opened = a.open("ca.key", &sealed).unwrap();
        assert_eq!(opened.value, secret);
        assert!(!opened.was_clear);
        let e = b.open("ca.key", &sealed).unwrap_err();
        assert_eq!(e.code(), "SecretsKeyWrong", "{e}");
        assert!(
            e.to_string().contains(a.id()) && e.to_string().contains(b.id()),
            "{e}"
        );
        let e = a.open("admin-token", &sealed).unwrap_err();
        assert_eq!(e.code(), "SecretsCorrupt", "{e}");
        // A flipped byte of the ciphertext does not authenticate.
        let mut tampered = sealed.clone().into_bytes();
        let last = tampered.len() - 3;
        tampered[last] = if tampered[last] == b'A' { b'B' } else { b'A' };
        let e = a
            .open("ca.key", std::str::from_utf8(&tampered).unwrap())
            .unwrap_err();
        assert_eq!(e.code(), "SecretsCorrupt", "{e}");
        // Clear text (a row from before sealing) is given back to be sealed.
        let clear = a.open("admin-token", "0123abcd").unwrap();
        assert_eq!(clear.value, "0123abcd");
        assert!(clear.was_clear);
    }

    #[test]
    fn a_key_file_others_can_read_or_of_the_wrong_size_is_refused_naming_the_rule() {
        let dir = tempfile::tempdir().unwrap();
        let good = new_key_text().unwrap();
        for mode in [0o644, 0o640, 0o604] {
            let path = key_file(dir.path(), &format!("k{mode:o}"), &good, mode);
            let e = SecretsKey::load(&path).unwrap_err();
            assert_eq!(e.code(), "SecretsKeyFile");
            let text = e.to_string();
            assert!(
                text.contains(&format!("mode {mode:04o}")) && text.contains("chmod 600"),
                "{text}"
            );
            assert!(text.contains(&path.display().to_string()), "{text}");
        }
        let short = key_file(dir.path(), "short", "c2hvcnQ=\n", 0o600);
        let e = SecretsKey::load(&short).unwrap_err().to_string();
        assert!(e.contains("holds 5 bytes") && e.contains("32"), "{e}");
        let junk = key_file(dir.path(), "junk", "not base64 at all!\n", 0o600);
        let e = SecretsKey::load(&junk).unwrap_err().to_string();
        assert!(e.contains("not base64"), "{e}");
        let e = SecretsKey::load(&dir.path().join("absent")).unwrap_err();
        assert_eq!(e.code(), "SecretsKeyFile");
        let big = key_file(dir.path(), "big", &"A".repeat(4096), 0o600);
        let e = SecretsKey::load(&big).unwrap_err().to_string();
        assert!(e.contains("larger than"), "{e}");
        // The same file read twice is the same key (same id, opens).
        let path = key_file(dir.path(), "same", &good, 0o600);
        let k1 = SecretsKey::load(&path).unwrap();
        let k2 = SecretsKey::load(&path).unwrap();
        assert_eq!(k1.id(), k2.id());
        assert_eq!(
            k2.open("x", &k1.seal("x", "v").unwrap()).unwrap().value,
            "v"
        );
        assert!(!format!("{k1:?}").contains(good.trim()));
    }
}
