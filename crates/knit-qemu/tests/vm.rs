//! Real VMs under QEMU (TCG on a host without usable KVM): boot from the
//! node OS image, cloud-init's NoCloud seed, NVMe and virtio data disks,
//! the guest agent, reboot, teardown. One boot takes minutes under TCG;
//! `vm_boots_runs_cloud_init_and_reboots` is the one CI runs, the
//! `#[ignore]`d ones are the full suite:
//! `cargo nextest run -p knit-qemu --run-ignored all`.

mod common;

use common::{argv, Env};
use knit_qemu::{DiskSpec, Interface, Machines, VmTemplate};
use std::time::{Duration, Instant};

const BOOT_TIMEOUT: Duration = Duration::from_secs(900);

fn user_data() -> String {
    "Content-Type: multipart/mixed; boundary=\"==knit==\"\nMIME-Version: 1.0\n\n\
--==knit==\nContent-Type: text/cloud-config; charset=\"us-ascii\"\nContent-Disposition: attachment; filename=\"config.yaml\"\n\n\
#cloud-config\nwrite_files:\n- path: /etc/knit-test/hello.txt\n  content: |\n    hello from cloud-config\n  permissions: '0644'\n\n\
--==knit==\nContent-Type: text/x-shellscript; charset=\"us-ascii\"\nContent-Disposition: attachment; filename=\"script.sh\"\n\n\
#!/bin/sh\necho \"knit script ran on $(hostname)\"\ntouch /var/tmp/knit-script-ran\n\n\
--==knit==--\n"
        .to_string()
}

fn template(name: &str) -> VmTemplate {
    VmTemplate {
        name: name.into(),
        image: common::image(),
        system_disk_bytes: 4 << 30,
        disks: vec![
            DiskSpec {
                size_bytes: Some(1 << 30),
                interface: Interface::Nvme,
                snapshot: None,
            },
            DiskSpec {
                size_bytes: Some(2 << 30),
                interface: Interface::Virtio,
                snapshot: None,
            },
        ],
        user_data: user_data(),
        ..Default::default()
    }
}

