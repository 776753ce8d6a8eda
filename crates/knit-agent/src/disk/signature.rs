//! Reads what a disk holds from its first bytes: filesystem superblocks and
//! partition tables. Decides between "blank", "mount as is" and "refuse".

use std::fs::File;
use std::io::Read;
use std::path::Path;

/// How much of the disk is read: enough for every signature below.
const PROBE_BYTES: usize = 1 << 20;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Signature {
    /// Nothing but zeros where signatures live: safe to format.
    Blank,
    /// A filesystem knit mounts (ext4 family or xfs), with its UUID.
    Supported { fs_type: &'static str, uuid: String },
    /// A partition table: the disk is someone's, never formatted without `force`.
    PartitionTable(&'static str),
    /// A recognised filesystem or container knit does not use.
    Unsupported(&'static str),
    /// Data with no recognised signature.
    UnknownData,
}

impl Signature {
    pub fn describe(&self) -> String {
        match self {
            Signature::Blank => "no signature (blank)".to_string(),
            Signature::Supported { fs_type, uuid } => format!("{fs_type} filesystem (UUID {uuid})"),
            Signature::PartitionTable(kind) => format!("{kind} partition table"),
            Signature::Unsupported(kind) => format!("unsupported {kind} signature"),
            Signature::UnknownData => "data with no recognised signature".to_string(),
        }
    }
}

pub fn read_signature(device: &Path) -> std::io::Result<Signature> {
    let mut file = File::open(device)?;
    let mut buf = vec![0u8; PROBE_BYTES];
    let mut filled = 0;
    while filled < buf.len() {
        let n = file.read(&mut buf[filled..])?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    buf.truncate(filled);
    Ok(classify(&buf))
}

fn uuid_string(b: &[u8]) -> String {
    let h = hex::encode(b);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

fn at(buf: &[u8], offset: usize, len: usize) -> Option<&[u8]> {
    buf.get(offset..offset + len)
}

pub fn classify(buf: &[u8]) -> Signature {
    // ext2/3/4: superblock at 1024, magic 0xEF53 at +56, UUID at +104.
    if at(buf, 1024 + 56, 2) == Some(&[0x53, 0xEF]) {
        let compat = at(buf, 1024 + 92, 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .unwrap_or(0);
        let incompat = at(buf, 1024 + 96, 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .unwrap_or(0);
        let has_journal = compat & 0x4 != 0;
        let ext4_features = incompat & (0x40 | 0x80 | 0x200) != 0; // extents, 64bit, flex_bg
        let fs_type = if ext4_features {
            "ext4"
        } else if has_journal {
            "ext3"
        } else {
            "ext2"
        };
        let uuid = at(buf, 1024 + 104, 16).map(uuid_string).unwrap_or_default();
        return Signature::Supported { fs_type, uuid };
    }
    // XFS: "XFSB" at 0, UUID at 32.
    if at(buf, 0, 4) == Some(b"XFSB") {
        let uuid = at(buf, 32, 16).map(uuid_string).unwrap_or_default();
        return Signature::Supported {
            fs_type: "xfs",
            uuid,
        };
    }
    if at(buf, 512, 8) == Some(b"EFI PART") || at(buf, 4096, 8) == Some(b"EFI PART") {
        return Signature::PartitionTable("GPT");
    }
    if at(buf, 0, 6) == Some(b"LUKS\xba\xbe") {
        return Signature::Unsupported("LUKS");
    }
    if at(buf, 0x10040, 8) == Some(b"_BHRfS_M") {
        return Signature::Unsupported("btrfs");
    }
    if at(buf, 4086, 10) == Some(b"SWAPSPACE2") || at(buf, 65526, 10) == Some(b"SWAPSPACE2") {
        return Signature::Unsupported("swap");
    }
    if at(buf, 0x8001, 5) == Some(b"CD001") {
        return Signature::Unsupported("iso9660");
    }
    if at(buf, 0x218, 8) == Some(b"LVM2 001") {
        return Signature::Unsupported("LVM2");
    }
    if at(buf, 510, 2) == Some(&[0x55, 0xAA]) {
        let fat = at(buf, 0x36, 3) == Some(b"FAT") || at(buf, 0x52, 3) == Some(b"FAT");
        return if fat {
            Signature::Unsupported("vfat")
        } else {
            Signature::PartitionTable("MBR")
        };
    }
    if buf.iter().all(|&b| b == 0) {
        Signature::Blank
    } else {
        Signature::UnknownData
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blank_and_unknown() {
        assert_eq!(classify(&vec![0; 8192]), Signature::Blank);
        let mut data = vec![0; 8192];
        data[3000] = 7;
        assert_eq!(classify(&data), Signature::UnknownData);
    }

    #[test]
    fn mbr_and_gpt() {
        let mut mbr = vec![0; 8192];
        mbr[510] = 0x55;
        mbr[511] = 0xAA;
        assert_eq!(classify(&mbr), Signature::PartitionTable("MBR"));
        let mut gpt = mbr.clone();
        gpt[512..520].copy_from_slice(b"EFI PART");
        assert_eq!(classify(&gpt), Signature::PartitionTable("GPT"));
    }

    #[test]
    fn xfs_uuid() {
        let mut xfs = vec![0; 8192];
        xfs[0..4].copy_from_slice(b"XFSB");
        xfs[32..48].copy_from_slice(&[0x11; 16]);
        assert_eq!(
            classify(&xfs),
            Signature::Supported {
                fs_type: "xfs",
                uuid: "11111111-1111-1111-1111-111111111111".to_string()
            }
        );
    }
}
