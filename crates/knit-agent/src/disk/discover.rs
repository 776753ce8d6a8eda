//! Finds candidate data disks: block-device nodes under `<root>/dev` named
//! like cloud disks, with facts read by major:minor from `/sys/dev/block`.

use crate::error::{Context, Result};
use crate::host::Host;
use knit_api::ErrorCode;
use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockDisk {
    /// Device name as the node sees it, e.g. `nvme1n1`, `vdb`.
    pub name: String,
    /// Node-absolute path, e.g. `/dev/nvme1n1`.
    pub path: String,
    pub major: u32,
    pub minor: u32,
    pub size_bytes: u64,
    pub read_only: bool,
    pub serial: Option<String>,
    /// World-wide identifier from sysfs (`wwid`, `device/wwid`), where the bus has one.
    pub wwid: Option<String>,
    /// The `/dev/disk/by-id` link naming this device, if any.
    pub by_id: Option<String>,
    /// Partitions as `major:minor`.
    pub partitions: Vec<String>,
    /// Devices stacked on this one (device-mapper, md …).
    pub holders: Vec<String>,
    /// Why this disk can never be the data disk, if so.
    pub excluded: Option<String>,
}

impl BlockDisk {
    pub fn dev_id(&self) -> String {
        format!("{}:{}", self.major, self.minor)
    }

    pub fn is_nvme(&self) -> bool {
        self.name.starts_with("nvme")
    }

    pub fn identity(&self) -> DiskIdentity {
        DiskIdentity {
            serial: self.serial.clone(),
            wwid: self.wwid.clone(),
            by_id: self.by_id.clone(),
            size_bytes: self.size_bytes,
        }
    }
}

/// What tells one disk from another beyond its `major:minor`, which the
/// kernel hands to whatever disk is attached next.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiskIdentity {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wwid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by_id: Option<String>,
    pub size_bytes: u64,
}

impl DiskIdentity {
    /// `Err` with the first difference when `now` is not the disk recorded
    /// as `self`. An identifier present on one side only is a difference.
    pub fn same_disk(&self, now: &DiskIdentity) -> std::result::Result<(), String> {
        let fields = [
            ("serial", &self.serial, &now.serial),
            ("wwid", &self.wwid, &now.wwid),
            ("by-id link", &self.by_id, &now.by_id),
        ];
        for (what, was, is) in fields {
            if was != is {
                let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "none".to_string());
                return Err(format!("{what} was {}, is {}", show(was), show(is)));
            }
        }
        if self.size_bytes != now.size_bytes {
            return Err(format!(
                "size was {} bytes, is {} bytes",
                self.size_bytes, now.size_bytes
            ));
        }
        Ok(())
    }
}

/// Whole-disk names: `vd*`, `xvd*`, `sd*` (letters only) and `nvme<N>n<M>`.
pub fn is_disk_name(name: &str) -> bool {
    let letters_after = |prefix: &str| {
        name.strip_prefix(prefix)
            .is_some_and(|rest| !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_lowercase()))
    };
    if letters_after("xvd") || letters_after("vd") || letters_after("sd") {
        return true;
    }
    if let Some(rest) = name.strip_prefix("nvme") {
        if let Some((ctrl, ns)) = rest.split_once('n') {
            let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
            return digits(ctrl) && digits(ns);
        }
    }
    false
}

/// sysfs: the node's own if it has one, else the host's (under `--root`).
fn sys_block(host: &Host) -> PathBuf {
    let own = host.path("/sys/dev/block");
    if own.is_dir() {
        own
    } else {
        PathBuf::from("/sys/dev/block")
    }
}

fn read_trim(path: &Path) -> Option<String> {
    fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// `major:minor` of every mounted filesystem in our mount namespace.
fn mounted_dev_ids() -> BTreeSet<String> {
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|line| line.split_whitespace().nth(2).map(str::to_string))
        .collect()
}

/// The `/dev/disk/by-id` link to the device named `name`, if any.
fn by_id_link(host: &Host, name: &str) -> Option<String> {
    let by_id = host.path("/dev/disk/by-id");
    let mut links: Vec<String> = fs::read_dir(by_id)
        .ok()?
        .flatten()
        .filter(|entry| {
            fs::read_link(entry.path())
                .is_ok_and(|target| target.file_name().is_some_and(|f| f == name))
        })
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    links.sort();
    links.into_iter().next()
}

/// The disk serial from sysfs, or from its `/dev/disk/by-id` link.
fn serial_of(sys: &Path, by_id: Option<&str>) -> Option<String> {
    if let Some(s) =
        read_trim(&sys.join("serial")).or_else(|| read_trim(&sys.join("device/serial")))
    {
        return Some(s);
    }
    let id = by_id?;
    Some(
        id.split_once('-')
            .map(|(_, s)| s.to_string())
            .unwrap_or_else(|| id.to_string()),
    )
}

fn wwid_of(sys: &Path) -> Option<String> {
    read_trim(&sys.join("wwid")).or_else(|| read_trim(&sys.join("device/wwid")))
}

