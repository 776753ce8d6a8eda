//! `hardening`: the pool's hardening profile (docs/spec.md §1.3.7). Every rule is
//! concrete, checked before it is applied, and listed in docs/agent.md. The
//! profile is fixed at the node's first run: a different one later is refused.

use crate::error::{AgentError, Result};
use crate::host::Host;
use crate::phase::{Ctx, Decision, Phase};
use knit_api::{ErrorCode, HardeningProfile, PhaseName};
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

const SYSCTL_FILE: &str = "/etc/sysctl.d/91-knit-hardening.conf";
const SSHD_FILE: &str = "/etc/ssh/sshd_config.d/90-knit-hardening.conf";
/// Where sshd keeps its pid (Debian, RHEL).
const SSHD_PID_FILES: &[&str] = &["/run/sshd.pid", "/var/run/sshd.pid"];

pub struct HardeningPhase;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rule {
    /// A whole file owned by knit, with exactly this content.
    File {
        path: &'static str,
        content: String,
        mode: u32,
    },
    /// `KEY value` lines in a config file we do not own (e.g. login.defs).
    KeyValue {
        path: &'static str,
        key: &'static str,
        value: &'static str,
    },
    /// Permission bits of an existing system file (never more permissive).
    Mode { path: &'static str, mode: u32 },
}

const OS_SYSCTLS: &[(&str, &str)] = &[
    ("kernel.kptr_restrict", "2"),
    ("kernel.dmesg_restrict", "1"),
    ("kernel.randomize_va_space", "2"),
    ("fs.protected_hardlinks", "1"),
    ("fs.protected_symlinks", "1"),
    ("fs.suid_dumpable", "0"),
    ("net.ipv4.conf.all.accept_redirects", "0"),
    ("net.ipv4.conf.default.accept_redirects", "0"),
    ("net.ipv4.conf.all.send_redirects", "0"),
    ("net.ipv4.conf.all.accept_source_route", "0"),
    ("net.ipv4.conf.all.log_martians", "1"),
];

const OS_SSHD: &[&str] = &[
    "PermitEmptyPasswords no",
    "X11Forwarding no",
    "MaxAuthTries 4",
    "IgnoreRhosts yes",
    "HostbasedAuthentication no",
];

const MLPS_SSHD: &[&str] = &[
    "PermitRootLogin no",
    "LoginGraceTime 60",
    "ClientAliveInterval 600",
    "ClientAliveCountMax 3",
];

/// The rules of a profile, in the order they are applied.
pub fn rules(profile: HardeningProfile) -> Vec<Rule> {
    if profile == HardeningProfile::None {
        return Vec::new();
    }
    let mlps = profile == HardeningProfile::MlpsL3;
    let mut sshd: Vec<&str> = OS_SSHD.to_vec();
    if mlps {
        sshd.extend(MLPS_SSHD);
    }
    let mut rules = vec![
        Rule::File {
            path: SYSCTL_FILE,
            content: OS_SYSCTLS
                .iter()
                .map(|(k, v)| format!("{k} = {v}\n"))
                .collect(),
            mode: 0o644,
        },
        Rule::File {
            path: SSHD_FILE,
            content: sshd.iter().map(|l| format!("{l}\n")).collect(),
            mode: 0o600,
        },
        Rule::Mode {
            path: "/etc/passwd",
            mode: 0o644,
        },
        Rule::Mode {
            path: "/etc/group",
            mode: 0o644,
        },
        Rule::Mode {
            path: "/etc/shadow",
            mode: 0o640,
        },
        Rule::Mode {
            path: "/etc/gshadow",
            mode: 0o640,
        },
        Rule::Mode {
            path: "/etc/ssh/sshd_config",
            mode: 0o600,
        },
        Rule::Mode {
            path: "/etc/crontab",
            mode: 0o600,
        },
    ];
    if mlps {
        rules.extend([
            Rule::KeyValue {
                path: "/etc/login.defs",
                key: "PASS_MAX_DAYS",
                value: "90",
            },
            Rule::KeyValue {
                path: "/etc/login.defs",
                key: "PASS_MIN_DAYS",
                value: "7",
            },
            Rule::KeyValue {
                path: "/etc/login.defs",
                key: "PASS_WARN_AGE",
                value: "7",
            },
            Rule::File {
                path: "/etc/profile.d/knit-hardening.sh",
                content: "umask 027\nTMOUT=600\nreadonly TMOUT\nexport TMOUT\n".to_string(),
                mode: 0o644,
            },
        ]);
    }
    rules
}

fn holds(host: &Host, rule: &Rule) -> bool {
    match rule {
        Rule::File { path, content, .. } => host.read(path).is_some_and(|t| &t == content),
        Rule::KeyValue { path, key, value } => match host.read(path) {
            Some(text) => text.lines().any(|l| {
                let mut words = l.split_whitespace();
                words.next() == Some(key) && words.next() == Some(value)
            }),
            None => true, // no such file on this OS: nothing to harden
        },
        Rule::Mode { path, mode } => match std::fs::metadata(host.path(path)) {
            Ok(meta) => meta.permissions().mode() & 0o7777 & !mode == 0,
            Err(_) => true,
        },
    }
}

fn apply(host: &Host, rule: &Rule) -> Result<()> {
    match rule {
        Rule::File {
            path,
            content,
            mode,
        } => host.write_file(path, content.as_bytes(), *mode),
        Rule::KeyValue { path, key, value } => {
            let text = host.read(path).unwrap_or_default();
            let mut found = false;
            let mut lines: Vec<String> = text
                .lines()
                .map(|l| {
                    if l.split_whitespace().next() == Some(key) {
                        found = true;
                        format!("{key}\t{value}")
                    } else {
                        l.to_string()
                    }
                })
                .collect();
            if !found {
                lines.push(format!("{key}\t{value}"));
            }
            let mode = std::fs::metadata(host.path(path))
                .map(|m| m.permissions().mode() & 0o7777)
                .unwrap_or(0o644);
            host.write_file(path, (lines.join("\n") + "\n").as_bytes(), mode)
        }
        Rule::Mode { path, mode } => {
            let full = host.path(path);
            let current = std::fs::metadata(&full)
                .map(|m| m.permissions().mode() & 0o7777)
                .unwrap_or(*mode);
            std::fs::set_permissions(&full, std::fs::Permissions::from_mode(current & mode))
                .map_err(|e| {
                    AgentError::new(ErrorCode::FailHardening, format!("chmod {path}: {e}"))
                })
        }
    }
}

fn describe(rule: &Rule) -> String {
    match rule {
        Rule::File { path, .. } => path.to_string(),
        Rule::KeyValue { path, key, value } => format!("{path} {key} {value}"),
        Rule::Mode { path, mode } => format!("{path} mode {mode:o}"),
    }
}

fn profile_name(profile: HardeningProfile) -> &'static str {
    match profile {
        HardeningProfile::None => "none",
        HardeningProfile::Os => "os",
        HardeningProfile::MlpsL3 => "mlps-l3",
    }
}

