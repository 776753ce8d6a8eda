//! `kubernetes-components`: get the Kubernetes package (the one preloaded
//! in the node image first, then the data-disk cache, then `kubernetes.dir`,
//! then `kubernetes.url`), verify it, cache it
//! on the data disk, install its binaries and render the kubelet's and
//! containerd's configuration. Starting them is `join`'s work.
//!
//! Cluster access (CA, bootstrap kubeconfig) is rendered by `join`, which
//! owns everything that talks to the cluster.

use crate::disk::mounts::mounted_at;
use crate::error::{AgentError, Context, Result};
use crate::host::Host;
use crate::package::{self, Package, Source};
use crate::phase::{Ctx, Decision, Phase};
use crate::render::{self, RuntimeOptions};
use crate::services;
use crate::tls;
use knit_api::{ErrorCode, NodeConfig, PhaseName};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

/// The package download: the mirror must answer within the connect bound
/// and never go quiet for the idle bound; a slow but moving transfer may
/// take up to the total (51 MiB at 60 KB/s is 15 minutes).
const DOWNLOAD_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const DOWNLOAD_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
const DOWNLOAD_TOTAL_TIMEOUT: Duration = Duration::from_secs(30 * 60);

const SCOPE: &str = PhaseName::KubernetesComponents.as_str();
/// What this phase installed, to verify on a rerun.
pub const STAMP_FILE: &str = "/var/lib/knit/kubernetes.json";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Stamp {
    version: String,
    /// Node-absolute path → sha256.
    binaries: BTreeMap<String, String>,
    /// Digest of every input of the rendered files.
    config_sha256: String,
}

pub struct KubernetesComponents;

/// The runtime options for this host: systemd cgroups only under systemd.
pub fn runtime_options(host: &Host, config: &NodeConfig) -> RuntimeOptions {
    RuntimeOptions::new(config, services::uses_systemd(host))
}

/// The rendered files, node-absolute path → (content, mode).
fn rendered_files(ctx: &Ctx) -> Result<BTreeMap<String, (String, u32)>> {
    let host = ctx.host;
    let options = runtime_options(host, ctx.config);
    let mut files = BTreeMap::new();
    files.insert(
        render::KUBELET_CONFIG.to_string(),
        (
            render::kubelet_config(host, ctx.config, options)
                .map_err(|e| AgentError::new(ErrorCode::FailInstallComponents, e.to_string()))?,
            0o644,
        ),
    );
    files.insert(
        render::CUSTOMIZED_ARGS.to_string(),
        (render::customized_args_file(ctx.config), 0o644),
    );
    if !ctx.config.has_runtime() {
        // `runtime: none`: nothing of containerd's is written.
        return Ok(files);
    }
    files.insert(
        render::CONTAINERD_CONFIG.to_string(),
        (
            render::containerd_config(host, &ctx.config.containerd, options),
            0o644,
        ),
    );
    // Mirrors at the control plane's address (its registry of system
    // images) are verified with its CA, written beside containerd's config.
    let ca = ctx.config.cluster.control_plane_ca_cert.as_deref();
    let ca_file = host.host_path(render::CONTROL_PLANE_REGISTRY_CA);
    let control_plane = ca
        .and(ctx.config.cluster.report_url.as_deref())
        .and_then(render::url_origin)
        .map(|origin| render::ControlPlaneMirror {
            origin,
            ca_file: &ca_file,
        });
    let mut names_ca = false;
    for (registry, text) in render::registry_hosts(&ctx.config.containerd, control_plane)? {
        names_ca |= text.contains(&ca_file);
        files.insert(
            format!("{}/{registry}/hosts.toml", render::CONTAINERD_CERTS_D),
            (text, 0o644),
        );
    }
    if let (true, Some(ca)) = (names_ca, ca) {
        files.insert(
            render::CONTROL_PLANE_REGISTRY_CA.to_string(),
            (ca.to_string(), 0o644),
        );
    }
    Ok(files)
}

fn config_digest(ctx: &Ctx) -> Result<String> {
    let files = rendered_files(ctx)?;
    let mut hasher = Sha256::new();
    for (path, (text, mode)) in &files {
        hasher.update(format!("{path}\0{mode}\0{}\0", text.len()));
        hasher.update(text.as_bytes());
    }
    Ok(hex::encode(hasher.finalize()))
}

fn read_stamp(host: &Host) -> Option<Stamp> {
    serde_json::from_str(&host.read(STAMP_FILE)?).ok()
}

