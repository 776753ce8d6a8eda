//! A machine is bounded like a real instance (issue 29): it cannot open a
//! block device of the host's or of another machine, load a module, reboot
//! the host or change a host-wide sysctl; memory beyond its type's size is
//! its own out-of-memory kill, and it lives on; the size the kubelet
//! stand-in reads inside is its instance type's, for two types. Needs root.

mod common;

use common::TestCloud;
use std::path::PathBuf;
use std::process::Command;

/// A loop device of the test's own, standing for a block device of the
/// host's (never a real disk); detached on drop.
struct HostLoop {
    dev: String,
    _dir: tempfile::TempDir,
}

impl HostLoop {
    fn new() -> HostLoop {
        let dir = tempfile::Builder::new()
            .prefix("knit-bounds-host-")
            .tempdir()
            .expect("tempdir");
        let file = dir.path().join("host.img");
        std::fs::write(&file, b"host secret\n".repeat(1 << 12)).expect("write host image");
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(&file)
            .output()
            .expect("losetup");
        assert!(out.status.success(), "{out:?}");
        HostLoop {
            dev: String::from_utf8_lossy(&out.stdout).trim().to_string(),
            _dir: dir,
        }
    }

    /// (major, minor)
    fn numbers(&self) -> (u64, u64) {
        use std::os::unix::fs::MetadataExt;
        let rdev = std::fs::metadata(&self.dev).expect("stat").rdev();
        (nix::sys::stat::major(rdev), nix::sys::stat::minor(rdev))
    }
}

impl Drop for HostLoop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.dev]).status();
    }
}

fn major_minor_inside(c: &TestCloud, id: &str, dev: &str) -> (u64, u64) {
    let out = c.sh(id, &format!("stat -c '%t %T' {dev}"));
    let v: Vec<u64> = out
        .split_whitespace()
        .map(|x| u64::from_str_radix(x, 16).expect("hex"))
        .collect();
    (v[0], v[1])
}

#[test]
fn devices_of_the_host_and_of_other_machines_cannot_be_opened() {
    let c = TestCloud::new();
    let host = HostLoop::new();
    let tpl = "instanceType: ecs.t6-c1m1.large\nsystemDiskSize: 256Mi\ndisks:\n- {name: data, size: 16Mi}\n";
    let a = c.create(tpl);
    let b = c.create(tpl);
    // Where the host has a v2 hierarchy (pure, or hybrid as here), the list
    // is also a device program on the machine's v2 cgroup: exactly one.
    for dir in a.record.cgroups.iter().chain(&b.record.cgroups) {
        if dir.join("cgroup.controllers").exists() {
            let progs = knit_local::devprog::attached(dir).expect("query");
            assert_eq!(progs.len(), 1, "{}: {progs:?}", dir.display());
        }
    }
    let (a, b) = (&a.record.id, &b.record.id);

    // Its own disk: read and written.
    c.sh(a, "dd if=/dev/zero of=/dev/vdb bs=4k count=1 conv=fsync && dd if=/dev/vdb of=/dev/null bs=4k count=1");

    let (hmaj, hmin) = host.numbers();
    let (bmaj, bmin) = major_minor_inside(&c, b, "/dev/vdb");
    for (what, maj, min) in [("host", hmaj, hmin), ("other machine", bmaj, bmin)] {
        // Made (mknod is allowed, as runc needs), never opened. In /dev,
        // which (unlike /tmp) allows device nodes: the device list refuses.
        let out = c.sh_out(
            a,
            &format!("mknod /dev/x b {maj} {min} && dd if=/dev/x of=/dev/null bs=512 count=1; echo rc=$?; rm -f /dev/x"),
        );
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains("Operation not permitted"), "{what}: {text}");
        assert!(!text.contains("rc=0"), "{what}: {text}");
    }
    // Nor written through a mount (the kernel checks the device list too).
    let out = c.sh_out(
        a,
        &format!("mknod /dev/y b {hmaj} {hmin} && mount -o ro /dev/y /mnt"),
    );
    assert!(!out.status.success(), "{out:?}");
    // The host's device is untouched.
    let data = std::fs::read(&host.dev).expect("read host loop");
    assert!(data.starts_with(b"host secret\n"));
}

