//! QEMU's processes: found by their command line, ended, waited for.

use super::*;

impl Machines {
    /// QMP quit, then SIGKILL to what is still ours.
    pub(super) fn end_process(&self, rec: &VmRecord, dir: &Path) {
        let _ = agent::qmp(&qmp_socket(dir), "quit", None, QMP_TIMEOUT);
        if !wait_gone(rec, dir, Duration::from_secs(10)) {
            for pid in live_pids(rec, dir) {
                // Checked just now to be this VM's QEMU (cmdline names its dir).
                // SAFETY: kill(2) on a PID we identified as ours.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            wait_gone(rec, dir, Duration::from_secs(10));
        }
    }

    /// PIDs of QEMU processes of this VM that are alive now.
    pub fn qemu_pids(&self, id: &str) -> Vec<i32> {
        match self.state.vm(id) {
            Ok(rec) => live_pids(&rec, &self.state.vm_dir(id)),
            Err(_) => Vec::new(),
        }
    }
}

/// This VM's QEMU processes: those whose working directory is the VM's
/// and whose command line names the QMP socket there (or, started by an
/// earlier version, names it by its absolute path): the only QEMU
/// processes we ever signal (a PID alone could have been reused).
pub(super) fn pids_naming(dir: &Path) -> Vec<i32> {
    let legacy = format!("path={},", dir.join("qmp.sock").display());
    let ours = format!("path={RUN_DIR}/qmp.sock,");
    let has = |args: &[Vec<u8>], needle: &str| {
        args.iter()
            .any(|arg| arg.windows(needle.len()).any(|w| w == needle.as_bytes()))
    };
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let Some(args) = knit_os::proc::cmdline(*pid) else {
                return false;
            };
            has(&args, &legacy)
                || (has(&args, &ours) && knit_os::proc::cwd(*pid).is_some_and(|c| c == dir))
        })
        .filter(|pid| knit_os::proc::stat(*pid).is_some_and(|s| s.state != 'Z'))
        .collect()
}

/// `pid` when it is alive and is this VM's QEMU.
pub(super) fn owned_process(pid: i32, dir: &Path) -> Option<Process> {
    let process = Process::of(pid)?;
    pids_naming(dir).contains(&pid).then_some(process)
}

pub(super) fn live_pids(rec: &VmRecord, dir: &Path) -> Vec<i32> {
    let mut pids = pids_naming(dir);
    if let Some(p) = rec.process {
        if p.alive() && !pids.contains(&p.pid) {
            pids.push(p.pid);
        }
    }
    pids
}

pub(super) fn wait_gone(rec: &VmRecord, dir: &Path, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if live_pids(rec, dir).is_empty() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
