//! The local cloud's lifecycle on real loop devices, namespaces, overlayfs
//! and a real bridge. Run as root.

mod common;

use common::{leftovers_but_store, TestCloud};
use knit_local::InstanceState;
use std::time::Duration;

const MULTIPART: &str = r#"userData: |
  Content-Type: multipart/mixed; boundary="==B=="
  MIME-Version: 1.0

  --==B==
  Content-Type: text/x-shellscript; charset="us-ascii"
  Content-Disposition: attachment; filename="first.sh"

  #!/bin/sh
  echo first > /root/order
  curl -sf http://GATEWAY/latest/meta-data/instance-id > /root/md-id
  curl -sf http://GATEWAY/latest/meta-data/disks/ > /root/md-disks
  curl -sf http://GATEWAY/latest/user-data | head -1 > /root/md-ud
  --==B==
  Content-Type: text/cloud-config

  #cloud-config
  runcmd:
  - touch /root/from-cloud-config
  --==B==
  Content-Type: text/x-shellscript

  #!/bin/sh
  echo second >> /root/order
  echo to-the-log
  exit 3
  --==B==
  Content-Type: text/x-shellscript

  #!/bin/sh
  echo third >> /root/order
  --==B==--
"#;

#[test]
fn boot_runs_user_data_in_order_with_metadata_and_cloud_disks() {
    let t = TestCloud::new();
    let yaml = format!(
        "name: web-1\ninstanceType: ecs.g7.large\nsystemDiskSize: 1Gi\ndisks:\n- {{name: data, size: 256Mi, interface: nvme}}\n- {{name: logs, size: 128Mi}}\n- {{name: more, size: 128Mi}}\n{}",
        MULTIPART.replace("GATEWAY", &t.gateway())
    );
    let inst = t.create(&yaml);
    let id = inst.record.id.clone();
    assert!(inst.alive);
    let devices: Vec<_> = inst
        .data_disks
        .iter()
        .map(|d| d.device.clone().unwrap())
        .collect();
    assert_eq!(devices, ["nvme0n1", "vdb", "vdc"]);

    let result = t
        .cloud
        .wait_user_data(&id, Duration::from_secs(60))
        .unwrap();
    let parts = result["knit"]["parts"].as_array().unwrap();
    let names: Vec<_> = parts
        .iter()
        .map(|p| {
            (
                p["filename"].as_str().unwrap(),
                p["exitCode"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        names,
        [
            ("first.sh", 0),
            ("part-002", 0),
            ("part-003", 3),
            ("part-004", 0)
        ]
    );
    assert_eq!(result["knit"]["failedPart"], "part-003");
    assert_eq!(result["v1"]["errors"][0], "part-003: exited with 3");
    assert_eq!(parts[1]["status"], "succeeded");
    assert_eq!(parts[2]["status"], "failed");

    assert_eq!(t.sh(&id, "cat /root/order"), "first\nsecond\nthird\n");
    assert_eq!(t.sh(&id, "cat /root/md-id"), id);
    assert!(t
        .sh(&id, "cat /root/md-disks")
        .contains(&inst.data_disks[0].id));
    assert_eq!(
        t.sh(&id, "cat /root/md-ud"),
        "Content-Type: multipart/mixed; boundary=\"==B==\"\n"
    );
    assert!(t
        .sh(&id, "cat /var/log/cloud-init-output.log")
        .contains("to-the-log"));
    // The cloud-config part was applied by cloud-init, in its place.
    assert!(t
        .sh_out(&id, "test -e /root/from-cloud-config")
        .status
        .success());

    // Cloud names in /dev, /dev/disk/by-id and sysfs; no host disk anywhere.
    let dev = t.sh(&id, "ls /dev");
    for d in &devices {
        assert!(dev.lines().any(|l| l == d), "{d} missing from /dev: {dev}");
    }
    assert!(
        !dev.lines()
            .any(|l| l.starts_with("loop") || l == "vda" || l == "sda"),
        "{dev}"
    );
    assert_eq!(
        t.sh(&id, "ls /sys/block | sort | tr '\\n' ' '"),
        "nvme0n1 vdb vdc "
    );
    let by_id = t.sh(&id, "ls /dev/disk/by-id");
    assert!(
        by_id.contains(&format!("nvme-{}", inst.data_disks[0].serial)),
        "{by_id}"
    );
    assert!(
        by_id.contains(&format!("virtio-{}", inst.data_disks[1].serial)),
        "{by_id}"
    );
    assert_eq!(
        t.sh(&id, "cat /sys/block/nvme0n1/size").trim(),
        (256 * 2048).to_string()
    );

    // Own UTS and PID namespaces: its hostname, and our init as PID 1.
    assert_eq!(t.sh(&id, "hostname").trim(), "web-1");
    assert_eq!(
        t.sh(&id, "getent hosts web-1").split_whitespace().next(),
        Some(inst.record.private_ip.as_str())
    );
    assert!(t
        .sh(&id, "cat /proc/1/cmdline | tr '\\0' ' '")
        .contains("__boot"));
    // The host sees none of the instance's mounts (only the block store's).
    assert!(leftovers_but_store(&t.dir).mounts.is_empty());

    // Metadata paths from inside.
    let md = |p: &str| {
        t.sh(
            &id,
            &format!("curl -sf http://{}/latest/meta-data/{p}", t.gateway()),
        )
    };
    assert_eq!(md("instance/instance-type"), "ecs.g7.large");
    assert_eq!(md("private-ipv4"), inst.record.private_ip);
    assert_eq!(md("region-id"), "local");
    assert_eq!(
        md(&format!("disks/{}/device", inst.data_disks[0].id)),
        "/dev/nvme0n1"
    );
    assert_eq!(
        md(&format!("disks/{}/serial", inst.data_disks[1].id)),
        inst.data_disks[1].serial
    );
}

#[test]
fn stop_start_keeps_everything_and_reimage_keeps_only_data_disks() {
    let t = TestCloud::new();
    let inst = t.create("systemDiskSize: 1Gi\ndisks:\n- {name: data, size: 128Mi, format: ext4}\nuserData: \"#!/bin/sh\\necho v1 > /root/ud\\n\"\n");
    let id = inst.record.id.clone();
    let old_disk = inst.data_disks[0].id.clone();
    t.cloud
        .wait_user_data(&id, Duration::from_secs(60))
        .unwrap();
    t.sh(&id, "echo system > /etc/knit-marker && mount /dev/vdb /mnt && echo data > /mnt/file && umount /mnt");

    let stopped = t.cloud.stop(&id).unwrap();
    assert_eq!(stopped.record.state, InstanceState::Stopped);
    assert!(!stopped.alive);
    assert!(t.cloud.exec(&id, &["true".into()]).is_err());
    assert!(
        leftovers_but_store(&t.dir).loop_devices.is_empty(),
        "stop must release loop devices"
    );

    t.cloud.start(&id).unwrap();
    assert_eq!(t.sh(&id, "cat /etc/knit-marker"), "system\n");
    assert_eq!(
        t.sh(&id, "mount /dev/vdb /mnt && cat /mnt/file && umount /mnt"),
        "data\n"
    );
    // User data ran once per instance, not again on start.
    let r = t
        .cloud
        .wait_user_data(&id, Duration::from_secs(60))
        .unwrap();
    assert!(r["knit"]["skipped"][0]
        .as_str()
        .unwrap()
        .contains("already ran"));

    let re = t
        .cloud
        .reimage(&id, Some("#!/bin/sh\necho v2 > /root/ud\n".into()))
        .unwrap();
    assert_eq!(re.data_disks.len(), 1);
    assert_ne!(
        re.data_disks[0].id, old_disk,
        "reimage gives data disks new ids"
    );
    assert_eq!(re.data_disks[0].device.as_deref(), Some("vdb"));
    assert!(t.cloud.disks().unwrap().iter().all(|d| d.id != old_disk));
    t.cloud
        .wait_user_data(&id, Duration::from_secs(60))
        .unwrap();
    assert_eq!(t.sh(&id, "cat /root/ud"), "v2\n");
    assert!(
        !t.sh_out(&id, "test -e /etc/knit-marker").status.success(),
        "system layer must be new"
    );
    assert_eq!(
        t.sh(&id, "mount /dev/vdb /mnt && cat /mnt/file && umount /mnt"),
        "data\n"
    );
    assert!(t
        .sh(&id, "ls /dev/disk/by-id")
        .contains(&re.data_disks[0].serial));

    t.cloud.reboot(&id).unwrap();
    assert_eq!(t.sh(&id, "cat /root/ud"), "v2\n");
}

#[test]
fn snapshot_copies_a_disk_and_disks_hot_attach() {
    let t = TestCloud::new();
    let a = t.create("systemDiskSize: 1Gi\ndisks:\n- {name: data, size: 128Mi, format: ext4}\n");
    let b = t.create("systemDiskSize: 1Gi\n");
    let (a_id, b_id) = (a.record.id.clone(), b.record.id.clone());
    t.sh(&a_id, "mount /dev/vdb /mnt && head -c 3000000 /dev/urandom > /mnt/blob && sha256sum /mnt/blob | cut -c1-64 > /mnt/sum && umount /mnt");
    let sum = t.sh(
        &a_id,
        "mount -o ro /dev/vdb /mnt && cat /mnt/sum && umount /mnt",
    );

    let snap = t.cloud.snapshot_create(&a.data_disks[0].id).unwrap();
    assert!(["reflink", "sparse-copy"].contains(&snap.method.as_str()));
    assert_eq!(t.cloud.snapshots().unwrap().len(), 1);
    let small = t
        .cloud
        .create(
            &knit_local::Template::parse(&format!(
                "disks:\n- {{name: r, size: 64Mi, snapshot: {}}}\n",
                snap.id
            ))
            .unwrap(),
        )
        .unwrap_err();
    assert!(
        small.to_string().contains(&format!(
            "disks[0].size: value \"64Mi\" must be at least the size of snapshot {}",
            snap.id
        )),
        "{small}"
    );
    let disk = t
        .cloud
        .disk_create(&knit_local::DiskSpec {
            name: "restored".into(),
            size: None,
            interface: knit_local::DiskInterface::Nvme,
            snapshot: Some(snap.id.clone()),
            format: None,
        })
        .unwrap();
    assert_eq!(disk.size, 128 << 20);
    let attached = t.cloud.disk_attach(&disk.id, &b_id).unwrap();
    assert_eq!(attached.device.as_deref(), Some("nvme0n1"));
    assert_eq!(
        t.sh(
            &b_id,
            "mount /dev/nvme0n1 /mnt && sha256sum /mnt/blob | cut -c1-64"
        ),
        sum
    );
    let busy = t.cloud.disk_detach(&disk.id).unwrap_err();
    assert_eq!(busy.code(), "LocalBusy", "{busy}");
    t.sh(&b_id, "umount /mnt");
    t.cloud.disk_detach(&disk.id).unwrap();
    assert!(!t.sh(&b_id, "ls /dev /sys/block").contains("nvme0n1"));
    t.cloud.disk_delete(&disk.id).unwrap();
    t.cloud.snapshot_delete(&snap.id).unwrap();
    assert!(t.cloud.snapshots().unwrap().is_empty());

    t.cloud.delete(&a_id).unwrap();
    assert_eq!(t.cloud.list().unwrap().len(), 1);
    assert!(
        t.cloud.disks().unwrap().is_empty(),
        "delete releases the instance's disks"
    );
    let err = t.cloud.describe(&a_id).unwrap_err();
    assert_eq!(err.code(), "LocalNotFound");
    assert!(err.to_string().contains(&a_id));
}

/// An image directory instead of the host's root: the instance sees only it.
#[test]
fn an_image_directory_can_be_the_base_root() {
    let t = TestCloud::new();
    let image = t.dir.parent().unwrap().join("image");
    common::build_image(
        &image,
        "ID=knittest\nVERSION_ID=\"1\"\nPRETTY_NAME=\"knit test image\"\n",
    );

    let inst = t.create(&format!(
        "baseRoot: {}\nsystemDiskSize: 256Mi\nuserData: \"#!/bin/sh\\necho ran > /ran\\n\"\n",
        image.display()
    ));
    let id = inst.record.id.clone();
    assert_eq!(inst.record.os.id, "knittest");
    t.cloud
        .wait_user_data(&id, Duration::from_secs(60))
        .unwrap();
    assert_eq!(t.sh(&id, "read x < /ran; echo $x"), "ran\n");
    assert_eq!(
        t.sh(
            &id,
            "test -e /usr/bin/apt-get && echo host-root || echo image-only"
        ),
        "image-only\n"
    );
    // The image itself is the read-only lower layer: untouched.
    assert!(!image.join("ran").exists());
}

#[test]
fn attributes_reach_the_instance_and_secrets_are_not_kept() {
    let t = TestCloud::new();
    let inst = t.create(
        "systemDiskSize: 256Mi\nattributes:\n  swap: true\n  os: {id: aliyun, versionId: '3', prettyName: Alibaba Cloud Linux 3}\n  login: {password: Secret-123}\n  tags: {ack.aliyun.com: c-1}\n",
    );
    let id = inst.record.id.clone();
    assert!(t.sh(&id, "cat /proc/swaps").contains("/swapfile"));
    assert!(t.sh(&id, "cat /etc/os-release").contains("ID=aliyun"));
    assert!(
        !std::fs::read_to_string("/etc/os-release")
            .unwrap()
            .contains("aliyun"),
        "host os-release changed"
    );
    assert_eq!(
        t.sh(
            &id,
            &format!(
                "curl -sf http://{}/latest/meta-data/tags/instance/ack.aliyun.com",
                t.gateway()
            )
        ),
        "c-1"
    );
    let described = serde_json::to_string(&t.cloud.describe(&id).unwrap()).unwrap();
    assert!(!described.contains("Secret-123"));
    let stored =
        std::fs::read_to_string(t.dir.join("instances").join(&id).join("instance.json")).unwrap();
    assert!(!stored.contains("Secret-123"));
}

/// A pool may run Debian's cloud-init (installed in the base root: the host's
/// `/`, see scripts/setup.sh) instead of knit's runner.
#[test]
fn cloud_init_runs_user_data_from_the_nocloud_seed() {
    let t = TestCloud::new();
    let id = t
        .create("systemDiskSize: 1Gi\nuserDataRunner: cloud-init\nuserData: |\n  #!/bin/sh\n  echo from-cloud-init > /root/ci\n")
        .record
        .id;
    // cloud-init writes result.json itself, after its final stage.
    let result = t
        .cloud
        .wait_user_data(&id, Duration::from_secs(120))
        .unwrap();
    assert!(
        result["v1"]["datasource"]
            .as_str()
            .unwrap()
            .starts_with("DataSourceNoCloud"),
        "{result}"
    );
    assert!(
        result.get("knit").is_none(),
        "knit's runner must not have run: {result}"
    );
    assert_eq!(t.sh(&id, "cat /root/ci"), "from-cloud-init\n");
    assert!(t
        .sh(&id, "cat /var/log/cloud-init-output.log")
        .contains("Cloud-init v."));
}

/// The control plane creates in parallel on one `Cloud`: distinct addresses,
/// every instance up.
#[test]
fn parallel_creates_get_distinct_addresses() {
    let t = TestCloud::new();
    let ids: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..6)
            .map(|_| {
                s.spawn(|| {
                    t.create("systemDiskSize: 256Mi\ndisks:\n- {name: d, size: 64Mi}\n")
                        .record
                        .id
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let list = t.cloud.list().unwrap();
    assert_eq!(list.len(), 6);
    let ips: std::collections::BTreeSet<_> =
        list.iter().map(|i| i.record.private_ip.clone()).collect();
    assert_eq!(ips.len(), 6, "{ips:?}");
    for id in &ids {
        assert_eq!(t.sh(id, "ls /dev/vdb"), "/dev/vdb\n");
    }
}

/// A create repeated with the same client token (a paused server woken,
/// the next leader retrying) gets the instance the first one made, also
/// when both race; another token makes another instance.
#[test]
fn a_client_token_makes_one_instance() {
    let t = TestCloud::new();
    let tpl = "systemDiskSize: 256Mi\nclientToken: pool-a-00001\n";
    let ids: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..3)
            .map(|_| s.spawn(|| t.create(tpl).record.id))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
    assert_eq!(t.cloud.list().unwrap().len(), 1);
    let other = t.create("systemDiskSize: 256Mi\nclientToken: pool-a-00002\n");
    assert_ne!(other.record.id, ids[0]);
    assert_eq!(t.cloud.list().unwrap().len(), 2);
    let bad = knit_local::Template::parse(&format!("clientToken: {}\n", "x".repeat(65)))
        .unwrap()
        .validate()
        .unwrap_err()
        .to_string();
    assert!(bad.contains("clientToken"), "{bad}");
}

/// PID 1 may say `ready` before the shim, descheduled after fork, names
/// it: the boot still records PID 1, so commands run in the instance (on
/// a loaded CI host the instance once ran with no init on record, and every
/// exec in it was refused as "its init is gone").
#[test]
fn an_init_named_after_it_said_ready_is_recorded() {
    // nextest runs each test in its own process: only this test's boots
    // see the variable.
    std::env::set_var("KNIT_LOCAL_DELAY_AT", "shim-pid");
    let t = TestCloud::new();
    let inst = t.create("systemDiskSize: 256Mi\n");
    let id = inst.record.id.clone();
    let init = inst.record.init.expect("PID 1 on record");
    assert!(init.alive());
    assert_eq!(t.sh(&id, "echo ok"), "ok\n");
}

/// PID 1 killed from outside (a host crash, an OOM kill): the record still
/// says running, `alive` says otherwise, and start brings it back intact.
#[test]
fn an_instance_whose_init_died_can_be_started_again() {
    let t = TestCloud::new();
    let inst = t.create("systemDiskSize: 256Mi\n");
    let id = inst.record.id.clone();
    t.sh(&id, "echo kept > /etc/knit-kept");
    let init = inst.record.init.unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(init.pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    while init.alive() {
        std::thread::sleep(Duration::from_millis(10));
    }
    let dead = t.cloud.describe(&id).unwrap();
    assert_eq!(dead.record.state, InstanceState::Running);
    assert!(!dead.alive);
    assert_eq!(
        t.cloud.exec(&id, &["true".into()]).unwrap_err().code(),
        "LocalWrongState"
    );
    let back = t.cloud.start(&id).unwrap();
    assert!(back.alive);
    assert_eq!(back.record.boots, 2);
    assert_eq!(t.sh(&id, "cat /etc/knit-kept"), "kept\n");
}