fn sh(m: &Machines, id: &str, script: &str) -> (i32, String) {
    let out = m
        .exec(id, &argv(&["sh", "-c", script]), Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("{script}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.code, text)
}

/// Waits until `cloud-init status --long` says done; its output.
fn wait_cloud_init(m: &Machines, id: &str) -> String {
    m.wait_agent(id, BOOT_TIMEOUT).expect("guest agent answers");
    let deadline = Instant::now() + BOOT_TIMEOUT;
    loop {
        let (_, out) = sh(m, id, "cloud-init status --long");
        if out.contains("status: done") || out.contains("status: error") {
            return out;
        }
        assert!(Instant::now() < deadline, "cloud-init not done: {out}");
        std::thread::sleep(Duration::from_secs(3));
    }
}

fn qemu_rss_kib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

#[test]
fn vm_boots_runs_cloud_init_and_reboots() {
    skip_unless_able!();
    let env = Env::new();
    let m = &env.machines;
    let started = Instant::now();
    let vm = m.create(&template("vm-boot")).expect("create");
    let id = vm.record.id.clone();
    assert!(vm.alive);
    let accel = vm.record.accel.clone().unwrap();

    // cloud-init: the real one, from the seed, all stages done.
    let status = wait_cloud_init(m, &id);
    let boot_to_done = started.elapsed();
    assert!(status.contains("status: done"), "{status}");
    assert!(status.contains("NoCloud"), "{status}");
    // The #cloud-config part was applied, the script part ran and logged.
    let hello = m
        .read_file(
            &id,
            "/etc/knit-test/hello.txt",
            4096,
            Duration::from_secs(30),
        )
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&hello), "hello from cloud-config\n");
    let (code, log) = sh(
        m,
        &id,
        "cat /var/log/cloud-init-output.log; test -e /var/tmp/knit-script-ran",
    );
    assert_eq!(code, 0, "{log}");
    assert!(log.contains("knit script ran on vm-boot"), "{log}");

    // Data disks on their interfaces, at their sizes; the system disk grown.
    let (code, sizes) = sh(
        m,
        &id,
        "blockdev --getsize64 /dev/nvme0n1 /dev/vdb; cat /sys/block/nvme0n1/device/serial; cat /sys/block/vdb/serial; echo; findmnt -no SOURCE /",
    );
    assert_eq!(code, 0, "{sizes}");
    let lines: Vec<&str> = sizes.lines().map(str::trim).collect();
    assert_eq!(lines[0], (1u64 << 30).to_string(), "{sizes}");
    assert_eq!(lines[1], (2u64 << 30).to_string(), "{sizes}");
    assert_eq!(lines[2], vm.record.disks[0].id, "{sizes}");
    assert_eq!(lines[3], vm.record.disks[1].id, "{sizes}");
    assert_eq!(lines[4], "/dev/vda", "{sizes}");

    // Network: the address from network-config, the gateway on our bridge.
    let (code, net) = sh(
        m,
        &id,
        &format!(
            "hostname; ip -4 -o addr show dev eth0; ping -c 1 -W 10 {}",
            env.gateway
        ),
    );
    assert_eq!(code, 0, "{net}");
    assert!(net.starts_with("vm-boot\n"), "{net}");
    assert!(net.contains(&format!("{}/", vm.record.ip)), "{net}");

    // Anti-spoofing on the tap: from an address not its own the VM reaches
    // nothing (without the guard the host would answer: it is on the
    // subnet, and the VM answers ARP for any address it holds); the guard
    // counted the drops; its own address still works after.
    let spoofed = knit_local::net::Subnet::parse(&env.subnet)
        .and_then(|s| s.host(123))
        .unwrap();
    assert_ne!(spoofed.to_string(), vm.record.ip);
    let dropped = || {
        knit_local::net::guard_dropped(&vm.record.bridge, &vm.record.tap).expect("the tap's guard")
    };
    let before = dropped();
    let (code, out) = sh(
        m,
        &id,
        &format!(
            "ip addr add {spoofed}/32 dev eth0 && ping -c 2 -W 3 -I {spoofed} {gw}; r=$?; \
             ip addr del {spoofed}/32 dev eth0; exit $r",
            gw = env.gateway
        ),
    );
    assert_ne!(code, 0, "a spoofed source got through: {out}");
    assert!(dropped() > before, "the guard dropped nothing");
    let (code, out) = sh(m, &id, &format!("ping -c 1 -W 10 {}", env.gateway));
    assert_eq!(code, 0, "{out}");

    // Exec: exit codes and stderr come back; a command past its deadline is killed.
    let out = m
        .exec(
            &id,
            &argv(&["sh", "-c", "echo oops >&2; exit 7"]),
            Duration::from_secs(60),
        )
        .unwrap();
    assert_eq!((out.code, out.stderr.as_slice()), (7, b"oops\n".as_slice()));
    let err = m
        .exec(&id, &argv(&["sleep", "600"]), Duration::from_secs(5))
        .unwrap_err();
    assert_eq!(err.code(), "QemuAgent", "{err}");
    // A file over the cap is refused, not truncated.
    let err = m
        .read_file(&id, "/etc/services", 100, Duration::from_secs(30))
        .unwrap_err();
    assert!(err.to_string().contains("larger than 100 bytes"), "{err}");

    let pid = m.qemu_pids(&id)[0];
    let rss = qemu_rss_kib(pid);
    eprintln!(
        "MEASURE accel={accel} create→cloud-init done: {:.1} s; qemu RSS after boot: {} MiB (guest memory {} MiB)",
        boot_to_done.as_secs_f64(),
        rss / 1024,
        vm.record.memory_mib
    );

    // Reboot: a new boot, cloud-init done again, the file still there.
    let before = m.boot_id(&id, Duration::from_secs(30)).unwrap();
    let t = Instant::now();
    m.reboot(&id, BOOT_TIMEOUT).expect("reboot");
    assert_ne!(m.boot_id(&id, Duration::from_secs(30)).unwrap(), before);
    // A clean reboot by systemd, not a reset: the kernel said so on the console.
    let console = std::fs::read_to_string(vm.dir.join("console.log")).unwrap();
    assert!(
        console.contains("reboot: Restarting system"),
        "no clean reboot on the console"
    );
    let status = wait_cloud_init(m, &id);
    assert!(status.contains("status: done"), "{status}");
    eprintln!(
        "MEASURE reboot→cloud-init done: {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let (code, _) = sh(
        m,
        &id,
        "test -s /etc/knit-test/hello.txt && test -b /dev/nvme0n1",
    );
    assert_eq!(code, 0);

    // Teardown: no process, tap or file left.
    let tap = vm.record.tap.clone();
    let dir = vm.dir.clone();
    let report = m.down().expect("down");
    assert_eq!(report.vms, vec![id.clone()]);
    assert!(
        !std::path::Path::new("/proc").join(pid.to_string()).exists() || {
            // A zombie awaiting its reaper is gone as a VM.
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map(|s| s.contains(") Z "))
                .unwrap_or(true)
        }
    );
    assert!(
        !std::path::Path::new("/sys/class/net").join(&tap).exists(),
        "tap {tap} left"
    );
    assert!(!dir.exists(), "{} left", dir.display());
    assert!(!m.state_dir().exists());
}

