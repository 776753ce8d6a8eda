//! The control plane's own image registry: the system images its nodes
//! pull (`images.txt`, [`crate::mirror::DEFAULT_SYSTEM_IMAGES`]) built
//! here with no network (`knit_registry::oci`: a real pause process and
//! stand-ins for the rest) into `<state>/system-images`, an OCI image
//! layout, and served read-only at `/v2/` on the server's own address
//! (`http::registry`).
//!
//! The rule for pools (docs/spec.md §4.2 containerd, docs/images.md): on the local
//! cloud, every registry host knit serves images of (`registry.k8s.io`,
//! `docker.io`) is mirrored to the control plane
//! (`https://<advertise>/`) unless the pool's
//! `spec.containerd.registryMirrors` names that host itself (with other
//! mirrors, or upstream's own URL to pull from it alone). The agent trusts
//! the control plane's CA for that mirror only.

use crate::control::ControlPlane;
use crate::error::{Result, ServerError};
use knit_api::NodeConfig;
use knit_registry::oci::{Layout, Reference};
use std::path::{Path, PathBuf};

/// `<state>/system-images`: the OCI image layout served at `/v2/`.
pub fn layout_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("system-images")
}

/// The references served: the package's system images.
pub fn served() -> Vec<String> {
    crate::mirror::DEFAULT_SYSTEM_IMAGES
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// The registry hosts those images come from (sorted, once each).
pub fn served_hosts() -> Vec<String> {
    let mut hosts: Vec<String> = served()
        .iter()
        .filter_map(|r| Reference::parse(r).ok().map(|r| r.host))
        .collect();
    hosts.sort();
    hosts.dedup();
    hosts
}

/// One build at a time in this process (several servers may share it in
/// tests); the layout's own writes are atomic renames, so another process
/// building the same bytes at once is harmless.
static BUILD: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn registry_err(e: knit_registry::RegistryError) -> ServerError {
    ServerError::Internal(format!("system images ({}): {e}", e.code()))
}

/// The layout under `state_dir`, built first when it is missing or lacks
/// one of the served images (a few hundred kilobytes, milliseconds).
pub fn ensure_layout(state_dir: &Path) -> Result<Layout> {
    let dir = layout_dir(state_dir);
    let complete = |l: &Layout| {
        served()
            .iter()
            .all(|r| Reference::parse(r).is_ok_and(|r| l.entries.iter().any(|e| e.reference == r)))
    };
    if let Ok(l) = Layout::open(&dir) {
        if complete(&l) {
            return Ok(l);
        }
    }
    let _one = BUILD.lock().unwrap_or_else(|p| p.into_inner());
    if let Ok(l) = Layout::open(&dir) {
        if complete(&l) {
            return Ok(l);
        }
    }
    let entries = knit_registry::oci::build_layout(&dir, &served()).map_err(registry_err)?;
    for e in &entries {
        tracing::info!(image = %e.reference.full(), digest = %e.digest, dir = %dir.display(), "system image built");
    }
    Layout::open(&dir).map_err(registry_err)
}

/// Adds the control plane's registry as the mirror of each served host the
/// pool does not name (see the module's rule), on the local cloud only.
pub fn default_mirrors(provider: &str, advertise_url: &str, config: &mut NodeConfig) {
    if provider != "local" {
        return;
    }
    for host in served_hosts() {
        config
            .containerd
            .registry_mirrors
            .entry(host)
            .or_insert_with(|| vec![advertise_url.to_string()]);
    }
}

/// [`default_mirrors`] with this server's provider and address.
pub fn apply_default_mirrors(cp: &ControlPlane, config: &mut NodeConfig) {
    if let Some(p) = &cp.provider {
        default_mirrors(p.name(), &cp.advertise_url, config);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_pools_mirror_to_the_control_plane_unless_they_name_the_host() {
        let url = "https://10.213.0.1:7443";
        let mut c = NodeConfig::default();
        default_mirrors("local", url, &mut c);
        assert_eq!(
            c.containerd.registry_mirrors.keys().collect::<Vec<_>>(),
            ["docker.io", "registry.k8s.io"]
        );
        assert_eq!(c.containerd.registry_mirrors["registry.k8s.io"], [url]);
        // The pool's own mirrors for a host are kept as written.
        let mut c = NodeConfig::default();
        c.containerd
            .registry_mirrors
            .insert("docker.io".into(), vec!["http://10.0.0.9:5000".into()]);
        c.containerd.registry_mirrors.insert(
            "registry.k8s.io".into(),
            vec!["https://registry.k8s.io".into()],
        );
        let before = c.clone();
        default_mirrors("local", url, &mut c);
        assert_eq!(c, before);
        // A pool naming one host keeps knit's mirror for the other.
        let mut c = NodeConfig::default();
        c.containerd
            .registry_mirrors
            .insert("docker.io".into(), vec!["http://10.0.0.9:5000".into()]);
        default_mirrors("local", url, &mut c);
        assert_eq!(
            c.containerd.registry_mirrors["docker.io"],
            ["http://10.0.0.9:5000"]
        );
        assert_eq!(c.containerd.registry_mirrors["registry.k8s.io"], [url]);
        // Other providers: nothing added.
        let mut c = NodeConfig::default();
        default_mirrors("ecs", url, &mut c);
        default_mirrors("qemu", url, &mut c);
        assert!(c.containerd.registry_mirrors.is_empty());
    }

    #[test]
    fn the_layout_is_built_once_and_rebuilt_when_incomplete() {
        let dir = tempfile::tempdir().unwrap();
        let l = ensure_layout(dir.path()).unwrap();
        assert_eq!(l.entries.len(), served().len());
        let pause = l
            .manifest(Some("registry.k8s.io"), "pause", "3.10")
            .unwrap()
            .clone();
        let index = layout_dir(dir.path()).join("index.json");
        std::fs::write(&index, br#"{"schemaVersion":2,"manifests":[]}"#).unwrap();
        let again = ensure_layout(dir.path()).unwrap();
        assert_eq!(
            again.manifest(Some("registry.k8s.io"), "pause", "3.10"),
            Some(&pause)
        );
    }
}
