//! Host networking: the bridge, one network namespace and veth pair per
//! running instance, optional tc shaping.

use crate::error::{LocalError, Result, SysContext};
use crate::run::{run, run_absent_ok};
use std::net::Ipv4Addr;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

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

    /// How many machines the network has addresses for (all but the
    /// network, gateway and broadcast addresses).
    pub fn machine_addresses(&self) -> u64 {
        (1u64 << (32 - self.prefix)).saturating_sub(3)
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

/// Overflow bridge `n` of a local cloud (2, 3, …; its main bridge, the
/// gateway's, is 1) and the veth pair linking it to the main bridge: a
/// plain bridge without an address, so the cloud stays one L2 domain
/// whose gateway is the main bridge (`host_limits::BridgeLayout` says
/// when one is needed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overflow {
    pub bridge: String,
    /// The link's end on the main bridge.
    pub main_end: String,
    /// The link's end on the overflow bridge.
    pub own_end: String,
}

impl Overflow {
    /// Overflow bridge `n` of `main`: `<main>-<n>`, its link's ends that
    /// with `a` (on the main bridge) and `b`. When that would pass 15
    /// characters (an interface name's limit), the main bridge's name is
    /// cut and 4 hex digits of its hash keep cut names apart.
    pub fn of(main: &str, n: usize) -> Overflow {
        let suffix = format!("-{n}");
        // Room for the suffix and the link ends' one more letter.
        let room = 15usize.saturating_sub(suffix.len() + 1);
        let stem = if main.chars().count() <= room {
            main.to_string()
        } else {
            let cut: String = main.chars().take(room.saturating_sub(4)).collect();
            format!("{cut}{:04x}", fnv1a(main) & 0xffff)
        };
        Overflow::named(format!("{stem}{suffix}"))
    }

    /// The overflow bridge named `bridge` (as [`Overflow::of`] names it).
    pub fn named(bridge: String) -> Overflow {
        Overflow {
            main_end: format!("{bridge}a"),
            own_end: format!("{bridge}b"),
            bridge,
        }
    }

    /// Makes what is missing of the bridge and its link to `main`, and
    /// brings both up: a repeat (or a run after a crash half-way) finishes
    /// the job. One `ip -batch`.
    pub fn create(&self, main: &str) -> Result<()> {
        let Overflow {
            bridge,
            main_end,
            own_end,
        } = self;
        let mut batch = String::new();
        if !link_exists(bridge) {
            batch.push_str(&format!("link add name {bridge} type bridge\n"));
        }
        if !link_exists(main_end) {
            batch.push_str(&format!(
                "link add name {main_end} type veth peer name {own_end}\n"
            ));
        }
        let linked = master_of(main_end).as_deref() == Some(main)
            && master_of(own_end).as_deref() == Some(bridge.as_str());
        if batch.is_empty() && linked && is_up(bridge) {
            return Ok(());
        }
        // No address of the host's on it (the gateway is the main bridge):
        // none made from here on, and any made before (a bridge left half
        // made, up without this) removed.
        batch.push_str(&format!(
            "link set dev {bridge} addrgenmode none\n\
             link set dev {own_end} master {bridge} up\nlink set dev {bridge} up\n\
             link set dev {main_end} master {main} up\naddr flush dev {bridge}\n"
        ));
        crate::run::run_input("ip", &["-batch", "-"], &batch).map(|_| ())
    }

    /// Removes the bridge and its link (either end takes the other); what
    /// is gone already is fine.
    pub fn delete(&self) -> Result<()> {
        delete_link(&self.main_end)?;
        delete_link(&self.bridge)
    }
}

