//! What bounds a machine like a real instance: its size (a cgroup with the
//! CPU quota, memory limit and PID limit of its instance type), the devices
//! it may open (a device cgroup allow-list), the capabilities it may ever
//! hold (its bounding set) and the system calls it may make (a seccomp
//! filter). See docs/local-cloud.md, "What bounds a machine".
//!
//! Layout, for each cgroup hierarchy of the process that boots the machine:
//! `<its cgroup>/knit-local-<id>` holds the limits and the device list, and
//! the machine's processes live in its child `m`, which is also the root of
//! the machine's cgroup namespace. Root inside can mount the cgroup
//! filesystem and write `m`'s files, but never the parent's, and a child
//! cannot exceed its parent (memory, CPU and PIDs are hierarchical, a v1
//! device list cannot be widened beyond the parent's). Under a pure cgroup
//! v2 host the directory is at the hierarchy's root instead (a v2 cgroup with
//! processes cannot hand controllers to its children).

use crate::error::{IoContext, LocalError, Result};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// The size a machine gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size {
    /// vCPUs of the instance type.
    pub vcpus: u32,
    /// CPUs the quota grants: `vcpus` capped at the host's CPUs.
    pub cpus: u32,
    pub memory_bytes: u64,
    pub pids: u64,
}

/// The local cloud's own types, for templates that name no ECS type.
const LOCAL_TYPES: [(&str, u32, u64); 3] = [
    ("local.small", 2, 4096),
    ("local.medium", 4, 8192),
    ("local.large", 8, 16384),
];

/// PIDs per vCPU, at least [`MIN_PIDS`]: room for containerd, runc, the
/// agent and a node's pods, while a fork bomb stays the machine's problem.
const PIDS_PER_VCPU: u64 = 1024;
const MIN_PIDS: u64 = 4096;

/// vCPUs and memory (MiB) of an instance type: the ECS catalog, or one of
/// the local cloud's `local.*` types.
pub fn type_size(instance_type: &str) -> Option<(u32, u64)> {
    if let Some(t) = knit_api::instance_types::lookup(instance_type) {
        return Some((t.vcpus, t.memory_mib));
    }
    LOCAL_TYPES
        .iter()
        .find(|(n, _, _)| *n == instance_type)
        .map(|&(_, c, m)| (c, m))
}

