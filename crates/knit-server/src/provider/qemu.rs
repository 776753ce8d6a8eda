//! QEMU VMs (knit-qemu) as a [`Provider`]: every instance a real VM booted
//! from the node OS image, on the local cloud's bridge (same subnet,
//! metadata endpoint, mirror and registry as sandboxes). knit-qemu's API is
//! blocking (processes, sockets, files), so every call runs on tokio's
//! blocking pool, bounded by a timeout.

use crate::error::{Result, ServerError};
use crate::provider::{
    InstanceTemplate, Provider, ProviderInstance, ProviderSnapshot, CALL_TIMEOUT, CREATE_TIMEOUT,
    READ_FILE_MAX_BYTES, READ_FILE_TIMEOUT, TAG_NAME,
};
use async_trait::async_trait;
use knit_qemu::{DiskSpec, Interface, Machines, QemuError, Vm, VmTemplate};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How long a reboot may take to come back (a TCG boot takes minutes).
const REBOOT_TIMEOUT: Duration = Duration::from_secs(240);

pub struct QemuProvider {
    machines: Arc<Machines>,
}

/// knit-qemu's settings for a server whose local cloud is `local`: the
/// local cloud's bridge and subnet; `KNIT_QEMU_STATE_DIR` (default
/// `/var/lib/knit/qemu`), `KNIT_QEMU_ACCEL` (auto | kvm | tcg),
/// `KNIT_QEMU_MEMORY_MIB` (default 1024).
pub fn qemu_config(local: &knit_local::Config) -> Result<knit_qemu::Config> {
    let mut cfg = knit_qemu::Config {
        bridge: local.bridge.clone(),
        subnet: local.subnet.clone(),
        ..knit_qemu::Config::default()
    };
    if let Some(dir) = std::env::var_os("KNIT_QEMU_STATE_DIR").filter(|d| !d.is_empty()) {
        cfg.state_dir = PathBuf::from(dir);
    }
    if let Ok(a) = std::env::var("KNIT_QEMU_ACCEL") {
        cfg.accel = knit_qemu::Accel::parse(&a).ok_or_else(|| ServerError::Provider {
            provider: "qemu".into(),
            message: format!("KNIT_QEMU_ACCEL: value {a:?} must be auto, kvm or tcg"),
        })?;
    }
    if let Ok(m) = std::env::var("KNIT_QEMU_MEMORY_MIB") {
        cfg.memory_mib = m
            .parse()
            .ok()
            .filter(|m| (256..=1 << 20).contains(m))
            .ok_or_else(|| ServerError::Provider {
                provider: "qemu".into(),
                message: format!(
                    "KNIT_QEMU_MEMORY_MIB: value {m:?} must be a number from 256 to 1048576"
                ),
            })?;
    }
    Ok(cfg)
}

impl QemuProvider {
    /// Opens the VMs of `qemu.state_dir`; the local cloud's network (bridge,
    /// metadata server) is made first, and its instances' addresses are
    /// never given to a VM.
    pub fn new(local: knit_local::Config, mut qemu: knit_qemu::Config) -> Result<QemuProvider> {
        let cloud =
            Arc::new(
                knit_local::Cloud::open(local).map_err(|e| ServerError::Provider {
                    provider: "qemu".into(),
                    message: format!("the local cloud's network: {e} [{}]", e.code()),
                })?,
            );
        cloud.network_up().map_err(|e| ServerError::Provider {
            provider: "qemu".into(),
            message: format!("the local cloud's network: {e} [{}]", e.code()),
        })?;
        let sandboxes = cloud.clone();
        qemu.reserved = Some(Arc::new(move || {
            sandboxes
                .list()
                .map(|l| {
                    l.iter()
                        .filter_map(|i| i.record.private_ip.parse().ok())
                        .collect()
                })
                .unwrap_or_default()
        }));
        let machines = Machines::open(qemu).map_err(err)?;
        Ok(QemuProvider {
            machines: Arc::new(machines),
        })
    }

    async fn blocking<T: Send + 'static>(
        &self,
        what: &str,
        limit: Duration,
        f: impl FnOnce(&Machines) -> knit_qemu::Result<T> + Send + 'static,
    ) -> Result<T> {
        let machines = self.machines.clone();
        let task = tokio::task::spawn_blocking(move || f(&machines));
        match tokio::time::timeout(limit, task).await {
            Err(_) => Err(ServerError::Provider {
                provider: "qemu".into(),
                message: format!("{what} did not finish within {} s", limit.as_secs()),
            }),
            Ok(joined) => joined
                .map_err(|e| ServerError::Internal(format!("qemu task: {e}")))?
                .map_err(err),
        }
    }
}

