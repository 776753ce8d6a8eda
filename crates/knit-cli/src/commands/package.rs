//! `knit package build`: the package mirror assembled from what this
//! machine has (the agent, the kubelet stand-in, containerd and runc, CNI
//! plugins), the Debian repository nodes install their base packages
//! and updates from (`mirror/debian/`, see [`build_debian_repository`]),
//! and the system images the server serves nodes (`system-images/`).

use crate::error::{io, CliError, Result};
use clap::Subcommand;
use knit_server::Settings;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Subcommand)]
pub enum PackageAction {
    /// Assemble the package mirror from what this machine has.
    Build {
        #[arg(long, env = "KNIT_STATE_DIR", default_value = "/var/lib/knit/server")]
        state_dir: PathBuf,
        #[arg(long, default_value = knit_api::DEFAULT_KUBERNETES_VERSION)]
        kubernetes_version: String,
        /// The agent binary (default: knit-agent beside knit).
        #[arg(long)]
        agent: Option<PathBuf>,
        /// Shipped as bin/kubelet (default: knit-kubelet-sim beside knit).
        #[arg(long)]
        kubelet: Option<PathBuf>,
        /// Leave containerd, its shim, ctr and runc out of the tarball.
        #[arg(long)]
        no_runtime: bool,
    },
}

pub fn sibling(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe().map_err(io("find the knit executable"))?;
    Ok(exe.with_file_name(name))
}

pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

pub fn run(action: PackageAction) -> Result<ExitCode> {
    let PackageAction::Build {
        state_dir,
        kubernetes_version,
        agent,
        kubelet,
        no_runtime,
    } = action;
    let agent = match agent {
        Some(a) => a,
        None => sibling("knit-agent")?,
    };
    let kubelet = match kubelet {
        Some(k) => k,
        None => sibling("knit-kubelet-sim")?,
    };
    let mut runtime_bins = Vec::new();
    let mut containerd_version = String::new();
    if !no_runtime {
        for name in ["containerd", "containerd-shim-runc-v2", "ctr", "runc"] {
            let path = which(name).ok_or_else(|| {
                CliError::Failed(format!("{name} is not installed (apt-get install containerd runc), or pass --no-runtime"))
            })?;
            runtime_bins.push((name.to_string(), path));
        }
        let out = knit_os::command::run(
            std::process::Command::new(&runtime_bins[0].1).arg("--version"),
            VERSION_TIMEOUT,
            VERSION_OUTPUT_CAP,
        )?;
        // "containerd github.com/containerd/containerd 1.6.20~ds1 …": the third word.
        containerd_version = out
            .stdout_text()
            .split_whitespace()
            .nth(2)
            .unwrap_or("")
            .to_string();
    }
    let mirror_dir = Settings::new(state_dir.clone()).mirror_dir();
    let summary = knit_server::mirror::build(&knit_server::mirror::PackageBuild {
        mirror_dir: mirror_dir.clone(),
        kubernetes_version,
        kubelet,
        agent,
        runtime_bins,
        containerd_version,
        images: knit_server::mirror::DEFAULT_SYSTEM_IMAGES
            .iter()
            .map(|s| s.to_string())
            .collect(),
        cni_plugins: knit_server::mirror::LOCAL_CNI_PLUGINS
            .iter()
            .map(|name| {
                (
                    name.to_string(),
                    Path::new(knit_server::mirror::DEBIAN_CNI_DIR).join(name),
                )
            })
            .filter(|(_, path)| path.is_file())
            .collect(),
        network_config: Some((
            knit_server::mirror::LOCAL_NETWORK_CONFIG.0.to_string(),
            knit_server::mirror::LOCAL_NETWORK_CONFIG.1.to_string(),
        )),
    })?;
    println!(
        "{} ({} MiB, sha256 {})\nknit-agent sha256 {}",
        summary.tarball.display(),
        summary.tarball_bytes >> 20,
        summary.tarball_sha256,
        summary.agent_sha256
    );
    // The images nodes pull, served by the server at /v2/ (it builds them
    // itself when missing: a failure here is a warning).
    match knit_server::ensure_registry_layout(&state_dir) {
        Ok(layout) => {
            for e in &layout.entries {
                println!(
                    "system image {} {} ({})",
                    e.reference.full(),
                    e.digest,
                    if e.reference.is_pause() {
                        "a pause process built here"
                    } else {
                        "a stand-in holding /pause"
                    }
                );
            }
        }
        Err(e) => eprintln!("warning: the system images were not built: {e}"),
    }
    let image = knit_local::image::images_dir().join(knit_local::image::NAME);
    if let Err(e) = build_debian_repository(&mirror_dir, &image, &mut |line| println!("{line}")) {
        // Nodes fall back to their image's own sources: a warning, not a failure.
        eprintln!("warning: the Debian repository was not built: {e}");
    }
    Ok(ExitCode::SUCCESS)
}

