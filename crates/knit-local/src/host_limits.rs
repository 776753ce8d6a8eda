//! Host-wide limits every machine spends, checked before a create: the
//! local cloud refuses the machine this host cannot carry (a clear
//! `OutOfCapacity`, which the pool shows and the autoscaler backs off from)
//! instead of making one that never gets Ready and starves the host's own
//! root processes of the same resource.
//!
//! Two such limits are known (docs/benchmarks.md, "Scale-out on one
//! host"): a bridge's ports (1,023, one per running machine; a cloud
//! spreads its machines over several bridges, [`BridgeLayout`]) and inotify
//! instances. `fs.inotify.max_user_instances` is per user
//! and every machine runs as root in the host's user namespace, so each
//! machine's containerd takes one of root's instances (128 on Debian).

use crate::error::{IoContext, LocalError, Result};
use crate::model::{InstanceState, Template};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The host's per-user inotify instance limit.
pub const INOTIFY_SYSCTL: &str = "/proc/sys/fs/inotify/max_user_instances";
/// Instances left to the host's own root processes (systemd, udev, a
/// shell's tools) whatever the machines need.
pub const INOTIFY_RESERVE: u64 = 8;
/// Instances one machine holds once its node runs (its containerd).
pub const INOTIFY_PER_MACHINE: u64 = 1;
/// How long a scan of /proc stands for the host: a scan costs a readlink
/// per open fd of every process (tens of ms at hundreds of machines), and
/// creates between two scans are counted by [`InotifyBudget`] itself.
const SCAN_FOR: Duration = Duration::from_secs(5);

/// Root's inotify instances, by where their processes run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InotifyUse {
    /// Held by processes in the host's PID namespace.
    pub host: u64,
    /// Held by processes in other PID namespaces: machines of this and of
    /// any other local cloud on the host.
    pub machines: u64,
}