fn err(e: QemuError) -> ServerError {
    ServerError::Provider {
        provider: "qemu".to_string(),
        message: format!("{e} [{}]", e.code()),
    }
}

/// A pool's `image` as an OS image directory: `debian-12` (the pools'
/// default) and `host` (a VM cannot boot the host's root) mean the node OS
/// image `knit image build` made.
fn image_dir(image: &str) -> PathBuf {
    if image == "host" || image == knit_api::DEFAULT_IMAGE {
        knit_local::image::images_dir().join(knit_local::image::NAME)
    } else {
        PathBuf::from(image)
    }
}

/// knit-qemu's template for a pool's instance.
pub fn vm_template(t: &InstanceTemplate) -> VmTemplate {
    VmTemplate {
        name: t.name.clone(),
        image: image_dir(&t.image),
        system_disk_bytes: (t.system_disk_gib.max(0) as u64) << 30,
        disks: t
            .data_disks
            .iter()
            .map(|d| DiskSpec {
                // A disk from a snapshot takes the snapshot's size.
                size_bytes: d
                    .snapshot_id
                    .is_none()
                    .then_some((d.size_gib.max(0) as u64) << 30),
                interface: if d.interface == "nvme" {
                    Interface::Nvme
                } else {
                    Interface::Virtio
                },
                snapshot: d.snapshot_id.clone(),
            })
            .collect(),
        user_data: t.user_data.clone(),
        tags: t.tags.clone(),
        ..Default::default()
    }
}

fn view(vm: &Vm) -> ProviderInstance {
    let r = &vm.record;
    let mut state = r.state.to_string();
    if state == "running" && !vm.alive {
        // Recorded as running but its QEMU is gone (host crash, kill).
        state = "dead".to_string();
    }
    ProviderInstance {
        id: r.id.clone(),
        name: r
            .tags
            .get(TAG_NAME)
            .cloned()
            .or_else(|| Some(r.name.clone())),
        state,
        ip: Some(r.ip.clone()),
        tags: r.tags.clone(),
    }
}

#[async_trait]
impl Provider for QemuProvider {
    fn name(&self) -> &str {
        "qemu"
    }

    fn gateway(&self) -> Option<std::net::IpAddr> {
        Some(self.machines.gateway().into())
    }

    async fn create(&self, template: &InstanceTemplate) -> Result<ProviderInstance> {
        let t = vm_template(template);
        self.blocking("creating a VM", CREATE_TIMEOUT, move |m| m.create(&t))
            .await
            .map(|vm| view(&vm))
    }

    async fn get(&self, id: &str) -> Result<Option<ProviderInstance>> {
        let id = id.to_string();
        let found = self
            .blocking("describing a VM", CALL_TIMEOUT, move |m| {
                match m.describe(&id) {
                    Ok(vm) => Ok(Some(vm)),
                    Err(QemuError::NotFound { .. }) => Ok(None),
                    Err(e) => Err(e),
                }
            })
            .await?;
        Ok(found.as_ref().map(view))
    }

    async fn list(&self) -> Result<Vec<ProviderInstance>> {
        let vms = self
            .blocking("listing VMs", CALL_TIMEOUT, |m| m.list())
            .await?;
        Ok(vms.iter().map(view).collect())
    }

    async fn start(&self, id: &str) -> Result<()> {
        let id = id.to_string();
        self.blocking("starting a VM", CALL_TIMEOUT, move |m| m.start(&id))
            .await
            .map(|_| ())
    }

    async fn stop(&self, id: &str) -> Result<()> {
        let id = id.to_string();
        self.blocking("stopping a VM", CALL_TIMEOUT, move |m| m.stop(&id))
            .await
            .map(|_| ())
    }

    async fn reboot(&self, id: &str) -> Result<()> {
        let id = id.to_string();
        self.blocking("rebooting a VM", CALL_TIMEOUT, move |m| {
            m.reboot(&id, REBOOT_TIMEOUT)
        })
        .await
    }

    async fn reimage(&self, id: &str, image: &str, user_data: &str) -> Result<()> {
        let (id, dir, user_data) = (id.to_string(), image_dir(image), user_data.to_string());
        // knit-qemu checks the image (and makes its base disk) before it stops the VM.
        self.blocking("re-imaging a VM", CREATE_TIMEOUT, move |m| {
            m.reimage(&id, Some(&dir), &user_data)
        })
        .await
        .map(|_| ())
    }

    async fn check_image(&self, image: &str) -> Result<()> {
        knit_qemu::base::check_image(&image_dir(image)).map_err(|e| ServerError::Provider {
            provider: "qemu".into(),
            message: format!("image {image:?}: {e}"),
        })
    }

