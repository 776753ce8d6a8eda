//! What must be proven about isolation: containerd side by side, apt-get
//! into the overlay only, the agent's disk handling invisible to the host,
//! networking between instances. Run as root.

mod common;

use common::TestCloud;
use std::path::Path;

const CONTAINERD: &str = "mkdir -p /var/lib/containerd && mount /dev/vdb /var/lib/containerd && \
    (containerd >/var/log/containerd.log 2>&1 &) && \
    for i in $(seq 300); do ctr version >/dev/null 2>&1 && break; sleep 0.1; done; ctr version";

#[test]
fn containerd_runs_in_two_instances_side_by_side() {
    let host_sock = Path::new("/run/containerd/containerd.sock").exists();
    let host_meta = Path::new("/var/lib/containerd/io.containerd.metadata.v1.bolt").exists();
    let t = TestCloud::new();
    let tpl = "systemDiskSize: 1Gi\ndisks:\n- {name: containerd, size: 512Mi, format: ext4}\n";
    let a = t.create(tpl).record.id;
    let b = t.create(tpl).record.id;
    let uuid = |out: &str| {
        out.lines()
            .find(|l| l.trim().starts_with("UUID:"))
            .map(str::to_string)
    };
    let va = t.sh(&a, CONTAINERD);
    let vb = t.sh(&b, CONTAINERD);
    assert!(
        va.contains("Server:") && vb.contains("Server:"),
        "{va}\n{vb}"
    );
    assert!(uuid(&va).is_some());
    assert_ne!(uuid(&va), uuid(&vb), "two different containerd daemons");
    // State on the instance's own ext4 data disk.
    assert!(t
        .sh(&a, "findmnt -n -o SOURCE,FSTYPE /var/lib/containerd")
        .starts_with("/dev/vdb ext4"));
    assert!(t
        .sh(&a, "ls /var/lib/containerd")
        .contains("io.containerd.metadata.v1.bolt"));
    // What one does, the other does not see.
    t.sh(&a, "ctr namespaces create knit-only-in-a");
    assert!(t.sh(&a, "ctr namespaces ls -q").contains("knit-only-in-a"));
    assert!(!t.sh(&b, "ctr namespaces ls -q").contains("knit-only-in-a"));
    // Nothing of theirs reached the host's own containerd paths.
    assert_eq!(
        Path::new("/run/containerd/containerd.sock").exists(),
        host_sock
    );
    assert_eq!(
        Path::new("/var/lib/containerd/io.containerd.metadata.v1.bolt").exists(),
        host_meta
    );
}

#[test]
fn apt_get_install_writes_only_into_the_overlay() {
    let t = TestCloud::new();
    let id = t.create("systemDiskSize: 1Gi\n").record.id;
    let name = format!("knit-local-test-{}", std::process::id());
    // A real package, built here so the test needs no network.
    let build = t.dir.parent().unwrap().join("pkg");
    std::fs::create_dir_all(build.join("DEBIAN")).unwrap();
    std::fs::create_dir_all(build.join(format!("usr/share/{name}"))).unwrap();
    std::fs::write(build.join("DEBIAN/control"), format!("Package: {name}\nVersion: 1.0\nArchitecture: all\nMaintainer: knit <knit@localhost>\nDescription: knit-local overlay test\n")).unwrap();
    std::fs::write(build.join(format!("usr/share/{name}/hello")), "hello\n").unwrap();
    let deb = t.dir.parent().unwrap().join("pkg.deb");
    let out = std::process::Command::new("dpkg-deb")
        .args(["--build", "--root-owner-group"])
        .arg(&build)
        .arg(&deb)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let init = t.cloud.describe(&id).unwrap().record.init.unwrap().pid;
    std::fs::copy(&deb, format!("/proc/{init}/root/root/pkg.deb")).unwrap();

    t.sh(
        &id,
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -q /root/pkg.deb",
    );
    assert_eq!(
        t.sh(&id, &format!("cat /usr/share/{name}/hello")),
        "hello\n"
    );
    assert!(t
        .sh(&id, &format!("dpkg-query -W -f='${{Status}}' {name}"))
        .contains("install ok installed"));

    assert!(
        !Path::new(&format!("/usr/share/{name}")).exists(),
        "the host got the package's files"
    );
    let host_status = std::fs::read_to_string("/var/lib/dpkg/status").unwrap();
    assert!(
        !host_status.contains(&format!("Package: {name}\n")),
        "the host's dpkg database got the package"
    );
    // The files are in the instance's system layer, and survive stop/start.
    t.cloud.stop(&id).unwrap();
    t.cloud.start(&id).unwrap();
    assert_eq!(
        t.sh(&id, &format!("cat /usr/share/{name}/hello")),
        "hello\n"
    );
}

