//! `knit package build`: the package mirror assembled from what this
//! machine has (the agent, the kubelet stand-in, containerd and runc, CNI
//! plugins).

use crate::error::{io, CliError, Result};
use clap::Subcommand;
use knit_server::control::Settings;
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
        let out = std::process::Command::new(&runtime_bins[0].1)
            .arg("--version")
            .output()
            .map_err(io("run containerd --version"))?;
        // "containerd github.com/containerd/containerd 1.6.20~ds1 …": the third word.
        containerd_version = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .nth(2)
            .unwrap_or("")
            .to_string();
    }
    let summary = knit_server::mirror::build(&knit_server::mirror::PackageBuild {
        mirror_dir: Settings::new(state_dir).mirror_dir(),
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
    Ok(ExitCode::SUCCESS)
}