/// 32-bit FNV-1a: a hash that is the same in every build (names made from
/// it must be found again by the next version).
fn fnv1a(s: &str) -> u32 {
    s.bytes().fold(0x811c_9dc5, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// The bridge `link` is a port of, if any.
pub fn master_of(link: &str) -> Option<String> {
    let target = std::fs::read_link(Path::new("/sys/class/net").join(link).join("master")).ok()?;
    Some(target.file_name()?.to_string_lossy().into_owned())
}

/// Whether `link` is administratively up.
fn is_up(link: &str) -> bool {
    std::fs::read_to_string(Path::new("/sys/class/net").join(link).join("flags"))
        .ok()
        .and_then(|f| u32::from_str_radix(f.trim().trim_start_matches("0x"), 16).ok())
        .is_some_and(|flags| flags & 1 != 0)
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

/// veth pair: host end on a bridge of the cloud, `eth0` inside the
/// namespace with its address and a default route via the gateway.
pub struct Veth<'a> {
    pub host: &'a str,
    pub netns: &'a str,
    /// The cloud's main bridge (the gateway's): its guard table and the
    /// host's neighbour entry, wherever the port is.
    pub bridge: &'a str,
    /// The bridge the host end joins: the main one or an overflow bridge.
    pub master: &'a str,
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
        guard_add(&Guard {
            bridge: self.bridge,
            port: self.host,
            mac: self.mac,
            ip: self.ip,
        })?;
        run(
            "ip",
            &["link", "set", self.host, "master", self.master, "up"],
        )?;
        pin_neighbour(&Guard {
            bridge: self.bridge,
            port: self.host,
            mac: self.mac,
            ip: self.ip,
        })?;
        // The gateway's entry pinned inside as well (the bridge's MAC is
        // fixed, see `bridge_mac`): see `pin_neighbour` for why.
        let batch = format!(
            "link set lo up\naddr add {}/{} dev eth0\nlink set eth0 up\nroute add default via {}\n\
             neigh replace {} lladdr {} dev eth0 nud permanent\n",
            self.ip,
            self.prefix,
            self.gateway,
            self.gateway,
            bridge_mac(self.gateway)
        );
        crate::run::run_input("ip", &["-n", self.netns, "-batch", "-"], &batch).map(|_| ())
    }
}

/// The host's neighbour entry for an instance's address, pinned to its MAC
/// on the bridge (`nud permanent`), as a cloud's network answers ARP for
/// its instances itself. Two reasons: the kernel keeps one neighbour table
/// for every network namespace, and past `net.ipv4.neigh.default.gc_thresh3`
/// (1,024) dynamic entries, host's and instances' together, it refuses new
/// ones ("neighbor table overflow"): at 512 instances each with its entry
/// for the gateway and the host's for it, the 513th reached nothing
/// (docs/benchmarks.md, "Scale-out on one host"). Permanent entries do not
/// count toward that limit. And no ARP an instance sends can move the
/// host's entry for an address to another MAC.
pub fn pin_neighbour(guard: &Guard) -> Result<()> {
    let ip = guard.ip.to_string();
    run(
        "ip",
        &[
            "neigh",
            "replace",
            &ip,
            "lladdr",
            guard.mac,
            "dev",
            guard.bridge,
            "nud",
            "permanent",
        ],
    )
    .map(|_| ())
}

/// Removes what [`pin_neighbour`] made; an entry or bridge already gone is fine.
pub fn unpin_neighbour(guard: &Guard) -> Result<()> {
    let ip = guard.ip.to_string();
    run_absent_ok(
        "ip",
        &["neigh", "del", &ip, "dev", guard.bridge],
        &["No such file", "Cannot find device", "does not exist"],
    )
}

/// One port's guard: what the port on `bridge` (an instance's veth host end,
/// or a QEMU VM's tap) may send as.
#[derive(Debug, Clone, Copy)]
pub struct Guard<'a> {
    pub bridge: &'a str,
    pub port: &'a str,
    pub mac: &'a str,
    pub ip: Ipv4Addr,
}

/// The nftables table (family `bridge`) guarding every port of `bridge`:
/// one per bridge, made by the first guard and removed with the bridge.
pub fn guard_table(bridge: &str) -> String {
    format!("knit_guard_{bridge}")
}

