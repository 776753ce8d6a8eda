//! `base-packages`: the tools storage and network features need
//! (docs/spec.md §1.3.5) and minimal security fixes, honouring `/var/.skip-yum` and
//! `/var/.skip-security-fix`.
//!
//! With `basePackages.repository` (the control plane's flat Debian
//! repository, `<mirror>/debian/`) answering, the packages and the available
//! updates come from it alone: it is written as
//! `/etc/apt/sources.list.d/knit.sources` and apt is run against it only.
//! Otherwise the node's own sources are used when one answers a TCP
//! connect within [`PROBE_TIMEOUT`].

use crate::error::{AgentError, Result};
use crate::markers;
use crate::phase::{Ctx, Decision, Phase};
use crate::phases::kernel_hold;
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

/// apt options that make an unreachable repository fail in seconds, not minutes.
const APT_NET: &[&str] = &[
    "-o",
    "Acquire::Retries=1",
    "-o",
    "Acquire::http::Timeout=20",
    "-o",
    "Acquire::https::Timeout=20",
];

fn apt(ctx: &Ctx, extra: &[&str], args: &[&str]) -> Result<()> {
    let mut all: Vec<&str> = APT_NET.to_vec();
    all.extend(extra);
    all.extend(args);
    ctx.host.run(
        ErrorCode::FailBasePackages,
        "apt-get",
        &all,
        Duration::from_secs(1800),
    )?;
    Ok(())
}