/// A crash right after QEMU started, before its PID was recorded: the
/// record says `creating` and names no process. `delete` still finds the
/// QEMU (its command line names the VM's directory), ends it, removes the
/// tap and every file.
#[test]
fn vm_crash_after_spawn_is_released_by_delete() {
    skip_unless_able!();
    let env = Env::new();
    let m = &env.machines;
    let mut t = template("vm-crash");
    t.disks.truncate(1);
    let vm = m.create(&t).expect("create");
    let id = vm.record.id.clone();
    let pids = m.qemu_pids(&id);
    assert_eq!(pids.len(), 1);
    // What a crash between spawn and the record's update leaves.
    let mut rec = vm.record.clone();
    rec.process = None;
    rec.state = knit_qemu::VmState::Creating;
    let json = serde_json::to_vec_pretty(&rec).unwrap();
    std::fs::write(vm.dir.join("vm.json"), json).unwrap();
    assert!(m.list().unwrap()[0].alive, "found by its command line");

    m.delete(&id).expect("delete");
    let gone = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| s.contains(") Z "))
            .unwrap_or(true)
    };
    assert!(gone(pids[0]), "qemu {} still runs", pids[0]);
    assert!(!std::path::Path::new("/sys/class/net")
        .join(&rec.tap)
        .exists());
    assert!(!vm.dir.exists());
    assert!(m.list().unwrap().is_empty());
}

