//! What holds a VM's QEMU process on the host (issue 29, libvirt's
//! model): QEMU never runs as root. knit makes the tap as root, opens it
//! and hands QEMU the open descriptor (`-netdev tap,fd=N`), enters the
//! VM's directory, then drops to the VM's own uid and gid (no
//! supplementary groups but `/dev/kvm`'s under KVM) before QEMU starts;
//! QEMU then installs its seccomp filter (`-sandbox`, [`SANDBOX`]).
//!
//! Each VM has a uid and gid of its own, from [`UID_BASE`] up (no passwd
//! entry): one escaped QEMU cannot ptrace another, nor connect to another
//! VM's QMP or guest-agent socket, nor open another VM's disks. QEMU opens
//! its files by paths relative to the VM's directory (its working
//! directory), so the state directory's parents need not be searchable by
//! it; the base disk, kernel and initramfs (the cache) must be, and
//! [`check_reachable`] says so before a start.

use crate::error::{IoContext, QemuError, Result};
use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;

/// QEMU's seccomp filter: its default deny list, obsolete system calls,
/// set*uid/set*gid, fork/exec (no helper may be started), and scheduler
/// and affinity changes all refused.
pub const SANDBOX: &str = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny";
/// First uid (and gid) of VMs: 0x70000000, above the ranges systemd hands
/// out to users, dynamic users and containers, below 2^31.
pub const UID_BASE: u32 = 0x7000_0000;
/// How many uids VMs draw from (at random, unique within a state
/// directory).
pub const UID_SPAN: u32 = 1 << 24;

/// Whether `uid` is one knit gives VMs.
pub fn is_vm_uid(uid: u32) -> bool {
    (UID_BASE..UID_BASE + UID_SPAN).contains(&uid)
}

/// A free VM uid: random in the range, none of `used`.
pub fn pick_uid(used: &std::collections::BTreeSet<u32>) -> Result<u32> {
    for _ in 0..64 {
        let hex = crate::state::random_hex(3)?;
        let n = u32::from_str_radix(&hex, 16).map_err(|e| QemuError::State {
            path: "/dev/urandom".into(),
            message: e.to_string(),
        })?;
        let uid = UID_BASE + (n % UID_SPAN);
        if !used.contains(&uid) {
            return Ok(uid);
        }
    }
    Err(QemuError::Busy {
        what: "VM uids".into(),
        message: "no free uid found".into(),
    })
}

#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// The tap `name` (made before, persistent), opened as QEMU would open it:
/// a descriptor that is the VM's network card on the host side. Close on
/// exec here; the child clears that for itself only.
pub fn open_tap(name: &str) -> Result<OwnedFd> {
    const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
    const IFF_TAP: libc::c_short = 0x0002;
    const IFF_NO_PI: libc::c_short = 0x1000;
    const IFF_VNET_HDR: libc::c_short = 0x4000;
    if name.is_empty() || name.len() >= libc::IFNAMSIZ {
        return Err(QemuError::invalid(
            "tap",
            name,
            "must be a link name of 1-15 bytes",
        ));
    }
    let tun = std::fs::File::options()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/net/tun")
        .ctx("cannot open", "/dev/net/tun")?;
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        flags: IFF_TAP | IFF_NO_PI | IFF_VNET_HDR,
        _pad: [0; 22],
    };
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: TUNSETIFF reads and writes a struct ifreq, which IfReq lays
    // out (name, flags, padding to 40 bytes); the descriptor is ours.
    if unsafe { libc::ioctl(tun.as_raw_fd(), TUNSETIFF as _, &mut req) } != 0 {
        return Err(std::io::Error::last_os_error()).ctx(
            "cannot attach (TUNSETIFF) to tap",
            format!("/dev/net/tun {name}"),
        );
    }
    Ok(OwnedFd::from(tun))
}

/// Makes `path` (a regular file knit made) the VM's: owner, group, mode.
/// Refuses a symbolic link in its place.
pub fn give(path: &Path, uid: u32, gid: u32, mode: u32) -> Result<()> {
    let f = std::fs::File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .ctx("cannot open", path)?;
    // SAFETY: fchown/fchmod on a descriptor we own.
    if unsafe { libc::fchown(f.as_raw_fd(), uid, gid) } != 0 {
        return Err(std::io::Error::last_os_error()).ctx("cannot chown", path);
    }
    // SAFETY: as above.
    if unsafe { libc::fchmod(f.as_raw_fd(), mode as libc::mode_t) } != 0 {
        return Err(std::io::Error::last_os_error()).ctx("cannot chmod", path);
    }
    Ok(())
}

/// Owner, group and mode of a directory knit made (not a link).
pub fn set_dir(path: &Path, uid: u32, gid: u32, mode: u32) -> Result<()> {
    let meta = std::fs::symlink_metadata(path).ctx("cannot stat", path)?;
    if !meta.is_dir() {
        return Err(QemuError::State {
            path: path.display().to_string(),
            message: "must be a directory".into(),
        });
    }
    std::os::unix::fs::lchown(path, Some(uid), Some(gid)).ctx("cannot chown", path)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).ctx("cannot chmod", path)
}

