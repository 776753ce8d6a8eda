//! The runtime disk: which data disk holds containerd's root, the kubelet's
//! directory and the Kubernetes package cache (docs/spec.md §1.3.1).
//!
//! One rule, used by everyone who needs to know: the server (which disk's
//! settings go into the node's configuration, which disk a snapshot is
//! taken of) and the agent (which attached device it formats and mounts).
//!
//! **The runtime disk is the last NVMe data disk device when the instance
//! has one, otherwise the last data disk device, in byte-wise
//! lexicographic order of the device name** (docs/spec.md §1.3.1). Clouds attach
//! a pool's disks in `spec.dataDisks` order and name each the next free
//! name of its interface (`vdb`, `vdc`, … and `nvme0n1`, `nvme1n1`, …), so
//! the server finds the same disk by its index: [`runtime_disk_index`]
//! names the disks that way and applies the device rule. With two data
//! disks of one interface it is the second; byte-wise, `nvme10n1` sorts
//! before `nvme9n1` (the spec's order, kept).

/// Whether a data disk interface (`spec.dataDisks[].interface`) or a
/// device name is NVMe.
pub fn is_nvme(interface_or_device: &str) -> bool {
    interface_or_device.starts_with("nvme")
}

/// The device names a cloud gives data disks attached in this order
/// (`spec.dataDisks[].interface`): the next free name of each interface.
pub fn attach_names<S: AsRef<str>>(interfaces: &[S]) -> Vec<String> {
    let (mut virtio, mut nvme) = (0usize, 0usize);
    interfaces
        .iter()
        .map(|i| {
            if is_nvme(i.as_ref()) {
                nvme += 1;
                format!("nvme{}n1", nvme - 1)
            } else {
                virtio += 1;
                // vdb … vdz, then vdaa, vdab, …
                let letter = |n: usize| (b'a' + n as u8) as char;
                if virtio <= 25 {
                    format!("vd{}", letter(virtio))
                } else {
                    let n = virtio - 26;
                    format!("vd{}{}", letter(n / 26), letter(n % 26))
                }
            }
        })
        .collect()
}

/// The runtime disk's index among a pool's data disks, given each disk's
/// `interface` in spec order; `None` without data disks.
pub fn runtime_disk_index<S: AsRef<str>>(interfaces: &[S]) -> Option<usize> {
    let names = attach_names(interfaces);
    let chosen = runtime_device(&names)?;
    names.iter().position(|n| n == chosen)
}

/// The runtime disk of a pool's data disks (`spec.dataDisks`), with its
/// index: what the server configures the agent with and snapshots.
pub fn runtime_data_disk(
    disks: &[crate::pool::PoolDataDisk],
) -> Option<(usize, &crate::pool::PoolDataDisk)> {
    let interfaces: Vec<&str> = disks.iter().map(|d| d.interface.as_str()).collect();
    runtime_disk_index(&interfaces).map(|i| (i, &disks[i]))
}

/// The runtime disk among a node's usable data disk devices (`vdb`,
/// `nvme0n1`; any order): the last NVMe one, else the last one, by
/// byte-wise order of the name.
pub fn runtime_device<S: AsRef<str>>(devices: &[S]) -> Option<&str> {
    let last = |nvme: bool| {
        devices
            .iter()
            .map(AsRef::as_ref)
            .filter(|d| is_nvme(d) == nvme)
            .max_by(|a, b| a.as_bytes().cmp(b.as_bytes()))
    };
    last(true).or_else(|| last(false))
}

#[cfg(test)]
mod tests {
    use super::*;

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
            let devices = attach_names(case);
            let index = runtime_disk_index(case).unwrap();
            assert_eq!(
                runtime_device(&devices),
                Some(devices[index].as_str()),
                "{case:?} attached as {devices:?}"
            );
        }
        assert_eq!(
            attach_names(&["virtio", "nvme", "virtio"]),
            ["vdb", "nvme0n1", "vdc"]
        );
        assert_eq!(runtime_disk_index(&["nvme", "nvme", "virtio"]), Some(1));
        // Byte-wise (docs/spec.md §1.3.1): of twelve NVMe disks, nvme9n1 (the tenth).
        let many = vec!["nvme"; 12];
        assert_eq!(runtime_device(&attach_names(&many)), Some("nvme9n1"));
        assert_eq!(runtime_disk_index(&many), Some(9));
        let many = vec!["virtio"; 27];
        let names = attach_names(&many);
        assert_eq!((names[24].as_str(), names[25].as_str()), ("vdz", "vdaa"));
        assert_eq!(runtime_disk_index(&many), Some(24));
    }

    #[test]
    fn two_disks_the_last_one() {
        assert_eq!(runtime_disk_index(&["virtio", "virtio"]), Some(1));
        assert_eq!(runtime_device(&["vdc", "vdb"]), Some("vdc"));
        assert_eq!(runtime_disk_index::<&str>(&[]), None);
        assert_eq!(runtime_device::<&str>(&[]), None);
    }
}
