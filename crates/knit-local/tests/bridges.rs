//! One local cloud over several bridges: with the test knob at 3 ports
//! per bridge (the kernel's is 1,023), the main bridge keeps two ports for
//! the links of two overflow bridges and five machines spread 1 + 2 + 2;
//! the sixth is refused naming the limit. Each machine reaches the gateway
//! (the metadata server knows it by its address) and every other machine,
//! whatever its bridge; the guard drops what a machine on an overflow
//! bridge sends as another, as on the main one; an overflow bridge goes
//! when its last machine does, and `down` leaves no bridge, veth,
//! neighbour entry or guard. Run as root.

mod common;

use common::{guarded_ports, TestCloud};
use knit_local::host_limits::BRIDGE_PORTS_TEST_ENV;
use knit_local::net::{self, Overflow};
use knit_local::Instance;
use std::path::Path;
use std::process::Command;

fn host(program: &str, args: &[&str]) -> String {
    let out = Command::new(program).args(args).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn exists(link: &str) -> bool {
    Path::new("/sys/class/net").join(link).exists()
}

/// The ports of a bridge, sorted.
fn ports(bridge: &str) -> Vec<String> {
    let mut p = knit_local::host_limits::bridge_ports(bridge);
    p.sort();
    p
}

#[test]
fn machines_spread_over_overflow_bridges_reach_each_other_and_stay_guarded() {
    const SECRET: &str = "join-token-of-the-first-0123456789";
    // Each test is a process of its own (nextest); the knob is read when
    // the cloud is opened.
    std::env::set_var(BRIDGE_PORTS_TEST_ENV, "3");
    let (main, links, veths, netns, ips) = {
        let t = TestCloud::new();
        let (o2, o3) = (Overflow::of(&t.bridge, 2), Overflow::of(&t.bridge, 3));
        let gw = t.gateway();
        let mut machines: Vec<Instance> = vec![t.create(&format!(
            "systemDiskSize: 256Mi\nuserData: \"#!/bin/sh\\n# {SECRET}\\n\"\n"
        ))];
        for _ in 0..4 {
            machines.push(t.create("systemDiskSize: 256Mi\n"));
        }
        let placed: Vec<&str> = machines
            .iter()
            .map(|m| m.record.bridge.as_deref().unwrap_or("none"))
            .collect();
        let want = [&t.bridge, &o2.bridge, &o2.bridge, &o3.bridge, &o3.bridge];
        assert_eq!(placed, want, "placement");
        for (m, bridge) in machines.iter().zip(want) {
            assert_eq!(
                net::master_of(&m.record.veth).as_deref(),
                Some(bridge.as_str())
            );
        }
        // Every bridge full: the main one's two links, one link and two
        // machines on each overflow bridge.
        let mut want_main = vec![
            machines[0].record.veth.clone(),
            o2.main_end.clone(),
            o3.main_end.clone(),
        ];
        want_main.sort();
        assert_eq!(ports(&t.bridge), want_main);
        assert_eq!(ports(&o2.bridge).len(), 3);
        assert!(ports(&o3.bridge).contains(&o3.own_end));

        // A sixth: no port left on any bridge, refused before anything is made.
        let e = t
            .cloud
            .create(&knit_local::Template::parse("systemDiskSize: 256Mi\n").unwrap())
            .expect_err("no bridge port left");
        assert_eq!(e.code(), "LocalHostOutOfCapacity");
        let text = e.to_string();
        assert!(
            text.contains("bridge ports 5 in use of 5") && text.contains("at most 3 ports"),
            "{text}"
        );
        assert_eq!(t.cloud.list().unwrap().len(), 5);

        // Each reaches the gateway, and is known there by its address.
        for m in &machines {
            let id = &m.record.id;
            let who = t.sh(
                id,
                &format!("curl -sf --max-time 10 http://{gw}/latest/meta-data/instance-id"),
            );
            assert_eq!(&who, id, "{id} on {:?}", m.record.bridge);
        }
        // Each reaches every other, across bridges.
        let all: Vec<&str> = machines
            .iter()
            .map(|m| m.record.private_ip.as_str())
            .collect();
        for m in &machines {
            let script = format!(
                "for ip in {}; do ping -c 1 -W 5 $ip >/dev/null || {{ echo unreached $ip; exit 1; }}; done",
                all.join(" ")
            );
            t.sh(&m.record.id, &script);
        }
        // The pinned neighbour entries, for machines on overflow bridges too:
        // the host's on the main bridge (the gateway's link), and each
        // machine's for the gateway.
        let bridge_mac = net::bridge_mac(gw.parse().unwrap());
        for m in &machines {
            let entry = host(
                "ip",
                &["neigh", "show", &m.record.private_ip, "dev", &t.bridge],
            );
            assert!(
                entry.contains(&m.record.mac) && entry.contains("PERMANENT"),
                "host's entry for {}: {entry:?}",
                m.record.private_ip
            );
            let inside = t.sh(&m.record.id, &format!("ip neigh show {gw}"));
            assert!(
                inside.contains(&bridge_mac) && inside.contains("PERMANENT"),
                "{inside}"
            );
        }
        // Every machine's port is guarded in the cloud's one guard table;
        // the links between bridges are not (they carry guarded frames).
        let guarded: Vec<String> = net::guarded_ports(&t.bridge)
            .into_iter()
            .map(|(p, _)| p)
            .collect();
        for m in &machines {
            assert!(guarded.contains(&m.record.veth), "{guarded:?}");
        }
        for link in [&o2.main_end, &o2.own_end, &o3.main_end, &o3.own_end] {
            assert!(!guarded.contains(link), "{link} guarded");
        }

        // A machine on bridge 3 poses as the one on bridge 1: takes its
        // address and asks for its user data (three tries, 2 s apart, as
        // tests/network_guard.rs does).
        let (a, b) = (&machines[0], &machines[4]);
        let (a_ip, a_mac) = (&a.record.private_ip, &a.record.mac);
        let user_data = format!("http://{gw}/latest/user-data");
        let own = format!("curl -sf --max-time 10 {user_data}");
        assert!(t.sh(&a.record.id, &own).contains(SECRET));
        let pose = format!(
            "ip addr add {a_ip}/32 dev eth0 && for i in 1 2 3; do ip neigh flush dev eth0; \
             curl -s --max-time 3 --interface {a_ip} {user_data} && exit 0; sleep 2; done; exit 1"
        );
        let out = t.sh_out(&b.record.id, &pose);
        let got = String::from_utf8_lossy(&out.stdout);
        assert!(!got.contains(SECRET), "B read A's user data: {got}");
        assert!(!out.status.success(), "B was answered as A: {got}");
        let neigh = host("ip", &["neigh", "show", a_ip, "dev", &t.bridge]);
        assert!(!neigh.contains(&b.record.mac), "{neigh}");
        let dropped = net::guard_dropped(&t.bridge, &b.record.veth).unwrap();
        assert!(dropped > 0, "B's guard counted nothing");
        // B takes A's MAC: neither bridge learns it from B.
        t.sh_out(
            &b.record.id,
            &format!(
                "ip addr del {a_ip}/32 dev eth0; ip link set dev eth0 address {a_mac} && \
                 ping -c 3 -W 1 {gw}"
            ),
        );
        for (bridge, port) in [(&t.bridge, &o3.main_end), (&o3.bridge, &b.record.veth)] {
            let fdb = host("bridge", &["fdb", "show", "br", bridge]);
            assert!(
                !fdb.lines()
                    .any(|l| l.starts_with(a_mac.as_str()) && l.contains(port.as_str())),
                "{bridge} learnt A's MAC on {port}:\n{fdb}"
            );
        }
        assert!(t.sh(&a.record.id, &own).contains(SECRET), "A lost its own");
        assert!(net::guard_dropped(&t.bridge, &b.record.veth).unwrap() > dropped);

        // Bridge 3 goes with its last machine, its link too; so do the
        // machines' neighbour entries and guards.
        for m in &machines[3..] {
            t.cloud.delete(&m.record.id).unwrap();
            assert_eq!(
                host("ip", &["neigh", "show", &m.record.private_ip]).trim(),
                ""
            );
            assert!(!guarded_ports().contains(&m.record.veth));
        }
        for link in [&o3.bridge, &o3.main_end, &o3.own_end] {
            assert!(!exists(link), "{link} left after its machines went");
        }
        assert!(exists(&o2.bridge));
        // A stopped machine frees its port and takes the first with room
        // when it starts: the main bridge's, freed by the first machine.
        t.cloud.stop(&machines[0].record.id).unwrap();
        t.cloud.stop(&machines[1].record.id).unwrap();
        let again = t.cloud.start(&machines[1].record.id).unwrap();
        assert_eq!(again.record.bridge.as_ref(), Some(&t.bridge));
        t.sh(
            &again.record.id,
            &format!("curl -sf --max-time 10 http://{gw}/latest/meta-data/instance-id"),
        );

        let mut links = vec![t.bridge.clone()];
        for o in [&o2, &o3] {
            links.extend([o.bridge.clone(), o.main_end.clone(), o.own_end.clone()]);
        }
        (
            t.bridge.clone(),
            links,
            machines
                .iter()
                .map(|m| m.record.veth.clone())
                .collect::<Vec<_>>(),
            machines
                .iter()
                .map(|m| m.record.netns.clone())
                .collect::<Vec<_>>(),
            machines
                .iter()
                .map(|m| m.record.private_ip.clone())
                .collect::<Vec<_>>(),
        )
        // `down` on drop.
    };
    for link in links.iter().chain(&veths) {
        assert!(!exists(link), "{link} left after down");
    }
    for ns in &netns {
        assert!(!Path::new("/run/netns").join(ns).exists(), "{ns} left");
    }
    for ip in &ips {
        assert_eq!(host("ip", &["neigh", "show", ip]).trim(), "", "{ip}");
    }
    let table = net::guard_table(&main);
    assert!(
        !net::guard_tables().contains(&table),
        "{table} left after down"
    );
}

/// The knob is a test knob: a value that is not a port count in range is
/// refused when the cloud is opened, naming the variable.
#[test]
fn a_bad_bridge_port_knob_is_refused_naming_it() {
    let (bridge, subnet) = common::unique();
    let tmp = tempfile::tempdir().unwrap();
    let out = common::cli_env(&tmp.path().join("state"), &bridge, &subnet)
        .env(BRIDGE_PORTS_TEST_ENV, "2")
        .arg("list")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        stderr.contains(BRIDGE_PORTS_TEST_ENV) && stderr.contains("from 3 to 1023"),
        "{stderr}"
    );
    assert!(!exists(&bridge));
}