/// Counts the inotify fds of root's processes under `proc` (normally
/// `/proc`), split by PID namespace against `own_pid_ns` (the link text of
/// the caller's `/proc/self/ns/pid`). A process that ends meanwhile is
/// skipped; an fd duplicated into a child counts twice (which errs on the
/// side of refusing).
pub fn inotify_use(proc: &Path, own_pid_ns: &str) -> Result<InotifyUse> {
    let mut usage = InotifyUse::default();
    for entry in std::fs::read_dir(proc).ctx("cannot list", proc)? {
        let Ok(entry) = entry else { continue };
        let name = entry.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let dir = entry.path();
        if !runs_as_root(&dir) {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(dir.join("fd")) else {
            continue;
        };
        let held = fds
            .filter_map(|fd| fd.ok())
            .filter(|fd| {
                std::fs::read_link(fd.path())
                    .is_ok_and(|target| target.as_os_str() == "anon_inode:inotify")
            })
            .count() as u64;
        if held == 0 {
            continue;
        }
        let same_ns = std::fs::read_link(dir.join("ns/pid"))
            .is_ok_and(|ns| ns.as_os_str().to_string_lossy() == own_pid_ns);
        if same_ns {
            usage.host += held;
        } else {
            usage.machines += held;
        }
    }
    Ok(usage)
}

/// Whether the process's effective uid is 0 (the user inotify charges).
fn runs_as_root(dir: &Path) -> bool {
    let Ok(status) = std::fs::read_to_string(dir.join("status")) else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        == Some("0")
}

/// Instances a machine of `template` holds once its node runs: its
/// containerd's; a light machine (no container runtime) holds none.
pub fn inotify_of(template: &Template) -> u64 {
    if template.light {
        0
    } else {
        INOTIFY_PER_MACHINE
    }
}

/// Machines of a cloud that hold, or soon will, an instance: each one not
/// stopped, by its template (booting ones included).
pub fn inotify_holders<'a>(
    machines: impl IntoIterator<Item = (InstanceState, &'a Template)>,
) -> u64 {
    machines
        .into_iter()
        .filter(|(state, _)| *state != InstanceState::Stopped)
        .map(|(_, template)| inotify_of(template))
        .sum()
}

/// The decision, pure: may one more machine be made, given the host's
/// `limit`, what a scan saw, the machines granted since that scan and the
/// machines this cloud has (some may not hold their instance yet)?
pub fn check_inotify(
    limit: u64,
    seen: InotifyUse,
    granted_since_scan: u64,
    our_machines: u64,
) -> Result<()> {
    let machines = (seen.machines + granted_since_scan * INOTIFY_PER_MACHINE)
        .max(our_machines * INOTIFY_PER_MACHINE);
    let needed = seen.host + machines + INOTIFY_PER_MACHINE + INOTIFY_RESERVE;
    if needed > limit {
        return Err(LocalError::HostOutOfCapacity {
            resource: "fs.inotify.max_user_instances",
            limit,
            used: seen.host + machines,
            detail: format!(
                "every machine's containerd takes one of root's inotify instances and {INOTIFY_RESERVE} are kept for the host; \
                 raise the limit with `sysctl -w fs.inotify.max_user_instances={}` (or in /etc/sysctl.d) to carry more machines",
                (limit * 2).max(1024)
            ),
        });
    }
    Ok(())
}

/// Ports one Linux bridge holds: port numbers are 10 bits and 0 is never
/// given out (the kernel's `BR_MAX_PORTS`); the 1,024th port fails with
/// EXFULL. Every running machine's veth (and every QEMU VM's tap) is one,
/// and so is each end of the links between a cloud's bridges.
pub const BRIDGE_MAX_PORTS: u64 = 1023;

/// Test knob, not a setting: ports per bridge in place of
/// [`BRIDGE_MAX_PORTS`] (3 to 1,023), so that a test spreads a handful of
/// machines over several bridges. Read by [`bridge_port_limit`] only.
pub const BRIDGE_PORTS_TEST_ENV: &str = "KNIT_LOCAL_TEST_BRIDGE_PORTS";

/// Ports per bridge: [`BRIDGE_MAX_PORTS`], or the test knob
/// [`BRIDGE_PORTS_TEST_ENV`] when set.
pub fn bridge_port_limit() -> Result<u64> {
    let Some(value) = std::env::var_os(BRIDGE_PORTS_TEST_ENV) else {
        return Ok(BRIDGE_MAX_PORTS);
    };
    let text = value.to_string_lossy();
    match text.parse::<u64>() {
        Ok(n) if (3..=BRIDGE_MAX_PORTS).contains(&n) => Ok(n),
        _ => Err(LocalError::invalid(
            BRIDGE_PORTS_TEST_ENV,
            format!("{text:?}"),
            format!("must be a number of ports from 3 to {BRIDGE_MAX_PORTS} (a test knob)"),
        )),
    }
}

/// How one local cloud spreads its machines over bridges: its main bridge
/// (the gateway's) and up to `overflow` overflow bridges, each linked to
/// the main one by a veth pair (a star: one L2 domain, at most two bridges
/// between any two machines). An overflow bridge's link takes one of its
/// ports and one of the main bridge's, so the main bridge keeps `overflow`
/// ports free for those links.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BridgeLayout {
    /// Ports per bridge.
    pub limit: u64,
    /// Overflow bridges at most: as many as the subnet's addresses can
    /// fill, and no more than the main bridge has ports to link.
    pub overflow: u64,
}

impl BridgeLayout {
    /// The layout for `limit` ports per bridge and a subnet of `addresses`
    /// machine addresses: a machine needs an address, so more bridges than
    /// those can fill would only take ports from the main bridge.
    pub fn new(limit: u64, addresses: u64) -> BridgeLayout {
        // k overflow bridges hold (limit - k) + k * (limit - 1) machines.
        let overflow = if addresses <= limit || limit <= 2 {
            0
        } else {
            (addresses - limit).div_ceil(limit - 2).min(limit - 1)
        };
        BridgeLayout { limit, overflow }
    }

