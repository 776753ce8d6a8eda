//! No instance can speak for another on the local cloud's network: the
//! guard on the host end of each instance's link drops what it sends with
//! an address or MAC not its own, so it can neither read another's user
//! data from the metadata server (which knows callers by source address)
//! nor take over another's address or MAC on the host. The guard follows
//! the link: made with it, gone with `stop`, `delete` and `down`. Run as
//! root.

mod common;

use common::{guarded_ports, TestCloud};
use std::process::Command;

fn host(program: &str, args: &[&str]) -> String {
    let out = Command::new(program).args(args).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn an_instance_cannot_pose_as_another() {
    const SECRET: &str = "join-token-of-a-0123456789";
    let (a_veth, b_veth, bridge) = {
        let t = TestCloud::new();
        let a = t.create(&format!(
            "systemDiskSize: 256Mi\nuserData: \"#!/bin/sh\\n# {SECRET}\\n\"\n"
        ));
        let b = t.create("systemDiskSize: 256Mi\n");
        let (a_id, b_id) = (a.record.id.as_str(), b.record.id.as_str());
        let (a_ip, a_mac) = (&a.record.private_ip, &a.record.mac);
        let user_data = format!("http://{}/latest/user-data", t.gateway());
        let own = format!("curl -sf --max-time 10 {user_data}");
        assert!(t.sh(a_id, &own).contains(SECRET));
        let guarded = guarded_ports();
        for v in [&a.record.veth, &b.record.veth] {
            assert!(guarded.contains(v), "{v}: {guarded:?}");
        }

        // B (root in its namespace) takes A's address and asks as A. Its
        // ARP for the gateway then names A's address too, which would point
        // the host's neighbour entry for A at B. Tried three times, 2 s
        // apart: the host keeps a fresh entry for 1 s (locktime).
        let pose = format!(
            "ip addr add {a_ip}/32 dev eth0 && for i in 1 2 3; do ip neigh flush dev eth0; \
             curl -s --max-time 3 --interface {a_ip} {user_data} && exit 0; sleep 2; done; exit 1"
        );
        let out = t.sh_out(b_id, &pose);
        let got = String::from_utf8_lossy(&out.stdout);
        assert!(
            !got.contains(SECRET),
            "B read A's user data posing as A: {got}"
        );
        assert!(!out.status.success(), "B was answered as A: {got}");
        let neigh = host("ip", &["neigh", "show", a_ip, "dev", &t.bridge]);
        assert!(
            !neigh.contains(&b.record.mac),
            "the host's neighbour entry for A names B: {neigh}"
        );
        assert!(t.sh(a_id, &own).contains(SECRET), "A lost its own");
        let dropped = knit_local::net::guard_dropped(&t.bridge, &b.record.veth).unwrap();
        assert!(dropped > 0, "B's guard counted nothing");

        // B takes A's MAC: the bridge must not learn it on B's port (A's
        // traffic would go to B), and A keeps talking to the host.
        t.sh_out(
            b_id,
            &format!(
                "ip addr del {a_ip}/32 dev eth0; ip link set dev eth0 address {a_mac} && \
                 ping -c 3 -W 1 {}",
                t.gateway()
            ),
        );
        let fdb = host("bridge", &["fdb", "show", "br", &t.bridge]);
        assert!(
            !fdb.lines()
                .any(|l| l.starts_with(a_mac.as_str()) && l.contains(&b.record.veth)),
            "the bridge learnt A's MAC on B's port:\n{fdb}"
        );
        assert!(t.sh(a_id, &own).contains(SECRET), "A lost its traffic to B");
        assert!(knit_local::net::guard_dropped(&t.bridge, &b.record.veth).unwrap() > dropped);

        // The guard goes with the link: stop, delete; and comes with start.
        t.cloud.stop(a_id).unwrap();
        assert!(!guarded_ports().contains(&a.record.veth));
        t.cloud.start(a_id).unwrap();
        assert!(guarded_ports().contains(&a.record.veth));
        assert!(t.sh(a_id, &own).contains(SECRET));
        t.cloud.delete(b_id).unwrap();
        assert!(!guarded_ports().contains(&b.record.veth));
        (
            a.record.veth.clone(),
            b.record.veth.clone(),
            t.bridge.clone(),
        )
        // `down` on drop.
    };
    let guarded = guarded_ports();
    for v in [a_veth, b_veth] {
        assert!(
            !guarded.contains(&v),
            "{v}'s guard left after down: {guarded:?}"
        );
    }
    let table = knit_local::net::guard_table(&bridge);
    assert!(
        !knit_local::net::guard_tables().contains(&table),
        "{table} left after down"
    );
}
