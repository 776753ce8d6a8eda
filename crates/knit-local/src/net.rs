//! Host networking: the bridge, one network namespace and veth pair per
//! running instance, optional tc shaping.

use crate::error::{LocalError, Result, SysContext};
use crate::run::{run, run_absent_ok};
use std::net::Ipv4Addr;
use std::os::unix::fs::MetadataExt;

/// An IPv4 network in CIDR form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subnet {
    pub base: Ipv4Addr,
    pub prefix: u8,
}

impl Subnet {
    pub fn parse(s: &str) -> Option<Subnet> {
        let (ip, prefix) = match s.split_once('/') {
            Some((ip, p)) => (ip, p.parse().ok()?),
            None => (s, 32),
        };
        let ip: Ipv4Addr = ip.parse().ok()?;
        if prefix > 32 {
            return None;
        }
        let base = Ipv4Addr::from(u32::from(ip) & mask(prefix));
        Some(Subnet { base, prefix })
    }

    pub fn overlaps(&self, other: &Subnet) -> bool {
        let m = mask(self.prefix.min(other.prefix));
        u32::from(self.base) & m == u32::from(other.base) & m
    }

    /// The n-th address of the network (1 = gateway).
    pub fn host(&self, n: u32) -> Option<Ipv4Addr> {
        let size = 1u64 << (32 - self.prefix);
        if (n as u64) < size - 1 && n > 0 {
            Some(Ipv4Addr::from(u32::from(self.base) + n))
        } else {
            None
        }
    }
}

impl std::fmt::Display for Subnet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.base, self.prefix)
    }
}

fn mask(prefix: u8) -> u32 {
    if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - prefix)
    }
}

/// Checks a bridge name and subnet; the subnet must not collide with any host route.
pub fn check_network(bridge: &str, subnet: &str) -> Result<Subnet> {
    if bridge.is_empty()
        || bridge.len() > 15
        || !bridge
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(LocalError::invalid(
            "bridge",
            format!("{bridge:?}"),
            "must be 1-15 letters, digits, '-' or '_' (a Linux interface name)",
        ));
    }
    let net = Subnet::parse(subnet).ok_or_else(|| {
        LocalError::invalid(
            "subnet",
            format!("{subnet:?}"),
            "must be an IPv4 CIDR like 10.213.0.0/24",
        )
    })?;
    if !(16..=29).contains(&net.prefix) {
        return Err(LocalError::invalid(
            "subnet",
            format!("{subnet:?}"),
            "must have a prefix length in [16, 29]",
        ));
    }
    let routes = run("ip", &["-j", "-4", "route", "show", "table", "all"])?;
    let routes: serde_json::Value =
        serde_json::from_str(&routes).map_err(|e| LocalError::Parse {
            what: "`ip -j route` output".into(),
            message: e.to_string(),
        })?;
    for r in routes.as_array().into_iter().flatten() {
        let dst = r["dst"].as_str().unwrap_or("");
        if r["dev"].as_str() == Some(bridge)
            || dst == "default"
            || r["type"].as_str().is_some_and(|t| t == "broadcast")
        {
            continue;
        }
        if let Some(other) = Subnet::parse(dst) {
            if other.prefix > 0 && net.overlaps(&other) && !other.base.is_loopback() {
                return Err(LocalError::invalid(
                    "subnet",
                    format!("{subnet:?}"),
                    format!(
                        "collides with host route {dst} on {}",
                        r["dev"].as_str().unwrap_or("?")
                    ),
                ));
            }
        }
    }
    Ok(net)
}

pub fn link_exists(name: &str) -> bool {
    std::path::Path::new("/sys/class/net").join(name).exists()
}

/// The bridge's own MAC: fixed, derived from the gateway address, locally
/// administered. Left to the kernel, a bridge takes the lowest MAC of its
/// ports and changes it whenever such a port comes or goes; every
/// instance's neighbour entry for the gateway then names a MAC nobody
/// answers to, and all instances lose the control plane at once for as long
/// as that entry lives (measured: 40-50 s after one instance was deleted or
/// added).
pub fn bridge_mac(gateway: Ipv4Addr) -> String {
    let o = gateway.octets();
    format!("02:6b:{:02x}:{:02x}:{:02x}:{:02x}", o[0], o[1], o[2], o[3])
}

pub fn create_bridge(bridge: &str, gateway: Ipv4Addr, prefix: u8) -> Result<()> {
    let mac = bridge_mac(gateway);
    run(
        "ip",
        &["link", "add", bridge, "address", &mac, "type", "bridge"],
    )?;
    run(
        "ip",
        &["addr", "add", &format!("{gateway}/{prefix}"), "dev", bridge],
    )?;
    run("ip", &["link", "set", bridge, "up"])?;
    Ok(())
}

