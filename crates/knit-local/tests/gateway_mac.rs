//! The gateway (the bridge) keeps one MAC for its whole life. Left to the
//! kernel, a bridge takes the lowest MAC of its ports: deleting the instance
//! with the lowest address (or adding one below it) changed the gateway's
//! MAC, and every other instance's neighbour entry then named a MAC nobody
//! answers to, so all of them lost the control plane at once for 40–50 s.
//! Run as root.

mod common;

use common::TestCloud;

/// The MAC of a link of the host.
fn mac_of(link: &str) -> String {
    std::fs::read_to_string(format!("/sys/class/net/{link}/address"))
        .unwrap()
        .trim()
        .to_string()
}

#[test]
fn deleting_or_adding_an_instance_keeps_the_gateway_mac() {
    let t = TestCloud::new();
    let gw = t.gateway();
    let first = t.create("systemDiskSize: 256Mi\n");
    let other = t.create("systemDiskSize: 256Mi\n");
    let fixed = mac_of(&t.bridge);
    assert_eq!(fixed, knit_local::net::bridge_mac(gw.parse().unwrap()));
    // Not borrowed from a port (the kernel's choice when none is set: it is
    // then always the lowest port's).
    for port in [&first.record.veth, &other.record.veth] {
        assert_ne!(mac_of(port), fixed, "the gateway's MAC is port {port}'s");
    }
    let meta = format!("curl -sf --max-time 10 http://{gw}/latest/meta-data/hostname");
    // `other` resolves the gateway now, so its neighbour entry holds the
    // gateway's MAC of this moment.
    t.sh(&other.record.id, &meta);
    let neigh = t.sh(&other.record.id, &format!("ip neigh show {gw}"));
    assert!(neigh.contains(&fixed), "{neigh}");

    t.cloud.delete(&first.record.id).unwrap();
    assert_eq!(mac_of(&t.bridge), fixed, "after a delete");
    let neigh = t.sh(&other.record.id, &format!("ip neigh show {gw}"));
    assert!(neigh.contains(&fixed), "{neigh}");
    // Reached at once, with the entry it already had.
    t.sh(&other.record.id, &meta);

    let _third = t.create("systemDiskSize: 256Mi\n");
    assert_eq!(mac_of(&t.bridge), fixed, "after an add");
    t.sh(&other.record.id, &meta);
}

/// The host's neighbour entry for each instance and each instance's for
/// the gateway are pinned (`PERMANENT`): the kernel's neighbour table is
/// shared by every network namespace and refuses dynamic entries past
/// `gc_thresh3` (1,024 here), which at two entries per instance left the
/// 513th instance unable to reach the host; permanent entries do not count.
/// The host's entry goes with the instance's link (stop, delete).
#[test]
fn neighbour_entries_are_pinned_and_go_with_the_link() {
    let t = TestCloud::new();
    let gw = t.gateway();
    let a = t.create("systemDiskSize: 256Mi\n");
    let (id, ip, mac) = (&a.record.id, &a.record.private_ip, &a.record.mac);
    let host_entry = || {
        let out = std::process::Command::new("ip")
            .args(["neigh", "show", ip, "dev", &t.bridge])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let entry = host_entry();
    assert!(
        entry.contains(mac.as_str()) && entry.contains("PERMANENT"),
        "host's entry for {ip}: {entry:?}"
    );
    let inside = t.sh(id, &format!("ip neigh show {gw}"));
    let bridge_mac = knit_local::net::bridge_mac(gw.parse().unwrap());
    assert!(
        inside.contains(&bridge_mac) && inside.contains("PERMANENT"),
        "instance's entry for the gateway: {inside:?}"
    );
    // Reached without asking ARP first.
    t.sh(
        id,
        &format!("curl -sf --max-time 10 http://{gw}/latest/meta-data/hostname"),
    );

    t.cloud.stop(id).unwrap();
    assert_eq!(host_entry(), "", "after stop");
    t.cloud.start(id).unwrap();
    assert!(host_entry().contains("PERMANENT"), "after start");
    t.cloud.delete(id).unwrap();
    assert_eq!(host_entry(), "", "after delete");
}