fn os_sysctls() -> BTreeMap<String, String> {
    OS_SYSCTLS
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Kernel settings of the profile that differ from the running kernel and
/// that this node may write (in a sandbox only the network namespace's are).
fn pending_kernel_settings(host: &Host) -> Vec<String> {
    if !host.is_live() {
        return Vec::new();
    }
    OS_SYSCTLS
        .iter()
        .filter(|(key, value)| {
            let path = format!("/proc/sys/{}", key.replace('.', "/"));
            let current = std::fs::read_to_string(&path).unwrap_or_default();
            current.trim() != *value
                && nix::unistd::access(path.as_str(), nix::unistd::AccessFlags::W_OK).is_ok()
        })
        .map(|(key, _)| key.to_string())
        .collect()
}

/// A running sshd's pid (guarded against a stale pid file).
fn sshd_pid(host: &Host) -> Option<i32> {
    SSHD_PID_FILES.iter().find_map(|file| {
        let pid: i32 = host.read(file)?.trim().parse().ok()?;
        (knit_os::proc::comm(pid)? == "sshd").then_some(pid)
    })
}

/// Makes a running sshd read its configuration again, after checking it
/// (`sshd -t`: a broken configuration is never loaded). Returns what was done.
fn reload_sshd(host: &Host) -> Result<String> {
    if !host.is_live() {
        return Ok("sshd not reloaded under --root".to_string());
    }
    let Some(pid) = sshd_pid(host) else {
        return Ok("sshd is not running: the settings apply when it starts".to_string());
    };
    let sshd = host
        .find_program("sshd")
        .unwrap_or_else(|| "/usr/sbin/sshd".to_string());
    host.run(
        ErrorCode::FailHardening,
        &sshd,
        &["-t"],
        Duration::from_secs(30),
    )
    .map_err(|e| {
        AgentError::new(
            ErrorCode::FailHardening,
            format!(
                "sshd rejects its configuration with {SSHD_FILE}, not reloaded: {}",
                e.message
            ),
        )
    })?;
    // What `systemctl reload ssh` does (ExecReload=kill -HUP $MAINPID).
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGHUP,
    )
    .map_err(|e| {
        AgentError::new(
            ErrorCode::FailHardening,
            format!("cannot reload sshd (pid {pid}): {e}"),
        )
    })?;
    Ok(format!("sshd (pid {pid}) reloaded"))
}