pub fn delete_link(name: &str) -> Result<()> {
    run_absent_ok(
        "ip",
        &["link", "del", name],
        &["Cannot find device", "does not exist"],
    )
}

const NETNS_DIR: &str = "/run/netns";

pub fn netns_path(netns: &str) -> std::path::PathBuf {
    std::path::Path::new(NETNS_DIR).join(netns)
}

/// `ip netns add` bind-mounts /run/netns on itself the first time it runs
/// and nothing ever undoes that. Once no namespace is left there (ours or
/// anyone's) and nothing is mounted below it, that mount goes, so the host
/// ends as it started. Returns how many mounts were released.
pub fn release_netns_dir() -> Result<usize> {
    let dir = std::path::Path::new(NETNS_DIR);
    let empty = std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_none());
    let mounts = crate::mounts::mount_points();
    let below = mounts
        .iter()
        .any(|m| std::path::Path::new(m).starts_with(dir) && std::path::Path::new(m) != dir);
    if !empty || below {
        return Ok(0);
    }
    let stacked = mounts
        .iter()
        .filter(|m| std::path::Path::new(m) == dir)
        .count();
    for _ in 0..stacked {
        nix::mount::umount2(dir, nix::mount::MntFlags::MNT_DETACH)
            .sys(|| format!("umount {NETNS_DIR}"))?;
    }
    Ok(stacked)
}

pub fn netns_add(netns: &str) -> Result<()> {
    run("ip", &["netns", "add", netns])?;
    Ok(())
}

pub fn netns_del(netns: &str) -> Result<()> {
    if netns_path(netns).exists() {
        run_absent_ok("ip", &["netns", "del", netns], &["No such file"])?;
    }
    Ok(())
}

/// veth pair: host end on the bridge, `eth0` inside the namespace with its
/// address and a default route via the gateway.
pub struct Veth<'a> {
    pub host: &'a str,
    pub netns: &'a str,
    pub bridge: &'a str,
    pub mac: &'a str,
    pub ip: Ipv4Addr,
    pub prefix: u8,
    pub gateway: Ipv4Addr,
}

impl Veth<'_> {
    pub fn create(&self) -> Result<()> {
        run(
            "ip",
            &[
                "link", "add", self.host, "type", "veth", "peer", "name", "eth0", "address",
                self.mac, "netns", self.netns,
            ],
        )?;
        // Guarded before the link comes up: no frame passes unfiltered.
        guard_add(self.host, self.mac, self.ip)?;
        run(
            "ip",
            &["link", "set", self.host, "master", self.bridge, "up"],
        )?;
        let batch = format!(
            "link set lo up\naddr add {}/{} dev eth0\nlink set eth0 up\nroute add default via {}\n",
            self.ip, self.prefix, self.gateway
        );
        crate::run::run_input("ip", &["-n", self.netns, "-batch", "-"], &batch).map(|_| ())
    }
}

/// The nftables table guarding the host end `host_veth` of an instance's
/// link. Named after the link, which the instance record holds before the
/// link is made, so `delete` and `down` find it after a crash at any step.
pub fn guard_table(host_veth: &str) -> String {
    format!("knit_guard_{host_veth}")
}

/// Anti-spoofing, as clouds do on every instance port: of what the instance
/// sends (ingress of the host end, before the bridge sees it) only IPv4
/// from its own address and ARP naming its own address, both from its own
/// MAC, pass; the rest is counted and dropped. So no instance can speak
/// with another's address (the metadata server knows callers by source
/// address), take over another's address or MAC in the host's neighbour
/// table or the bridge's forwarding table, or send IPv6 (instances have no
/// IPv6 address). Replaces a table left by an earlier boot, atomically.
pub fn guard_add(host_veth: &str, mac: &str, ip: Ipv4Addr) -> Result<()> {
    let rules = guard_rules(host_veth, mac, ip);
    match crate::run::run_input("nft", &["-f", "-"], &rules) {
        Err(LocalError::Command { status, .. }) if status == "not started" => {
            Err(LocalError::Command {
                command: "nft".into(),
                status: "not installed".into(),
                stderr: "nft (Debian package nftables) guards every instance's link against \
                         address spoofing; install it (scripts/setup.sh)"
                    .into(),
            })
        }
        other => other.map(|_| ()),
    }
}

