//! The device allow-list under cgroup v2, which has no `devices.allow`: a
//! BPF program of type `BPF_PROG_TYPE_CGROUP_DEVICE` attached to the
//! machine's cgroup, as runc does (libcontainer's `devicefilter`). The
//! kernel runs it on every open and mknod of a device node by a process in
//! that cgroup or below; it returns 1 (allow) or 0 (`EPERM`).
//!
//! The program is assembled here by hand from the same rules as the v1
//! list (`"c 1:3 rwm"`, `"b *:* m"`): eight instruction forms, loaded and
//! attached with the bpf(2) system call, no BPF library. It is attached
//! with `BPF_F_ALLOW_MULTI`: runc inside the machine may attach programs of
//! its own for its containers below, and the kernel allows an access only
//! when every program from the leaf up allows it, so nothing inside can
//! widen the machine's list. Hybrid hosts (v1 controllers and a v2
//! hierarchy at `/sys/fs/cgroup/unified`) run it too, alongside the v1
//! device cgroup: the kernel checks both.

use crate::error::{IoContext, LocalError, Result};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

/// What a rule allows: its device type (`None`: all), major and minor
/// (`None`: any), and access bits ([`MKNOD`], [`READ`], [`WRITE`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    pub kind: Option<u32>,
    pub major: Option<u32>,
    pub minor: Option<u32>,
    pub access: u32,
}

/// `bpf_cgroup_dev_ctx.access_type`: the type in the low 16 bits…
pub const BLOCK: u32 = 1;
pub const CHAR: u32 = 2;
/// … the access in the high 16 bits.
pub const MKNOD: u32 = 1;
pub const READ: u32 = 2;
pub const WRITE: u32 = 4;

impl Rule {
    /// A v1 `devices.allow` line: `TYPE MAJOR:MINOR ACCESS` (`*` for any
    /// number), or `a` (everything).
    pub fn parse(line: &str) -> Option<Rule> {
        let mut f = line.split_whitespace();
        let kind = match f.next()? {
            "a" => {
                return Some(Rule {
                    kind: None,
                    major: None,
                    minor: None,
                    access: MKNOD | READ | WRITE,
                })
            }
            "b" => BLOCK,
            "c" => CHAR,
            _ => return None,
        };
        let (major, minor) = f.next()?.split_once(':')?;
        let num = |s: &str| -> Option<Option<u32>> {
            if s == "*" {
                Some(None)
            } else {
                s.parse().ok().map(Some)
            }
        };
        let mut access = 0;
        for c in f.next()?.chars() {
            access |= match c {
                'm' => MKNOD,
                'r' => READ,
                'w' => WRITE,
                _ => return None,
            };
        }
        if f.next().is_some() || access == 0 {
            return None;
        }
        Some(Rule {
            kind: Some(kind),
            major: num(major)?,
            minor: num(minor)?,
            access,
        })
    }
}

/// One eBPF instruction (`struct bpf_insn`): opcode, destination register
/// in the low nibble and source in the high one, offset, immediate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct Insn {
    pub code: u8,
    pub regs: u8,
    pub off: i16,
    pub imm: i32,
}

// Opcodes: class | operation | source.
const LDX_MEM_W: u8 = 0x61; // dst = *(u32 *)(src + off)
const ALU32_AND_K: u8 = 0x54; // dst &= imm (32-bit)
const ALU32_RSH_K: u8 = 0x74; // dst >>= imm (32-bit)
const ALU32_MOV_K: u8 = 0xb4; // dst = imm (32-bit)
const ALU32_MOV_X: u8 = 0xbc; // dst = src (32-bit)
const JNE_K: u8 = 0x55; // if dst != imm: pc += off
const JNE_X: u8 = 0x5d; // if dst != src: pc += off
const EXIT: u8 = 0x95; // return r0

fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: (src << 4) | dst,
        off,
        imm,
    }
}