/// The packages the agent's base-packages phase installs on Debian.
const DEBIAN_BASE_PACKAGES: &[&str] = &["pigz", "zlib1g"];
/// `containerd --version` prints one line at once.
const VERSION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
const VERSION_OUTPUT_CAP: usize = 64 << 10;
/// `apt-get update` / download each get this long.
const APT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);
/// apt's and dpkg-scanpackages' output kept (each stream): a repository's
/// Packages index of every package and its dependencies.
const APT_OUTPUT_CAP: usize = 64 << 20;

/// Builds `mirror/debian/`, a flat Debian repository: the base packages
/// (at their candidate versions), their dependencies the node image lacks,
/// and every available update of a package in the image. apt resolves
/// against a private state whose dpkg status is the image's own, so the
/// closure is exactly what a node lacks; only apt's configured sources are
/// used. `pool/*.deb`, then `Packages` (dpkg-scanpackages) and `Release`
/// (sha256 of the index). The same versions as the last build: nothing done.
pub fn build_debian_repository(
    mirror_dir: &Path,
    image: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<()> {
    let status = image.join("root/var/lib/dpkg/status");
    if !status.is_file() {
        progress(&format!(
            "debian repository: skipped, no node image at {} (knit image build makes it)",
            image.display()
        ));
        return Ok(());
    }
    let repo = mirror_dir.join("debian");
    let pool = repo.join("pool");
    // apt's private state sits beside the mirror, not in it: not served.
    let apt_dir = mirror_dir.parent().unwrap_or(mirror_dir).join("debian-apt");
    for dir in [
        pool.clone(),
        apt_dir.join("lists/partial"),
        apt_dir.join("cache/archives/partial"),
    ] {
        std::fs::create_dir_all(&dir).map_err(io(format!("create {}", dir.display())))?;
    }
    std::fs::copy(&status, apt_dir.join("status"))
        .map_err(io(format!("copy {}", status.display())))?;
    let opts: Vec<String> = [
        ("Dir::State::Lists", apt_dir.join("lists")),
        ("Dir::Cache", apt_dir.join("cache")),
        ("Dir::State::status", apt_dir.join("status")),
    ]
    .iter()
    .flat_map(|(k, v)| ["-o".to_string(), format!("{k}={}", v.display())])
    .chain(["-o".to_string(), "Debug::NoLocking=1".to_string()])
    .collect();
    let apt = |args: &[&str], cwd: &Path| -> Result<String> {
        let mut all: Vec<&str> = opts.iter().map(String::as_str).collect();
        all.extend(args);
        run_timed("apt-get", &all, cwd)
    };
    progress("debian repository [1/4] apt-get update (apt's configured sources, private lists)");
    if let Err(e) = apt(&["update", "-q"], &apt_dir) {
        progress(&format!(
            "      warning: apt-get update failed, using the last lists: {e}"
        ));
    }
    progress("debian repository [2/4] resolving base packages, their missing dependencies and the image's updates");
    let mut wanted: std::collections::BTreeMap<String, String> = Default::default();
    let mut install = vec!["-s", "install", "--no-install-recommends"];
    install.extend(DEBIAN_BASE_PACKAGES);
    for args in [install, vec!["-s", "upgrade"]] {
        wanted.extend(simulated(&apt(&args, &apt_dir)?));
    }
    // The base packages themselves even when the image has them: a node
    // whose image lacks them installs them from here.
    let policy = run_timed(
        "apt-cache",
        &[
            &opts.iter().map(String::as_str).collect::<Vec<_>>()[..],
            &["policy"],
            DEBIAN_BASE_PACKAGES,
        ]
        .concat(),
        &apt_dir,
    )?;
    wanted.extend(candidates(&policy));
    let files: Vec<(String, String)> = wanted
        .iter()
        .map(|(name, version)| {
            (
                format!("{name}={version}"),
                format!("{name}_{}_", version.replace(':', "%3a")),
            )
        })
        .collect();
    let present: Vec<String> = std::fs::read_dir(&pool)
        .map_err(io(format!("read {}", pool.display())))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .collect();
    let fetch: Vec<&str> = files
        .iter()
        .filter(|(_, prefix)| {
            !present
                .iter()
                .any(|p| p.starts_with(prefix.as_str()) && p.ends_with(".deb"))
        })
        .map(|(spec, _)| spec.as_str())
        .collect();
    let stale: Vec<&String> = present
        .iter()
        .filter(|p| {
            !files
                .iter()
                .any(|(_, prefix)| p.starts_with(prefix.as_str()))
        })
        .collect();
    if fetch.is_empty() && stale.is_empty() && repo.join("Release").is_file() {
        // A repository indexed before it was signed gets its signatures.
        if !repo.join("InRelease").is_file() {
            sign_repository(&repo, &apt_dir, progress);
        }
        progress(&format!(
            "debian repository: up to date ({} packages) in {}",
            files.len(),
            repo.display()
        ));
        return Ok(());
    }
    progress(&format!(
        "debian repository [3/4] downloading {} of {} packages: {}",
        fetch.len(),
        files.len(),
        fetch.join(" ")
    ));
    if !fetch.is_empty() {
        let mut args = vec!["download", "-q"];
        args.extend(&fetch);
        apt(&args, &pool)?;
    }
    for name in stale {
        let path = pool.join(name);
        std::fs::remove_file(&path).map_err(io(format!("remove {}", path.display())))?;
    }
    progress("debian repository [4/4] index: Packages (dpkg-scanpackages) and Release");
    let packages = run_timed(
        "dpkg-scanpackages",
        &["--multiversion", "pool", "/dev/null"],
        &repo,
    )
    .map_err(|e| {
        CliError::Failed(format!(
            "{e} (dpkg-scanpackages is in dpkg-dev: scripts/setup.sh installs it)"
        ))
    })?;
    write_atomic(&repo.join("Packages"), packages.as_bytes())?;
    let sum = knit_server::mirror::sha256_file(&repo.join("Packages"))?;
    // apt warns about a Release without a valid Date (RFC 1123, UTC).
    let date = run_timed(
        "env",
        &["LC_ALL=C", "date", "-u", "+%a, %d %b %Y %H:%M:%S UTC"],
        &repo,
    )?;
    // The image's release: agents on nodes of another release leave the
    // repository alone (its packages are built for this one).
    let os_release = std::fs::read_to_string(image.join("root/etc/os-release")).unwrap_or_default();
    let codename = os_release
        .lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .map(|v| format!("Codename: {}\n", v.trim().trim_matches('"')))
        .unwrap_or_default();
    let release = format!(
        "Origin: knit\nLabel: knit\n{codename}Date: {}\nDescription: the control plane's Debian repository (base packages and updates)\nSHA256:\n {sum} {} Packages\n",
        date.trim(),
        packages.len()
    );
    write_atomic(&repo.join("Release"), release.as_bytes())?;
    sign_repository(&repo, &apt_dir, progress);
    let bytes: u64 = std::fs::read_dir(&pool)
        .map_err(io(format!("read {}", pool.display())))?
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum();
    progress(&format!(
        "debian repository: {} packages, {} KiB in {}",
        files.len(),
        bytes >> 10,
        repo.display()
    ));
    Ok(())
}

/// Signs the repository (`InRelease`, `Release.gpg`, the public key beside
/// them: [`knit_server::mirror::sign_debian_repository`]) with a key kept
/// beside the mirror (`<state>/debian-apt/gnupg`, never served). Without
/// gpg it stays unsigned (nodes trust it through the control plane's TLS)
/// and old signature files are removed, so that no node checks a new
/// `Release` against an old signature.
fn sign_repository(repo: &Path, apt_dir: &Path, progress: &mut dyn FnMut(&str)) {
    if let Err(e) = knit_server::mirror::sign_debian_repository(repo, &apt_dir.join("gnupg")) {
        knit_server::mirror::remove_debian_signatures(repo);
        progress(&format!(
            "      warning: the repository is not signed ({e}); nodes trust it through the control plane's TLS"
        ));
    }
}

fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    Ok(knit_os::durable::write(path, data, 0o644)?)
}