#[test]
fn the_agent_formats_and_mounts_its_cloud_disks_unseen_by_the_host() {
    let agent = Path::new(common::BIN).with_file_name("knit-agent");
    assert!(
        agent.exists(),
        "{} missing: build the workspace (cargo build -p knit-agent)",
        agent.display()
    );
    let t = TestCloud::new();
    let inst =
        t.create("systemDiskSize: 1Gi\ndisks:\n- {name: data, size: 512Mi, interface: nvme}\n");
    let id = inst.record.id;
    let config = "apiVersion: knit.dev/v1alpha1\nkind: NodeConfig\nnode: {region: local, instanceId: i-1, ip: 10.0.0.5}\ndataDisk:\n  enabled: true\n";
    t.sh(
        &id,
        &format!("printf '{}' > /root/node.yaml", config.replace('\n', "\\n")),
    );
    // Copied in: the build tree may sit under /tmp, which is the instance's own.
    let mut copy = t
        .cloud
        .exec_command(
            &id,
            &[
                "sh".to_string(),
                "-c".to_string(),
                "cat > /usr/local/bin/knit-agent && chmod 755 /usr/local/bin/knit-agent"
                    .to_string(),
            ],
        )
        .unwrap();
    let mut child = copy.stdin(std::process::Stdio::piped()).spawn().unwrap();
    std::io::Write::write_all(
        &mut child.stdin.take().unwrap(),
        &std::fs::read(&agent).unwrap(),
    )
    .unwrap();
    assert!(
        child.wait().unwrap().success(),
        "copying knit-agent into the instance"
    );
    let out = t.sh_out(
        &id,
        "/usr/local/bin/knit-agent init --config /root/node.yaml --stop-after data-disk",
    );
    assert!(
        out.status.success(),
        "agent failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let mounts = t.sh(&id, "findmnt -n -o SOURCE,FSTYPE /var/lib/container");
    assert!(mounts.starts_with("/dev/nvme0n1 ext4"), "{mounts}");
    let host = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let loop_dev = knit_local::loopdev::backed_under(&t.dir)
        .into_iter()
        .find(|(_, f)| f.to_string_lossy().contains(&inst.data_disks[0].id))
        .unwrap()
        .0;
    let num = knit_local::loopdev::LoopDev::of(&loop_dev).unwrap();
    let num = format!(" {}:{} ", num.major, num.minor);
    assert!(
        !host.contains(&num),
        "the host sees the instance's mount of {}",
        loop_dev.display()
    );
}

#[test]
fn instances_reach_each_other_and_links_can_be_shaped() {
    let t = TestCloud::new();
    let a = t.create("systemDiskSize: 256Mi\n");
    let fixed = format!("{}.200", t.gateway().rsplit_once('.').unwrap().0);
    let b = t.create(&format!(
        "systemDiskSize: 256Mi\nbandwidthMbit: 20\nprivateIp: {fixed}\n"
    ));
    assert_eq!(b.record.private_ip, fixed);
    assert!(t
        .sh(&b.record.id, "ip -4 -o addr show dev eth0")
        .contains(&format!("{fixed}/24")));
    let ping = t.sh(
        &a.record.id,
        &format!("ping -c 2 -W 5 {}", b.record.private_ip),
    );
    assert!(ping.contains("2 received"), "{ping}");
    let qdisc = t.sh(&b.record.id, "tc qdisc show dev eth0");
    assert!(
        qdisc.contains("tbf") && qdisc.contains("rate 20Mbit"),
        "{qdisc}"
    );
    t.cloud.set_bandwidth(&b.record.id, None).unwrap();
    assert!(!t.sh(&b.record.id, "tc qdisc show dev eth0").contains("tbf"));
    t.cloud.set_bandwidth(&a.record.id, Some(5)).unwrap();
    assert!(t
        .sh(&a.record.id, "tc qdisc show dev eth0")
        .contains("rate 5Mbit"));
    // The metadata endpoint answers each instance with its own identity.
    let who = |i: &knit_local::Instance| {
        t.sh(
            &i.record.id,
            &format!(
                "curl -sf http://{}/latest/meta-data/instance-id",
                t.gateway()
            ),
        )
    };
    assert_eq!(who(&a), a.record.id);
    assert_eq!(who(&b), b.record.id);
    // Anyone else (here: the host, from the gateway address) is refused.
    let host = std::process::Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            &format!("http://{}/latest/meta-data/instance-id", t.gateway()),
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&host.stdout), "403");
}