#[test]
fn no_module_no_reboot_no_host_sysctl() {
    let c = TestCloud::new();
    let i = c.create("instanceType: ecs.t6-c1m1.large\nsystemDiskSize: 256Mi\n");
    let id = &i.record.id;

    // The bounding set has none of the capabilities no node needs, and the
    // filter is there (mode 2).
    let status = c.sh(id, "cat /proc/self/status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_string())
            .unwrap_or_default()
    };
    let bnd = u64::from_str_radix(&field("CapBnd:"), 16).expect("CapBnd");
    for (cap, name) in knit_local::bounds::DROPPED_CAPS {
        assert_eq!(bnd & (1 << cap), 0, "{name} still in the bounding set");
    }
    assert_eq!(bnd & (1 << 21), 1 << 21, "SYS_ADMIN kept (mounts)");
    assert_eq!(field("Seccomp:"), "2", "{status}");

    // Module loading, kexec, open_by_handle_at and reboot: EPERM, whatever
    // the arguments (perl is Essential in Debian). Reboot with the
    // magic numbers and RESTART: denied before the kernel looks at them.
    let perl = |call: &str| -> String {
        c.sh(
            id,
            &format!("perl -e '$! = 0; my $r = syscall({call}); print \"$r \", $!+0, \"\\n\"'"),
        )
    };
    let eperm = format!("-1 {}", libc::EPERM);
    for (name, call) in [
        ("init_module", format!("{}, 0, 0, 0", libc::SYS_init_module)),
        (
            "finit_module",
            format!("{}, -1, 0, 0", libc::SYS_finit_module),
        ),
        (
            "delete_module",
            format!("{}, 0, 0", libc::SYS_delete_module),
        ),
        (
            "kexec_load",
            format!("{}, 0, 0, 0, 0", libc::SYS_kexec_load),
        ),
        (
            "open_by_handle_at",
            format!("{}, 0, 0, 0", libc::SYS_open_by_handle_at),
        ),
        (
            "reboot",
            format!("{}, 0xfee1dead, 672274793, 0x01234567, 0", libc::SYS_reboot),
        ),
    ] {
        assert_eq!(perl(&call).trim(), eperm, "{name}");
    }
    // And the tools say so.
    let out = c.sh_out(id, "modprobe -q dummy; echo rc=$?");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("rc=0"),
        "{out:?}"
    );

    // Host-wide sysctls are read-only; its own namespaces' are not. The
    // write would put back the host's current value, so even a failure of
    // this test changes nothing.
    let host = std::fs::read_to_string("/proc/sys/kernel/printk_ratelimit").expect("read");
    let out = c.sh_out(
        id,
        &format!("echo {} > /proc/sys/kernel/printk_ratelimit", host.trim()),
    );
    assert!(!out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Read-only"),
        "{out:?}"
    );
    c.sh(id, "sysctl -q -w net.ipv4.ip_forward=1 && sysctl -q -w kernel.shmmni=4000 && sysctl -q -w kernel.domainname=knit.test");
    // Masked and read-only paths (those this kernel has).
    c.sh(
        id,
        "for f in /proc/kcore /proc/sysrq-trigger /proc/timer_list /proc/keys; do [ ! -e $f ] || [ ! -s $f ] || { echo $f readable; exit 1; }; done; \
         ! touch /proc/irq/x 2>/dev/null; ! touch /sys/x 2>/dev/null",
    );
    // The machine is still there.
    assert!(c.cloud.describe(id).expect("describe").alive);
}

#[test]
fn memory_beyond_the_type_kills_inside_and_the_machine_lives() {
    let c = TestCloud::new();
    // ecs.t6-c4m1.large: 2 vCPUs, 512 MiB.
    let i = c.create("instanceType: ecs.t6-c4m1.large\nsystemDiskSize: 256Mi\n");
    let id = &i.record.id;
    // A long-lived process of the machine's, as the agent would be.
    c.sh(
        id,
        "setsid sleep 600 >/dev/null 2>&1 < /dev/null & echo $! > /run/sleeper",
    );
    let out = c.sh_out(
        id,
        "perl -e '$x = \"a\" x (1024 * 1024 * 1024); print \"allocated\\n\"'",
    );
    assert!(!out.status.success(), "{out:?}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("allocated"));
    let oom = c.sh(
        id,
        "cat /sys/fs/cgroup/memory/memory.oom_control 2>/dev/null || cat /sys/fs/cgroup/memory.events",
    );
    let kills: u64 = oom
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    assert!(kills >= 1, "{oom}");
    // Its init and its other processes carry on; it still runs commands.
    assert!(c.cloud.describe(id).expect("describe").alive);
    c.sh(id, "kill -0 $(cat /run/sleeper)");
    assert_eq!(c.sh(id, "echo ok").trim(), "ok");
}

fn host_memory() -> u64 {
    let m = std::fs::read_to_string("/proc/meminfo").expect("meminfo");
    m.lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("MemTotal")
        * 1024
}

#[test]
fn node_capacity_is_the_instance_type() {
    let c = TestCloud::new();
    let host_cpus = knit_local::bounds::host_cpus() as u64;
    let mut ids = Vec::new();
    for (ty, vcpus, gib) in [("ecs.t6-c1m1.large", 2u64, 2u64), ("ecs.c7.xlarge", 4, 8)] {
        let i = c.create(&format!("instanceType: {ty}\nsystemDiskSize: 256Mi\n"));
        let pid = i.record.init.expect("init").pid;
        // What the kubelet stand-in reads inside: its /sys/fs/cgroup.
        let cg = PathBuf::from(format!("/proc/{pid}/root/sys/fs/cgroup"));
        let size = knit_kubelet_sim::machine::size_at(&cg, host_cpus, host_memory());
        // vCPUs capped at the host's (documented).
        assert_eq!(size.cpu_millis, vcpus.min(host_cpus) * 1000, "{ty}");
        assert_eq!(size.memory_bytes, (gib << 30).min(host_memory()), "{ty}");
        assert_eq!(size.memory_quantity(), format!("{}Ki", gib << 20), "{ty}");
        c.cloud.delete(&i.record.id).expect("delete");
        ids.push(i.record.id);
    }
    // The machine's cgroups go with it.
    let left = Command::new("sh")
        .args([
            "-c",
            "find /sys/fs/cgroup -maxdepth 4 -name 'knit-local-*' 2>/dev/null",
        ])
        .output()
        .expect("find");
    let left = String::from_utf8_lossy(&left.stdout);
    for id in ids {
        assert!(!left.contains(&id), "{left}");
    }
}

#[test]
fn an_unknown_instance_type_is_refused_naming_it() {
    let c = TestCloud::new();
    let e = c
        .cloud
        .create(&knit_local::Template::parse("instanceType: ecs.g7.huge\n").expect("parse"))
        .expect_err("unknown type");
    assert_eq!(e.code(), "LocalInvalid");
    let text = e.to_string();
    assert!(
        text.contains("instanceType") && text.contains("ecs.g7.huge"),
        "{text}"
    );
    assert!(c.cloud.list().expect("list").is_empty());
}
