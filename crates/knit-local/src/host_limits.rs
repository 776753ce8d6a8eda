//! Host-wide limits every machine spends, checked before a create: the
//! local cloud refuses the machine this host cannot carry (a clear
//! `OutOfCapacity`, which the pool shows and the autoscaler backs off from)
//! instead of making one that never gets Ready and starves the host's own
//! root processes of the same resource.
//!
//! Two such limits are known (docs/benchmarks.md, "Scale-out on one
//! host"): a bridge's ports (1,023, one per running machine) and inotify
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
/// EXFULL. Every running machine's veth (and every QEMU VM's tap) is one.
pub const BRIDGE_MAX_PORTS: u64 = 1023;

/// Ports on `bridge` now (0 when it does not exist yet).
pub fn bridge_ports(bridge: &str) -> u64 {
    std::fs::read_dir(Path::new("/sys/class/net").join(bridge).join("brif"))
        .map(|d| d.count() as u64)
        .unwrap_or(0)
}

/// The decision, pure: may one more machine join `bridge`, which has
/// `ports_now` ports, while this cloud has `our_machines` machines that
/// are or will soon be running (each takes a port once it boots)?
pub fn check_bridge_ports(bridge: &str, ports_now: u64, our_machines: u64) -> Result<()> {
    let used = ports_now.max(our_machines);
    if used + 1 > BRIDGE_MAX_PORTS {
        return Err(LocalError::HostOutOfCapacity {
            resource: "bridge ports",
            limit: BRIDGE_MAX_PORTS,
            used,
            detail: format!(
                "bridge {bridge} holds at most {BRIDGE_MAX_PORTS} ports and every running machine \
                 (and QEMU VM) on it takes one; delete or stop machines of this local cloud, or \
                 run more in a second one (its own bridge and subnet)"
            ),
        });
    }
    Ok(())
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
    fn a_bridge_refuses_its_1024th_port_naming_the_limit() {
        assert!(check_bridge_ports("kb0", 0, 0).is_ok());
        assert!(check_bridge_ports("kb0", 1021, 900).is_ok());
        // Machines being made count before their veth exists.
        let e = check_bridge_ports("kb0", 10, 1023).unwrap_err();
        assert_eq!(e.code(), "LocalHostOutOfCapacity");
        let e = check_bridge_ports("kb0", 1023, 5).unwrap_err().to_string();
        assert!(
            e.contains("bridge ports") && e.contains("1023") && e.contains("kb0"),
            "{e}"
        );
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