/// The stamp, if the wanted version's binaries are installed intact.
fn intact_binaries(ctx: &Ctx) -> std::result::Result<Stamp, String> {
    let version = &ctx.config.kubernetes.version;
    let Some(stamp) = read_stamp(ctx.host) else {
        return Err(format!("Kubernetes {version} is not installed"));
    };
    if &stamp.version != version {
        return Err(format!(
            "installed Kubernetes {}, wanted {version}",
            stamp.version
        ));
    }
    for (path, want) in &stamp.binaries {
        match package::sha256_file(&ctx.host.path(path)) {
            Ok(got) if &got == want => {}
            Ok(_) => return Err(format!("{path} was modified")),
            Err(e) => return Err(format!("{path}: {e}")),
        }
    }
    Ok(stamp)
}

/// Why the installed state differs from the wanted one, if it does.
fn installed_state_problem(ctx: &Ctx) -> Result<Option<String>> {
    let stamp = match intact_binaries(ctx) {
        Ok(stamp) => stamp,
        Err(reason) => return Ok(Some(reason)),
    };
    let files = rendered_files(ctx)?;
    for (path, (text, _)) in &files {
        if ctx.host.read(path).as_deref() != Some(text.as_str()) {
            return Ok(Some(format!("{path} differs from the configuration")));
        }
    }
    if stamp.config_sha256 != config_digest(ctx)? {
        return Ok(Some(
            "the kubelet/containerd configuration changed".to_string(),
        ));
    }
    Ok(None)
}

impl Phase for KubernetesComponents {
    fn name(&self) -> PhaseName {
        PhaseName::KubernetesComponents
    }

    fn inspect(&self, ctx: &Ctx) -> Result<Decision> {
        Ok(match installed_state_problem(ctx)? {
            Some(reason) => Decision::Run(reason),
            None => Decision::Done(format!(
                "Kubernetes {} installed and configured",
                ctx.config.kubernetes.version
            )),
        })
    }

    fn run(&self, ctx: &mut Ctx) -> Result<String> {
        let host = ctx.host;
        let version = ctx.config.kubernetes.version.clone();
        // Only the configuration changed: no need to fetch the package again.
        if let Ok(stamp) = intact_binaries(ctx) {
            let rendered = configure(ctx, &stamp.binaries)?;
            return Ok(format!(
                "Kubernetes {version} already installed; rendered {rendered} files"
            ));
        }
        let target = &ctx.config.data_disk.mount_target;
        let cache_abs = package::cache_dir(target);
        // Only a mounted data disk keeps the cache (and its snapshots carry
        // it); a package headed there is unpacked beside it directly.
        let caching = mounted_at(&host.host_path(target)).is_some();
        let unpack_to = if caching {
            host.path(&package::cache_staging(&cache_abs))
        } else {
            host.path(&format!("{}/kubernetes-{version}", package::STAGING_DIR))
        };
        // The image's preloaded package first: it is already in the host's
        // page cache and its binaries already in place.
        let preloaded = if package::has_preloaded(host) {
            let want = ctx.config.kubernetes.sha256.as_deref();
            package::check_preloaded(host, &version, want)
                .inspect(|_| {
                    host.log.line(
                        SCOPE,
                        &format!(
                            "using kubernetes {version} preloaded in the image ({})",
                            package::PRELOAD_DIR
                        ),
                    )
                })
                .inspect_err(|why| host.log.line(SCOPE, why))
                .ok()
        } else {
            None
        };
        let mut package = match preloaded {
            Some(package) => package,
            None => cached_or_fetched(ctx, &cache_abs, &unpack_to)?,
        };
        let same_in_cache = package.source == Source::Preloaded
            && package::cache_holds(host, &cache_abs, &version, &package.tarball_sha256);
        if same_in_cache {
            host.log.line(
                SCOPE,
                &format!("the data-disk cache {cache_abs} holds the same package: kept"),
            );
        } else if package.source != Source::Cache {
            if caching {
                match package::write_cache(host, &cache_abs, &package) {
                    Ok(dir) => {
                        host.log.line(
                            SCOPE,
                            &format!("cached kubernetes {version} in {cache_abs}"),
                        );
                        package.dir = dir;
                    }
                    Err(e) => host
                        .log
                        .line(SCOPE, &format!("cannot write the cache (continuing): {e}")),
                }
            } else {
                host.log.line(
                    SCOPE,
                    &format!("no data disk mounted at {target}: package not cached"),
                );
            }
        }
        let result = install(ctx, &package);
        // An unpacked copy outside the cache is only needed until the
        // binaries are installed.
        if package.dir == unpack_to {
            let _ = std::fs::remove_dir_all(&unpack_to);
        }
        result
    }
}