/// Lists candidate disks, sorted by name. Excluded disks are kept in the list
/// with the reason, so `plan` can say why they were passed over.
pub fn discover(host: &Host) -> Result<Vec<BlockDisk>> {
    let dev = host.path("/dev");
    let entries = fs::read_dir(&dev).context(ErrorCode::FailDataDiskNotFound, || {
        format!("cannot list {}", dev.display())
    })?;
    let mounted = mounted_dev_ids();
    // The device holding the node's root filesystem.
    let root_dev = fs::metadata(host.root()).ok().map(|m| {
        let d = m.dev();
        format!("{}:{}", nix::sys::stat::major(d), nix::sys::stat::minor(d))
    });
    let sys_root = sys_block(host);
    let mut disks = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !is_disk_name(&name) {
            continue;
        }
        let Ok(meta) = fs::metadata(entry.path()) else {
            continue;
        };
        if !meta.file_type().is_block_device() {
            continue;
        }
        let rdev = meta.rdev();
        let (major, minor) = (
            nix::sys::stat::major(rdev) as u32,
            nix::sys::stat::minor(rdev) as u32,
        );
        let sys = sys_root.join(format!("{major}:{minor}"));
        let sectors: u64 = read_trim(&sys.join("size"))
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let read_only = read_trim(&sys.join("ro")).as_deref() == Some("1");
        let mut partitions = Vec::new();
        if let Ok(children) = fs::read_dir(&sys) {
            for child in children.flatten() {
                if child.path().join("partition").exists() {
                    if let Some(dev) = read_trim(&child.path().join("dev")) {
                        partitions.push(dev);
                    }
                }
            }
        }
        partitions.sort();
        let holders: Vec<String> = fs::read_dir(sys.join("holders"))
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        let dev_id = format!("{major}:{minor}");
        let excluded = if root_dev.as_deref() == Some(dev_id.as_str())
            || partitions.iter().any(|p| root_dev.as_deref() == Some(p))
        {
            Some("holds the root filesystem".to_string())
        } else if mounted.contains(&dev_id) {
            Some("is mounted".to_string())
        } else if let Some(p) = partitions.iter().find(|p| mounted.contains(*p)) {
            Some(format!("has a mounted partition ({p})"))
        } else if !holders.is_empty() {
            Some(format!("is in use by {}", holders.join(", ")))
        } else if read_only {
            Some("is read-only".to_string())
        } else if sectors == 0 {
            Some("has size 0 (no medium)".to_string())
        } else {
            None
        };
        let by_id = by_id_link(host, &name);
        disks.push(BlockDisk {
            serial: serial_of(&sys, by_id.as_deref()),
            wwid: wwid_of(&sys),
            by_id,
            path: format!("/dev/{name}"),
            name,
            major,
            minor,
            size_bytes: sectors * 512,
            read_only,
            partitions,
            holders,
            excluded,
        });
    }
    disks.sort_by(|a, b| a.name.as_bytes().cmp(b.name.as_bytes()));
    Ok(disks)
}

/// docs/spec.md §1.3.1: the runtime disk, by the rule the server also uses
/// ([`knit_api::disk::runtime_device`]): NVMe preferred; among the
/// preferred kind, the last by byte-wise order of the device name.
pub fn choose(disks: &[BlockDisk]) -> Option<&BlockDisk> {
    let usable: Vec<&str> = disks
        .iter()
        .filter(|d| d.excluded.is_none())
        .map(|d| d.name.as_str())
        .collect();
    let name = knit_api::disk::runtime_device(&usable)?;
    disks
        .iter()
        .find(|d| d.excluded.is_none() && d.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk(name: &str) -> BlockDisk {
        BlockDisk {
            name: name.to_string(),
            path: format!("/dev/{name}"),
            major: 7,
            minor: 0,
            size_bytes: 1 << 30,
            read_only: false,
            serial: None,
            wwid: None,
            by_id: None,
            partitions: vec![],
            holders: vec![],
            excluded: None,
        }
    }

    #[test]
    fn identity_differences() {
        let mut was = disk("vdb").identity();
        was.serial = Some("d-1".into());
        assert_eq!(was.same_disk(&was.clone()), Ok(()));
        let mut other = was.clone();
        other.serial = Some("d-2".into());
        assert_eq!(was.same_disk(&other), Err("serial was d-1, is d-2".into()));
        let mut no_serial = was.clone();
        no_serial.serial = None;
        assert!(was.same_disk(&no_serial).is_err());
        let mut bigger = was.clone();
        bigger.size_bytes += 512;
        assert!(was.same_disk(&bigger).unwrap_err().contains("size"));
    }

    #[test]
    fn disk_names() {
        for ok in ["vda", "vdb", "vdaa", "xvdf", "sdb", "nvme0n1", "nvme12n3"] {
            assert!(is_disk_name(ok), "{ok}");
        }
        for bad in [
            "vda1",
            "sdb2",
            "nvme0n1p1",
            "nvme0",
            "loop0",
            "vd",
            "dm-0",
            "nvmen1",
            "sr0",
        ] {
            assert!(!is_disk_name(bad), "{bad}");
        }
    }

    #[test]
    fn choice_prefers_nvme_then_last_name() {
        let set = [disk("vdb"), disk("vdc"), disk("nvme0n1"), disk("nvme1n1")];
        assert_eq!(choose(&set).map(|d| d.name.as_str()), Some("nvme1n1"));
        let set = [disk("vdb"), disk("vdd"), disk("vdc")];
        assert_eq!(choose(&set).map(|d| d.name.as_str()), Some("vdd"));
        // Byte-wise, not natural, order: nvme10n1 < nvme2n1.
        let set = [disk("nvme10n1"), disk("nvme2n1")];
        assert_eq!(choose(&set).map(|d| d.name.as_str()), Some("nvme2n1"));
        let mut excluded = disk("nvme3n1");
        excluded.excluded = Some("is mounted".into());
        let set = [disk("vdb"), excluded];
        assert_eq!(choose(&set).map(|d| d.name.as_str()), Some("vdb"));
        assert!(choose(&[]).is_none());
    }
}