/// The program for `rules`: everything not allowed by one of them is
/// refused. Registers after the prologue: r2 the device type, r3 the
/// access asked, r4 the major, r5 the minor (r1, the context, is read only
/// there). Each rule is a block that jumps past itself on the first
/// mismatch and returns 1 otherwise; the last block returns 0.
pub fn program(rules: &[Rule]) -> Vec<Insn> {
    let mut p = vec![
        insn(LDX_MEM_W, 2, 1, 0, 0),
        insn(ALU32_AND_K, 2, 0, 0, 0xffff),
        insn(LDX_MEM_W, 3, 1, 0, 0),
        insn(ALU32_RSH_K, 3, 0, 0, 16),
        insn(LDX_MEM_W, 4, 1, 4, 0),
        insn(LDX_MEM_W, 5, 1, 8, 0),
    ];
    for r in rules {
        // (opcode, dst, src, imm) of each check, jumps resolved below.
        let mut checks: Vec<Insn> = Vec::new();
        if let Some(kind) = r.kind {
            checks.push(insn(JNE_K, 2, 0, 0, kind as i32));
        }
        if r.access != MKNOD | READ | WRITE {
            // The access asked must lie within the rule's.
            checks.push(insn(ALU32_MOV_X, 1, 3, 0, 0));
            checks.push(insn(ALU32_AND_K, 1, 0, 0, r.access as i32));
            checks.push(insn(JNE_X, 1, 3, 0, 0));
        }
        if let Some(major) = r.major {
            checks.push(insn(JNE_K, 4, 0, 0, major as i32));
        }
        if let Some(minor) = r.minor {
            checks.push(insn(JNE_K, 5, 0, 0, minor as i32));
        }
        checks.push(insn(ALU32_MOV_K, 0, 0, 0, 1));
        checks.push(insn(EXIT, 0, 0, 0, 0));
        let n = checks.len();
        for (i, c) in checks.iter_mut().enumerate() {
            if c.code == JNE_K || c.code == JNE_X {
                // To the first instruction after this block.
                c.off = (n - i - 1) as i16;
            }
        }
        p.extend(checks);
    }
    p.push(insn(ALU32_MOV_K, 0, 0, 0, 0));
    p.push(insn(EXIT, 0, 0, 0, 0));
    p
}

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_ATTACH: libc::c_long = 8;
const BPF_PROG_DETACH: libc::c_long = 9;
const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_PROG_QUERY: libc::c_long = 16;
const BPF_PROG_TYPE_CGROUP_DEVICE: u32 = 15;
const BPF_CGROUP_DEVICE: u32 = 6;
const BPF_F_ALLOW_MULTI: u32 = 2;
/// Programs a cgroup may hold that we look at (the kernel's limit is 64).
const MAX_PROGS: usize = 64;
/// The verifier's log, asked for only when a load fails.
const LOG_BYTES: usize = 64 << 10;

#[repr(C)]
#[derive(Default)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

#[repr(C)]
#[derive(Default)]
struct ProgAttach {
    target_fd: u32,
    attach_bpf_fd: u32,
    attach_type: u32,
    attach_flags: u32,
    replace_bpf_fd: u32,
}

#[repr(C)]
#[derive(Default)]
struct ProgQuery {
    target_fd: u32,
    attach_type: u32,
    query_flags: u32,
    attach_flags: u32,
    prog_ids: u64,
    prog_cnt: u32,
    _pad: u32,
}

#[repr(C)]
#[derive(Default)]
struct GetFdById {
    prog_id: u32,
    next_id: u32,
    open_flags: u32,
}

/// bpf(2) with `attr`; its result or the errno.
fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> std::result::Result<i64, nix::errno::Errno> {
    // SAFETY: `attr` is a repr(C) prefix of `union bpf_attr` for `cmd`,
    // valid for the call; the kernel reads (and for a query writes) only
    // `size_of::<T>()` bytes of it and the buffers it points to, which
    // outlive the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T,
            std::mem::size_of::<T>() as libc::c_uint,
        )
    };
    if r < 0 {
        Err(nix::errno::Errno::last())
    } else {
        Ok(r)
    }
}

fn sys(what: String) -> impl FnOnce(nix::errno::Errno) -> LocalError {
    move |source| LocalError::Sys { what, source }
}