impl Phase for HardeningPhase {
    fn name(&self) -> PhaseName {
        PhaseName::Hardening
    }

    fn inspect(&self, ctx: &Ctx) -> Result<Decision> {
        let profile = ctx.config.hardening.profile;
        let name = profile_name(profile);
        if let Some(applied) = &ctx.journal.hardening_profile {
            if applied != name {
                return Ok(Decision::Run(format!(
                    "profile changed from {applied} to {name}: refused"
                )));
            }
        }
        if profile == HardeningProfile::None {
            return Ok(Decision::Skip("hardening.profile is none".to_string()));
        }
        let mut pending: Vec<String> = rules(profile)
            .iter()
            .filter(|r| !holds(ctx.host, r))
            .map(describe)
            .collect();
        pending.extend(pending_kernel_settings(ctx.host));
        if pending.is_empty() {
            Ok(Decision::Done(format!("profile {name}: every rule holds")))
        } else {
            Ok(Decision::Run(format!(
                "profile {name}: {} rule(s) to apply",
                pending.len()
            )))
        }
    }

    fn run(&self, ctx: &mut Ctx) -> Result<String> {
        let profile = ctx.config.hardening.profile;
        let name = profile_name(profile);
        if let Some(applied) = &ctx.journal.hardening_profile {
            if applied != name {
                return Err(AgentError::new(
                    ErrorCode::FailHardening,
                    format!("hardening profile is {applied} since this node's first run and cannot change to {name}"),
                ));
            }
        }
        let mut changed = Vec::new();
        for rule in rules(profile) {
            if !holds(ctx.host, &rule) {
                apply(ctx.host, &rule)?;
                ctx.host.log.line(
                    PhaseName::Hardening.as_str(),
                    &format!("applied {}", describe(&rule)),
                );
                changed.push(describe(&rule));
            }
        }
        // The files take effect at boot; apply them now too.
        let (applied, left) = crate::phases::os_config::apply_sysctls(ctx.host, &os_sysctls())
            .map_err(|e| AgentError::new(ErrorCode::FailHardening, e.message))?;
        if !left.is_empty() {
            ctx.host.log.line(
                PhaseName::Hardening.as_str(),
                &format!(
                    "kernel settings not applied now, set at next boot: {}",
                    left.join(", ")
                ),
            );
        }
        let sshd = if changed.iter().any(|c| c == SSHD_FILE) {
            reload_sshd(ctx.host)?
        } else {
            "sshd settings unchanged".to_string()
        };
        ctx.host.log.line(PhaseName::Hardening.as_str(), &sshd);
        ctx.journal.hardening_profile = Some(name.to_string());
        ctx.save_journal()?;
        Ok(format!(
            "profile {name}: {} rule(s) applied; {applied} of {} kernel settings in effect now; {sshd}",
            changed.len(),
            OS_SYSCTLS.len()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mlps_is_a_superset_of_os() {
        let os = rules(HardeningProfile::Os);
        let mlps = rules(HardeningProfile::MlpsL3);
        assert!(rules(HardeningProfile::None).is_empty());
        assert!(mlps.len() > os.len());
        let sshd = |rules: &[Rule]| {
            rules.iter().find_map(|r| match r {
                Rule::File { path, content, .. } if path.contains("sshd") => Some(content.clone()),
                _ => None,
            })
        };
        assert!(sshd(&mlps).is_some_and(|c| c.contains("PermitRootLogin no")));
        assert!(sshd(&os).is_some_and(|c| !c.contains("PermitRootLogin")));
    }
}
