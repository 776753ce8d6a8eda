//! `optional-components`: GPU, image acceleration and SGX, each only when
//! configured, each failing clearly when configured but impossible here.
//!
//! - GPU: NVIDIA devices found by PCI vendor `0x10de` in sysfs; containerd's
//!   `nvidia` runtime is rendered by `kubernetes-components`.
//! - Image acceleration: the `stargz-snapshotter` package (installed with the
//!   node's package manager, on a live node only) and `containerd-stargz-grpc`
//!   (from that package, or `bin/` of the Kubernetes package: Debian's package
//!   ships only `ctr-remote`) run as a service; containerd's config names it
//!   as proxy snapshotter.
//! - SGX: the enclave device must exist.

use crate::error::{AgentError, Result};
use crate::host::Host;
use crate::phase::{Ctx, Decision, Phase};
use crate::phases::base_packages::{detect_package_manager, PackageManager};
use crate::render;
use crate::services;
use knit_api::{ErrorCode, PhaseName};
use std::time::{Duration, Instant};

const SCOPE: &str = PhaseName::OptionalComponents.as_str();
const NVIDIA_VENDOR: &str = "0x10de";
const PCI_DEVICES: &str = "/sys/bus/pci/devices";
pub const SGX_DEVICES: &[&str] = &["/dev/sgx_enclave", "/dev/sgx/enclave"];
const STARGZ_PACKAGE: &str = "stargz-snapshotter";
const STARGZ_BIN: &str = "containerd-stargz-grpc";
const STARGZ_READY_TIMEOUT: Duration = Duration::from_secs(30);

fn fail(message: impl Into<String>) -> AgentError {
    AgentError::new(ErrorCode::FailOptionalComponents, message)
}

/// PCI addresses of NVIDIA devices.
pub fn nvidia_devices(host: &Host) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(host.path(PCI_DEVICES)) else {
        return Vec::new();
    };
    let mut found: Vec<String> = entries
        .flatten()
        .filter(|e| {
            std::fs::read_to_string(e.path().join("vendor"))
                .is_ok_and(|v| v.trim().eq_ignore_ascii_case(NVIDIA_VENDOR))
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    found.sort();
    found
}

pub fn sgx_device(host: &Host) -> Option<&'static str> {
    SGX_DEVICES.iter().copied().find(|d| host.exists(d))
}

fn wanted(ctx: &Ctx) -> Vec<&'static str> {
    let c = &ctx.config.components;
    [
        (c.gpu.enabled, "gpu"),
        (c.image_acceleration.enabled, "imageAcceleration"),
        (c.sgx.enabled, "sgx"),
    ]
    .into_iter()
    .filter_map(|(on, name)| on.then_some(name))
    .collect()
}

/// What stops a configured component here, if anything.
fn problems(ctx: &Ctx) -> Vec<String> {
    let c = &ctx.config.components;
    let mut problems = Vec::new();
    if c.gpu.enabled && nvidia_devices(ctx.host).is_empty() {
        problems.push(format!(
            "components.gpu is enabled but no NVIDIA GPU (PCI vendor {NVIDIA_VENDOR}) is present under {PCI_DEVICES}: \
             use a GPU instance type or turn components.gpu off"
        ));
    }
    if c.sgx.enabled && sgx_device(ctx.host).is_none() {
        problems.push(format!(
            "components.sgx is enabled but neither {} exists: use an SGX-capable instance type \
             (with SGX enabled in firmware and a kernel ≥ 5.11) or turn components.sgx off",
            SGX_DEVICES.join(" nor ")
        ));
    }
    if c.image_acceleration.enabled
        && !ctx.host.is_live()
        && ctx.host.find_program(STARGZ_BIN).is_none()
    {
        problems.push(format!(
            "components.imageAcceleration is enabled but {STARGZ_BIN} is not installed under {} \
             (packages are installed only on a live node, without --root)",
            ctx.host.root().display()
        ));
    }
    problems
}

