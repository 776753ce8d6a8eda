//! `os-config`: the pool's kernel parameters and transparent huge pages,
//! applied after every package is installed so that they hold (SPEC §1 3.6).
//! The file is written always; values are applied where this node may: under
//! `--root`, or where a parameter is host-wide and read-only in a sandbox, it
//! is left to the next boot and the log says so.

use crate::engine::{Ctx, Decision, Phase};
use crate::error::Result;
use knit_api::PhaseName;
use std::collections::BTreeMap;

pub const SYSCTL_FILE: &str = "/etc/sysctl.d/90-knit.conf";
/// The user's own file wins at boot (99 > 90) and is re-applied after ours.
pub const USER_SYSCTL_FILE: &str = "/etc/sysctl.d/99-user-customized.conf";
const THP_DIR: &str = "/sys/kernel/mm/transparent_hugepage";

pub struct OsConfigPhase;

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
        PhaseName::OsConfig
    }

    fn inspect(&self, ctx: &Ctx) -> Result<Decision> {
        // Always applied again: this phase exists to re-assert the values after
        // packages may have changed them.
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
        let mut sysctls = ctx.config.os.effective_sysctls();
        ctx.host
            .write_file(SYSCTL_FILE, render(&sysctls).as_bytes(), 0o644)?;
        if let Some(user) = ctx.host.read(USER_SYSCTL_FILE) {
            sysctls.extend(parse_sysctl_file(&user));
        }
        let mut applied = 0;
        let mut left: Vec<String> = Vec::new();
        if ctx.host.is_live() {
            for (key, value) in &sysctls {
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
                    crate::undo::note_kernel(ctx.host, &path, previous)?;
                }
                match std::fs::write(&path, value) {
                    Ok(()) => applied += 1,
                    Err(e) => left.push(format!("{key} ({e})")),
                }
            }
        } else {
            left.push("all (not applied under --root: the kernel is the host's)".to_string());
        }
        let mut summary = format!(
            "{SYSCTL_FILE} written; {applied} of {} applied now",
            sysctls.len()
        );
        if !left.is_empty() {
            let note = format!("not applied now, set at next boot: {}", left.join(", "));
            ctx.host.log.line("os-config", &note);
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
                crate::undo::note_kernel(ctx.host, &path, previous)?;
            }
            match std::fs::write(&path, want) {
                Ok(()) => summary.push_str(&format!("; THP {file}={want}")),
                Err(e) => {
                    ctx.host
                        .log
                        .line("os-config", &format!("THP {file}={want} not applied: {e}"));
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
