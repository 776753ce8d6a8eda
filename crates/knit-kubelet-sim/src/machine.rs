//! The machine's size as cAdvisor reads it for the kubelet: the host's CPUs
//! and memory, bounded by the cgroup the node runs in (its CPU quota and
//! memory limit, cgroup v1 or v2, mounted at /sys/fs/cgroup). On a local
//! cloud machine that cgroup is the instance type's size; on a VM or a
//! real host there is no limit and the machine's own figures stand.

use std::path::Path;

/// CPUs in millicores and memory in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size {
    pub cpu_millis: u64,
    pub memory_bytes: u64,
}

impl Size {
    /// The Node's `cpu` quantity: whole CPUs, or millicores.
    pub fn cpu_quantity(&self) -> String {
        if self.cpu_millis.is_multiple_of(1000) {
            (self.cpu_millis / 1000).to_string()
        } else {
            format!("{}m", self.cpu_millis)
        }
    }

    /// The Node's `memory` quantity, in Ki.
    pub fn memory_quantity(&self) -> String {
        format!("{}Ki", self.memory_bytes / 1024)
    }
}

fn read_u64(p: &Path) -> Option<u64> {
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

/// CPU quota in millicores, if one is set (`cpu.max`, or v1's
/// `cpu.cfs_quota_us` / `cpu.cfs_period_us`).
fn cpu_quota_millis(cgroup: &Path) -> Option<u64> {
    if let Ok(t) = std::fs::read_to_string(cgroup.join("cpu.max")) {
        let mut it = t.split_whitespace();
        let quota = it.next()?.parse::<u64>().ok()?; // "max": none
        let period = it.next()?.parse::<u64>().ok().filter(|p| *p > 0)?;
        return Some(quota * 1000 / period);
    }
    let dir = cgroup.join("cpu");
    let quota = std::fs::read_to_string(dir.join("cpu.cfs_quota_us")).ok()?;
    let quota = quota.trim().parse::<i64>().ok().filter(|q| *q > 0)? as u64;
    let period = read_u64(&dir.join("cpu.cfs_period_us")).filter(|p| *p > 0)?;
    Some(quota * 1000 / period)
}

/// Memory limit in bytes, if one is set (`memory.max`, or v1's
/// `memory.limit_in_bytes`; v1's "no limit" is a huge number).
fn memory_limit(cgroup: &Path) -> Option<u64> {
    if let Ok(t) = std::fs::read_to_string(cgroup.join("memory.max")) {
        return t.trim().parse().ok();
    }
    read_u64(&cgroup.join("memory/memory.limit_in_bytes"))
}

/// The size given the host's figures and the cgroup filesystem's root.
pub fn size_at(cgroup: &Path, host_cpus: u64, host_memory_bytes: u64) -> Size {
    let host_millis = host_cpus.max(1) * 1000;
    Size {
        cpu_millis: cpu_quota_millis(cgroup)
            .map(|q| q.min(host_millis))
            .filter(|q| *q > 0)
            .unwrap_or(host_millis),
        memory_bytes: memory_limit(cgroup)
            .map(|m| m.min(host_memory_bytes))
            .filter(|m| *m > 0)
            .unwrap_or(host_memory_bytes),
    }
}

/// This machine's size.
pub fn size() -> Size {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let mem_kib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .unwrap_or(0);
    size_at(Path::new("/sys/fs/cgroup"), cpus as u64, mem_kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_quota_and_limit_bound_the_host() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("cpu")).unwrap();
        std::fs::create_dir_all(d.path().join("memory")).unwrap();
        std::fs::write(d.path().join("cpu/cpu.cfs_quota_us"), "200000\n").unwrap();
        std::fs::write(d.path().join("cpu/cpu.cfs_period_us"), "100000\n").unwrap();
        std::fs::write(
            d.path().join("memory/memory.limit_in_bytes"),
            "2147483648\n",
        )
        .unwrap();
        let s = size_at(d.path(), 8, 24 << 30);
        assert_eq!(
            (s.cpu_quantity(), s.memory_quantity()),
            ("2".into(), "2097152Ki".into())
        );
        // A quota above the host's CPUs is the host's.
        let s = size_at(d.path(), 1, 24 << 30);
        assert_eq!(s.cpu_quantity(), "1");
        // No limit (v1's huge number) is the host's memory.
        std::fs::write(d.path().join("cpu/cpu.cfs_quota_us"), "-1\n").unwrap();
        std::fs::write(
            d.path().join("memory/memory.limit_in_bytes"),
            "9223372036854771712\n",
        )
        .unwrap();
        let s = size_at(d.path(), 4, 1 << 30);
        assert_eq!((s.cpu_millis, s.memory_bytes), (4000, 1 << 30));
    }

    #[test]
    fn v2_max_files() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("cpu.max"), "150000 100000\n").unwrap();
        std::fs::write(d.path().join("memory.max"), "1073741824\n").unwrap();
        let s = size_at(d.path(), 4, 8 << 30);
        assert_eq!(
            (s.cpu_quantity(), s.memory_bytes),
            ("1500m".into(), 1 << 30)
        );
        std::fs::write(d.path().join("cpu.max"), "max 100000\n").unwrap();
        std::fs::write(d.path().join("memory.max"), "max\n").unwrap();
        let s = size_at(d.path(), 4, 8 << 30);
        assert_eq!((s.cpu_millis, s.memory_bytes), (4000, 8 << 30));
    }

    #[test]
    fn no_cgroup_is_the_host() {
        let s = size_at(Path::new("/nonexistent-knit"), 2, 1 << 30);
        assert_eq!((s.cpu_millis, s.memory_bytes), (2000, 1 << 30));
    }
}