/// Anti-spoofing, as clouds do on every instance port: of what a guarded
/// port sends (the bridge's prerouting, before the bridge learns its source
/// MAC or forwards it) only IPv4 from its own address and ARP naming its own
/// address, both from its own MAC, pass; the rest is counted (per port) and
/// dropped. So no instance can speak with another's address (the metadata
/// server knows callers by source address), take over another's address or
/// MAC in the host's neighbour table or the bridge's forwarding table, or
/// send IPv6 (instances have no IPv6 address).
///
/// One table per bridge with the ports in sets, not a table per port:
/// every `nft` run reads the whole ruleset first, so with a table per port
/// each guard cost time and memory in the number of ports (measured at 1,000
/// machines: about 0.5 MB per table and port creation slowing to 1.5/s),
/// while adding set elements costs the same at 1,000 ports as at 10.
/// Frames of ports not in the sets (other bridges, other clouds) pass.
pub fn guard_add(guard: &Guard) -> Result<()> {
    match crate::run::run_input("nft", &["-f", "-"], &guard_rules(guard)) {
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

/// The `nft -f` script [`guard_add`] applies, one transaction: the bridge's
/// table, sets and chain if missing, the chain's three rules rewritten
/// (flushed and added again, so a repeat leaves them once), the port's
/// elements. Also the guard of a QEMU VM's tap (knit-qemu), so sandboxes
/// and VMs on one bridge are held to the same rules.
pub fn guard_rules(guard: &Guard) -> String {
    let t = format!("bridge {}", guard_table(guard.bridge));
    let mut lines = vec![
        format!("add table {t}"),
        format!("add set {t} ports {{ type ifname; counter; }}"),
        format!("add set {t} ipv4_from {{ type ifname . ether_addr . ipv4_addr; }}"),
        format!("add set {t} arp_from {{ type ifname . ether_addr . ether_addr . ipv4_addr; }}"),
        format!(
            "add chain {t} ports_in {{ type filter hook prerouting priority -500; policy accept; }}"
        ),
        format!("flush chain {t} ports_in"),
        format!("add rule {t} ports_in meta protocol ip iifname . ether saddr . ip saddr @ipv4_from accept"),
        format!(
            "add rule {t} ports_in meta protocol arp arp htype 1 arp ptype ip \
             iifname . ether saddr . arp saddr ether . arp saddr ip @arp_from accept"
        ),
        format!("add rule {t} ports_in iifname @ports drop"),
    ];
    // The port last: its frames are dropped until it is allowed, never between.
    lines.extend(
        guard_elements(guard)
            .iter()
            .rev()
            .map(|(set, element)| format!("add element {t} {set} {{ {element} }}")),
    );
    lines.push(String::new());
    lines.join("\n")
}

/// The `nft -f` script [`guard_del`] applies: the port's elements, in one
/// transaction (they were added in one).
pub fn guard_del_rules(guard: &Guard) -> String {
    let t = format!("bridge {}", guard_table(guard.bridge));
    let mut lines: Vec<String> = guard_elements(guard)
        .iter()
        .map(|(set, element)| format!("delete element {t} {set} {{ {element} }}"))
        .collect();
    lines.push(String::new());
    lines.join("\n")
}

/// One port's element in each of the guard table's sets: what
/// [`guard_rules`] adds and [`guard_del_rules`] removes.
fn guard_elements(guard: &Guard) -> [(&'static str, String); 3] {
    let Guard { port, mac, ip, .. } = *guard;
    [
        ("ports", format!("\"{port}\"")),
        ("ipv4_from", format!("\"{port}\" . {mac} . {ip}")),
        ("arp_from", format!("\"{port}\" . {mac} . {mac} . {ip}")),
    ]
}

/// What nft says when a guard (table, set or element) to remove is not there.
pub const GUARD_ABSENT: &str = "No such file or directory";

/// Removes the guard of one port, if any (the kernel keeps set elements
/// when the link goes).
pub fn guard_del(guard: &Guard) -> Result<()> {
    match crate::run::run_input("nft", &["-f", "-"], &guard_del_rules(guard)) {
        Err(LocalError::Command { stderr, .. }) if stderr.contains(GUARD_ABSENT) => Ok(()),
        // Without nft no guard can have been made.
        Err(LocalError::Command { status, .. }) if status == "not started" => Ok(()),
        other => other.map(|_| ()),
    }
}

/// Removes the guard table of `bridge` (with the bridge: `down`).
pub fn guard_table_del(bridge: &str) -> Result<()> {
    match run_absent_ok(
        "nft",
        &["delete", "table", "bridge", &guard_table(bridge)],
        &[GUARD_ABSENT],
    ) {
        Err(LocalError::Command { status, .. }) if status == "not started" => Ok(()),
        other => other,
    }
}

/// The guarded ports of `bridge` and the frames each has had dropped
/// (empty: no guard table).
pub fn guarded_ports(bridge: &str) -> Vec<(String, u64)> {
    let table = guard_table(bridge);
    let Ok(out) = run("nft", &["-j", "list", "set", "bridge", &table, "ports"]) else {
        return Vec::new();
    };
    parse_guarded_ports(&out)
}

/// The elements of `nft -j list set … ports`: name and dropped packets.
fn parse_guarded_ports(json: &str) -> Vec<(String, u64)> {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(json) else {
        return Vec::new();
    };
    v["nftables"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|o| o["set"]["elem"].as_array())
        .flatten()
        .filter_map(|e| match &e["elem"] {
            serde_json::Value::Object(el) => Some((
                el.get("val")?.as_str()?.to_string(),
                el.get("counter")
                    .and_then(|c| c["packets"].as_u64())
                    .unwrap_or(0),
            )),
            other => Some((other.as_str().or_else(|| e.as_str())?.to_string(), 0)),
        })
        .collect()
}

/// Frames the guard of `port` on `bridge` dropped so far (None: no guard).
pub fn guard_dropped(bridge: &str, port: &str) -> Option<u64> {
    guarded_ports(bridge)
        .into_iter()
        .find(|(p, _)| p == port)
        .map(|(_, dropped)| dropped)
}

/// The guard tables on the host ([`guard_table`] of each guarded bridge).
pub fn guard_tables() -> Vec<String> {
    let Ok(out) = run("nft", &["list", "tables", "bridge"]) else {
        return Vec::new();
    };
    out.lines()
        .filter_map(|l| l.trim().strip_prefix("table bridge "))
        .filter(|t| t.starts_with("knit_guard_"))
        .map(str::to_string)
        .collect()
}

/// An instance's link and its guard.
pub fn delete_veth(guard: &Guard) -> Result<()> {
    delete_link(guard.port)?;
    unpin_neighbour(guard)?;
    guard_del(guard)
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
    fn a_guard_is_one_transaction_on_the_bridge_table_and_repeats_leave_one_rule_set() {
        let g = Guard {
            bridge: "kb0",
            port: "kv0123",
            mac: "02:00:0a:00:00:02",
            ip: Ipv4Addr::new(10, 0, 0, 2),
        };
        let add = guard_rules(&g);
        let lines: Vec<&str> = add.lines().collect();
        assert!(
            lines.iter().all(|l| l.contains("bridge knit_guard_kb0")),
            "{add}"
        );
        // The rules are rewritten after a flush, never appended to.
        let flush = lines
            .iter()
            .position(|l| l.starts_with("flush chain"))
            .unwrap();
        let rules: Vec<usize> = (0..lines.len())
            .filter(|&i| lines[i].starts_with("add rule"))
            .collect();
        assert_eq!(rules.len(), 3, "{add}");
        assert!(rules.iter().all(|&i| i > flush), "{add}");
        assert!(
            add.contains("ipv4_from { \"kv0123\" . 02:00:0a:00:00:02 . 10.0.0.2 }"),
            "{add}"
        );
        assert!(
            add.contains(
                "arp_from { \"kv0123\" . 02:00:0a:00:00:02 . 02:00:0a:00:00:02 . 10.0.0.2 }"
            ),
            "{add}"
        );
        assert!(add.trim_end().ends_with("ports { \"kv0123\" }"), "{add}");
        // Deleting names exactly what adding made.
        let del = guard_del_rules(&g);
        for set in ["ports", "ipv4_from", "arp_from"] {
            let added = add
                .lines()
                .find(|l| l.starts_with(&format!("add element bridge knit_guard_kb0 {set} ")))
                .unwrap();
            let deleted = del
                .lines()
                .find(|l| l.starts_with(&format!("delete element bridge knit_guard_kb0 {set} ")))
                .unwrap();
            assert_eq!(added.strip_prefix("add "), deleted.strip_prefix("delete "));
        }
    }

    #[test]
    fn guarded_ports_are_read_with_their_drop_counters() {
        let json = r#"{"nftables": [{"metainfo": {"version": "1.0.6"}}, {"set": {"family": "bridge",
            "name": "ports", "table": "knit_guard_kb0", "type": "ifname", "handle": 1,
            "elem": [{"elem": {"val": "kv1", "counter": {"packets": 0, "bytes": 0}}},
                     {"elem": {"val": "kv2", "counter": {"packets": 7, "bytes": 420}}}]}}]}"#;
        assert_eq!(
            parse_guarded_ports(json),
            vec![("kv1".to_string(), 0), ("kv2".to_string(), 7)]
        );
        assert!(parse_guarded_ports("not json").is_empty());
    }

    #[test]
    fn overflow_bridges_are_named_from_the_main_one_within_15_characters() {
        let o = Overflow::of("knit0", 2);
        assert_eq!(
            (o.bridge.as_str(), o.main_end.as_str(), o.own_end.as_str()),
            ("knit0-2", "knit0-2a", "knit0-2b")
        );
        assert_eq!(Overflow::named("knit0-2".into()), o);
        // A long main name is cut; its hash keeps two cut names apart.
        let a = Overflow::of("a-long-bridge-1", 64);
        let b = Overflow::of("a-long-bridge-2", 64);
        for name in [&a.bridge, &a.main_end, &a.own_end, &b.own_end] {
            assert!(name.len() <= 15, "{name}");
        }
        assert!(
            a.bridge.starts_with("a-long") && a.bridge.ends_with("-64"),
            "{a:?}"
        );
        assert_ne!(a.bridge, b.bridge);
        // The same in every run and build.
        assert_eq!(Overflow::of("a-long-bridge-1", 64), a);
        // FNV-1a's published value for "a".
        assert_eq!(fnv1a("a"), 0xe40c_292c);
        assert_eq!(
            Subnet::parse("10.0.0.0/24").unwrap().machine_addresses(),
            253
        );
        assert_eq!(
            Subnet::parse("10.0.0.0/16").unwrap().machine_addresses(),
            65_533
        );
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
