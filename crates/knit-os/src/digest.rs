//! File digests: the sha256 a package, an image or a mirror file is
//! checked against, read through a fixed buffer (a 100 MB binary never
//! sits in memory).

use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::Path;

/// The lowercase hex sha256 of the file at `path`.
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    sha256_read(&mut std::fs::File::open(path)?)
}

/// The lowercase hex sha256 of what `reader` holds to its end (an open
/// file whose identity the caller took first, say).
pub fn sha256_read(reader: &mut impl Read) -> std::io::Result<String> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex::encode(hasher.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_of_a_file_and_a_missing_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"abc").unwrap();
        assert_eq!(
            sha256_file(&path).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(sha256_file(&dir.path().join("missing")).is_err());
        assert_eq!(
            sha256_read(&mut &b"abc"[..]).unwrap(),
            sha256_file(&path).unwrap()
        );
    }
}
