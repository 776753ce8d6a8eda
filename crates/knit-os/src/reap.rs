//! Long-lived children reaped by one thread for the whole process.
//!
//! A child that outlives the call that started it (a machine's PID 1 shim,
//! a metadata server) must still be waited for when it ends, or it stays a
//! zombie in a long-lived parent. A thread blocked in `wait` per child did
//! that at the price of a thread per machine: a thousand machines were a
//! thousand threads in the server, and every `fork` it made (a command with
//! a `pre_exec`) copied their stacks' mappings. Here one thread waits on
//! every such child's pidfd and reaps each as it ends.

use nix::libc;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Child;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::OnceLock;

/// The reaper thread's inbox and the eventfd that wakes it.
struct Reaper {
    inbox: Sender<(Child, OwnedFd)>,
    wake: OwnedFd,
}

static REAPER: OnceLock<Option<Reaper>> = OnceLock::new();

/// Reaps `child` whenever it ends. Falls back to a thread of its own when
/// the kernel has no pidfds (before Linux 5.3) or the reaper cannot start.
pub fn when_done(child: Child) {
    let Some(pidfd) = pidfd_open(child.id()) else {
        return wait_in_thread(child);
    };
    let Some(reaper) = REAPER.get_or_init(start).as_ref() else {
        return wait_in_thread(child);
    };
    match reaper.inbox.send((child, pidfd)) {
        Ok(()) => {
            let one = 1u64.to_ne_bytes();
            // SAFETY: writes 8 bytes from a live buffer to our eventfd.
            unsafe { libc::write(reaper.wake.as_raw_fd(), one.as_ptr().cast(), one.len()) };
        }
        Err(back) => wait_in_thread(back.0 .0),
    }
}

fn wait_in_thread(mut child: Child) {
    let spawned = std::thread::Builder::new()
        .name("knit-reap".into())
        .spawn(move || child.wait());
    if let Err(e) = spawned {
        // Without a thread it stays a zombie until this process ends.
        eprintln!("knit: cannot start a thread to reap a child: {e}");
    }
}

fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a PID and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    // SAFETY: a non-negative return is a descriptor that is ours alone.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn start() -> Option<Reaper> {
    // SAFETY: eventfd returns a new descriptor or -1.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return None;
    }
    // SAFETY: a new descriptor, ours alone.
    let wake = unsafe { OwnedFd::from_raw_fd(fd) };
    let thread_wake = wake.try_clone().ok()?;
    let (tx, rx) = channel();
    std::thread::Builder::new()
        .name("knit-reaper".into())
        .spawn(move || run(rx, thread_wake))
        .ok()?;
    Some(Reaper { inbox: tx, wake })
}

/// Waits on the eventfd and every child's pidfd; a pidfd turns readable
/// when its process ends, and the child is reaped then.
fn run(inbox: Receiver<(Child, OwnedFd)>, wake: OwnedFd) {
    let mut children: Vec<(Child, OwnedFd)> = Vec::new();
    loop {
        let mut fds: Vec<libc::pollfd> = std::iter::once(wake.as_raw_fd())
            .chain(children.iter().map(|(_, fd)| fd.as_raw_fd()))
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: polls a live array of pollfds of its own length.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if n < 0 {
            continue; // EINTR
        }
        let mut ended: Vec<usize> = fds[1..]
            .iter()
            .enumerate()
            .filter(|(_, p)| p.revents != 0)
            .map(|(i, _)| i)
            .collect();
        // Last first, so that removing one moves none still to be removed.
        ended.reverse();
        for i in ended {
            let (child, _) = &mut children[i];
            // Not ended after all (a spurious wake): kept.
            if matches!(child.try_wait(), Ok(None)) {
                continue;
            }
            children.swap_remove(i);
        }
        if fds[0].revents != 0 {
            let mut count = [0u8; 8];
            // SAFETY: reads 8 bytes into a live buffer from our eventfd.
            unsafe { libc::read(wake.as_raw_fd(), count.as_mut_ptr().cast(), count.len()) };
            while let Ok(c) = inbox.try_recv() {
                children.push(c);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;
    use std::time::{Duration, Instant};

    fn is_zombie_or_gone(pid: u32) -> (bool, bool) {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Ok(stat) => {
                let state = stat[stat.rfind(')').unwrap() + 2..].chars().next();
                (state == Some('Z'), false)
            }
            Err(_) => (false, true),
        }
    }

    /// Children handed over are reaped as each ends, by one thread, while
    /// the others go on running.
    #[test]
    fn ended_children_are_reaped_and_running_ones_kept() {
        let quick: Vec<u32> = (0..5)
            .map(|_| {
                let c = Command::new("true").spawn().unwrap();
                let pid = c.id();
                when_done(c);
                pid
            })
            .collect();
        let long = Command::new("sleep").arg("30").spawn().unwrap();
        let long_pid = long.id();
        when_done(long);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !quick.iter().all(|p| is_zombie_or_gone(*p).1) {
            assert!(Instant::now() < deadline, "ended children left as zombies");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(is_zombie_or_gone(long_pid), (false, false), "still running");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(long_pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        while !is_zombie_or_gone(long_pid).1 {
            assert!(Instant::now() < deadline, "a killed child left as a zombie");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