fn install_stargz(ctx: &Ctx) -> Result<String> {
    let host = ctx.host;
    if host.find_program(STARGZ_BIN).is_none() {
        // problems() has refused this case under --root.
        let os_release = host.read("/etc/os-release").unwrap_or_default();
        let timeout = Duration::from_secs(600);
        match detect_package_manager(&os_release) {
            Some(PackageManager::Apt) => {
                host.run(ErrorCode::FailOptionalComponents, "apt-get", &["update", "-q"], timeout)?;
                host.run(
                    ErrorCode::FailOptionalComponents,
                    "apt-get",
                    &["install", "-y", "-q", "--no-install-recommends", STARGZ_PACKAGE],
                    timeout,
                )?;
            }
            Some(manager @ (PackageManager::Dnf | PackageManager::Yum)) => {
                let program = if manager == PackageManager::Dnf { "dnf" } else { "yum" };
                host.run(
                    ErrorCode::FailOptionalComponents,
                    program,
                    &["install", "-y", STARGZ_PACKAGE],
                    timeout,
                )?;
            }
            None => {
                return Err(fail(format!(
                    "cannot install {STARGZ_PACKAGE}: no apt, dnf or yum recognized from /etc/os-release"
                )))
            }
        }
    }
    let bin = host.find_program(STARGZ_BIN).ok_or_else(|| {
        fail(format!(
            "{STARGZ_PACKAGE} is installed but provides no {STARGZ_BIN}"
        ))
    })?;
    // Lazy pulls fall back to a normal fetch; the snapshotter's own defaults are kept.
    host.write_file(
        render::STARGZ_CONFIG,
        format!("{}\n", render::MANAGED_HEADER).as_bytes(),
        0o644,
    )?;
    let spec = render::stargz_service(host, &host.host_path(&bin));
    services::ensure_running(host, &spec).map_err(|e| fail(e.message))?;
    let socket = host.path(render::STARGZ_SOCK);
    let deadline = Instant::now() + STARGZ_READY_TIMEOUT;
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        if Instant::now() > deadline {
            return Err(fail(format!(
                "{STARGZ_BIN} did not answer on {} within {}s; see {}",
                socket.display(),
                STARGZ_READY_TIMEOUT.as_secs(),
                host.host_path(render::STARGZ_LOG)
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(format!("{STARGZ_BIN} serving on {}", socket.display()))
}

impl Phase for OptionalComponentsPhase {
    fn name(&self) -> PhaseName {
        PhaseName::OptionalComponents
    }

    fn inspect(&self, ctx: &Ctx) -> Result<Decision> {
        let wanted = wanted(ctx);
        if wanted.is_empty() {
            return Ok(Decision::Skip(
                "no optional component configured (components.gpu, imageAcceleration and sgx are off)"
                    .to_string(),
            ));
        }
        let problems = problems(ctx);
        if !problems.is_empty() {
            return Ok(Decision::Run(problems.join("; ")));
        }
        if ctx.config.components.image_acceleration.enabled
            && !services::is_running(ctx.host, "containerd-stargz-grpc")
        {
            return Ok(Decision::Run(format!("{STARGZ_BIN} not running")));
        }
        let mut found = present(ctx);
        // A GPU alone, without NVIDIA's driver and toolkit, is only seen:
        // knit installs neither, nor the device plugin, so nothing ran.
        if wanted == ["gpu"] && !ctx.host.exists(render::NVIDIA_RUNTIME) {
            return Ok(Decision::Skip(format!(
                "{}; knit installs no NVIDIA driver, container toolkit or device plugin: \
                 install them and the next init reports the GPU in place",
                found.join("; ")
            )));
        }
        if ctx.config.components.image_acceleration.enabled {
            found.push(format!("{STARGZ_BIN} running"));
        }
        Ok(Decision::Done(format!(
            "{} in place: {}",
            wanted.join(", "),
            found.join("; ")
        )))
    }

    fn run(&self, ctx: &mut Ctx) -> Result<String> {
        let problems = problems(ctx);
        if !problems.is_empty() {
            return Err(fail(problems.join("; ")));
        }
        let mut done = present(ctx);
        if ctx.config.components.image_acceleration.enabled {
            done.push(install_stargz(ctx)?);
        }
        ctx.host.log.line(SCOPE, &done.join("; "));
        Ok(done.join("; "))
    }
}

/// What the configured GPU and SGX components found on this machine.
fn present(ctx: &Ctx) -> Vec<String> {
    let c = &ctx.config.components;
    let mut found = Vec::new();
    if c.gpu.enabled {
        let gpus = nvidia_devices(ctx.host);
        // knit does not ship the NVIDIA driver or container toolkit: say so.
        let toolkit = if ctx.host.exists(render::NVIDIA_RUNTIME) {
            "present".to_string()
        } else {
            format!(
                "absent, install the NVIDIA driver and container toolkit for {}",
                render::NVIDIA_RUNTIME
            )
        };
        found.push(format!(
            "{} NVIDIA GPU(s) at {}; containerd runtime `nvidia` configured ({toolkit})",
            gpus.len(),
            gpus.join(", ")
        ));
    }
    if c.sgx.enabled {
        if let Some(device) = sgx_device(ctx.host) {
            found.push(format!("SGX enclave device {device} present"));
        }
    }
    found
}

pub struct OptionalComponentsPhase;
