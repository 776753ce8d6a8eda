//! `base-packages`: the tools storage and network features need (SPEC §1
//! 3.5) and minimal security fixes, honouring `/var/.skip-yum` and
//! `/var/.skip-security-fix`.

use crate::engine::{Ctx, Decision, Phase};
use crate::error::{AgentError, Result};
use crate::markers;
use knit_api::{ErrorCode, PhaseName};
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PackageManager {
    Apt,
    Dnf,
    Yum,
}

impl PackageManager {
    /// The standard tools under this distribution family's names.
    pub fn base_packages(self) -> &'static [&'static str] {
        match self {
            PackageManager::Apt => &["pigz", "zlib1g"],
            PackageManager::Dnf | PackageManager::Yum => &["pigz", "container-selinux", "zlib"],
        }
    }
}

/// Reads `ID` and `ID_LIKE` (and `VERSION_ID` for yum vs dnf) from os-release text.
pub fn detect_package_manager(os_release: &str) -> Option<PackageManager> {
    let field = |key: &str| {
        os_release.lines().find_map(|l| {
            l.strip_prefix(key)
                .and_then(|v| v.strip_prefix('='))
                .map(|v| v.trim().trim_matches('"').to_lowercase())
        })
    };
    let id = field("ID").unwrap_or_default();
    let like = field("ID_LIKE").unwrap_or_default();
    let version_major: u32 = field("VERSION_ID")
        .and_then(|v| v.split('.').next().and_then(|m| m.parse().ok()))
        .unwrap_or(0);
    let family: Vec<&str> = std::iter::once(id.as_str())
        .chain(like.split_whitespace())
        .collect();
    if family.iter().any(|f| matches!(*f, "debian" | "ubuntu")) {
        return Some(PackageManager::Apt);
    }
    if family.iter().any(|f| {
        matches!(
            *f,
            "rhel" | "centos" | "fedora" | "alinux" | "anolis" | "rocky" | "almalinux"
        )
    }) {
        // CentOS/RHEL 7 and Alibaba Cloud Linux 2 ship yum only.
        let old = (id == "centos" || id == "rhel") && version_major > 0 && version_major < 8
            || id == "alinux" && version_major == 2;
        return Some(if old {
            PackageManager::Yum
        } else {
            PackageManager::Dnf
        });
    }
    None
}

pub struct BasePackagesPhase;

fn missing_packages(ctx: &Ctx, manager: PackageManager, wanted: &[String]) -> Vec<String> {
    wanted
        .iter()
        .filter(|p| {
            let probe = match manager {
                PackageManager::Apt => ctx.host.run(
                    ErrorCode::FailBasePackages,
                    "dpkg-query",
                    &["-W", "-f=${Status}", p],
                    Duration::from_secs(30),
                ),
                PackageManager::Dnf | PackageManager::Yum => ctx.host.run(
                    ErrorCode::FailBasePackages,
                    "rpm",
                    &["-q", p],
                    Duration::from_secs(30),
                ),
            };
            !probe.is_ok_and(|out| {
                manager != PackageManager::Apt || out.stdout.contains("install ok installed")
            })
        })
        .cloned()
        .collect()
}

fn wanted(ctx: &Ctx, manager: PackageManager) -> Vec<String> {
    manager
        .base_packages()
        .iter()
        .map(|s| s.to_string())
        .chain(ctx.config.base_packages.extra.iter().cloned())
        .collect()
}

impl Phase for BasePackagesPhase {
    fn name(&self) -> PhaseName {
        PhaseName::BasePackages
    }

    fn inspect(&self, ctx: &Ctx) -> Result<Decision> {
        if !ctx.config.base_packages.enabled {
            return Ok(Decision::Skip("basePackages.enabled is false".to_string()));
        }
        if markers::present(ctx.host, markers::SKIP_YUM) {
            return Ok(Decision::Skip(format!(
                "marker {} present: no packages, no security fixes",
                markers::SKIP_YUM
            )));
        }
        let Some(manager) =
            detect_package_manager(&ctx.host.read("/etc/os-release").unwrap_or_default())
        else {
            return Ok(Decision::Skip(
                "no supported package manager (apt, dnf, yum) for this OS".to_string(),
            ));
        };
        if !ctx.host.is_live() {
            return Ok(Decision::Skip(format!(
                "{manager:?} would change the host: packages are installed only without --root"
            )));
        }
        let missing = missing_packages(ctx, manager, &wanted(ctx, manager));
        let fixes = security_fixes_wanted(ctx);
        if missing.is_empty() && !fixes {
            return Ok(Decision::Done(
                "base packages installed; security fixes not requested".to_string(),
            ));
        }
        Ok(Decision::Run(format!(
            "install [{}]{}",
            missing.join(", "),
            if fixes {
                " and apply security fixes"
            } else {
                ""
            }
        )))
    }

