//! Bad input, missing root, and a provider killed in the middle of create:
//! clear errors, and nothing left behind after `down`. Run as root.

mod common;

use common::{cli_env, leftovers, unique, TestCloud};
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::Stdio;

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn bad_input_is_named_and_leaves_nothing_half_created() {
    let t = TestCloud::new();
    let tpl = t.dir.parent().unwrap().join("t.yaml");
    let mut cases = vec![
        ("systemDiskSize: 1Gi\ndisk: []\n", "unknown field `disk`"),
        (
            "disks:\n- {name: a, size: 0}\n",
            "disks[0].size: value 0 must be > 0",
        ),
        (
            "disks:\n- {name: a, size: 1Gi}\n- {name: a, size: 1Gi}\n",
            "disks[1].name: value \"a\" must be unique",
        ),
        (
            "disks:\n- {name: a, snapshot: s-000000000000}\n",
            "disks[0].snapshot: value \"s-000000000000\" must name an existing snapshot",
        ),
        (
            "baseRoot: /nonexistent\n",
            "baseRoot: value \"/nonexistent\" must be a root filesystem directory",
        ),
        ("bandwidthMbit: 0\n", "bandwidthMbit: value 0 must be > 0"),
        (
            "privateIp: 10.0.0.300\n",
            "privateIp: value \"10.0.0.300\" must be an IPv4 address",
        ),
        (
            "privateIp: 192.0.2.77\n",
            "privateIp: value \"192.0.2.77\" must be a host address of",
        ),
    ];
    for (yaml, want) in cases.drain(..) {
        std::fs::write(&tpl, yaml).unwrap();
        let out = t.cli(&["create", "-f", &tpl.to_string_lossy()]);
        assert!(!out.status.success(), "{yaml} was accepted");
        assert!(
            stderr(&out).contains(want),
            "for {yaml:?}: want {want:?}, got {}",
            stderr(&out)
        );
    }
    for args in [
        &["describe", "i-0123456789ab"][..],
        &["delete", "i-0123456789ab"],
        &["stop", "i-0123456789ab"],
        &["exec", "i-0123456789ab", "true"],
    ] {
        let out = t.cli(args);
        assert!(
            stderr(&out)
                .contains("error[LocalNotFound]: instance \"i-0123456789ab\" does not exist"),
            "{args:?}: {}",
            stderr(&out)
        );
    }
    assert!(t.cloud.list().unwrap().is_empty());
    assert!(t.cloud.disks().unwrap().is_empty());
    assert!(knit_local::loopdev::backed_under(&t.dir).is_empty());

    // A subnet that collides with a host route (this cloud's own bridge).
    t.create("systemDiskSize: 256Mi\n");
    let (bridge, _) = unique();
    let other = t.dir.parent().unwrap().join("other");
    std::fs::write(&tpl, "{}").unwrap();
    let out = cli_env(&other, &bridge, &t.subnet)
        .args(["create", "-f", &tpl.to_string_lossy()])
        .output()
        .unwrap();
    let overlapping = t.subnet.replace(".0/24", ".128/25");
    let out2 = cli_env(&other, &bridge, &overlapping)
        .args(["create", "-f", &tpl.to_string_lossy()])
        .output()
        .unwrap();
    for (o, subnet) in [(&out, &t.subnet), (&out2, &overlapping)] {
        assert!(
            stderr(o).contains(&format!(
                "subnet: value \"{subnet}\" collides with host route"
            )),
            "{}",
            stderr(o)
        );
    }
    assert!(!std::path::Path::new("/sys/class/net")
        .join(&bridge)
        .exists());
    assert!(knit_local::loopdev::backed_under(&other).is_empty());
}

#[test]
fn without_root_a_clear_error() {
    let (bridge, subnet) = unique();
    let out = cli_env(std::path::Path::new("/nonexistent/knit"), &bridge, &subnet)
        .arg("list")
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out)
            .contains("error[LocalNotRoot]: knit-local must run as root (running as uid 65534)"),
        "{}",
        stderr(&out)
    );
}

/// Kill -9 the provider at each step of create; `down` must release it all.
#[test]
fn killed_mid_create_then_down_leaves_nothing() {
    // "store-loop": the block store's loop device attached, not yet mounted.
    // "cgroups": the machine's cgroups made (issue 29), no network yet.
    for step in [
        "record",
        "store-loop",
        "disks",
        "loops",
        "cgroups",
        "network",
        "spawn",
    ] {
        let tmp = tempfile::Builder::new()
            .prefix("knit-local-crash-")
            .tempdir()
            .unwrap();
        let dir = tmp.path().join("state");
        let (bridge, subnet) = unique();
        let tpl = tmp.path().join("t.yaml");
        std::fs::write(&tpl, "systemDiskSize: 256Mi\ndisks:\n- {name: a, size: 64Mi}\n- {name: b, size: 64Mi, interface: nvme}\nuserData: \"#!/bin/sh\\nsleep 1000\\n\"\n").unwrap();
        let mut child = cli_env(&dir, &bridge, &subnet)
            .args(["create", "-f", &tpl.to_string_lossy()])
            .env("KNIT_LOCAL_PAUSE_AFTER", step)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stderr.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), format!("knit-local: paused after {step}"));
        child.kill().unwrap();
        child.wait().unwrap();

        let rec: serde_json::Value = {
            let inst = std::fs::read_dir(dir.join("instances"))
                .unwrap()
                .next()
                .unwrap()
                .unwrap()
                .path();
            serde_json::from_str(&std::fs::read_to_string(inst.join("instance.json")).unwrap())
                .unwrap()
        };
        let links = vec![bridge.clone(), rec["veth"].as_str().unwrap().to_string()];
        let netns = vec![rec["netns"].as_str().unwrap().to_string()];
        let before = leftovers(&dir, &links, &netns);
        let cgroups: Vec<std::path::PathBuf> = rec["cgroups"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|c| c.as_str())
                    .map(Into::into)
                    .collect()
            })
            .unwrap_or_default();
        if matches!(step, "cgroups" | "network" | "spawn") {
            assert!(
                !cgroups.is_empty() && cgroups.iter().all(|c| c.is_dir()),
                "{step}: the machine's cgroups should be recorded and made: {cgroups:?}"
            );
        }
        if step != "record" {
            assert!(
                !before.loop_devices.is_empty(),
                "{step}: the crash should have left loop devices (at least the block store's)"
            );
        }
        let xfs_store = knit_local::blockstore::BlockStore::new(&dir)
            .record()
            .unwrap()
            .is_some_and(|r| r.kind == knit_local::blockstore::StoreKind::XfsLoop);
        if xfs_store && step != "record" && step != "store-loop" {
            let store = dir.join("store").to_string_lossy().into_owned();
            assert!(
                before
                    .mounts
                    .iter()
                    .any(|m| m.contains(&format!(" {store} "))),
                "{step}: the block store should be mounted: {:?}",
                before.mounts
            );
        }
        if step == "spawn" {
            assert!(
                !before.processes.is_empty(),
                "{step}: the instance should be running"
            );
        }

        let out = cli_env(&dir, &bridge, &subnet)
            .arg("down")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{step}: down failed: {}",
            stderr(&out)
        );
        let after = leftovers(&dir, &links, &netns);
        assert_eq!(
            after,
            common::Leftovers::default(),
            "{step}: down left {after:?}"
        );
        for c in &cgroups {
            assert!(!c.exists(), "{step}: down left the cgroup {}", c.display());
        }
    }
}
