//! Process identity through /proc. A PID alone can name another process
//! once the first has ended and the kernel reused it; a PID with the
//! process's start time (field 22 of /proc/PID/stat, clock ticks since
//! boot) names one process for good, even across exec. Everything here
//! reads /proc only and signals nothing.

use serde::{Deserialize, Serialize};

/// One process, identified so a reused PID is never taken for it (kept in
/// state files as `{"pid": …, "startTime": …}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcRef {
    pub pid: i32,
    /// Field 22 of /proc/PID/stat when it was recorded.
    pub start_time: u64,
}

impl ProcRef {
    /// `pid` as it is now, when it is running (not ended, not a zombie).
    pub fn of(pid: i32) -> Option<ProcRef> {
        stat(pid).filter(Stat::running).map(|s| ProcRef {
            pid,
            start_time: s.start_time,
        })
    }

    /// Still running and still the same process (not a reused PID).
    pub fn alive(&self) -> bool {
        ProcRef::of(self.pid) == Some(*self)
    }
}

/// The fields of /proc/PID/stat knit reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// R, S, D, T, Z (zombie: ended, not yet reaped), X (dead), ...
    pub state: char,
    pub ppid: i32,
    /// Clock ticks since boot at which it started.
    pub start_time: u64,
    /// utime + stime + cutime + cstime in clock ticks: its CPU time and
    /// that of the children it has reaped.
    pub cpu_ticks: u64,
}

impl Stat {
    /// Neither a zombie nor dead.
    pub fn running(&self) -> bool {
        !matches!(self.state, 'Z' | 'X')
    }
}

/// /proc/PID/stat, `None` when there is no such process.
pub fn stat(pid: i32) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

fn parse_stat(text: &str) -> Option<Stat> {
    // The command name (field 2) may hold spaces and parentheses: the
    // fields start after its last ')'. `f[0]` is field 3 (state).
    let (_, rest) = text.rsplit_once(')')?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let cpu_ticks = f
        .get(11..15)?
        .iter()
        .map(|v| v.parse::<u64>().unwrap_or(0))
        .sum();
    Some(Stat {
        state: f.first()?.chars().next()?,
        ppid: f.get(1)?.parse().ok()?,
        start_time: f.get(19)?.parse().ok()?,
        cpu_ticks,
    })
}

/// A process's arguments (/proc/PID/cmdline), `None` when there is no
/// such process; empty for a kernel thread or a zombie.
pub fn cmdline(pid: i32) -> Option<Vec<Vec<u8>>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let raw = raw.strip_suffix(b"\0").unwrap_or(&raw);
    if raw.is_empty() {
        return Some(Vec::new());
    }
    Some(raw.split(|b| *b == 0).map(<[u8]>::to_vec).collect())
}

/// A process's command name (/proc/PID/comm: the program's file name, cut
/// at 15 bytes), `None` when there is no such process.
pub fn comm(pid: i32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    Some(text.trim_end_matches('\n').to_string())
}

/// A process's working directory (/proc/PID/cwd), `None` when there is no
/// such process or it cannot be read.
pub fn cwd(pid: i32) -> Option<std::path::PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/cwd")).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    /// A child of this test, killed and reaped however the test ends.
    struct Child(std::process::Child);
    impl Drop for Child {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    #[test]
    fn a_child_is_the_same_process_until_it_ends_and_a_different_start_time_is_not_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = Child(
            Command::new("sleep")
                .arg("300")
                .current_dir(dir.path())
                .stdin(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let pid = child.0.id() as i32;
        assert_eq!(cwd(pid).as_deref(), Some(dir.path()));
        let me = ProcRef::of(pid).expect("the child runs");
        assert!(me.alive());
        let s = stat(pid).unwrap();
        assert_eq!(s.ppid, std::process::id() as i32);
        assert!(s.running());
        // Just after spawn the child may not have exec'd sleep yet.
        let want = vec![b"sleep".to_vec(), b"300".to_vec()];
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while cmdline(pid).as_ref() != Some(&want) {
            assert!(std::time::Instant::now() < deadline, "{:?}", cmdline(pid));
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(comm(pid).as_deref(), Some("sleep"));
        // The start time is the fork's: the same before and after exec.
        assert!(me.alive());
        // Same PID, another start time: what a reused PID looks like.
        let other = ProcRef {
            start_time: me.start_time + 1,
            ..me
        };
        assert!(!other.alive());
        child.0.kill().unwrap();
        // Killed, not reaped: a zombie is not alive.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let status = loop {
            match stat(pid) {
                Some(s) if s.state == 'Z' => break s,
                _ if std::time::Instant::now() > deadline => panic!("{pid} never became a zombie"),
                _ => std::thread::sleep(std::time::Duration::from_millis(10)),
            }
        };
        assert!(!status.running());
        assert!(!me.alive());
        assert_eq!(ProcRef::of(pid), None);
        child.0.wait().unwrap();
        assert!(!me.alive());
        assert_eq!(stat(pid), None);
        assert_eq!(comm(pid), None);
        assert_eq!(cwd(pid), None);
    }

    #[test]
    fn stat_reads_past_a_command_name_with_spaces_and_parentheses() {
        let text = "42 (a (b) c) S 7 42 42 0 -1 4194560 100 0 0 0 3 4 5 6 20 0 1 0 98765 1000 10";
        let s = parse_stat(text).unwrap();
        assert_eq!(
            s,
            Stat {
                state: 'S',
                ppid: 7,
                start_time: 98765,
                cpu_ticks: 18
            }
        );
        assert_eq!(parse_stat("42 (x"), None);
    }

    #[test]
    fn a_record_keeps_its_field_names() {
        let r = ProcRef {
            pid: 5,
            start_time: 9,
        };
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(text, r#"{"pid":5,"startTime":9}"#);
        assert_eq!(serde_json::from_str::<ProcRef>(&text).unwrap(), r);
    }
}