/// Whether (uid, gid, groups) has `bit` (4 read, 1 search) on `meta` by
/// its mode bits (no ACLs: knit sets none).
fn permits(meta: &std::fs::Metadata, uid: u32, gids: &[u32], bit: u32) -> bool {
    let mode = meta.mode();
    if meta.uid() == uid {
        mode & (bit << 6) != 0
    } else if gids.contains(&meta.gid()) {
        mode & (bit << 3) != 0
    } else {
        mode & bit != 0
    }
}

/// Refuses a start whose QEMU could not read `file` (an absolute path: the
/// cache's base disk, kernel, initramfs), naming the directory or file
/// that stops it.
pub fn check_reachable(field: &str, file: &Path, uid: u32, gids: &[u32]) -> Result<()> {
    let meta = std::fs::metadata(file).ctx("cannot stat", file)?;
    if !permits(&meta, uid, gids, 4) {
        return Err(QemuError::invalid(
            field,
            file.display(),
            format!(
                "must be readable by the VM's QEMU (uid {uid}); its mode is {:04o}",
                meta.mode() & 0o7777
            ),
        ));
    }
    for dir in file.ancestors().skip(1) {
        if dir.as_os_str().is_empty() {
            continue;
        }
        let meta = std::fs::metadata(dir).ctx("cannot stat", dir)?;
        if !permits(&meta, uid, gids, 1) {
            return Err(QemuError::invalid(
                field,
                file.display(),
                format!(
                    "must be reachable by the VM's QEMU (uid {uid}): {} (mode {:04o}) is not searchable by it",
                    dir.display(),
                    meta.mode() & 0o7777
                ),
            ));
        }
    }
    Ok(())
}

/// What a non-root QEMU may do with a `/dev/kvm` of this mode and group:
/// the group to join for it (when that group, not root's, may read and
/// write it), and whether it can open it at all.
fn kvm_access(mode: u32, gid: u32) -> (Option<u32>, bool) {
    let group = (gid != 0 && mode & 0o060 == 0o060).then_some(gid);
    (group, group.is_some() || mode & 0o006 == 0o006)
}

/// The group of `/dev/kvm` QEMU joins under KVM ([`kvm_access`]).
pub fn kvm_gid() -> Option<u32> {
    let m = std::fs::metadata("/dev/kvm").ok()?;
    kvm_access(m.mode(), m.gid()).0
}

/// Whether QEMU, once it is no longer root, can open `/dev/kvm`.
pub fn kvm_usable() -> bool {
    std::fs::metadata("/dev/kvm").is_ok_and(|m| kvm_access(m.mode(), m.gid()).1)
}

/// How the child becomes the VM's QEMU, between fork and exec: into the
/// VM's directory (as root: its parents need not be searchable), a session
/// of its own (no terminal's signals), the tap descriptor kept open, then
/// groups, gid and uid dropped for good.
pub struct Demote {
    pub dir: CString,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<libc::gid_t>,
    pub tap: RawFd,
}

impl Demote {
    pub fn new(dir: &Path, uid: u32, gid: u32, groups: Vec<u32>, tap: RawFd) -> Result<Demote> {
        let dir = CString::new(dir.as_os_str().as_bytes()).map_err(|_| {
            QemuError::invalid("stateDir", dir.display(), "must not contain a NUL byte")
        })?;
        if uid == 0 || gid == 0 {
            return Err(QemuError::invalid("uid", uid, "QEMU never runs as root"));
        }
        Ok(Demote {
            dir,
            uid,
            gid,
            groups,
            tap,
        })
    }

    pub fn install(self, cmd: &mut std::process::Command) {
        let Demote {
            dir,
            uid,
            gid,
            groups,
            tap,
        } = self;
        let step = |r: libc::c_int| {
            if r < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(())
            }
        };
        // SAFETY: only async-signal-safe calls (chdir, setsid, fcntl,
        // setgroups, setgid, setuid) on data made before the fork.
        unsafe {
            cmd.pre_exec(move || {
                step(libc::chdir(dir.as_ptr()))?;
                step(libc::setsid())?;
                step(libc::fcntl(tap, libc::F_SETFD, 0))?;
                step(libc::setgroups(groups.len(), groups.as_ptr()))?;
                step(libc::setgid(gid))?;
                step(libc::setuid(uid))?;
                Ok(())
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kvm_is_usable_through_its_group_or_by_anyone() {
        // Debian's udev rule: root:kvm 0660.
        assert_eq!(kvm_access(0o20660, 993), (Some(993), true));
        // Root's alone (this build host): TCG.
        assert_eq!(kvm_access(0o20600, 0), (None, false));
        assert_eq!(kvm_access(0o20660, 0), (None, false));
        assert_eq!(kvm_access(0o20640, 993), (None, false));
        assert_eq!(kvm_access(0o20666, 0), (None, true));
    }

    #[test]
    fn vm_uids_are_in_their_range_and_unique() {
        let mut used = std::collections::BTreeSet::new();
        for _ in 0..32 {
            let uid = pick_uid(&used).unwrap();
            assert!(is_vm_uid(uid) && uid >= UID_BASE, "{uid}");
            assert!(used.insert(uid), "{uid} twice");
        }
        assert!(!is_vm_uid(0) && !is_vm_uid(65534) && !is_vm_uid(UID_BASE + UID_SPAN));
    }
}