    async fn rename(&self, id: &str, name: &str) -> Result<()> {
        let (id, name) = (id.to_string(), name.to_string());
        self.blocking("renaming a VM", CALL_TIMEOUT, move |m| m.rename(&id, &name))
            .await
            .map(|_| ())
    }

    async fn set_password(&self, id: &str, password: &str) -> Result<()> {
        let (id, password) = (id.to_string(), password.to_string());
        // knit-qemu's errors never carry the password.
        self.blocking("setting a password", CALL_TIMEOUT, move |m| {
            m.set_password(&id, &password)
        })
        .await
    }

    async fn delete(&self, id: &str) -> Result<()> {
        let id = id.to_string();
        self.blocking("deleting a VM", CALL_TIMEOUT, move |m| m.delete(&id))
            .await
    }

    async fn read_file(&self, id: &str, path: &str) -> Result<Vec<u8>> {
        self.read_file_limited(id, path, READ_FILE_MAX_BYTES, READ_FILE_TIMEOUT)
            .await
    }

    /// Bounded by the guest agent: chunks are read until the cap is passed,
    /// the session's socket gives up at the limit.
    async fn read_file_limited(
        &self,
        id: &str,
        path: &str,
        max_bytes: usize,
        limit: Duration,
    ) -> Result<Vec<u8>> {
        let (id, path) = (id.to_string(), path.to_string());
        self.blocking("reading a file", limit + Duration::from_secs(5), move |m| {
            m.read_file(&id, &path, max_bytes, limit)
        })
        .await
    }

    async fn snapshot_create(
        &self,
        id: &str,
        data_disk_index: usize,
        name: &str,
    ) -> Result<ProviderSnapshot> {
        let (id, name) = (id.to_string(), name.to_string());
        let snap = self
            .blocking("snapshotting a disk", CREATE_TIMEOUT, move |m| {
                m.snapshot_create(&id, data_disk_index, Some(&name))
            })
            .await?;
        Ok(ProviderSnapshot {
            id: snap.id,
            size_bytes: snap.size_bytes,
        })
    }

    async fn snapshot_delete(&self, snapshot_id: &str) -> Result<()> {
        let id = snapshot_id.to_string();
        self.blocking("deleting a snapshot", CALL_TIMEOUT, move |m| {
            m.snapshot_delete(&id)
        })
        .await
    }

    async fn snapshots_named(&self, name: &str) -> Result<Vec<String>> {
        let name = name.to_string();
        let all = self
            .blocking("listing snapshots", CALL_TIMEOUT, |m| m.snapshots())
            .await?;
        Ok(all
            .into_iter()
            .filter(|s| s.name.as_deref() == Some(name.as_str()))
            .map(|s| s.id)
            .collect())
    }

    async fn exec(&self, id: &str, argv: &[String]) -> Result<(i32, Vec<u8>, Vec<u8>)> {
        let (id, argv) = (id.to_string(), argv.to_vec());
        let limit = CALL_TIMEOUT - Duration::from_secs(10);
        let out = self
            .blocking("running a command", CALL_TIMEOUT, move |m| {
                m.exec(&id, &argv, limit)
            })
            .await?;
        Ok((out.code, out.stdout, out.stderr))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::DiskTemplate;

    #[test]
    fn template_maps_pool_settings() {
        let t = InstanceTemplate {
            name: "workers-abcde".into(),
            instance_type: "ecs.g7.large".into(),
            image: "host".into(),
            system_disk_gib: 20,
            data_disks: vec![
                DiskTemplate {
                    size_gib: 40,
                    interface: "nvme".into(),
                    snapshot_id: None,
                },
                DiskTemplate {
                    size_gib: 0,
                    interface: "virtio".into(),
                    snapshot_id: Some("s-0123456789ab".into()),
                },
            ],
            user_data: "#!/bin/sh\n".into(),
            region: "local".into(),
            zone: None,
            vpc: "vpc-local".into(),
            tags: [(TAG_NAME.to_string(), "workers-abcde".to_string())]
                .into_iter()
                .collect(),
        };
        let v = vm_template(&t);
        assert_eq!(v.system_disk_bytes, 20 << 30);
        assert_eq!(v.disks[0].interface, Interface::Nvme);
        assert_eq!(v.disks[0].size_bytes, Some(40 << 30));
        assert_eq!(v.disks[1].size_bytes, None);
        assert_eq!(v.disks[1].snapshot.as_deref(), Some("s-0123456789ab"));
        assert!(v.image.ends_with(knit_local::image::NAME));
        // The pools' default image is the same node image, by absolute path.
        let v = vm_template(&InstanceTemplate {
            image: knit_api::DEFAULT_IMAGE.into(),
            ..t
        });
        assert_eq!(
            v.image,
            knit_local::image::images_dir().join(knit_local::image::NAME)
        );
    }
}