/// The rule an unknown instance type breaks (for `LocalInvalid`).
pub fn unknown_type_rule() -> String {
    format!(
        "must be an instance type of the catalog (knit_api::instance_types: ecs.g7.large, ecs.t6-c1m1.large, …) or one of {}: the local cloud makes a machine the size its type says",
        LOCAL_TYPES
            .iter()
            .map(|(n, _, _)| *n)
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// The host's CPUs (online).
pub fn host_cpus() -> u32 {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    u32::try_from(n).ok().filter(|n| *n > 0).unwrap_or(1)
}

impl Size {
    pub fn of(instance_type: &str) -> Result<Size> {
        let (vcpus, memory_mib) = type_size(instance_type).ok_or_else(|| {
            LocalError::invalid(
                "instanceType",
                format!("{instance_type:?}"),
                unknown_type_rule(),
            )
        })?;
        Ok(Size {
            vcpus,
            cpus: vcpus.min(host_cpus()),
            memory_bytes: memory_mib * 1024 * 1024,
            pids: (PIDS_PER_VCPU * u64::from(vcpus)).max(MIN_PIDS),
        })
    }
}

/// Character devices every machine may open: null, zero, full, random,
/// urandom, tty, console, ptmx, its pseudo-terminals, tun (CNI, VPNs) and
/// fuse (containerd's fuse-overlayfs, sshfs). Anything may be made with
/// mknod (`m`), as runc does for a container's /dev; only these and the
/// machine's own disks may be opened.
const ALLOWED_DEVICES: [&str; 13] = [
    "c *:* m",
    "b *:* m",
    "c 1:3 rwm",
    "c 1:5 rwm",
    "c 1:7 rwm",
    "c 1:8 rwm",
    "c 1:9 rwm",
    "c 5:0 rwm",
    "c 5:1 rwm",
    "c 5:2 rwm",
    "c 136:* rwm",
    "c 10:200 rwm",
    "c 10:229 rwm",
];

/// A cgroup hierarchy the booting process is in.
#[derive(Debug, Clone, PartialEq)]
struct Hierarchy {
    /// Where it is mounted on the host.
    mount: PathBuf,
    /// The process's cgroup, relative to the mount.
    own: PathBuf,
    v2: bool,
}

/// The hierarchies of this process that are mounted (v1 controllers, named
/// v1 hierarchies, the v2 unified one).
fn hierarchies() -> Result<Vec<Hierarchy>> {
    let cgroup =
        std::fs::read_to_string("/proc/self/cgroup").ctx("cannot read", "/proc/self/cgroup")?;
    let info = std::fs::read_to_string("/proc/self/mountinfo")
        .ctx("cannot read", "/proc/self/mountinfo")?;
    Ok(parse_hierarchies(&cgroup, &info))
}

fn parse_hierarchies(cgroup: &str, mountinfo: &str) -> Vec<Hierarchy> {
    // (fstype, root, mount point, super options)
    let mounts: Vec<(&str, &str, &str, Vec<&str>)> = mountinfo
        .lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let f: Vec<&str> = pre.split(' ').collect();
            let p: Vec<&str> = post.split(' ').collect();
            let fstype = *p.first()?;
            if fstype != "cgroup" && fstype != "cgroup2" {
                return None;
            }
            Some((
                fstype,
                *f.get(3)?,
                *f.get(4)?,
                p.get(2)?.split(',').collect(),
            ))
        })
        .collect();
    let mut out = Vec::new();
    for line in cgroup.lines() {
        let mut it = line.splitn(3, ':');
        let (Some(_), Some(ctrls), Some(path)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        let v2 = ctrls.is_empty();
        let found = mounts.iter().find(|(fstype, root, _, opts)| {
            *root == "/"
                && if v2 {
                    *fstype == "cgroup2"
                } else {
                    *fstype == "cgroup" && ctrls.split(',').all(|c| opts.contains(&c))
                }
        });
        if let Some((_, _, mount, _)) = found {
            out.push(Hierarchy {
                mount: PathBuf::from(unescape(mount)),
                own: PathBuf::from(path.trim_start_matches('/')),
                v2,
            });
        }
    }
    out
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// The cgroup directories a machine's boot will make, one per hierarchy:
/// recorded before they are made, so that `halt` and `down` remove them
/// after a crash at any step.
pub fn plan(id: &str) -> Result<Vec<PathBuf>> {
    let hs = hierarchies()?;
    let pure_v2 = hs.iter().all(|h| h.v2);
    Ok(hs
        .iter()
        .map(|h| {
            let name = format!("knit-local-{id}");
            if h.v2 && pure_v2 {
                h.mount.join(name)
            } else {
                h.mount.join(&h.own).join(name)
            }
        })
        .collect())
}

/// The child of a machine's cgroup its processes live in.
pub fn leaf(dir: &Path) -> PathBuf {
    dir.join("m")
}

fn write(path: &Path, value: &str) -> Result<()> {
    std::fs::write(path, value).ctx("cannot write cgroup file", path)
}

/// A block device the machine may open (its system and data disks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dev {
    pub major: u64,
    pub minor: u64,
}

impl Dev {
    fn rule(&self) -> String {
        format!("b {}:{} rwm", self.major, self.minor)
    }
}

/// Makes the cgroups [`plan`] named: limits and device list on each, the
/// same limits on its leaf (what the machine reads as its size, as cAdvisor
/// does). Undone by [`remove`], also on failure.
pub fn create(dirs: &[PathBuf], size: &Size, disks: &[Dev]) -> Result<()> {
    let made = (|| {
        for dir in dirs {
            let v2 = dir
                .parent()
                .is_some_and(|p| p.join("cgroup.controllers").exists());
            if v2 {
                if let Some(parent) = dir.parent() {
                    enable_controllers(parent)?;
                }
            }
            std::fs::create_dir(dir)
                .or_else(|e| {
                    if e.kind() == std::io::ErrorKind::AlreadyExists {
                        Ok(())
                    } else {
                        Err(e)
                    }
                })
                .ctx("cannot create cgroup", dir)?;
            configure(dir, size)?;
            let devices = dir.join("devices.deny");
            if devices.exists() {
                write(&devices, "a")?;
                for rule in ALLOWED_DEVICES
                    .iter()
                    .map(|s| s.to_string())
                    .chain(disks.iter().map(Dev::rule))
                {
                    write(&dir.join("devices.allow"), &rule)?;
                }
            }
            if v2 {
                enable_controllers(dir)?;
                device_program(dir, disks)?;
            }
            let m = leaf(dir);
            std::fs::create_dir(&m)
                .or_else(|e| {
                    if e.kind() == std::io::ErrorKind::AlreadyExists {
                        Ok(())
                    } else {
                        Err(e)
                    }
                })
                .ctx("cannot create cgroup", &m)?;
            configure(&m, size)?;
        }
        Ok(())
    })();
    if made.is_err() {
        if let Err(e) = remove(dirs) {
            tracing::warn!(error = %e, "removing the cgroups of a failed boot");
        }
    }
    made
}

/// The device list as a program on a v2 cgroup ([`crate::devprog`]). On a
/// hybrid host the v1 device cgroup holds the same list; if the kernel
/// refuses the program there, that list still does, and a warning says so.
fn device_program(dir: &Path, disks: &[Dev]) -> Result<()> {
    let rules: Vec<crate::devprog::Rule> = ALLOWED_DEVICES
        .iter()
        .map(|s| s.to_string())
        .chain(disks.iter().map(Dev::rule))
        .filter_map(|l| crate::devprog::Rule::parse(&l))
        .collect();
    match crate::devprog::apply(dir, &rules) {
        Err(e) if v1_devices() => {
            tracing::warn!(cgroup = %dir.display(), error = %e, "no device program on the v2 hierarchy: the v1 device cgroup alone holds the list");
            Ok(())
        }
        other => other,
    }
}

/// Whether this process is in a v1 device cgroup (a hybrid or v1 host).
fn v1_devices() -> bool {
    hierarchies().is_ok_and(|hs| {
        hs.iter()
            .any(|h| !h.v2 && h.mount.join(&h.own).join("devices.allow").exists())
    })
}

/// Hands cpu, memory and pids (those the cgroup has) to its children (v2).
fn enable_controllers(dir: &Path) -> Result<()> {
    let have = std::fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
    let on = std::fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap_or_default();
    for c in ["cpu", "memory", "pids"] {
        let has = |s: &str| s.split_whitespace().any(|x| x == c);
        if has(&have) && !has(&on) {
            write(&dir.join("cgroup.subtree_control"), &format!("+{c}"))?;
        }
    }
    Ok(())
}

fn configure(dir: &Path, size: &Size) -> Result<()> {
    const PERIOD: u64 = 100_000;
    let quota = u64::from(size.cpus) * PERIOD;
    // v1 cpuset: a new cgroup has no CPUs or memory nodes until given some.
    for f in ["cpuset.cpus", "cpuset.mems"] {
        let p = dir.join(f);
        if p.exists()
            && std::fs::read_to_string(&p)
                .unwrap_or_default()
                .trim()
                .is_empty()
        {
            if let Some(parent) = dir.parent() {
                let v = std::fs::read_to_string(parent.join(f))
                    .ctx("cannot read cgroup file", parent.join(f))?;
                write(&p, v.trim())?;
            }
        }
    }
    if dir.join("cpu.cfs_quota_us").exists() {
        write(&dir.join("cpu.cfs_period_us"), &PERIOD.to_string())?;
        write(&dir.join("cpu.cfs_quota_us"), &quota.to_string())?;
    }
    if dir.join("cpu.max").exists() {
        write(&dir.join("cpu.max"), &format!("{quota} {PERIOD}"))?;
    }
    if dir.join("memory.limit_in_bytes").exists() {
        write(
            &dir.join("memory.limit_in_bytes"),
            &size.memory_bytes.to_string(),
        )?;
    }
    if dir.join("memory.max").exists() {
        write(&dir.join("memory.max"), &size.memory_bytes.to_string())?;
        if dir.join("memory.swap.max").exists() {
            write(&dir.join("memory.swap.max"), "0")?;
        }
    }
    if dir.join("pids.max").exists() {
        write(&dir.join("pids.max"), &size.pids.to_string())?;
    }
    Ok(())
}

/// Opens each leaf's `cgroup.procs` for writing: a process that writes `0`
/// to them joins the machine's cgroups (done between fork and exec).
pub fn join_files(dirs: &[PathBuf]) -> Result<Vec<std::fs::File>> {
    dirs.iter()
        .map(|d| {
            let p = leaf(d).join("cgroup.procs");
            std::fs::OpenOptions::new()
                .write(true)
                .open(&p)
                .ctx("cannot open", p)
        })
        .collect()
}

/// Allows (hot attach) or denies (detach) one more disk; `disks` are the
/// machine's disks after the change (a v2 device program is made anew from
/// them).
pub fn set_disk(dirs: &[PathBuf], dev: Dev, allow: bool, disks: &[Dev]) -> Result<()> {
    for dir in dirs {
        if dir.join("cgroup.controllers").exists() {
            device_program(dir, disks)?;
            continue;
        }
        if !dir.join("devices.allow").exists() {
            continue;
        }
        if allow {
            // A child gets what its parent allows only when told.
            write(&dir.join("devices.allow"), &dev.rule())?;
            write(&leaf(dir).join("devices.allow"), &dev.rule())?;
        } else {
            // A parent's deny reaches its children.
            write(&dir.join("devices.deny"), &dev.rule())?;
        }
    }
    Ok(())
}

/// PIDs still in a machine's cgroups (to end them when its network
/// namespace no longer finds them).
pub fn pids(dirs: &[PathBuf]) -> Vec<i32> {
    let mut out = Vec::new();
    for d in dirs {
        for f in [leaf(d).join("cgroup.procs"), d.join("cgroup.procs")] {
            if let Ok(t) = std::fs::read_to_string(&f) {
                out.extend(t.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// Removes a machine's cgroups (leaf first); missing ones are fine. A
/// cgroup whose last process is still exiting is retried for a while.
pub fn remove(dirs: &[PathBuf]) -> Result<()> {
    for dir in dirs {
        for d in [leaf(dir), dir.clone()] {
            let mut tries = 0;
            loop {
                match std::fs::remove_dir(&d) {
                    Ok(()) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) && tries < 250 => {
                        tries += 1;
                        std::thread::sleep(std::time::Duration::from_millis(20));
                    }
                    Err(e) => return Err(e).ctx("cannot remove cgroup", d),
                }
            }
        }
    }
    Ok(())
}

// ---- capabilities ----------------------------------------------------------

/// Capabilities no node needs, dropped from a machine's bounding set (so no
/// process inside can ever hold them, even root after an exec). Each kept
/// one, and why, is listed in docs/local-cloud.md.
pub const DROPPED_CAPS: [(u32, &str); 16] = [
    (2, "DAC_READ_SEARCH"),
    (16, "SYS_MODULE"),
    (17, "SYS_RAWIO"),
    (20, "SYS_PACCT"),
    (22, "SYS_BOOT"),
    (25, "SYS_TIME"),
    (26, "SYS_TTY_CONFIG"),
    (30, "AUDIT_CONTROL"),
    (32, "MAC_OVERRIDE"),
    (33, "MAC_ADMIN"),
    (34, "SYSLOG"),
    (35, "WAKE_ALARM"),
    (36, "BLOCK_SUSPEND"),
    (37, "AUDIT_READ"),
    (38, "PERFMON"),
    (40, "CHECKPOINT_RESTORE"),
];

/// Drops [`DROPPED_CAPS`] from the calling process's bounding set. Only
/// raw syscalls: safe between fork and exec. A capability the kernel does
/// not know (EINVAL) is no capability to drop.
pub fn drop_caps() -> std::io::Result<()> {
    for (cap, _) in DROPPED_CAPS {
        // SAFETY: prctl with integer arguments.
        let r = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINVAL) {
                return Err(e);
            }
        }
    }
    Ok(())
}

// ---- seccomp ---------------------------------------------------------------

/// System calls a machine may not make (EPERM): LXC's default deny list
/// (module loading and unloading, kexec, open_by_handle_at, forced
/// unmounts) and the host-wide operations no node needs: reboot, swap,
/// process accounting, the kernel log, the clock, raw I/O ports, perf.
pub const DENIED_SYSCALLS: [(&str, libc::c_long); 15] = [
    ("init_module", libc::SYS_init_module),
    ("finit_module", libc::SYS_finit_module),
    ("delete_module", libc::SYS_delete_module),
    ("kexec_load", libc::SYS_kexec_load),
    ("kexec_file_load", libc::SYS_kexec_file_load),
    ("open_by_handle_at", libc::SYS_open_by_handle_at),
    ("reboot", libc::SYS_reboot),
    ("swapon", libc::SYS_swapon),
    ("swapoff", libc::SYS_swapoff),
    ("acct", libc::SYS_acct),
    ("syslog", libc::SYS_syslog),
    ("settimeofday", libc::SYS_settimeofday),
    ("clock_settime", libc::SYS_clock_settime),
    ("perf_event_open", libc::SYS_perf_event_open),
    ("lookup_dcookie", libc::SYS_lookup_dcookie),
];

/// x86's raw I/O port access and the a.out loader.
#[cfg(target_arch = "x86_64")]
pub const DENIED_SYSCALLS_ARCH: [(&str, libc::c_long); 3] = [
    ("iopl", libc::SYS_iopl),
    ("ioperm", libc::SYS_ioperm),
    ("uselib", libc::SYS_uselib),
];
#[cfg(not(target_arch = "x86_64"))]
pub const DENIED_SYSCALLS_ARCH: [(&str, libc::c_long); 0] = [];

/// The x32 ABI's system call numbers are x86-64's with this bit set.
const X32_SYSCALL_BIT: libc::c_long = 0x4000_0000;

/// A compiled seccomp filter, installed between fork and exec.
pub struct Filter(Vec<libc::sock_filter>);

/// Compiles the machine's filter: [`DENIED_SYSCALLS`] and `umount2` with
/// `MNT_FORCE` (LXC's reject_force_umount) answer EPERM, everything else is
/// allowed; a system call of another architecture (a 32-bit one on x86-64)
/// kills the process, as seccompiler's architecture check does.
pub fn filter() -> Result<Filter> {
    use seccompiler::{
        SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
        SeccompRule, TargetArch,
    };
    let err = |e: String| LocalError::Boot {
        id: "seccomp".into(),
        message: format!("cannot build the seccomp filter: {e}"),
    };
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| err(e.to_string()))?;
    let mut rules: std::collections::BTreeMap<i64, Vec<SeccompRule>> = DENIED_SYSCALLS
        .iter()
        .chain(DENIED_SYSCALLS_ARCH.iter())
        .flat_map(|(_, nr)| {
            // x86-64's x32 ABI passes the same architecture check with
            // the number | __X32_SYSCALL_BIT: deny those too.
            let x32 = cfg!(target_arch = "x86_64").then_some(*nr | X32_SYSCALL_BIT);
            std::iter::once(*nr).chain(x32)
        })
        .map(|nr| (nr, Vec::new()))
        .collect();
    let force = SeccompCondition::new(
        1,
        SeccompCmpArgLen::Dword,
        SeccompCmpOp::MaskedEq(libc::MNT_FORCE as u64),
        libc::MNT_FORCE as u64,
    )
    .map_err(|e| err(e.to_string()))?;
    rules.insert(
        libc::SYS_umount2,
        vec![SeccompRule::new(vec![force]).map_err(|e| err(e.to_string()))?],
    );
    let f = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(|e| err(e.to_string()))?;
    let prog: seccompiler::BpfProgram = f
        .try_into()
        .map_err(|e: seccompiler::BackendError| err(e.to_string()))?;
    Ok(Filter(
        prog.into_iter()
            .map(|i| libc::sock_filter {
                code: i.code,
                jt: i.jt,
                jf: i.jf,
                k: i.k,
            })
            .collect(),
    ))
}

impl Filter {
    /// Installs the filter on the calling thread, inherited by every child.
    /// Without no_new_privs (root inside keeps its set-uid programs): the
    /// caller has CAP_SYS_ADMIN. Only a raw syscall: safe between fork and
    /// exec.
    pub fn install(&self) -> std::io::Result<()> {
        let prog = libc::sock_fprog {
            len: self.0.len() as libc::c_ushort,
            filter: self.0.as_ptr() as *mut libc::sock_filter,
        };
        // SAFETY: prog points at a valid program that outlives the call.
        let r = unsafe {
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                0,
                &prog as *const libc::sock_fprog,
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

/// Everything a process entering a machine applies to itself between fork
/// and exec: its cgroups, its bounding set, its filter.
pub struct Entry {
    join: Vec<std::fs::File>,
    filter: Filter,
}

impl Entry {
    pub fn new(dirs: &[PathBuf]) -> Result<Entry> {
        Ok(Entry {
            join: join_files(dirs)?,
            filter: filter()?,
        })
    }

    /// Joins the cgroups (call before unsharing a cgroup namespace).
    pub fn join(&self) -> std::io::Result<()> {
        for f in &self.join {
            // SAFETY: writing two bytes from a static buffer to an open fd.
            let n = unsafe { libc::write(f.as_raw_fd(), b"0".as_ptr().cast(), 1) };
            if n < 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }

    /// Drops the capabilities and installs the filter (last: the filter
    /// also binds what runs the rest of this process).
    pub fn confine(&self) -> std::io::Result<()> {
        drop_caps()?;
        self.filter.install()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_come_from_the_catalog_and_are_capped() {
        let s = Size::of("ecs.t6-c1m1.large").expect("known");
        assert_eq!((s.vcpus, s.memory_bytes), (2, 2 << 30));
        assert_eq!(s.cpus, 2.min(host_cpus()));
        assert_eq!(s.pids, MIN_PIDS);
        let s = Size::of("ecs.g7.32xlarge").expect("known");
        assert_eq!(s.cpus, 128.min(host_cpus()));
        assert_eq!(s.pids, 128 * 1024);
        assert!(Size::of("local.small").is_ok());
        let e = Size::of("ecs.g7.huge").expect_err("unknown");
        assert_eq!(e.code(), "LocalInvalid");
        assert!(e.to_string().contains("instanceType"), "{e}");
        assert!(e.to_string().contains("ecs.g7.huge"), "{e}");
    }

    #[test]
    fn hierarchies_of_v1_hybrid_and_v2_hosts() {
        let info = "\
30 25 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
34 30 0:30 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
35 30 0:31 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
36 30 0:32 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd
";
        let cg = "4:memory:/knit.service\n3:cpu,cpuacct:/knit.service\n1:name=systemd:/x\n0::/knit.service\n";
        let hs = parse_hierarchies(cg, info);
        assert_eq!(hs.len(), 4, "{hs:?}");
        assert_eq!(hs[0].mount, PathBuf::from("/sys/fs/cgroup/memory"));
        assert_eq!(hs[0].own, PathBuf::from("knit.service"));
        assert_eq!(hs[1].mount, PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"));
        assert_eq!(hs[2].mount, PathBuf::from("/sys/fs/cgroup/systemd"));
        assert!(hs[3].v2);
        let v2 = parse_hierarchies(
            "0::/user.slice\n",
            "30 25 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
        );
        assert_eq!(v2.len(), 1);
        assert!(v2[0].v2);
    }

    #[test]
    fn the_filter_compiles() {
        let f = filter().expect("compiles");
        assert!(f.0.len() > 2 * DENIED_SYSCALLS.len());
    }
}