/// `Inst NAME [OLD] (VERSION …)` lines of `apt-get -s`: name → version.
fn simulated(out: &str) -> Vec<(String, String)> {
    out.lines()
        .filter_map(|l| l.strip_prefix("Inst "))
        .filter_map(|l| {
            let name = l.split_whitespace().next()?;
            let version = l.split_once('(')?.1.split_whitespace().next()?;
            Some((name.to_string(), version.to_string()))
        })
        .collect()
}

/// `apt-cache policy` output: each package's `Candidate:` version.
fn candidates(out: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let mut name = None;
    for line in out.lines() {
        if !line.starts_with(' ') {
            name = line.strip_suffix(':').map(str::to_string);
        } else if let (Some(n), Some(v)) = (&name, line.trim().strip_prefix("Candidate:")) {
            let v = v.trim();
            if v != "(none)" {
                found.push((n.clone(), v.to_string()));
            }
        }
    }
    found
}

/// Runs a command in `cwd` with a deadline; its stdout, or its stderr as the error.
fn run_timed(program: &str, args: &[&str], cwd: &Path) -> Result<String> {
    let out = knit_os::command::run(
        std::process::Command::new(program)
            .args(args)
            .current_dir(cwd),
        APT_TIMEOUT,
        APT_OUTPUT_CAP,
    )?;
    if !out.success() {
        return Err(CliError::Failed(format!(
            "`{program} {}` failed: {}",
            args.join(" "),
            out.stderr_text().trim()
        )));
    }
    Ok(out.stdout_text())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_apt_simulations_and_policies() {
        let sim = "Inst curl [7.88.1-10+deb12u14] (7.88.1-10+deb12u15 Debian-Security:12/oldstable-security [amd64])\nConf curl (7.88.1-10+deb12u15 Debian-Security:12/oldstable-security [amd64])\nInst libfoo1 (1:2.0-1 Debian:12 [amd64])\n";
        assert_eq!(
            simulated(sim),
            [
                ("curl".to_string(), "7.88.1-10+deb12u15".to_string()),
                ("libfoo1".to_string(), "1:2.0-1".to_string())
            ]
        );
        let policy = "pigz:\n  Installed: (none)\n  Candidate: 2.6-1\n  Version table:\n     2.6-1 500\nzlib1g:\n  Installed: (none)\n  Candidate: (none)\n";
        assert_eq!(
            candidates(policy),
            [("pigz".to_string(), "2.6-1".to_string())]
        );
    }
}
