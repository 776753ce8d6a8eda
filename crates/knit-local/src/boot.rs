//! Inside the instance: the host-side shim that waits for PID 1, and PID 1
//! itself, which builds the root filesystem and /dev in its own mount
//! namespace, pivots into it, starts the user-data runner and reaps.
//!
//! Runs in a freshly exec'd, single-threaded helper process (`knit-local
//! __boot`), already in the instance's network, UTS and IPC namespaces and
//! with a new PID namespace pending for its children (set up by the host in
//! `pre_exec`). Protocol on stdout: the shim's `pid N` (PID 1 as seen by
//! the host) and PID 1's `ready` or `error MESSAGE`; two processes write
//! them, so they come in either order.

use crate::error::{IoContext, Result, SysContext};
use crate::loopdev::LoopDev;
use crate::model::{OsInfo, UserDataRunner};
use crate::userdata;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sys::signal::{kill, sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
use nix::sys::stat::{makedev, mknod, umask, Mode, SFlag};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{chdir, fork, pivot_root, sethostname, ForkResult, Pid};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Everything PID 1 needs, written by the host before spawning.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BootSpec {
    pub id: String,
    pub hostname: String,
    pub private_ip: String,
    pub base_root: PathBuf,
    pub instance_dir: PathBuf,
    /// Host paths covered by an empty tmpfs inside (the state directory).
    pub hide: Vec<PathBuf>,
    pub system_disk: LoopDev,
    pub disks: Vec<BootDisk>,
    pub user_data: Option<String>,
    pub runner: UserDataRunner,
    pub os_override: Option<OsInfo>,
    pub swap: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BootDisk {
    /// Cloud name: `vdb`, `nvme0n1`.
    pub device: String,
    pub major: u64,
    pub minor: u64,
    /// The loop device's kernel name, for its sysfs entry.
    pub loop_name: String,
    /// Name under /dev/disk/by-id: `virtio-SERIAL` or `nvme-SERIAL`.
    pub by_id: String,
}

/// Seconds PID 1 gives its processes between SIGTERM and SIGKILL on stop.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// Entry point of `knit-local __boot SPEC`; returns the shim's exit code.
pub fn shim_main(spec_path: &Path) -> i32 {
    let spec: BootSpec = match std::fs::read_to_string(spec_path)
        .map_err(|e| e.to_string())
        .and_then(|t| serde_json::from_str(&t).map_err(|e| e.to_string()))
    {
        Ok(s) => s,
        Err(e) => {
            say(&format!(
                "error cannot read boot spec {}: {e}",
                spec_path.display()
            ));
            return 1;
        }
    };
    // SAFETY: this process is single-threaded (fresh exec, no threads started).
    match unsafe { fork() } {
        Err(e) => {
            say(&format!("error fork: {e}"));
            1
        }
        Ok(ForkResult::Child) => pid1(&spec),
        Ok(ForkResult::Parent { child }) => {
            // A test's stand-in for a shim descheduled right after fork.
            crate::pause::delay_if_set(
                "KNIT_LOCAL_DELAY_AT",
                "shim-pid",
                std::time::Duration::from_millis(1500),
            );
            say(&format!("pid {child}"));
            stdout_to_stderr();
            let status = loop {
                match waitpid(child, None) {
                    Ok(WaitStatus::Exited(_, code)) => break format!("exited {code}"),
                    Ok(WaitStatus::Signaled(_, sig, _)) => break format!("killed by {sig}"),
                    Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
                    Err(e) => break format!("wait failed: {e}"),
                }
            };
            let _ = std::fs::write(spec.instance_dir.join("last-exit"), format!("{status}\n"));
            0
        }
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", line.replace('\n', " | "));
    let _ = out.flush();
}

/// The host stops reading after the handshake; later output goes to the console log.
fn stdout_to_stderr() {
    // SAFETY: dup2 on our own standard descriptors.
    unsafe {
        libc::dup2(2, 1);
    }
}

fn pid1(spec: &BootSpec) -> i32 {
    if let Err(e) = setup(spec) {
        say(&format!("error {e}"));
        return 1;
    }
    say("ready");
    stdout_to_stderr();
    init_loop(spec)
}

fn mnt(
    src: &str,
    target: &Path,
    fstype: Option<&str>,
    flags: MsFlags,
    data: Option<&str>,
) -> Result<()> {
    mount(Some(src), target, fstype, flags, data)
        .sys(|| format!("mount {} on {}", fstype.unwrap_or(src), target.display()))
}

fn mkdirs(p: &Path) -> Result<()> {
    std::fs::create_dir_all(p).ctx("cannot create directory", p)
}

fn setup(spec: &BootSpec) -> Result<()> {
    // A private mount namespace: nothing mounted here is ever seen by the host.
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
        .sys(|| "unshare mount namespace".into())?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .sys(|| "make / private".into())?;
    umask(Mode::from_bits_truncate(0o022));

    // System disk: ext4 on a loop device; the overlay's upper layer lives on it.
    let sys = spec.instance_dir.join("sys");
    let root = spec.instance_dir.join("root");
    mkdirs(&sys)?;
    mkdirs(&root)?;
    mnt(
        &spec.system_disk.path.to_string_lossy(),
        &sys,
        Some("ext4"),
        MsFlags::MS_NOATIME,
        None,
    )?;
    let fresh = !sys.join("upper").exists();
    mkdirs(&sys.join("upper"))?;
    mkdirs(&sys.join("work"))?;
    let opts = format!(
        "lowerdir={},upperdir={},workdir={}",
        spec.base_root.display(),
        sys.join("upper").display(),
        sys.join("work").display()
    );
    mnt(
        "overlay",
        &root,
        Some("overlay"),
        MsFlags::empty(),
        Some(&opts),
    )?;

    let nosuid = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    let proc_dir = root.join("proc");
    mkdirs(&proc_dir)?;
    mnt("proc", &proc_dir, Some("proc"), nosuid, None)?;
    // Most sysctls are global: read-only, except the per-namespace net.*.
    let ps = proc_dir.join("sys");
    mnt(&ps.to_string_lossy(), &ps, None, MsFlags::MS_BIND, None)?;
    mnt(
        "none",
        &ps,
        None,
        MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | nosuid,
        None,
    )?;
    // A bind inherits the read-only flag of its source: remount writable
    // the sysctls that belong to the machine's own namespaces (network,
    // IPC, UTS).
    for rel in NAMESPACED_SYSCTLS {
        let p = ps.join(rel);
        if !p.exists() {
            continue;
        }
        mnt(&p.to_string_lossy(), &p, None, MsFlags::MS_BIND, None)?;
        mnt(
            "none",
            &p,
            None,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | nosuid,
            None,
        )?;
    }

    let sys_dir = root.join("sys");
    mkdirs(&sys_dir)?;
    mnt(
        "sysfs",
        &sys_dir,
        Some("sysfs"),
        nosuid | MsFlags::MS_RDONLY,
        None,
    )?;
    // sysfs is not namespaced for block devices: replace its block indexes
    // by ones that list only the instance's disks (links to the real loop
    // devices' entries, under their cloud names).
    for d in SYS_BLOCK_DIRS {
        let p = sys_dir.join(d);
        if p.is_dir() {
            mnt(
                "tmpfs",
                &p,
                Some("tmpfs"),
                nosuid,
                Some("size=64k,mode=755"),
            )?;
        }
    }

    mount_cgroups(&sys_dir.join("fs/cgroup"));

    make_dev(&root.join("dev"))?;
    for d in &spec.disks {
        add_disk(&root, d)?;
    }
    mask_paths(&root)?;

    let run = root.join("run");
    mkdirs(&run)?;
    mnt(
        "tmpfs",
        &run,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=755,size=64m"),
    )?;
    let tmp = root.join("tmp");
    mkdirs(&tmp)?;
    mnt(
        "tmpfs",
        &tmp,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=1777"),
    )?;
    for h in &spec.hide {
        let p = root.join(h.strip_prefix("/").unwrap_or(h));
        if p.is_dir() {
            mnt(
                "tmpfs",
                &p,
                Some("tmpfs"),
                nosuid | MsFlags::MS_RDONLY,
                Some("size=4k,mode=700"),
            )?;
        }
    }

    // /proc/swaps as the attributes say (a simulated view; swap is host-wide).
    let swaps = run.join("knit-swaps");
    let mut text = String::from("Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n");
    if spec.swap {
        text.push_str("/swapfile                               file\t\t2097148\t\t0\t\t-2\n");
    }
    std::fs::write(&swaps, text).ctx("cannot write", &swaps)?;
    mnt(
        &swaps.to_string_lossy(),
        &proc_dir.join("swaps"),
        None,
        MsFlags::MS_BIND,
        None,
    )?;

    sethostname(&spec.hostname).sys(|| format!("sethostname {}", spec.hostname))?;
    write_file(&root.join("etc/hostname"), &format!("{}\n", spec.hostname))?;
    // As cloud images do: the hostname resolves to the private address.
    let hosts = root.join("etc/hosts");
    let text = std::fs::read_to_string(&hosts).unwrap_or_default();
    let entry = format!("{}\t{}", spec.private_ip, spec.hostname);
    if !text.lines().any(|l| l == entry) {
        write_file(
            &hosts,
            &format!(
                "{text}{}{entry}\n",
                if text.is_empty() || text.ends_with('\n') {
                    ""
                } else {
                    "\n"
                }
            ),
        )?;
    }
    if fresh {
        let mut id = [0u8; 16];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut id))
            .ctx("cannot read", "/dev/urandom")?;
        write_file(
            &root.join("etc/machine-id"),
            &format!("{}\n", crate::state::hex(&id)),
        )?;
    }
    if let Some(os) = &spec.os_override {
        let p = root.join("etc/os-release");
        // Debian's is a symlink into /usr/lib: replace it, do not write through it.
        let _ = std::fs::remove_file(&p);
        write_file(&p, &os.render())?;
    }

    // Enter the new root; the old one (and every host mount) is detached.
    chdir(&root).sys(|| format!("chdir {}", root.display()))?;
    pivot_root(".", ".").sys(|| "pivot_root".into())?;
    umount2(".", MntFlags::MNT_DETACH).sys(|| "detach old root".into())?;
    chdir("/").sys(|| "chdir /".into())?;
    for (k, _) in std::env::vars_os() {
        std::env::remove_var(k);
    }
    std::env::set_var("PATH", userdata::PATH_ENV);
    std::env::set_var("HOME", "/root");
    Ok(())
}

/// Sysctls of the machine's own namespaces, under /proc/sys: writable
/// inside; every other one is host-wide and read-only.
const NAMESPACED_SYSCTLS: [&str; 12] = [
    "net",
    "kernel/hostname",
    "kernel/domainname",
    "kernel/shmmax",
    "kernel/shmall",
    "kernel/shmmni",
    "kernel/shm_rmid_forced",
    "kernel/msgmax",
    "kernel/msgmnb",
    "kernel/msgmni",
    "kernel/sem",
    "fs/mqueue",
];

/// Docker's masked paths: files covered by /dev/null, directories by an
/// empty read-only tmpfs (a kernel's memory, the kernel keyring, timers,
/// the magic SysRq trigger, firmware and power interfaces).
const MASKED: [&str; 12] = [
    "proc/kcore",
    "proc/keys",
    "proc/latency_stats",
    "proc/timer_list",
    "proc/timer_stats",
    "proc/sched_debug",
    "proc/sysrq-trigger",
    "proc/acpi",
    "proc/asound",
    "proc/scsi",
    "sys/firmware",
    "sys/devices/virtual/powercap",
];

/// Docker's read-only paths under /proc (/proc/sys is handled above).
const READ_ONLY: [&str; 3] = ["proc/bus", "proc/fs", "proc/irq"];

fn mask_paths(root: &Path) -> Result<()> {
    let null = root.join("dev/null");
    let nosuid = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    for rel in MASKED {
        let p = root.join(rel);
        let Ok(meta) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if meta.is_dir() {
            mnt(
                "tmpfs",
                &p,
                Some("tmpfs"),
                nosuid | MsFlags::MS_RDONLY,
                Some("size=0,mode=555"),
            )?;
        } else {
            mnt(&null.to_string_lossy(), &p, None, MsFlags::MS_BIND, None)?;
        }
    }
    for rel in READ_ONLY {
        let p = root.join(rel);
        if !p.is_dir() {
            continue;
        }
        mnt(
            &p.to_string_lossy(),
            &p,
            None,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None,
        )?;
        mnt(
            "none",
            &p,
            None,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | nosuid,
            None,
        )?;
    }
    Ok(())
}

/// The machine's own cgroups, read-only at /sys/fs/cgroup (its cgroup
/// namespace makes its cgroup their root), where the kubelet stand-in reads
/// its size as cAdvisor would. Best effort: a hierarchy the kernel will not
/// mount is reported on the console and left out.
fn mount_cgroups(at: &Path) {
    let Ok(text) = std::fs::read_to_string("/proc/self/cgroup") else {
        return;
    };
    let lines: Vec<(String, bool)> = text
        .lines()
        .filter_map(|l| {
            let mut it = l.splitn(3, ':');
            let (_, c) = (it.next()?, it.next()?);
            Some((c.to_string(), c.is_empty()))
        })
        .collect();
    if lines.is_empty() || !at.is_dir() {
        return;
    }
    let ro = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC | MsFlags::MS_RDONLY;
    let pure_v2 = lines.iter().all(|(_, v2)| *v2);
    if pure_v2 {
        if let Err(e) = mnt("cgroup2", at, Some("cgroup2"), ro, None) {
            eprintln!("knit-init: cgroup2 not mounted: {e}");
        }
        return;
    }
    if let Err(e) = mnt(
        "tmpfs",
        at,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("mode=755,size=64k"),
    ) {
        eprintln!("knit-init: /sys/fs/cgroup not mounted: {e}");
        return;
    }
    for (ctrls, v2) in &lines {
        let (name, fstype, data) = if *v2 {
            ("unified".to_string(), "cgroup2", None)
        } else if let Some(n) = ctrls.strip_prefix("name=") {
            (n.to_string(), "cgroup", Some(format!("none,name={n}")))
        } else {
            (ctrls.clone(), "cgroup", Some(ctrls.clone()))
        };
        let dir = at.join(&name);
        if std::fs::create_dir_all(&dir).is_err() {
            continue;
        }
        if let Err(e) = mnt("cgroup", &dir, Some(fstype), ro, data.as_deref()) {
            eprintln!("knit-init: cgroup {name} not mounted: {e}");
            let _ = std::fs::remove_dir(&dir);
            continue;
        }
        // `cpu` and `cpuacct` name a `cpu,cpuacct` hierarchy, as systemd does.
        if name.contains(',') {
            for c in name.split(',') {
                let _ = std::os::unix::fs::symlink(&name, at.join(c));
            }
        }
    }
    let _ = mount(
        None::<&str>,
        at,
        None::<&str>,
        MsFlags::MS_REMOUNT
            | MsFlags::MS_RDONLY
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV
            | MsFlags::MS_NOEXEC,
        Some("mode=755,size=64k"),
    );
}

fn write_file(p: &Path, text: &str) -> Result<()> {
    if let Some(d) = p.parent() {
        mkdirs(d)?;
    }
    std::fs::write(p, text).ctx("cannot write", p)
}

/// A private /dev: the basics and the instance's own disks, nothing of the host.
fn make_dev(dev: &Path) -> Result<()> {
    mkdirs(dev)?;
    mnt(
        "tmpfs",
        dev,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("mode=755,size=1m"),
    )?;
    let chr = [
        ("null", 1, 3),
        ("zero", 1, 5),
        ("full", 1, 7),
        ("random", 1, 8),
        ("urandom", 1, 9),
        ("tty", 5, 0),
    ];
    for (name, major, minor) in chr {
        let p = dev.join(name);
        mknod(
            &p,
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o666),
            makedev(major, minor),
        )
        .sys(|| format!("mknod {}", p.display()))?;
        // mknod's mode passes through the umask (022 here): without this
        // /dev/null is 0644 and no program but root's may write to it
        // (apt's _apt user discarding a 404 page stalled on that).
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o666))
            .ctx("cannot chmod", &p)?;
    }
    mkdirs(&dev.join("disk/by-id"))?;
    let pts = dev.join("pts");
    mkdirs(&pts)?;
    mnt(
        "devpts",
        &pts,
        Some("devpts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620,gid=5"),
    )?;
    let shm = dev.join("shm");
    mkdirs(&shm)?;
    mnt(
        "tmpfs",
        &shm,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=1777"),
    )?;
    let mq = dev.join("mqueue");
    mkdirs(&mq)?;
    mnt(
        "mqueue",
        &mq,
        Some("mqueue"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None,
    )?;
    for (link, target) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        std::os::unix::fs::symlink(target, dev.join(link)).ctx("cannot link", dev.join(link))?;
    }
    Ok(())
}