/// The full VM suite (not in CI: several TCG boots). Data disk kept across
/// stop/start and reimage, snapshot → a disk that is a qcow2 overlay on it
/// with the same bytes, snapshot in use refused, rename, root password
/// through the guest agent and never stored, graceful power-off.
#[test]
#[ignore = "slow: several VM boots under TCG; run with --run-ignored all"]
fn vm_full_lifecycle() {
    skip_unless_able!();
    let env = Env::new();
    let m = &env.machines;
    let mut t = template("vm-full");
    t.disks = vec![DiskSpec {
        size_bytes: Some(1 << 30),
        interface: Interface::Virtio,
        snapshot: None,
    }];
    let vm = m.create(&t).expect("create");
    let id = vm.record.id.clone();
    assert!(wait_cloud_init(m, &id).contains("status: done"));
    let (code, out) = sh(
        m,
        &id,
        "mkfs.ext4 -q /dev/vdb && mkdir -p /mnt/d && mount /dev/vdb /mnt/d && echo kept > /mnt/d/marker && umount /mnt/d && sync",
    );
    assert_eq!(code, 0, "{out}");

    // Password: set inside, a SHA-512 crypt hash in the guest's shadow,
    // the password in no file of the state directory.
    let password = "Knit-test-pass-7731";
    m.set_password(&id, password).expect("set_password");
    let (_, shadow) = sh(m, &id, "grep '^root:' /etc/shadow | cut -d: -f2");
    assert!(
        shadow.starts_with("$6$") || shadow.starts_with("$y$"),
        "{shadow}"
    );
    let grep = std::process::Command::new("grep")
        .args(["-r", "-l", "-a", password])
        .arg(m.state_dir())
        .output()
        .unwrap();
    assert!(
        grep.stdout.is_empty(),
        "password found in {}",
        String::from_utf8_lossy(&grep.stdout)
    );
    assert!(m.describe(&id).unwrap().record.password_set_at.is_some());
    let err = m
        .set_password(&id, "bad\npassword")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("password") && !err.contains("bad\npassword"),
        "{err}"
    );

    // Rename: at once inside.
    m.rename(&id, "vm-renamed").unwrap();
    let (_, host) = sh(m, &id, "hostname; cat /etc/hostname");
    assert_eq!(host, "vm-renamed\nvm-renamed\n");

    // Graceful stop: the guest powered itself off.
    m.stop(&id).expect("stop");
    let console = std::fs::read_to_string(vm.dir.join("console.log")).unwrap();
    assert!(console.contains("reboot: Power down"), "no clean power-off");
    assert!(!m.describe(&id).unwrap().alive);
    assert!(!std::path::Path::new("/sys/class/net")
        .join(&vm.record.tap)
        .exists());

    // Snapshot of the stopped disk; a second VM's disk from it.
    let snap = m
        .snapshot_create(&id, 0, Some("build-1"))
        .expect("snapshot");
    assert!(snap.complete);
    let mut t2 = template("vm-from-snap");
    t2.disks = vec![DiskSpec {
        size_bytes: None,
        interface: Interface::Nvme,
        snapshot: Some(snap.id.clone()),
    }];
    let vm2 = m.create(&t2).expect("create from snapshot");
    let info = std::process::Command::new("qemu-img")
        .args(["info", "-U", "--output=json"])
        .arg(
            vm2.dir
                .join(format!("disk-{}.qcow2", vm2.record.disks[0].id)),
        )
        .output()
        .unwrap();
    let info: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
    assert!(
        info["backing-filename"]
            .as_str()
            .unwrap()
            .ends_with(&format!("{}/snapshot.qcow2", snap.id)),
        "{info}"
    );
    let err = m.snapshot_delete(&snap.id).unwrap_err();
    assert_eq!(err.code(), "QemuBusy", "{err}");
    m.wait_agent(&vm2.record.id, BOOT_TIMEOUT).unwrap();
    let (code, out) = sh(
        m,
        &vm2.record.id,
        "mkdir -p /mnt/d && mount /dev/nvme0n1 /mnt/d && cat /mnt/d/marker",
    );
    assert_eq!((code, out.as_str()), (0, "kept\n"));

    // Reimage: new user data runs, the data disk is kept.
    let mut ud = user_data();
    ud = ud.replace("knit script ran", "knit reimaged script ran");
    m.reimage(&id, None, &ud).expect("reimage");
    let status = wait_cloud_init(m, &id);
    assert!(status.contains("status: done"), "{status}");
    let (code, out) = sh(
        m,
        &id,
        "grep -c 'knit reimaged script ran' /var/log/cloud-init-output.log; mkdir -p /mnt/d && mount /dev/vdb /mnt/d && cat /mnt/d/marker",
    );
    assert_eq!((code, out.as_str()), (0, "1\nkept\n"));
    // The reimaged system disk has the image's shadow again.
    let (_, shadow) = sh(m, &id, "grep '^root:' /etc/shadow | cut -d: -f2");
    assert!(!shadow.starts_with("$6$"), "{shadow}");

    m.delete(&vm2.record.id).unwrap();
    m.snapshot_delete(&snap.id).unwrap();
    m.delete(&id).unwrap();
    assert!(m.list().unwrap().is_empty());
}

