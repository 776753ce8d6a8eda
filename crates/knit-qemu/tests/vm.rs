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
        "blockdev --getsize64 /dev/nvme0n1 /dev/vdb; cat /sys/block/nvme0n1/device/serial; cat /sys/block/vdb/serial; findmnt -no SOURCE /",
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
