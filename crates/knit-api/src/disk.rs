//! The runtime disk: which data disk holds containerd's root, the kubelet's
//! directory and the Kubernetes package cache (SPEC §1 3.1).
//!
//! One rule, used by everyone who needs to know: the server (which disk's
//! settings go into the node's configuration, which disk a snapshot is
//! taken of) and the agent (which attached device it formats and mounts).
//!
//! **The runtime disk is the last NVMe data disk when the instance has one,
//! otherwise the last data disk.** "Last" is the spec's order
//! (`spec.dataDisks`); clouds attach disks in that order and name the
//! devices in it (`vdb`, `vdc`, … and `nvme0n1`, `nvme1n1`, …), so inside
//! the instance it is the NVMe device, or else the device, with the
//! highest name in attach order ([`device_order`]).

use std::cmp::Ordering;

/// Whether a data disk interface (`spec.dataDisks[].interface`) or a
/// device name is NVMe.
pub fn is_nvme(interface_or_device: &str) -> bool {
    interface_or_device.starts_with("nvme")
}

/// The runtime disk's index among a pool's data disks, given each disk's
/// `interface` in spec order; `None` without data disks.
pub fn runtime_disk_index<S: AsRef<str>>(interfaces: &[S]) -> Option<usize> {
    let last_nvme = interfaces.iter().rposition(|i| is_nvme(i.as_ref()));
    last_nvme.or_else(|| interfaces.len().checked_sub(1))
}

/// The runtime disk of a pool's data disks (`spec.dataDisks`), with its
/// index: what the server configures the agent with and snapshots.
pub fn runtime_data_disk(
    disks: &[crate::pool::PoolDataDisk],
) -> Option<(usize, &crate::pool::PoolDataDisk)> {
    let interfaces: Vec<&str> = disks.iter().map(|d| d.interface.as_str()).collect();
    runtime_disk_index(&interfaces).map(|i| (i, &disks[i]))
}

/// Attach order of two device names of one interface: a longer name comes
/// later (`vdaa` after `vdz`, `nvme10n1` after `nvme9n1`), then bytes.
pub fn device_order(a: &str, b: &str) -> Ordering {
    a.len().cmp(&b.len()).then_with(|| a.cmp(b))
}

/// The runtime disk among a node's usable data disk devices (`vdb`,
/// `nvme0n1`; any order): the last NVMe one, else the last one.
pub fn runtime_device<S: AsRef<str>>(devices: &[S]) -> Option<&str> {
    let last = |nvme: bool| {
        devices
            .iter()
            .map(AsRef::as_ref)
            .filter(|d| is_nvme(d) == nvme)
            .max_by(|a, b| device_order(a, b))
    };
    last(true).or_else(|| last(false))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Device names as a cloud gives them: in spec order, the next free
    /// name of the disk's interface.
    fn attach(interfaces: &[&str]) -> Vec<String> {
        let (mut virtio, mut nvme) = (0u8, 0u32);
        interfaces
            .iter()
            .map(|i| {
                if is_nvme(i) {
                    nvme += 1;
                    format!("nvme{}n1", nvme - 1)
                } else {
                    virtio += 1;
                    let n = virtio as usize; // vdb is the first data disk
                    if n < 25 {
                        format!("vd{}", (b'a' + n as u8) as char)
                    } else {
                        format!("vda{}", (b'a' + (n - 25) as u8) as char)
                    }
                }
            })
            .collect()
    }

    #[test]
    fn spec_index_and_device_agree() {
        let cases: &[&[&str]] = &[
            &["virtio"],
            &["virtio", "virtio"],
            &["virtio", "virtio", "virtio"],
            &["nvme", "virtio"],
            &["virtio", "nvme", "virtio"],
            &["nvme", "nvme"],
        ];
        for case in cases {
            let devices = attach(case);
            let index = runtime_disk_index(case).unwrap();
            assert_eq!(
                runtime_device(&devices),
                Some(devices[index].as_str()),
                "{case:?} attached as {devices:?}"
            );
        }
        let many = vec!["nvme"; 12];
        let devices = attach(&many);
        assert_eq!(runtime_device(&devices), Some("nvme11n1"));
        assert_eq!(runtime_disk_index(&many), Some(11));
        let many = vec!["virtio"; 27];
        let devices = attach(&many);
        assert_eq!(runtime_device(&devices), Some(devices[26].as_str()));
    }

    #[test]
    fn two_disks_the_last_one() {
        assert_eq!(runtime_disk_index(&["virtio", "virtio"]), Some(1));
        assert_eq!(runtime_device(&["vdc", "vdb"]), Some("vdc"));
        assert_eq!(runtime_disk_index::<&str>(&[]), None);
        assert_eq!(runtime_device::<&str>(&[]), None);
    }
}
