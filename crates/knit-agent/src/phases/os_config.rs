//! `os-config-initial` and `os-config`: the pool's kernel parameters and
//! transparent huge pages. Applied once before the kubelet starts (forwarding
//! and bridge settings matter to it, docs/spec.md §1.3.1) and again after every
//! package is installed so that they hold (§1.3.6). The file is written always;
//! values are applied where this node may: under `--root`, or where a
//! parameter is host-wide and read-only in a sandbox, it is left to the next
//! boot and the log says so.

use crate::error::{AgentError, Result};
use crate::host::Host;
use crate::phase::{Ctx, Decision, Phase};
use knit_api::{ErrorCode, PhaseName};
use std::collections::BTreeMap;

pub const SYSCTL_FILE: &str = "/etc/sysctl.d/90-knit.conf";
/// The user's own file wins at boot (99 > 90) and is re-applied after ours.
pub const USER_SYSCTL_FILE: &str = "/etc/sysctl.d/99-user-customized.conf";
const THP_DIR: &str = "/sys/kernel/mm/transparent_hugepage";

/// `initial`: the application before the kubelet starts; otherwise the
/// re-application after packages.
pub struct OsConfigPhase {
    pub initial: bool,
}

fn os_error(e: AgentError) -> AgentError {
    AgentError::new(ErrorCode::FailOsConfig, e.message)
}

/// Writes each kernel parameter to `/proc/sys` unless it already holds the
/// value (recorded in the undo ledger first). Returns how many hold now and
/// the ones the kernel refused (read-only in a sandbox, unknown key), with
/// the reason. Under `--root` nothing is written: the kernel is the host's.
pub fn apply_sysctls(
    host: &Host,
    sysctls: &BTreeMap<String, String>,
) -> Result<(usize, Vec<String>)> {
    let mut applied = 0;
    let mut left: Vec<String> = Vec::new();
    if !host.is_live() {
        left.push("all (not applied under --root: the kernel is the host's)".to_string());
        return Ok((0, left));
    }
    for (key, value) in sysctls {
        let path = proc_path(key);
        let current = std::fs::read_to_string(&path);
        if current
            .as_ref()
            .is_ok_and(|cur| cur.split_whitespace().collect::<Vec<_>>().join(" ") == *value)
        {
            applied += 1;
            continue;
        }
        if let Ok(previous) = &current {
            host.ledger().note_kernel(&path, previous)?;
        }
        match std::fs::write(&path, value) {
            Ok(()) => applied += 1,
            Err(e) => left.push(format!("{key} ({e})")),
        }
    }
    Ok((applied, left))
}

fn render(sysctls: &BTreeMap<String, String>) -> String {
    let mut text = String::from("# Written by knit-agent from the node pool's OS parameters.\n");
    for (k, v) in sysctls {
        text.push_str(&format!("{k} = {v}\n"));
    }
    text
}

/// `key = value` lines of a sysctl.d file.
pub fn parse_sysctl_file(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with(';'))
        .filter_map(|l| {
            l.split_once('=')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        })
        .collect()
}

fn proc_path(key: &str) -> String {
    format!("/proc/sys/{}", key.replace('.', "/"))
}

/// THP values are shown as `always [madvise] never`: the bracketed one is current.
fn thp_current(text: &str) -> Option<&str> {
    text.split_whitespace()
        .find_map(|w| w.strip_prefix('[').and_then(|w| w.strip_suffix(']')))
}

impl Phase for OsConfigPhase {
    fn name(&self) -> PhaseName {
        if self.initial {
            PhaseName::OsConfigInitial
        } else {
            PhaseName::OsConfig
        }
    }

    fn inspect(&self, ctx: &Ctx) -> Result<Decision> {
        // Always applied: before the kubelet, and again after packages may
        // have changed the values.
        let sysctls = ctx.config.os.effective_sysctls();
        let written = ctx
            .host
            .read(SYSCTL_FILE)
            .is_some_and(|t| t == render(&sysctls));
        Ok(Decision::Run(if written {
            format!("re-apply {} kernel parameters", sysctls.len())
        } else {
            format!("write and apply {} kernel parameters", sysctls.len())
        }))
    }

    fn run(&self, ctx: &mut Ctx) -> Result<String> {
        let phase = self.name().as_str();
        let mut sysctls = ctx.config.os.effective_sysctls();
        ctx.host
            .write_file(SYSCTL_FILE, render(&sysctls).as_bytes(), 0o644)
            .map_err(os_error)?;
        if let Some(user) = ctx.host.read(USER_SYSCTL_FILE) {
            sysctls.extend(parse_sysctl_file(&user));
        }
        let (applied, left) = apply_sysctls(ctx.host, &sysctls).map_err(os_error)?;
        let mut summary = format!(
            "{SYSCTL_FILE} written; {applied} of {} applied now",
            sysctls.len()
        );
        if !left.is_empty() {
            let note = format!("not applied now, set at next boot: {}", left.join(", "));
            ctx.host.log.line(phase, &note);
            summary.push_str(&format!("; {} left to boot", left.len()));
        }
        let thp = &ctx.config.os.transparent_huge_page;
        for (file, want) in [("enabled", &thp.enabled), ("defrag", &thp.defrag)] {
            let Some(want) = want else { continue };
            let path = format!("{THP_DIR}/{file}");
            if !ctx.host.is_live() {
                summary.push_str(&format!("; THP {file}={want} not applied under --root"));
                continue;
            }
            let current = std::fs::read_to_string(&path).unwrap_or_default();
            if thp_current(&current) == Some(want.as_str()) {
                continue;
            }
            if let Some(previous) = thp_current(&current) {
                ctx.host
                    .ledger()
                    .note_kernel(&path, previous)
                    .map_err(os_error)?;
            }
            match std::fs::write(&path, want) {
                Ok(()) => summary.push_str(&format!("; THP {file}={want}")),
                Err(e) => {
                    ctx.host
                        .log
                        .line(phase, &format!("THP {file}={want} not applied: {e}"));
                    summary.push_str(&format!("; THP {file} not applied ({e})"));
                }
            }
        }
        Ok(summary)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sysctl file that cannot be written fails the phase with its own code
    /// (it was FailCommand).
    #[test]
    fn unwritable_sysctl_file_is_fail_os_config() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("etc")).unwrap();
        // A file where the directory should be: the write must fail.
        std::fs::write(dir.path().join("etc/sysctl.d"), b"not a directory").unwrap();
        let host = Host::without_log(dir.path());
        let mut config = knit_api::NodeConfig::default();
        config.node.region = Some("cn-test".into());
        config.node.instance_id = Some("i-1".into());
        config.node.ip = Some("10.0.0.7".into());
        let mut ctx = crate::phase::context(&host, &config).unwrap();
        for initial in [true, false] {
            let err = OsConfigPhase { initial }.run(&mut ctx).unwrap_err();
            assert_eq!(err.code, ErrorCode::FailOsConfig, "{err}");
            assert!(err.message.contains("90-knit.conf"), "{err}");
        }
    }

    #[test]
    fn parses_and_reads_thp() {
        let parsed = parse_sysctl_file("# c\nvm.max_map_count = 5\n\nnet.core.somaxconn=7\n");
        assert_eq!(
            parsed.get("vm.max_map_count").map(String::as_str),
            Some("5")
        );
        assert_eq!(
            parsed.get("net.core.somaxconn").map(String::as_str),
            Some("7")
        );
        assert_eq!(thp_current("always [madvise] never"), Some("madvise"));
        assert_eq!(
            proc_path("net.ipv4.ip_forward"),
            "/proc/sys/net/ipv4/ip_forward"
        );
    }
}