    /// How many bridges at most, the main one included.
    pub fn bridges(&self) -> usize {
        self.overflow as usize + 1
    }

    /// Machine ports of bridge `index` (0: the main bridge).
    pub fn room(&self, index: usize) -> u64 {
        if index == 0 {
            self.limit - self.overflow
        } else {
            self.limit - 1
        }
    }

    /// Machine ports of all bridges together.
    pub fn machine_ports(&self) -> u64 {
        (0..self.bridges()).map(|i| self.room(i)).sum()
    }

    /// The first bridge with a free machine port, given the machine ports
    /// in use on each (by index; a bridge not listed uses none).
    pub fn place(&self, used: &[u64]) -> Option<usize> {
        (0..self.bridges()).find(|&i| used.get(i).copied().unwrap_or(0) < self.room(i))
    }
}

/// Ports on `bridge` now (empty when it does not exist).
pub fn bridge_ports(bridge: &str) -> Vec<String> {
    std::fs::read_dir(Path::new("/sys/class/net").join(bridge).join("brif"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The decision, pure: may one more machine join the cloud whose main
/// bridge is `bridge`, laid out as `layout`, with `used` machine ports in
/// use on each bridge now (a bridge's ports other than its links, or this
/// cloud's machines placed on it, whichever is more) and `pending` machines
/// of this cloud that will take a port but have none placed yet?
pub fn check_bridge_ports(
    bridge: &str,
    layout: &BridgeLayout,
    used: &[u64],
    pending: u64,
) -> Result<()> {
    let free: u64 = (0..layout.bridges())
        .map(|i| {
            layout
                .room(i)
                .saturating_sub(used.get(i).copied().unwrap_or(0))
        })
        .sum();
    if free <= pending {
        return Err(bridge_ports_full(bridge, layout, used, pending));
    }
    Ok(())
}

/// The refusal of a machine no bridge of the cloud has a port for.
pub fn bridge_ports_full(
    bridge: &str,
    layout: &BridgeLayout,
    used: &[u64],
    pending: u64,
) -> LocalError {
    let BridgeLayout { limit, overflow } = *layout;
    LocalError::HostOutOfCapacity {
        resource: "bridge ports",
        limit: layout.machine_ports(),
        used: used.iter().sum::<u64>() + pending,
        detail: format!(
            "a Linux bridge holds at most {limit} ports; this local cloud spreads its machines \
             over bridge {bridge} and up to {overflow} overflow bridges linked to it, and every \
             running machine (and QEMU VM) takes a port; delete or stop machines of this local \
             cloud, or give it a larger subnet, or run more in a second one (its own bridge and \
             subnet)"
        ),
    }
}

/// The host's inotify budget, shared by every cloud in this process: the
/// last scan and the machines granted since.
pub struct InotifyBudget {
    last: Mutex<Option<(Instant, InotifyUse, u64)>>,
}

static BUDGET: InotifyBudget = InotifyBudget {
    last: Mutex::new(None),
};

impl InotifyBudget {
    /// The process-wide budget.
    pub fn host() -> &'static InotifyBudget {
        &BUDGET
    }

    /// Refuses one more machine when the host cannot carry it; grants it
    /// (counts it until the next scan) otherwise. Call under the cloud's
    /// state lock so that two creates of one cloud do not both take the
    /// last instance.
    pub fn reserve_one(&self, our_machines: u64) -> Result<()> {
        let limit = read_limit(Path::new(INOTIFY_SYSCTL))?;
        let cached = self.last.lock().ok().and_then(|last| *last);
        let (at, seen, granted) = match cached {
            Some((at, seen, granted)) if at.elapsed() < SCAN_FOR => (at, seen, granted),
            _ => {
                // Scanned without the mutex held: it is only a cache.
                let own = std::fs::read_link("/proc/self/ns/pid")
                    .ctx("cannot read", "/proc/self/ns/pid")?;
                let seen = inotify_use(Path::new("/proc"), &own.to_string_lossy())?;
                (Instant::now(), seen, 0)
            }
        };
        check_inotify(limit, seen, granted, our_machines)?;
        if let Ok(mut last) = self.last.lock() {
            *last = Some((at, seen, granted + 1));
        }
        Ok(())
    }
}

/// Reads a sysctl holding one unsigned number.
fn read_limit(path: &Path) -> Result<u64> {
    let text = std::fs::read_to_string(path).ctx("cannot read", path)?;
    text.trim().parse().map_err(|_| LocalError::Parse {
        what: path.display().to_string(),
        message: format!("{:?} is not an unsigned number", text.trim()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(host: u64, machines: u64) -> InotifyUse {
        InotifyUse { host, machines }
    }

    #[test]
    fn one_bridge_holds_a_small_subnet_and_refuses_past_its_ports_naming_the_limit() {
        // A /24 (253 machine addresses) fits one bridge: no overflow.
        let one = BridgeLayout::new(BRIDGE_MAX_PORTS, 253);
        assert_eq!((one.bridges(), one.machine_ports()), (1, 1023));
        assert!(check_bridge_ports("kb0", &one, &[0], 0).is_ok());
        assert!(check_bridge_ports("kb0", &one, &[1021], 1).is_ok());
        // Machines being made count before their veth exists.
        let e = check_bridge_ports("kb0", &one, &[10], 1013).unwrap_err();
        assert_eq!(e.code(), "LocalHostOutOfCapacity");
        let e = check_bridge_ports("kb0", &one, &[1023], 0)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("bridge ports 1023 in use of 1023")
                && e.contains("at most 1023 ports")
                && e.contains("kb0"),
            "{e}"
        );
    }

    #[test]
    fn a_large_subnet_spreads_over_overflow_bridges_first_with_room() {
        // A /16 (65,533 machine addresses): 64 overflow bridges, the main
        // one keeping a port for each one's link.
        let big = BridgeLayout::new(BRIDGE_MAX_PORTS, 65_533);
        assert_eq!(big.overflow, 64);
        assert_eq!((big.room(0), big.room(1), big.room(64)), (959, 1022, 1022));
        assert!(big.machine_ports() >= 65_533);
        assert!(BridgeLayout::new(BRIDGE_MAX_PORTS, 65_533 - 1_022).overflow < 64);
        // A /21 (2,045): two.
        assert_eq!(BridgeLayout::new(BRIDGE_MAX_PORTS, 2_045).overflow, 2);
        // Placement: the first bridge with room, a freed port reused first.
        assert_eq!(big.place(&[]), Some(0));
        assert_eq!(big.place(&[959]), Some(1));
        assert_eq!(big.place(&[959, 1022, 5]), Some(2));
        assert_eq!(big.place(&[958, 1022, 5]), Some(0));
    }

    #[test]
    fn three_ports_per_bridge_carry_five_machines_on_three_bridges_and_no_sixth() {
        // The test knob's case: the main bridge keeps two ports for links,
        // each overflow bridge one: 1 + 2 + 2 machines.
        let small = BridgeLayout::new(3, 253);
        assert_eq!(small.overflow, 2);
        assert_eq!((small.room(0), small.room(1), small.room(2)), (1, 2, 2));
        assert_eq!(small.machine_ports(), 5);
        assert_eq!(small.place(&[1, 2, 1]), Some(2));
        assert_eq!(small.place(&[1, 2, 2]), None);
        assert!(check_bridge_ports("kt0", &small, &[1, 2, 1], 0).is_ok());
        let e = check_bridge_ports("kt0", &small, &[1, 2, 1], 1)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("bridge ports 5 in use of 5") && e.contains("at most 3 ports"),
            "{e}"
        );
        // Two ports leave nothing to link: one bridge.
        assert_eq!(BridgeLayout::new(2, 253).bridges(), 1);
    }

    #[test]
    fn the_last_instances_are_kept_for_the_host() {
        // 128 of root's: 20 the host's, 99 machines', one more fits (20 +
        // 99 + 1 + 8 = 128), the next does not.
        assert!(check_inotify(128, seen(20, 99), 0, 99).is_ok());
        let err = check_inotify(128, seen(20, 100), 0, 100).unwrap_err();
        assert_eq!(err.code(), "LocalHostOutOfCapacity");
        let text = err.to_string();
        assert!(text.starts_with("OutOfCapacity:"), "{text}");
        assert!(text.contains("fs.inotify.max_user_instances"), "{text}");
        assert!(text.contains("120 in use of 128"), "{text}");
        assert!(
            text.contains("sysctl -w fs.inotify.max_user_instances=1024"),
            "{text}"
        );
    }

    /// A light machine (a pool's `runtime: none`) runs no containerd:
    /// it needs no instance and counts for none; stopped machines neither.
    #[test]
    fn light_and_stopped_machines_hold_no_instance() {
        let full = Template::default();
        let light = Template {
            light: true,
            ..Template::default()
        };
        assert_eq!((inotify_of(&full), inotify_of(&light)), (1, 0));
        let machines = [
            (InstanceState::Running, &full),
            (InstanceState::Creating, &full),
            (InstanceState::Running, &light),
            (InstanceState::Stopped, &full),
        ];
        assert_eq!(inotify_holders(machines), 2);
        // 300 light machines beside 99 full ones leave room for one more
        // full one, as 99 alone do.
        let many: Vec<(InstanceState, &Template)> =
            std::iter::repeat_n((InstanceState::Running, &light), 300)
                .chain(std::iter::repeat_n((InstanceState::Running, &full), 99))
                .collect();
        assert!(check_inotify(128, seen(20, 99), 0, inotify_holders(many)).is_ok());
    }

    #[test]
    fn machines_not_yet_holding_their_instance_count() {
        // The scan saw 10 machines' containerds, but this cloud has made
        // 60 (50 still booting): they are counted as holding theirs.
        assert!(check_inotify(128, seen(20, 10), 0, 60).is_ok());
        assert!(check_inotify(128, seen(20, 10), 0, 100).is_err());
        // Grants since the scan count too (other clouds' creates included).
        assert!(check_inotify(128, seen(20, 90), 9, 0).is_ok());
        assert!(check_inotify(128, seen(20, 90), 10, 0).is_err());
    }

    #[test]
    fn a_scan_finds_this_process_inotify_instance_on_the_host_side() {
        let own = std::fs::read_link("/proc/self/ns/pid").unwrap();
        let own = own.to_string_lossy();
        let before = inotify_use(Path::new("/proc"), &own).unwrap();
        // SAFETY: inotify_init1 takes flags only and returns an fd or -1.
        let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
        assert!(
            fd >= 0,
            "inotify_init1: {}",
            std::io::Error::last_os_error()
        );
        let after = inotify_use(Path::new("/proc"), &own).unwrap();
        // SAFETY: fd is ours, opened above and closed once.
        unsafe { libc::close(fd) };
        // Other tests may open and close instances meanwhile; this one is
        // charged to root only when the test runs as root (CI does).
        if nix::unistd::geteuid().is_root() {
            assert!(after.host >= 1, "{before:?} -> {after:?}");
        }
        // Nothing in another PID namespace is counted as the host's: a
        // namespace link that matches nothing puts every fd on the
        // machines' side.
        let none = inotify_use(Path::new("/proc"), "pid:[0]").unwrap();
        assert_eq!(none.host, 0);
    }

    #[test]
    fn a_limit_that_is_not_a_number_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("max_user_instances");
        std::fs::write(&path, "lots\n").unwrap();
        let err = read_limit(&path).unwrap_err().to_string();
        assert!(err.contains("\"lots\" is not an unsigned number"), "{err}");
        std::fs::write(&path, "8192\n").unwrap();
        assert_eq!(read_limit(&path).unwrap(), 8192);
    }
}