const SYS_BLOCK_DIRS: [&str; 3] = ["block", "class/block", "dev/block"];

/// The links that make one disk visible the way a cloud VM shows it:
/// `/dev/disk/by-id/…` and the sysfs block indexes.
fn disk_links(d: &BootDisk) -> Vec<(PathBuf, String)> {
    let sys = format!("/sys/devices/virtual/block/{}", d.loop_name);
    vec![
        (
            PathBuf::from("dev/disk/by-id").join(&d.by_id),
            format!("../../{}", d.device),
        ),
        (PathBuf::from("sys/block").join(&d.device), sys.clone()),
        (
            PathBuf::from("sys/class/block").join(&d.device),
            sys.clone(),
        ),
        (
            PathBuf::from("sys/dev/block").join(format!("{}:{}", d.major, d.minor)),
            sys,
        ),
    ]
}

/// Block node and links for one disk under an instance root; the host uses
/// it to hot-attach, through /proc/PID/root.
pub fn add_disk(root: &Path, d: &BootDisk) -> Result<()> {
    let p = root.join("dev").join(&d.device);
    mknod(
        &p,
        SFlag::S_IFBLK,
        Mode::from_bits_truncate(0o660),
        makedev(d.major, d.minor),
    )
    .sys(|| format!("mknod {}", p.display()))?;
    for (link, target) in disk_links(d) {
        let at = root.join(link);
        std::os::unix::fs::symlink(&target, &at).ctx("cannot link", &at)?;
    }
    Ok(())
}