/// `/proc/PID/status` fields of a process, by name.
fn status_field(pid: i32, field: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix(&format!("{field}:"))
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// `head -c 4 FILE` run the way QEMU is started (as root into `dir`, then
/// down to `uid`): its exit status and output.
fn read_as(dir: &std::path::Path, uid: u32, file: &str) -> (bool, Vec<u8>) {
    let null = std::fs::File::open("/dev/null").unwrap();
    let mut cmd = std::process::Command::new("head");
    cmd.args(["-c", "4", file]);
    knit_qemu::confine::Demote::new(dir, uid, uid, Vec::new(), {
        use std::os::fd::AsRawFd;
        null.as_raw_fd()
    })
    .unwrap()
    .install(&mut cmd);
    let out = cmd.output().unwrap();
    (out.status.success(), out.stdout)
}

/// Issue 29, item 7, without waiting for a boot: each VM's QEMU runs as
/// a uid of its own (not root, no capabilities, no groups) under seccomp
/// (mode 2, QEMU's `-sandbox`); its tap carries the anti-spoofing guard
/// (nftables, the local cloud's rules) from before it joined the bridge;
/// one VM's uid cannot read the other's disk, its own can; delete removes
/// the guard with the tap.
#[test]
fn vm_qemu_is_unprivileged_filtered_and_guarded() {
    skip_unless_able!();
    let env = Env::new();
    let m = &env.machines;
    let mut t = template("vm-bounds-a");
    t.disks.truncate(1);
    let a = m.create(&t).expect("create a");
    t.name = "vm-bounds-b".into();
    let b = m.create(&t).expect("create b");
    let (ua, ub) = (a.record.uid.unwrap(), b.record.uid.unwrap());
    assert_ne!(ua, ub, "each VM has a uid of its own");
    for (vm, uid) in [(&a, ua), (&b, ub)] {
        assert!(knit_qemu::confine::is_vm_uid(uid) && uid != 0, "{uid}");
        let pids = m.qemu_pids(&vm.record.id);
        assert_eq!(pids.len(), 1, "{pids:?}");
        let pid = pids[0];
        assert_eq!(status_field(pid, "Seccomp"), "2", "QEMU runs under seccomp");
        let ids = format!("{uid}\t{uid}\t{uid}\t{uid}");
        assert_eq!(status_field(pid, "Uid"), ids);
        assert_eq!(status_field(pid, "Gid"), ids);
        assert_eq!(status_field(pid, "Groups"), "");
        assert_eq!(status_field(pid, "CapEff"), "0000000000000000");
        assert_eq!(status_field(pid, "CapPrm"), "0000000000000000");

        let table = knit_local::net::guard_table(&vm.record.bridge);
        let out = std::process::Command::new("nft")
            .args(["list", "table", "bridge", &table])
            .output()
            .unwrap();
        let rules = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            rules.contains("hook prerouting")
                && rules.contains("iifname @ports drop")
                && rules.contains(&format!(
                    "\"{}\" . {} . {}",
                    vm.record.tap, vm.record.mac, vm.record.ip
                )),
            "{rules}"
        );
    }
    use std::os::unix::fs::MetadataExt;
    let disk_b = format!("disk-{}.qcow2", b.record.disks[0].id);
    let meta = std::fs::metadata(b.dir.join(&disk_b)).unwrap();
    assert_eq!(
        (meta.uid(), meta.gid(), meta.mode() & 0o777),
        (ub, ub, 0o600)
    );
    // The record stays root's alone.
    let meta = std::fs::metadata(b.dir.join("vm.json")).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o077), (0, 0));
    let (ok, head) = read_as(&b.dir, ub, &disk_b);
    assert!(ok && head == b"QFI\xfb", "B's uid reads B's disk: {head:?}");
    let (ok, _) = read_as(&b.dir, ua, &disk_b);
    assert!(!ok, "A's uid read B's disk");

    for vm in [&a, &b] {
        m.delete(&vm.record.id).expect("delete");
        let guarded = knit_local::net::guarded_ports(&vm.record.bridge);
        assert!(
            !guarded.iter().any(|(port, _)| *port == vm.record.tap),
            "the guard of {} left: {guarded:?}",
            vm.record.tap
        );
        assert!(!std::path::Path::new("/sys/class/net")
            .join(&vm.record.tap)
            .exists());
    }
}