/// The package from the data-disk cache, else fetched (`kubernetes.dir`,
/// then `kubernetes.url`) and unpacked into `unpack_to`.
fn cached_or_fetched(ctx: &mut Ctx, cache_abs: &str, unpack_to: &Path) -> Result<Package> {
    let host = ctx.host;
    let version = ctx.config.kubernetes.version.clone();
    Ok(match package::check_cache(host, cache_abs, &version) {
        Ok(mut package) if package.source == Source::HandMadeCache => {
            host.log.line(
                    SCOPE,
                    &format!(
                        "using cached kubernetes {version} from {cache_abs}: made by hand (no {}); \
                         checked against its {}: version {version}, {} files present with matching sha256",
                        package::CACHE_MANIFEST,
                        package::PACKAGE_MANIFEST,
                        package.manifest.files.len()
                    ),
                );
            match package::adopt_hand_made_cache(&package) {
                Ok(()) => host.log.line(
                    SCOPE,
                    &format!(
                        "wrote {cache_abs}/{} for the hand-made cache",
                        package::CACHE_MANIFEST
                    ),
                ),
                Err(e) => host.log.line(
                    SCOPE,
                    &format!("cannot write {} (continuing): {e}", package::CACHE_MANIFEST),
                ),
            }
            ctx.journal.package_cache_hit = Some(true);
            package.source = Source::Cache;
            package
        }
        Ok(package) => {
            host.log.line(
                SCOPE,
                &format!("using cached kubernetes {version} from {cache_abs}"),
            );
            ctx.journal.package_cache_hit = Some(true);
            package
        }
        Err(reason) => {
            host.log
                .line(SCOPE, &format!("check cached kubernetes failed: {reason}"));
            ctx.journal.package_cache_hit = Some(false);
            let package = fetch(ctx, unpack_to)?;
            if let Source::Download { bytes, .. } = &package.source {
                ctx.journal.package_bytes_downloaded += bytes;
            }
            package
        }
    })
}

/// Where the kubelet (stand-in) reads the system images to ensure.
pub const IMAGE_LIST: &str = "/etc/kubernetes/images.txt";

/// Installs the package's `images.txt` for the kubelet; a failure is logged
/// only (the images are then pulled on first use).
fn install_image_list(ctx: &Ctx, package: &Package) {
    let host = ctx.host;
    let src = package.dir.join("images.txt");
    if !src.is_file() {
        return;
    }
    let dest = host.path(IMAGE_LIST);
    let done = host
        .ledger()
        .note_file(IMAGE_LIST)
        .map_err(|e| std::io::Error::other(e.message))
        .and_then(|()| dest.parent().map_or(Ok(()), std::fs::create_dir_all))
        .and_then(|()| std::fs::copy(&src, &dest).map(|_| ()));
    if let Err(e) = done {
        host.log.line(
            SCOPE,
            &format!("cannot install {IMAGE_LIST} (continuing): {e}"),
        );
    }
}

pub const CNI_CONF_DIR: &str = "/etc/cni/net.d";

/// Installs the package's default network configuration (`cni/net.d/*`)
/// unless a network plugin already put one in place: on a real cluster the
/// network plugin's DaemonSet owns `/etc/cni/net.d`, on the local cloud the
/// package's bridge configuration stands in for it.
fn install_cni_config(ctx: &Ctx, package: &Package) -> Result<()> {
    let host = ctx.host;
    let src = package.dir.join("cni/net.d");
    let Ok(entries) = std::fs::read_dir(&src) else {
        return Ok(());
    };
    let dest = host.path(CNI_CONF_DIR);
    let has_config = std::fs::read_dir(&dest).is_ok_and(|d| {
        d.flatten().any(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.ends_with(".conf") || name.ends_with(".conflist") || name.ends_with(".json")
        })
    });
    if has_config {
        host.log.line(
            SCOPE,
            &format!("{CNI_CONF_DIR} already holds a network configuration: kept"),
        );
        return Ok(());
    }
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let content = std::fs::read(entry.path()).map_err(|e| {
            AgentError::new(
                ErrorCode::FailInstallComponents,
                format!("read cni/net.d/{name}: {e}"),
            )
        })?;
        host.write_file(&format!("{CNI_CONF_DIR}/{name}"), &content, 0o644)?;
        host.log.line(
            SCOPE,
            &format!("installed network configuration {CNI_CONF_DIR}/{name}"),
        );
    }
    Ok(())
}