/// Undoes [`add_disk`].
pub fn remove_disk(root: &Path, d: &BootDisk) -> Result<()> {
    crate::state::remove_file(&root.join("dev").join(&d.device))?;
    for (link, _) in disk_links(d) {
        crate::state::remove_file(&root.join(link))?;
    }
    Ok(())
}

extern "C" fn wake(_: libc::c_int) {}

const SIGNALS: [Signal; 4] = [
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGCHLD,
    Signal::SIGHUP,
];

fn init_loop(spec: &BootSpec) -> i32 {
    // PID 1 of a namespace only gets signals it handles: install a no-op
    // handler, block them, and take them synchronously with sigtimedwait.
    let action = SigAction::new(
        SigHandler::Handler(wake),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    let mut set = SigSet::empty();
    for s in SIGNALS {
        // SAFETY: the handler does nothing, so it is async-signal-safe.
        let _ = unsafe { sigaction(s, &action) };
        set.add(s);
    }
    let _ = set.thread_block();

    let data = spec.user_data.clone().unwrap_or_default().into_bytes();
    // SAFETY: PID 1 is single-threaded.
    match unsafe { fork() } {
        Ok(ForkResult::Child) => {
            let _ = SigSet::all().thread_unblock();
            let _ = nix::unistd::setsid();
            // PID 1 is never the out-of-memory victim; what it starts may be.
            let _ = std::fs::write("/proc/self/oom_score_adj", "0");
            let code = match spec.runner {
                UserDataRunner::Knit => userdata::run_knit(&spec.id, &data),
                UserDataRunner::CloudInit => {
                    userdata::run_cloud_init(&spec.id, &spec.hostname, &data)
                }
            };
            std::process::exit(code);
        }
        Ok(ForkResult::Parent { .. }) => {}
        Err(e) => eprintln!("knit-init: cannot start the user-data runner: {e}"),
    }

    loop {
        let sig = wait_signal(&set, Duration::from_secs(5));
        reap();
        if matches!(sig, Some(Signal::SIGTERM) | Some(Signal::SIGINT)) {
            return shutdown(&set);
        }
    }
}

fn wait_signal(set: &SigSet, timeout: Duration) -> Option<Signal> {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: valid set and timespec; a null siginfo pointer is allowed.
    let n = unsafe { libc::sigtimedwait(set.as_ref(), std::ptr::null_mut(), &ts) };
    Signal::try_from(n).ok()
}

/// Reaps every exited child; true once no child is left.
fn reap() -> bool {
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => return false,
            Ok(_) => continue,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return true,
        }
    }
}

fn shutdown(set: &SigSet) -> i32 {
    let all = Pid::from_raw(-1);
    let _ = kill(all, Signal::SIGTERM);
    let deadline = Instant::now() + STOP_GRACE;
    while Instant::now() < deadline {
        if reap() {
            break;
        }
        wait_signal(set, Duration::from_millis(100));
    }
    let _ = kill(all, Signal::SIGKILL);
    while !reap() {
        wait_signal(set, Duration::from_millis(50));
    }
    // No sync(2): it would flush the whole host. Our filesystems are
    // written back when the mount namespace goes, before the host can
    // detach their loop devices.
    0
}

impl BootDisk {
    pub fn new(dev: &LoopDev, disk: &crate::model::DiskRecord) -> BootDisk {
        let kind = match disk.interface {
            crate::model::DiskInterface::Virtio => "virtio",
            crate::model::DiskInterface::Nvme => "nvme",
        };
        BootDisk {
            device: disk.device.clone().unwrap_or_default(),
            major: dev.major,
            minor: dev.minor,
            loop_name: dev
                .path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            by_id: format!("{kind}-{}", disk.serial),
        }
    }
}