    fn run(&self, ctx: &mut Ctx) -> Result<String> {
        let os_release = ctx.host.read("/etc/os-release").unwrap_or_default();
        let manager = detect_package_manager(&os_release).ok_or_else(|| {
            AgentError::new(ErrorCode::FailBasePackages, "no supported package manager")
        })?;
        let missing = missing_packages(ctx, manager, &wanted(ctx, manager));
        let long = Duration::from_secs(1800);
        let code = ErrorCode::FailBasePackages;
        if !missing.is_empty() {
            let names: Vec<&str> = missing.iter().map(String::as_str).collect();
            match manager {
                PackageManager::Apt => {
                    ctx.host.run(code, "apt-get", &["update", "-q"], long)?;
                    let mut args = vec!["install", "-y", "-q", "--no-install-recommends"];
                    args.extend(&names);
                    ctx.host.run(code, "apt-get", &args, long)?;
                }
                PackageManager::Dnf | PackageManager::Yum => {
                    let tool = if manager == PackageManager::Dnf {
                        "dnf"
                    } else {
                        "yum"
                    };
                    let mut args = vec!["install", "-y"];
                    args.extend(&names);
                    ctx.host.run(code, tool, &args, long)?;
                }
            }
        }
        let mut summary = format!("installed [{}]", missing.join(", "));
        if security_fixes_wanted(ctx) {
            match manager {
                PackageManager::Apt => {
                    // Upgrade only from the security suite: a sources list holding
                    // just the "-security" lines of the node's own lists.
                    let sources = security_sources(ctx);
                    if sources.is_empty() {
                        summary.push_str("; no security suite configured, no fixes applied");
                    } else {
                        ctx.host.write_file(
                            "/etc/knit/security.sources.list",
                            sources.as_bytes(),
                            0o644,
                        )?;
                        let list = "Dir::Etc::SourceList=/etc/knit/security.sources.list";
                        let parts = "Dir::Etc::SourceParts=/nonexistent";
                        ctx.host.run(
                            code,
                            "apt-get",
                            &["-o", list, "-o", parts, "update", "-q"],
                            long,
                        )?;
                        ctx.host.run(
                            code,
                            "apt-get",
                            &["-o", list, "-o", parts, "upgrade", "-y", "-q"],
                            long,
                        )?;
                        summary.push_str("; security fixes applied");
                    }
                }
                PackageManager::Dnf | PackageManager::Yum => {
                    let tool = if manager == PackageManager::Dnf {
                        "dnf"
                    } else {
                        "yum"
                    };
                    ctx.host.run(
                        code,
                        tool,
                        &["update-minimal", "--security", "--exclude", "kernel*", "-y"],
                        long,
                    )?;
                    summary.push_str("; security fixes applied");
                }
            }
        } else if markers::present(ctx.host, markers::SKIP_SECURITY_FIX) {
            summary.push_str(&format!(
                "; security fixes skipped (marker {})",
                markers::SKIP_SECURITY_FIX
            ));
        }
        Ok(summary)
    }
}

fn security_fixes_wanted(ctx: &Ctx) -> bool {
    ctx.config.base_packages.security_updates
        && !markers::present(ctx.host, markers::SKIP_SECURITY_FIX)
}

/// The `deb` lines of the node's sources that point at a security suite.
fn security_sources(ctx: &Ctx) -> String {
    let mut text = ctx.host.read("/etc/apt/sources.list").unwrap_or_default();
    if let Ok(dir) = std::fs::read_dir(ctx.host.path("/etc/apt/sources.list.d")) {
        for entry in dir.flatten() {
            if entry.path().extension().is_some_and(|e| e == "list") {
                text.push_str(&std::fs::read_to_string(entry.path()).unwrap_or_default());
            }
        }
    }
    text.lines()
        .filter(|l| l.trim_start().starts_with("deb ") && l.contains("-security"))
        .map(|l| format!("{l}\n"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_families() {
        let cases = [
            ("ID=debian\nVERSION_ID=\"12\"\n", Some(PackageManager::Apt)),
            (
                "ID=ubuntu\nID_LIKE=debian\nVERSION_ID=\"22.04\"\n",
                Some(PackageManager::Apt),
            ),
            (
                "ID=\"centos\"\nID_LIKE=\"rhel fedora\"\nVERSION_ID=\"7\"\n",
                Some(PackageManager::Yum),
            ),
            (
                "ID=\"rocky\"\nID_LIKE=\"rhel centos fedora\"\nVERSION_ID=\"9.3\"\n",
                Some(PackageManager::Dnf),
            ),
            (
                "ID=\"alinux\"\nID_LIKE=\"rhel fedora centos anolis\"\nVERSION_ID=\"3\"\n",
                Some(PackageManager::Dnf),
            ),
            (
                "ID=\"alinux\"\nVERSION_ID=\"2.1903\"\n",
                Some(PackageManager::Yum),
            ),
            ("ID=fedora\nVERSION_ID=40\n", Some(PackageManager::Dnf)),
            ("ID=alpine\nVERSION_ID=3.19\n", None),
            ("", None),
        ];
        for (text, want) in cases {
            assert_eq!(detect_package_manager(text), want, "{text}");
        }
        assert!(PackageManager::Dnf
            .base_packages()
            .contains(&"container-selinux"));
        assert!(!PackageManager::Apt
            .base_packages()
            .contains(&"container-selinux"));
    }
}