/// Loads `insns` as a device program; a refusal carries the verifier's
/// last words.
pub fn load(insns: &[Insn]) -> Result<OwnedFd> {
    let license = c"Apache-2.0";
    let mut attr = ProgLoad {
        prog_type: BPF_PROG_TYPE_CGROUP_DEVICE,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        ..Default::default()
    };
    attr.prog_name[..10].copy_from_slice(b"knit_devcg");
    match bpf(BPF_PROG_LOAD, &mut attr) {
        // SAFETY: a new descriptor the kernel gave us alone.
        Ok(fd) => Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) }),
        Err(errno) => {
            let mut log = vec![0u8; LOG_BYTES];
            attr.log_level = 1;
            attr.log_size = LOG_BYTES as u32;
            attr.log_buf = log.as_mut_ptr() as u64;
            if let Ok(fd) = bpf(BPF_PROG_LOAD, &mut attr) {
                // SAFETY: as above (loaded on the second try).
                return Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) });
            }
            let text = String::from_utf8_lossy(&log);
            let text = text.trim_end_matches('\0').trim();
            let tail: Vec<&str> = text.lines().rev().take(3).collect();
            Err(LocalError::Sys {
                what: format!(
                    "loading the device program ({} instructions; verifier: {})",
                    insns.len(),
                    tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
                ),
                source: errno,
            })
        }
    }
}

fn open_dir(cgroup: &Path) -> Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::File::options()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(cgroup)
        .ctx("cannot open cgroup", cgroup)
}

/// IDs of the device programs attached to `cgroup` itself.
pub fn attached(cgroup: &Path) -> Result<Vec<u32>> {
    let dir = open_dir(cgroup)?;
    query(&dir, cgroup)
}

fn query(dir: &std::fs::File, cgroup: &Path) -> Result<Vec<u32>> {
    let mut ids = [0u32; MAX_PROGS];
    let mut attr = ProgQuery {
        target_fd: dir.as_raw_fd() as u32,
        attach_type: BPF_CGROUP_DEVICE,
        prog_ids: ids.as_mut_ptr() as u64,
        prog_cnt: MAX_PROGS as u32,
        ..Default::default()
    };
    bpf(BPF_PROG_QUERY, &mut attr).map_err(sys(format!(
        "querying the device programs of {}",
        cgroup.display()
    )))?;
    Ok(ids[..(attr.prog_cnt as usize).min(MAX_PROGS)].to_vec())
}