/// The `nft -f` script [`guard_add`] applies: also the guard of a QEMU
/// VM's tap (knit-qemu), so sandboxes and VMs on one bridge are held to
/// the same rules.
pub fn guard_rules(host_veth: &str, mac: &str, ip: Ipv4Addr) -> String {
    let table = guard_table(host_veth);
    [
        format!("table netdev {table}"),
        format!("delete table netdev {table}"),
        format!("table netdev {table} {{"),
        "  counter spoofed {}".into(),
        "  chain instance_egress {".into(),
        format!("    type filter hook ingress device \"{host_veth}\" priority -500; policy drop;"),
        format!("    ether saddr {mac} ip saddr {ip} accept"),
        format!("    ether saddr {mac} arp htype 1 arp ptype ip arp saddr ether {mac} arp saddr ip {ip} accept"),
        "    counter name spoofed drop".into(),
        "  }".into(),
        "}".into(),
    ]
    .join("\n")
}

/// Removes the guard of `host_veth`, if any (the kernel keeps the table
/// when the link goes).
pub fn guard_del(host_veth: &str) -> Result<()> {
    let table = guard_table(host_veth);
    match run_absent_ok(
        "nft",
        &["delete", "table", "netdev", &table],
        &["No such file or directory"],
    ) {
        // Without nft no guard can have been made.
        Err(LocalError::Command { status, .. }) if status == "not started" => Ok(()),
        other => other,
    }
}

/// Frames the guard of `host_veth` dropped so far (None: no guard).
pub fn guard_dropped(host_veth: &str) -> Option<u64> {
    let table = guard_table(host_veth);
    let out = run("nft", &["list", "counter", "netdev", &table, "spoofed"]).ok()?;
    let at = out.find("packets ")? + "packets ".len();
    out[at..].split_whitespace().next()?.parse().ok()
}

/// An instance's link and its guard.
pub fn delete_veth(host_veth: &str) -> Result<()> {
    delete_link(host_veth)?;
    guard_del(host_veth)
}

/// Token-bucket shaping on both directions of an instance's link; `None` removes it.
pub fn shape(host_veth: &str, netns: &str, mbit: Option<u32>) -> Result<()> {
    let rate = mbit.map(|m| format!("{m}mbit"));
    // burst must cover one timer tick at this rate: 1% of a second, at least 32 KiB.
    let burst = mbit.map(|m| {
        (u64::from(m) * 1_000_000 / 8 / 100)
            .max(32 * 1024)
            .to_string()
    });
    for (ns, dev) in [(None, host_veth), (Some(netns), "eth0")] {
        let mut args: Vec<&str> = ns.map(|n| vec!["-n", n]).unwrap_or_default();
        match (&rate, &burst) {
            (Some(rate), Some(burst)) => {
                args.extend([
                    "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate, "burst", burst,
                    "latency", "50ms",
                ]);
                run("tc", &args)?;
            }
            _ => {
                args.extend(["qdisc", "del", "dev", dev, "root"]);
                run_absent_ok(
                    "tc",
                    &args,
                    &["No such file", "handle of zero", "Invalid handle"],
                )?;
            }
        }
    }
    Ok(())
}

/// PIDs of every process whose network namespace is the named one.
pub fn pids_in_netns(netns: &str) -> Vec<i32> {
    let Ok(meta) = std::fs::metadata(netns_path(netns)) else {
        return Vec::new();
    };
    let want = format!("net:[{}]", meta.ino());
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        if std::fs::read_link(entry.path().join("ns/net"))
            .is_ok_and(|l| l.to_string_lossy() == want)
        {
            pids.push(pid);
        }
    }
    pids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subnets() {
        let s = Subnet::parse("10.213.0.7/24").unwrap();
        assert_eq!(s.to_string(), "10.213.0.0/24");
        assert_eq!(s.host(1), Some(Ipv4Addr::new(10, 213, 0, 1)));
        assert_eq!(s.host(255), None);
        assert!(s.overlaps(&Subnet::parse("10.0.0.0/8").unwrap()));
        assert!(s.overlaps(&Subnet::parse("10.213.0.9").unwrap()));
        assert!(!s.overlaps(&Subnet::parse("10.214.0.0/24").unwrap()));
        assert!(Subnet::parse("10.0.0.0/33").is_none());
        assert!(Subnet::parse("nonsense").is_none());
    }

    #[test]
    fn bad_bridge_and_subnet_are_named() {
        let e = check_network("this-name-is-too-long", "10.1.0.0/24")
            .unwrap_err()
            .to_string();
        assert!(e.contains("bridge"), "{e}");
        let e = check_network("kb0", "10.1.0.0").unwrap_err().to_string();
        assert!(e.contains("subnet") && e.contains("prefix"), "{e}");
    }
}