fn rpm_tool(manager: PackageManager) -> &'static str {
    if manager == PackageManager::Dnf {
        "dnf"
    } else {
        "yum"
    }
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
        let reach = probe(ctx, manager);
        if let Some(repository) = reach.knit {
            return Ok(Decision::Run(format!(
                "install [{}]{} from the knit repository {repository}",
                missing.join(", "),
                if fixes { " and apply its updates" } else { "" }
            )));
        }
        if missing.is_empty() {
            if let Some(tried) = reach.offline {
                return Ok(Decision::Done(format!(
                    "base packages installed; security fixes skipped: no package repository reachable (offline node; tried {} in {} ms)",
                    if tried.is_empty() { "none configured".to_string() } else { tried.join(", ") },
                    reach.probe_ms
                )));
            }
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
        let reach = probe(ctx, manager);
        if let Some(repository) = reach.knit {
            return install_from_knit_repository(ctx, &repository, &missing);
        }
        if let Some(tried) = reach.offline {
            if !missing.is_empty() {
                return Err(AgentError::new(
                    ErrorCode::FailBasePackages,
                    format!(
                        "[{}] must be installed but no package repository is reachable (tried {}); \
                         install them in the image, or create {} in pre-user-data for offline nodes",
                        missing.join(", "),
                        if tried.is_empty() { "none configured".to_string() } else { tried.join(", ") },
                        markers::SKIP_YUM
                    ),
                ));
            }
            return Ok(
                "base packages installed; security fixes skipped: no package repository reachable"
                    .to_string(),
            );
        }
        let long = Duration::from_secs(1800);
        let code = ErrorCode::FailBasePackages;
        if !missing.is_empty() {
            let names: Vec<&str> = missing.iter().map(String::as_str).collect();
            match manager {
                PackageManager::Apt => {
                    apt(ctx, &[], &["update", "-q"])?;
                    let mut args = vec!["install", "-y", "-q", "--no-install-recommends"];
                    args.extend(&names);
                    apt(ctx, &[], &args)?;
                }
                PackageManager::Dnf | PackageManager::Yum => {
                    let mut args = vec!["install", "-y"];
                    args.extend(&names);
                    ctx.host.run(code, rpm_tool(manager), &args, long)?;
                }
            }
        }
        let mut summary = format!("installed [{}]", missing.join(", "));
        if security_fixes_wanted(ctx) {
            match manager {
                PackageManager::Apt => {
                    // Upgrade from the security suites only: a sources file
                    // holding just those, and no other list.
                    let (lists, deb822) = apt_sources(ctx);
                    let sources = security_sources(&lists, &deb822);
                    if sources.is_empty() {
                        summary.push_str("; no security suite configured, no fixes applied");
                    } else {
                        ctx.host.write_file(
                            "/etc/knit/apt-security/security.sources",
                            sources.as_bytes(),
                            0o644,
                        )?;
                        let only = [
                            "-o",
                            "Dir::Etc::SourceList=/dev/null",
                            "-o",
                            "Dir::Etc::SourceParts=/etc/knit/apt-security",
                        ];
                        apt(ctx, &only, &["update", "-q"])?;
                        let ((), held) = kernel_hold::with_kernel_held(ctx, || {
                            apt(ctx, &only, &["upgrade", "-y", "-q"])
                        })?;
                        summary.push_str("; security fixes applied");
                        summary.push_str(&held_note(&held));
                    }
                    if let Some(old) = old_systemd(ctx) {
                        apt(
                            ctx,
                            &[],
                            &["install", "--only-upgrade", "-y", "-q", "systemd"],
                        )?;
                        summary.push_str(&systemd_note(old));
                    }
                }
                PackageManager::Dnf | PackageManager::Yum => {
                    ctx.host.run(
                        code,
                        rpm_tool(manager),
                        &["update-minimal", "--security", "--exclude", "kernel*", "-y"],
                        long,
                    )?;
                    summary.push_str("; security fixes applied");
                    if let Some(old) = old_systemd(ctx) {
                        ctx.host.run(
                            code,
                            rpm_tool(manager),
                            &["update", "-y", "systemd"],
                            long,
                        )?;
                        summary.push_str(&systemd_note(old));
                    }
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

/// The oldest systemd left as it is. Older ones — RHEL/CentOS 7's 219
/// above all, whose early builds leak cgroups under the kubelet — are
/// upgraded to the newest build the node's repositories have, with the
/// security fixes (the seed: "systemd may be upgraded for stability").
pub const MIN_SYSTEMD: u32 = 239;

/// The major version in `systemctl --version`'s first line
/// (`systemd 252 (252.30-1~deb12u2)`).
pub fn systemd_major(version_text: &str) -> Option<u32> {
    version_text
        .lines()
        .next()?
        .strip_prefix("systemd ")?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The node's systemd version when it is older than [`MIN_SYSTEMD`].
fn old_systemd(ctx: &Ctx) -> Option<u32> {
    let out = ctx
        .host
        .run(
            ErrorCode::FailBasePackages,
            "systemctl",
            &["--version"],
            Duration::from_secs(30),
        )
        .ok()?;
    systemd_major(&out.stdout).filter(|v| *v < MIN_SYSTEMD)
}

fn systemd_note(old: u32) -> String {
    format!("; systemd {old} is older than {MIN_SYSTEMD}: upgraded to the newest build available")
}

/// What the summary says of the kernel packages held for the upgrade.
fn held_note(held: &[String]) -> String {
    if held.is_empty() {
        String::new()
    } else {
        format!("; kernel packages held, not upgraded [{}]", held.join(", "))
    }
}

fn security_fixes_wanted(ctx: &Ctx) -> bool {
    ctx.config.base_packages.security_updates
        && !markers::present(ctx.host, markers::SKIP_SECURITY_FIX)
}

/// The node's apt sources: one-line `.list` files and deb822 `.sources` files.
fn apt_sources(ctx: &Ctx) -> (String, String) {
    let mut lists = ctx.host.read("/etc/apt/sources.list").unwrap_or_default();
    let mut deb822 = String::new();
    if let Ok(dir) = std::fs::read_dir(ctx.host.path("/etc/apt/sources.list.d")) {
        let mut paths: Vec<_> = dir.flatten().map(|e| e.path()).collect();
        paths.sort();
        for path in paths {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            match path.extension().and_then(|e| e.to_str()) {
                Some("list") => lists.push_str(&format!("{text}\n")),
                Some("sources") => deb822.push_str(&format!("{text}\n\n")),
                _ => {}
            }
        }
    }
    (lists, deb822)
}

/// Only the security suites of the node's apt sources, as a deb822 file:
/// stanzas (or one-line entries) whose suite ends in `-security`.
pub fn security_sources(lists: &str, deb822: &str) -> String {
    let mut out = String::new();
    for line in lists.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        // deb [options] URI SUITE COMPONENTS...
        let rest: Vec<&str> = match words.first() {
            Some(&"deb") => words[1..]
                .iter()
                .copied()
                .filter(|w| !w.starts_with('[') && !w.ends_with(']'))
                .collect(),
            _ => continue,
        };
        if let [uri, suite, components @ ..] = rest.as_slice() {
            if suite.ends_with("-security") {
                out.push_str(&format!(
                    "Types: deb\nURIs: {uri}\nSuites: {suite}\nComponents: {}\n\n",
                    components.join(" ")
                ));
            }
        }
    }
    for stanza in deb822.split("\n\n") {
        let field = |name: &str| {
            stanza.lines().find_map(|l| {
                l.strip_prefix(name)
                    .and_then(|v| v.strip_prefix(':'))
                    .map(str::trim)
            })
        };
        let Some(suites) = field("Suites") else {
            continue;
        };
        let security: Vec<&str> = suites
            .split_whitespace()
            .filter(|s| s.ends_with("-security"))
            .collect();
        if security.is_empty()
            || field("Types").is_some_and(|t| !t.split_whitespace().any(|t| t == "deb"))
        {
            continue;
        }
        for line in stanza.lines() {
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            if line.starts_with("Suites:") {
                out.push_str(&format!("Suites: {}\n", security.join(" ")));
            } else if line.starts_with("Types:") {
                out.push_str("Types: deb\n");
            } else {
                out.push_str(&format!("{line}\n"));
            }
        }
        out.push('\n');
    }
    out
}

/// Every http(s) repository URL the node's package manager would use.
pub fn repository_urls(manager: PackageManager, files: &[String]) -> Vec<String> {
    let mut urls = Vec::new();
    for text in files {
        for line in text.lines().map(str::trim) {
            let candidates: Vec<&str> = match manager {
                PackageManager::Apt => {
                    if let Some(v) = line.strip_prefix("URIs:") {
                        v.split_whitespace().collect()
                    } else if line.starts_with("deb ") {
                        line.split_whitespace()
                            .filter(|w| w.contains("://"))
                            .take(1)
                            .collect()
                    } else {
                        vec![]
                    }
                }
                PackageManager::Dnf | PackageManager::Yum => {
                    ["baseurl=", "mirrorlist=", "metalink="]
                        .iter()
                        .filter_map(|k| line.strip_prefix(k))
                        .collect()
                }
            };
            for url in candidates {
                if (url.starts_with("http://") || url.starts_with("https://"))
                    && !urls.iter().any(|u| u == url)
                {
                    urls.push(url.to_string());
                }
            }
        }
    }
    urls
}

fn repository_files(ctx: &Ctx, manager: PackageManager) -> Vec<String> {
    match manager {
        PackageManager::Apt => {
            let (lists, deb822) = apt_sources(ctx);
            vec![lists, deb822]
        }
        PackageManager::Dnf | PackageManager::Yum => {
            std::fs::read_dir(ctx.host.path("/etc/yum.repos.d"))
                .map(|d| {
                    d.flatten()
                        .filter(|e| e.path().extension().is_some_and(|x| x == "repo"))
                        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
                        .collect()
                })
                .unwrap_or_default()
        }
    }
}

/// How long a repository has to accept a TCP connection (name resolution
/// included). An offline node answers in this time, not in seconds: the
/// probe is on every node's path to "initialized" (issue 12, item 3).
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(150);

/// Whether a TCP connection to the URL's host opens within [`PROBE_TIMEOUT`].
/// Name resolution runs in a thread so that a dead resolver cannot hang us.
fn reachable(url: &str) -> bool {
    let https = url.starts_with("https://");
    let rest = url.split_once("://").map(|(_, r)| r).unwrap_or(url);
    let authority = rest.split('/').next().unwrap_or_default().to_string();
    let target = if authority.contains(':') && !authority.ends_with(']') {
        authority
    } else {
        format!("{authority}:{}", if https { 443 } else { 80 })
    };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::net::ToSocketAddrs;
        let ok = target
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .is_some_and(|addr| std::net::TcpStream::connect_timeout(&addr, PROBE_TIMEOUT).is_ok());
        let _ = tx.send(ok);
    });
    rx.recv_timeout(PROBE_TIMEOUT).unwrap_or(false)
}

/// The knit repository's apt source (deb822, flat repository).
pub const KNIT_SOURCES: &str = "/etc/apt/sources.list.d/knit.sources";
/// The same source alone in a directory: apt is pointed at it so that
/// nothing but the knit repository is read (the image's own sources are
/// unreachable on an offline node and would stall `apt-get update`).
const KNIT_ONLY_DIR: &str = "/etc/knit/apt-knit";
/// The control plane's CA, for apt's https to the mirror. Not under
/// /etc/knit (mode 0700): apt's https method reads it as the `_apt` user.
const KNIT_CA: &str = "/etc/apt/knit-ca.crt";
const KNIT_APT_CONF: &str = "/etc/apt/apt.conf.d/60knit-repository";

/// What one round of probes found.
struct Reach {
    /// The configured knit repository, when it answers and serves a
    /// `Release` file (a mirror built without the Debian repository has none).
    knit: Option<String>,
    /// `Some(urls)` when the node's own repositories are all unreachable.
    offline: Option<Vec<String>>,
    /// How long the TCP probes took (all run at once).
    probe_ms: u128,
}

/// Probes the knit repository and the node's own sources at once, so an
/// offline node waits one [`PROBE_TIMEOUT`], not one per source.
fn probe(ctx: &Ctx, manager: PackageManager) -> Reach {
    let knit_url = match manager {
        PackageManager::Apt => ctx.config.base_packages.repository.clone(),
        PackageManager::Dnf | PackageManager::Yum => None,
    };
    let urls = repository_urls(manager, &repository_files(ctx, manager));
    let started = std::time::Instant::now();
    let answers: Vec<bool> = knit_url
        .iter()
        .chain(urls.iter())
        .cloned()
        .map(|u| std::thread::spawn(move || reachable(&u)))
        .collect::<Vec<_>>()
        .into_iter()
        .map(|p| p.join().unwrap_or(false))
        .collect();
    let probe_ms = started.elapsed().as_millis();
    let (knit_answers, own) = answers.split_at(usize::from(knit_url.is_some()));
    let knit = match &knit_url {
        Some(url) if knit_answers.first() == Some(&true) => knit_release(ctx, url),
        _ => None,
    };
    // The knit repository is named among those tried when it was unusable.
    let offline = (urls.is_empty() || !own.iter().any(|a| *a)).then(|| {
        knit_url
            .iter()
            .filter(|_| knit.is_none())
            .cloned()
            .chain(urls)
            .collect()
    });
    Reach {
        knit,
        offline,
        probe_ms,
    }
}

/// The repository's URL (with a final `/`) when it serves `Release` made
/// for this node's release: its packages are built for the knit node image
/// (`Codename:` in `Release`), so a node of another release (an attached
/// Ubuntu instance, say) keeps its own sources.
fn knit_release(ctx: &Ctx, repository: &str) -> Option<String> {
    let base = repository.trim_end_matches('/');
    let agent = crate::tls::http_agent(
        ctx.config.cluster.control_plane_ca_cert.as_deref(),
        Duration::from_secs(5),
    )
    .ok()?;
    let release = agent
        .get(&format!("{base}/Release"))
        .call()
        .ok()?
        .into_string()
        .ok()?;
    let node = ctx.host.read("/etc/os-release").unwrap_or_default();
    release_fits(&release, &node).then(|| format!("{base}/"))
}

/// Whether a repository's `Release` suits a node (its os-release text): the
/// same `Codename` as the node's `VERSION_CODENAME`, or none named.
pub fn release_fits(release: &str, os_release: &str) -> bool {
    let field = |text: &str, key: &str| {
        text.lines().find_map(|l| {
            l.strip_prefix(key)
                .map(|v| v.trim().trim_matches('"').to_string())
        })
    };
    match field(release, "Codename:") {
        None => true,
        Some(codename) => field(os_release, "VERSION_CODENAME=").as_deref() == Some(&*codename),
    }
}

/// The host part of an http(s) URL, without port or brackets.
fn url_host(url: &str) -> &str {
    let rest = url.split_once("://").map(|(_, r)| r).unwrap_or(url);
    let authority = rest.split('/').next().unwrap_or_default();
    if let Some(v6) = authority.strip_prefix('[') {
        return v6.split(']').next().unwrap_or_default();
    }
    authority.split(':').next().unwrap_or_default()
}

/// The deb822 source for the knit repository. Signed (`knit package build`
/// signs it when gpg is there): apt checks `InRelease` against the
/// repository's key (`Signed-By`), which the agent fetched over https from
/// the control plane. Unsigned: it is trusted because it is fetched over
/// https from the control plane, whose CA apt checks (`CaInfo`). Either
/// way apt checks every index and package against the hashes in `Release`.
pub fn knit_source(repository: &str, signed_by: Option<&str>) -> String {
    let trust = match signed_by {
        Some(key) => format!("Signed-By: {key}"),
        None => "Trusted: yes".to_string(),
    };
    format!(
        "# Written by knit-agent (base-packages): the control plane's Debian repository.\n\
         Types: deb\nURIs: {repository}\nSuites: ./\n{trust}\n"
    )
}

/// The repository's public key, served beside `Release` by a signed
/// repository (`knit package build`), and where the node keeps it.
const REPOSITORY_KEY: &str = "knit-archive-keyring.gpg";
const KNIT_KEYRING: &str = "/etc/apt/keyrings/knit-archive-keyring.gpg";
/// An OpenPGP public key is a few hundred bytes; more is not one.
const KEY_MAX_BYTES: u64 = 64 * 1024;

/// The repository's public key when it serves one (`None`: unsigned, or
/// unreachable: apt then reports what it finds).
fn repository_key(ctx: &Ctx, repository: &str) -> Option<Vec<u8>> {
    use std::io::Read;
    let agent = crate::tls::http_agent(
        ctx.config.cluster.control_plane_ca_cert.as_deref(),
        Duration::from_secs(5),
    )
    .ok()?;
    let response = agent
        .get(&format!("{repository}{REPOSITORY_KEY}"))
        .call()
        .ok()?;
    let mut key = Vec::new();
    response
        .into_reader()
        .take(KEY_MAX_BYTES + 1)
        .read_to_end(&mut key)
        .ok()?;
    (!key.is_empty() && key.len() as u64 <= KEY_MAX_BYTES).then_some(key)
}

/// `Inst NAME (VERSION …)` lines of `apt-get -s`: the names.
pub fn simulated_installs(out: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| l.strip_prefix("Inst "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

fn install_from_knit_repository(
    ctx: &mut Ctx,
    repository: &str,
    missing: &[String],
) -> Result<String> {
    let signed_by = match repository_key(ctx, repository) {
        Some(key) => {
            ctx.host.write_file(KNIT_KEYRING, &key, 0o644)?;
            Some(KNIT_KEYRING)
        }
        None => None,
    };
    let source = knit_source(repository, signed_by);
    ctx.host
        .write_file(KNIT_SOURCES, source.as_bytes(), 0o644)?;
    ctx.host.write_file(
        &format!("{KNIT_ONLY_DIR}/knit.sources"),
        source.as_bytes(),
        0o644,
    )?;
    if repository.starts_with("https://") {
        if let Some(ca) = ctx.config.cluster.control_plane_ca_cert.as_deref() {
            ctx.host.write_file(KNIT_CA, ca.as_bytes(), 0o644)?;
            ctx.host.write_file(
                KNIT_APT_CONF,
                format!(
                    "// Written by knit-agent: the knit repository's https is checked against the control plane's CA.\n\
                     Acquire::https::{}::CaInfo \"{KNIT_CA}\";\n",
                    url_host(repository)
                )
                .as_bytes(),
                0o644,
            )?;
        }
    }
    let only_dir = format!("Dir::Etc::SourceParts={KNIT_ONLY_DIR}");
    let only = [
        "-o",
        "Dir::Etc::SourceList=/dev/null",
        "-o",
        only_dir.as_str(),
        // An update keeps the node's own changes to configuration files.
        "-o",
        "Dpkg::Options::=--force-confdef",
        "-o",
        "Dpkg::Options::=--force-confold",
    ];
    knit_apt(ctx, &only, &["update", "-q"])?;
    let mut summary = if missing.is_empty() {
        format!("base packages installed, nothing to install from the knit repository {repository}")
    } else {
        let mut args = vec!["install", "-y", "-q", "--no-install-recommends"];
        args.extend(missing.iter().map(String::as_str));
        knit_apt(ctx, &only, &args)?;
        format!(
            "installed [{}] from the knit repository {repository}",
            missing.join(", ")
        )
    };
    if security_fixes_wanted(ctx) {
        let (updates, held) = kernel_hold::with_kernel_held(ctx, || {
            let planned = knit_apt(ctx, &only, &["-s", "upgrade"])?;
            let updates = simulated_installs(&planned);
            if !updates.is_empty() {
                knit_apt(ctx, &only, &["upgrade", "-y", "-q"])?;
            }
            Ok(updates)
        })?;
        if updates.is_empty() {
            summary.push_str("; no updates available in it");
        } else {
            summary.push_str(&format!(
                "; updates applied from it [{}]",
                updates.join(", ")
            ));
        }
        summary.push_str(&held_note(&held));
        if let Some(old) = old_systemd(ctx) {
            knit_apt(
                ctx,
                &only,
                &["install", "--only-upgrade", "-y", "-q", "systemd"],
            )?;
            summary.push_str(&systemd_note(old));
        }
    } else if markers::present(ctx.host, markers::SKIP_SECURITY_FIX) {
        summary.push_str(&format!(
            "; updates skipped (marker {})",
            markers::SKIP_SECURITY_FIX
        ));
    }
    Ok(summary)
}

/// apt-get non-interactively (no debconf questions, stdin is closed);
/// its standard output.
fn knit_apt(ctx: &Ctx, extra: &[&str], args: &[&str]) -> Result<String> {
    let mut all: Vec<&str> = vec!["DEBIAN_FRONTEND=noninteractive", "apt-get"];
    all.extend(APT_NET);
    all.extend(extra);
    all.extend(args);
    let out = ctx.host.run(
        ErrorCode::FailBasePackages,
        "env",
        &all,
        Duration::from_secs(1800),
    )?;
    Ok(out.stdout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn systemd_major_is_read_from_the_first_line() {
        assert_eq!(
            systemd_major("systemd 252 (252.30-1~deb12u2)\n+PAM +AUDIT\n"),
            Some(252)
        );
        assert_eq!(systemd_major("systemd 219\n+PAM"), Some(219));
        assert_eq!(systemd_major("not systemd"), None);
        assert_eq!(systemd_major(""), None);
        assert!(systemd_major("systemd 219").is_some_and(|v| v < MIN_SYSTEMD));
    }

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

    #[test]
    fn security_suites_only() {
        let deb822 = "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\n\n\
                      Types: deb deb-src\n# comment\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\nComponents: main contrib\nSigned-By: /k.gpg\n";
        let lists = "deb http://mirror.example/ubuntu jammy main\ndeb [arch=amd64] http://mirror.example/ubuntu jammy-security main universe\n";
        let out = security_sources(lists, deb822);
        assert!(out.contains("URIs: http://mirror.example/ubuntu\nSuites: jammy-security\nComponents: main universe"), "{out}");
        assert!(out.contains("URIs: http://mirror.example/debian-security\nSuites: bookworm-security\nComponents: main contrib\nSigned-By: /k.gpg"), "{out}");
        assert!(
            !out.contains("bookworm-updates")
                && !out.contains("jammy main\n")
                && !out.contains("deb-src"),
            "{out}"
        );
        assert_eq!(
            security_sources("deb http://m.example/d bookworm main\n", ""),
            ""
        );
    }

    #[test]
    fn knit_source_is_a_trusted_flat_repository() {
        let signed = knit_source("https://10.213.0.1:7443/mirror/debian/", Some(KNIT_KEYRING));
        assert!(signed.ends_with(
            "URIs: https://10.213.0.1:7443/mirror/debian/\nSuites: ./\nSigned-By: /etc/apt/keyrings/knit-archive-keyring.gpg\n"
        ));
        let source = knit_source("https://10.213.0.1:7443/mirror/debian/", None);
        assert!(
            source.contains(
                "URIs: https://10.213.0.1:7443/mirror/debian/\nSuites: ./\nTrusted: yes\n"
            ),
            "{source}"
        );
        assert!(!source.contains("Components"), "{source}");
        assert_eq!(
            url_host("https://10.213.0.1:7443/mirror/debian/"),
            "10.213.0.1"
        );
        assert_eq!(url_host("http://[fd00::1]:80/x"), "fd00::1");
        assert_eq!(
            simulated_installs("Reading...\nInst pigz (2.6-1 knit [amd64])\nConf pigz (2.6-1 knit [amd64])\nInst curl [7.88.1-10] (7.88.1-10+deb12u15 knit [amd64])\n"),
            ["pigz", "curl"]
        );
    }

    #[test]
    fn a_repository_for_another_release_is_not_used() {
        let bookworm = "ID=debian\nVERSION_ID=\"12\"\nVERSION_CODENAME=bookworm\n";
        let jammy = "ID=ubuntu\nVERSION_CODENAME=jammy\n";
        let release = "Origin: knit\nCodename: bookworm\nSHA256:\n";
        assert!(release_fits(release, bookworm));
        assert!(!release_fits(release, jammy));
        assert!(!release_fits(release, "ID=debian\n"));
        assert!(release_fits("Origin: knit\n", jammy));
    }

    #[test]
    fn repository_urls_per_family() {
        let apt = repository_urls(
            PackageManager::Apt,
            &[
                "deb [signed-by=/k] https://a.example/x stable main\n# deb http://off.example/ x\n"
                    .to_string(),
                "URIs: http://b.example/y http://c.example/z\n".to_string(),
            ],
        );
        assert_eq!(
            apt,
            [
                "https://a.example/x",
                "http://b.example/y",
                "http://c.example/z"
            ]
        );
        let rpm = repository_urls(
            PackageManager::Dnf,
            &["[base]\nbaseurl=http://r.example/os/\nmirrorlist=https://m.example/list\nenabled=1\n".to_string()],
        );
        assert_eq!(rpm, ["http://r.example/os/", "https://m.example/list"]);
    }
}