/// Makes `rules` the device list of `cgroup`: the new program is attached
/// first, then the ones it replaces are detached, so no moment has no
/// list (for a moment both hold: an access needs both to allow it).
pub fn apply(cgroup: &Path, rules: &[Rule]) -> Result<()> {
    let dir = open_dir(cgroup)?;
    let old = query(&dir, cgroup)?;
    let prog = load(&program(rules))?;
    let mut attach = ProgAttach {
        target_fd: dir.as_raw_fd() as u32,
        attach_bpf_fd: prog.as_raw_fd() as u32,
        attach_type: BPF_CGROUP_DEVICE,
        attach_flags: BPF_F_ALLOW_MULTI,
        ..Default::default()
    };
    bpf(BPF_PROG_ATTACH, &mut attach).map_err(sys(format!(
        "attaching the device program to {}",
        cgroup.display()
    )))?;
    for id in old {
        let mut by_id = GetFdById {
            prog_id: id,
            ..Default::default()
        };
        let fd = match bpf(BPF_PROG_GET_FD_BY_ID, &mut by_id) {
            // SAFETY: a new descriptor the kernel gave us alone.
            Ok(fd) => unsafe { OwnedFd::from_raw_fd(fd as i32) },
            // Gone meanwhile (its cgroup's last reference went).
            Err(nix::errno::Errno::ENOENT) => continue,
            Err(e) => {
                return Err(sys(format!("opening device program {id}"))(e));
            }
        };
        let mut detach = ProgAttach {
            target_fd: dir.as_raw_fd() as u32,
            attach_bpf_fd: fd.as_raw_fd() as u32,
            attach_type: BPF_CGROUP_DEVICE,
            ..Default::default()
        };
        match bpf(BPF_PROG_DETACH, &mut detach) {
            Ok(_) | Err(nix::errno::Errno::ENOENT) => {}
            Err(e) => {
                return Err(sys(format!(
                    "detaching device program {id} from {}",
                    cgroup.display()
                ))(e))
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_parse_like_v1_lines() {
        assert_eq!(
            Rule::parse("c 1:3 rwm"),
            Some(Rule {
                kind: Some(CHAR),
                major: Some(1),
                minor: Some(3),
                access: MKNOD | READ | WRITE
            })
        );
        assert_eq!(
            Rule::parse("b *:* m"),
            Some(Rule {
                kind: Some(BLOCK),
                major: None,
                minor: None,
                access: MKNOD
            })
        );
        assert_eq!(Rule::parse("c 136:* rw").unwrap().minor, None);
        assert_eq!(Rule::parse("a").unwrap().kind, None);
        for bad in [
            "",
            "x 1:3 rwm",
            "c 1:3",
            "c 1-3 rwm",
            "c 1:3 rwx",
            "c 1:3 rwm extra",
        ] {
            assert_eq!(Rule::parse(bad), None, "{bad:?}");
        }
    }

    /// The program, run by an interpreter of the eight forms it uses: what
    /// the kernel would answer for each access.
    fn run(p: &[Insn], kind: u32, access: u32, major: u32, minor: u32) -> u64 {
        let ctx = [(access << 16) | kind, major, minor];
        let mut r = [0u64; 11];
        let mut pc = 0usize;
        loop {
            let i = p[pc];
            let (dst, src) = ((i.regs & 0xf) as usize, (i.regs >> 4) as usize);
            pc += 1;
            match i.code {
                LDX_MEM_W => {
                    assert_eq!(src, 1, "only the context is loaded from");
                    r[dst] = u64::from(ctx[i.off as usize / 4]);
                }
                ALU32_AND_K => r[dst] = u64::from(r[dst] as u32 & i.imm as u32),
                ALU32_RSH_K => r[dst] = u64::from((r[dst] as u32) >> i.imm),
                ALU32_MOV_K => r[dst] = u64::from(i.imm as u32),
                ALU32_MOV_X => r[dst] = u64::from(r[src] as u32),
                JNE_K => {
                    if r[dst] != i.imm as i64 as u64 {
                        pc += i.off as usize;
                    }
                }
                JNE_X => {
                    if r[dst] != r[src] {
                        pc += i.off as usize;
                    }
                }
                EXIT => return r[0],
                c => panic!("opcode {c:#x} at {}", pc - 1),
            }
        }
    }

    #[test]
    fn the_program_allows_exactly_the_rules() {
        let rules: Vec<Rule> = ["c *:* m", "b *:* m", "c 1:3 rwm", "c 136:* rw", "b 7:4 rwm"]
            .iter()
            .map(|l| Rule::parse(l).unwrap())
            .collect();
        let p = program(&rules);
        // Prologue, five blocks, the final deny.
        assert_eq!(p.len(), 6 + (6 + 6 + 5 + 7 + 5) + 2);
        let rwm = MKNOD | READ | WRITE;
        // mknod of anything; nothing else of an unlisted device.
        assert_eq!(run(&p, BLOCK, MKNOD, 8, 0), 1);
        assert_eq!(run(&p, CHAR, MKNOD, 4, 1), 1);
        assert_eq!(run(&p, BLOCK, READ, 8, 0), 0);
        assert_eq!(run(&p, BLOCK, READ | WRITE, 7, 5), 0);
        assert_eq!(run(&p, CHAR, READ, 4, 1), 0);
        // Listed: the exact number, any minor where `*`, the access asked
        // within the rule's.
        assert_eq!(run(&p, CHAR, READ | WRITE, 1, 3), 1);
        assert_eq!(run(&p, CHAR, READ, 1, 5), 0);
        assert_eq!(run(&p, CHAR, READ | WRITE, 136, 7), 1);
        assert_eq!(run(&p, BLOCK, rwm, 7, 4), 1);
        // Same numbers, other type.
        assert_eq!(run(&p, BLOCK, READ, 1, 3), 0);
        assert_eq!(run(&p, CHAR, READ, 7, 4), 0);
        // No rules: nothing at all.
        assert_eq!(run(&program(&[]), CHAR, MKNOD, 1, 3), 0);
        // `a`: everything.
        assert_eq!(
            run(&program(&[Rule::parse("a").unwrap()]), BLOCK, rwm, 8, 0),
            1
        );
    }

    /// A cgroup of the test's own on the v2 hierarchy (this process's
    /// cgroup there, a unique child), removed on drop.
    struct TestCgroup(std::path::PathBuf);

    impl TestCgroup {
        /// None (and why) where there is no v2 hierarchy or no root.
        fn new(tag: &str) -> std::result::Result<TestCgroup, String> {
            // SAFETY: geteuid has no preconditions.
            if unsafe { libc::geteuid() } != 0 {
                return Err("not root".into());
            }
            let mount = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
                .iter()
                .map(std::path::Path::new)
                .find(|m| m.join("cgroup.controllers").exists())
                .ok_or("no cgroup v2 hierarchy mounted")?;
            let own = std::fs::read_to_string("/proc/self/cgroup")
                .map_err(|e| e.to_string())?
                .lines()
                .find_map(|l| l.strip_prefix("0::").map(str::to_string))
                .ok_or("this process is in no v2 cgroup")?;
            let dir = mount
                .join(own.trim_start_matches('/'))
                .join(format!("knit-devprog-{tag}-{}", std::process::id()));
            std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            Ok(TestCgroup(dir))
        }

        /// `head -c 1 FILE` in this cgroup: whether it opened.
        fn opens(&self, file: &str) -> std::result::Result<bool, String> {
            use std::os::unix::process::CommandExt;
            let procs = std::fs::OpenOptions::new()
                .write(true)
                .open(self.0.join("cgroup.procs"))
                .unwrap();
            let fd = procs.as_raw_fd();
            let mut cmd = std::process::Command::new("head");
            cmd.args(["-c", "1", file]);
            // SAFETY: write(2) only, on a descriptor opened before the fork.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
            let out = cmd.output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr).to_string();
            match out.status.success() {
                true => Ok(true),
                false if err.contains("Operation not permitted") => Ok(false),
                false => Err(err),
            }
        }
    }

    impl Drop for TestCgroup {
        fn drop(&mut self) {
            for _ in 0..250 {
                match std::fs::remove_dir(&self.0) {
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                        std::thread::sleep(std::time::Duration::from_millis(20))
                    }
                    _ => return,
                }
            }
        }
    }

    /// The kernel loads and runs the program: in a v2 cgroup (the hybrid
    /// hierarchy on a v1 host) a process opens what the list allows and
    /// gets EPERM for the rest; a new list replaces the old one (one
    /// program attached) and takes effect at once.
    #[test]
    fn the_kernel_enforces_the_program() {
        let cg = match TestCgroup::new("enforce") {
            Ok(cg) => cg,
            Err(why) => return knit_test_support::missing(why),
        };
        assert!(cg.opens("/dev/zero").unwrap(), "before any program");
        let list = |lines: &[&str]| -> Vec<Rule> {
            lines.iter().map(|l| Rule::parse(l).unwrap()).collect()
        };
        apply(&cg.0, &list(&["c *:* m", "c 1:3 rwm", "c 1:9 r"])).unwrap();
        assert_eq!(attached(&cg.0).unwrap().len(), 1);
        assert!(cg.opens("/dev/null").unwrap());
        assert!(cg.opens("/dev/urandom").unwrap());
        assert!(!cg.opens("/dev/zero").unwrap(), "1:5 is not listed");
        assert!(!cg.opens("/dev/full").unwrap(), "1:7 is not listed");
        apply(&cg.0, &list(&["c 1:5 r"])).unwrap();
        assert_eq!(attached(&cg.0).unwrap().len(), 1, "the old one detached");
        assert!(cg.opens("/dev/zero").unwrap());
        assert!(!cg.opens("/dev/null").unwrap());
    }

    #[test]
    fn jumps_land_inside_the_program() {
        let rules: Vec<Rule> = ["c 1:3 r", "b 7:* w", "a"]
            .iter()
            .map(|l| Rule::parse(l).unwrap())
            .collect();
        let p = program(&rules);
        for (pc, i) in p.iter().enumerate() {
            if i.code == JNE_K || i.code == JNE_X {
                let to = pc + 1 + i.off as usize;
                assert!(to < p.len(), "jump at {pc} to {to}");
                // Every jump lands on a block's first check or the final deny.
                assert!(
                    to == p.len() - 2 || p[to - 1].code == EXIT,
                    "jump at {pc} lands mid-block at {to}"
                );
            }
        }
        assert_eq!(p.last().unwrap().code, EXIT);
    }
}