/// The package from `kubernetes.dir`, else `kubernetes.url`, unpacked (if it
/// comes as a tarball) into `unpack_to`.
fn fetch(ctx: &Ctx, unpack_to: &Path) -> Result<Package> {
    let k = &ctx.config.kubernetes;
    if let Some(dir) = &k.dir {
        if let Some(package) = package::from_dir(ctx.host, k, dir, unpack_to)? {
            return Ok(package);
        }
        let missing = format!(
            "kubernetes.dir {dir} holds neither {} nor {}/{}",
            k.tarball_name(),
            package::PACKAGE_PREFIX,
            package::PACKAGE_MANIFEST
        );
        if k.url.is_none() {
            return Err(AgentError::new(ErrorCode::FailDownloadKubernetes, missing));
        }
        ctx.host
            .log
            .line(SCOPE, &format!("{missing}: trying kubernetes.url"));
    }
    let Some(url) = &k.url else {
        return Err(AgentError::new(
            ErrorCode::FailDownloadKubernetes,
            "no Kubernetes package source: set kubernetes.url (a mirror) or kubernetes.dir (a local directory)",
        ));
    };
    // An https mirror may be the control plane, whose CA the config carries.
    let agent = tls::download_agent(
        ctx.config.cluster.control_plane_ca_cert.as_deref(),
        DOWNLOAD_CONNECT_TIMEOUT,
        DOWNLOAD_IDLE_TIMEOUT,
        DOWNLOAD_TOTAL_TIMEOUT,
    )?;
    package::download(ctx.host, k, url, &agent, unpack_to)
}

fn install(ctx: &Ctx, package: &Package) -> Result<String> {
    let host = ctx.host;
    let binaries = package::install_binaries(host, package)?;
    install_image_list(ctx, package);
    install_cni_config(ctx, package)?;
    if ctx.config.has_runtime() && host.find_program("containerd").is_none() {
        return Err(AgentError::new(
            ErrorCode::FailInstallComponents,
            format!(
                "containerd not found: the package from {} has no bin/containerd and none is installed \
                 in /usr/local/bin, /usr/bin or /usr/sbin{}",
                package.source,
                if host.is_live() { String::new() } else { format!(" under {}", host.root().display()) }
            ),
        ));
    }
    let rendered = configure(ctx, &binaries)?;
    let names: Vec<&str> = binaries
        .keys()
        .filter_map(|p| p.rsplit('/').next())
        .collect();
    let from = match &package.source {
        Source::Download { url, bytes } => format!("{url} ({bytes} bytes)"),
        other => other.to_string(),
    };
    Ok(format!(
        "Kubernetes {} from {from}: installed {}; rendered {rendered} files",
        package.manifest.version,
        names.join(", "),
    ))
}

/// Writes the rendered files and the stamp; returns how many files.
fn configure(ctx: &Ctx, binaries: &BTreeMap<String, String>) -> Result<usize> {
    let host = ctx.host;
    for dir in [
        render::KUBELET_CERT_DIR,
        "/etc/kubernetes/manifests",
        "/var/log/knit",
    ] {
        host.create_dir(dir)?;
    }
    let files = rendered_files(ctx)?;
    remove_stale_registry_hosts(host, &files)?;
    for (path, (text, mode)) in &files {
        host.write_file(path, text.as_bytes(), *mode)
            .map_err(|e| AgentError::new(ErrorCode::FailInstallComponents, e.message))?;
    }
    let stamp = Stamp {
        version: ctx.config.kubernetes.version.clone(),
        binaries: binaries.clone(),
        config_sha256: config_digest(ctx)?,
    };
    let text = serde_json::to_vec_pretty(&stamp)
        .context(ErrorCode::FailInstallComponents, || {
            "encode install stamp".to_string()
        })?;
    host.write_file(STAMP_FILE, &text, 0o644)?;
    Ok(files.len())
}

/// Removes `certs.d/<registry>` directories this agent wrote for registries
/// no longer configured; directories written by others are kept.
fn remove_stale_registry_hosts(host: &Host, files: &BTreeMap<String, (String, u32)>) -> Result<()> {
    let certs_d = host.path(render::CONTAINERD_CERTS_D);
    let Ok(entries) = std::fs::read_dir(&certs_d) else {
        return Ok(());
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let abs = format!("{}/{name}/hosts.toml", render::CONTAINERD_CERTS_D);
        if files.contains_key(&abs) {
            continue;
        }
        let ours = host
            .read(&abs)
            .is_some_and(|text| text.starts_with(render::MANAGED_HEADER));
        if ours {
            std::fs::remove_dir_all(entry.path())
                .context(ErrorCode::FailInstallComponents, || {
                    format!("remove stale {}", entry.path().display())
                })?;
        }
    }
    Ok(())
}
