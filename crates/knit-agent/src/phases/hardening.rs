//! `hardening`: the pool's hardening profile (SPEC §1 3.7). Every rule is
//! concrete, checked before it is applied, and listed in docs/agent.md. The
//! profile is fixed at the node's first run: a different one later is refused.

use crate::engine::{Ctx, Decision, Phase};
use crate::error::{AgentError, Result};
use crate::host::Host;
use knit_api::{ErrorCode, HardeningProfile, PhaseName};
use std::os::unix::fs::PermissionsExt;

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
            path: "/etc/sysctl.d/91-knit-hardening.conf",
            content: OS_SYSCTLS
                .iter()
                .map(|(k, v)| format!("{k} = {v}\n"))
                .collect(),
            mode: 0o644,
        },
        Rule::File {
            path: "/etc/ssh/sshd_config.d/90-knit-hardening.conf",
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
        let pending: Vec<String> = rules(profile)
            .iter()
            .filter(|r| !holds(ctx.host, r))
            .map(describe)
            .collect();
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
                ctx.host
                    .log
                    .line("hardening", &format!("applied {}", describe(&rule)));
                changed.push(describe(&rule));
            }
        }
        ctx.journal.hardening_profile = Some(name.to_string());
        ctx.save_journal()?;
        Ok(format!("profile {name}: {} rule(s) applied", changed.len()))
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