/// Removes the links it names when dropped (success, failure, panic).
struct Links(Vec<String>);

impl Drop for Links {
    fn drop(&mut self) {
        for link in &self.0 {
            let _ = net::delete_link(link);
        }
    }
}

/// Making an overflow bridge finishes what a crash left half-made (here:
/// the bridge without its link, then the link detached from the main
/// bridge, as after the main one was made again), a repeat changes
/// nothing, and removing it takes the bridge and both ends of its link.
#[test]
fn an_overflow_bridge_half_made_is_finished_and_removed_whole() {
    let (main, subnet) = common::unique();
    let gateway = net::Subnet::parse(&subnet).unwrap().host(1).unwrap();
    let o = Overflow::of(&main, 2);
    let _cleanup = Links(vec![main.clone(), o.bridge.clone(), o.main_end.clone()]);
    net::create_bridge(&main, gateway, 24).unwrap();
    let made = Command::new("ip")
        .args(["link", "add", "name", &o.bridge, "type", "bridge"])
        .status()
        .unwrap();
    assert!(made.success());
    o.create(&main).unwrap();
    let linked = || (net::master_of(&o.main_end), net::master_of(&o.own_end));
    assert_eq!(linked(), (Some(main.clone()), Some(o.bridge.clone())));
    o.create(&main).unwrap();
    assert_eq!(linked(), (Some(main.clone()), Some(o.bridge.clone())));
    let detached = Command::new("ip")
        .args(["link", "set", "dev", &o.main_end, "nomaster"])
        .status()
        .unwrap();
    assert!(detached.success());
    o.create(&main).unwrap();
    assert_eq!(linked(), (Some(main.clone()), Some(o.bridge.clone())));
    // No address of the host's on the overflow bridge.
    let addrs = host("ip", &["-o", "addr", "show", "dev", &o.bridge]);
    assert_eq!(addrs.trim(), "", "{addrs}");
    o.delete().unwrap();
    for link in [&o.bridge, &o.main_end, &o.own_end] {
        assert!(!exists(link), "{link} left");
    }
    // Gone already: fine.
    o.delete().unwrap();
}
