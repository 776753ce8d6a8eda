//! QEMU VMs (knit-qemu) as a [`Provider`]: every instance a real VM booted
//! from the node OS image, on the local cloud's bridge (same subnet,
//! metadata endpoint, mirror and registry as sandboxes). knit-qemu's API is
//! blocking (processes, sockets, files), so every call runs on tokio's
//! blocking pool, bounded by a timeout.

use crate::error::{Result, ServerError};
use crate::provider::{
    InstanceTemplate, Provider, ProviderError, ProviderErrorKind, ProviderInstance,
    ProviderSnapshot, CALL_TIMEOUT, CREATE_TIMEOUT, READ_FILE_MAX_BYTES, READ_FILE_TIMEOUT,
    TAG_NAME,
};
use async_trait::async_trait;
use knit_qemu::{DiskSpec, Interface, Machines, QemuError, Vm, VmTemplate};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How long a reboot may take to come back (a TCG boot takes minutes).
const REBOOT_TIMEOUT: Duration = Duration::from_secs(240);

/// The tag that carries the pool's instance type on a VM knit made: a VM
/// has no cloud instance type of its own (every VM gets the provider's
/// memory and vCPUs), but add-existing's preflight compares it with the
/// pool's `instanceTypes`.
pub const TAG_INSTANCE_TYPE: &str = "knit.dev/instance-type";
/// A VM's instance type without that tag (made outside knit).
pub const DEFAULT_INSTANCE_TYPE: &str = "qemu";
/// Each file preflight reads from inside a VM (os-release, swaps).
const FACTS_FILE_TIMEOUT: Duration = Duration::from_secs(20);
const FACTS_FILE_MAX_BYTES: usize = 64 << 10;

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
        cfg.accel = knit_qemu::Accel::parse(&a).ok_or_else(|| {
            ProviderError::refused(
                "qemu",
                format!("KNIT_QEMU_ACCEL: value {a:?} must be auto, kvm or tcg"),
            )
        })?;
    }
    if let Ok(m) = std::env::var("KNIT_QEMU_MEMORY_MIB") {
        cfg.memory_mib = m
            .parse()
            .ok()
            .filter(|m| (256..=1 << 20).contains(m))
            .ok_or_else(|| {
                ProviderError::refused(
                    "qemu",
                    format!(
                        "KNIT_QEMU_MEMORY_MIB: value {m:?} must be a number from 256 to 1048576"
                    ),
                )
            })?;
    }
    Ok(cfg)
}

impl QemuProvider {
    /// Opens the VMs of `qemu.state_dir`; the local cloud's network (bridge,
    /// metadata server) is made first, and its instances' addresses are
    /// never given to a VM.
    pub fn new(local: knit_local::Config, mut qemu: knit_qemu::Config) -> Result<QemuProvider> {
        // The network is the local cloud's: its errors keep their kinds.
        let network = |e: knit_local::LocalError| {
            ProviderError::new(
                "qemu",
                super::local::kind_of(&e),
                e.code(),
                format!("the local cloud's network: {e} [{}]", e.code()),
            )
        };
        let cloud = Arc::new(knit_local::Cloud::open(local).map_err(network)?);
        cloud.network_up().map_err(network)?;
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
            Err(_) => Err(ProviderError::timed_out("qemu", what, limit).into()),
            Ok(joined) => joined
                .map_err(|e| ServerError::Internal(format!("qemu task: {e}")))?
                .map_err(err),
        }
    }
}

fn err(e: QemuError) -> ServerError {
    ProviderError::new("qemu", kind_of(&e), e.code(), format!("{e} [{}]", e.code())).into()
}

/// The kind of a QEMU VM's error. VMs have no per-type capacity, so none
/// is `Capacity`; a VM busy, between states or slow to answer may pass.
pub fn kind_of(e: &QemuError) -> ProviderErrorKind {
    match e {
        QemuError::NotFound { .. } => ProviderErrorKind::NotFound,
        QemuError::Busy { .. }
        | QemuError::WrongState { .. }
        | QemuError::Agent { .. }
        | QemuError::Qmp { .. }
        | QemuError::Timeout { .. }
        | QemuError::Io { .. }
        | QemuError::Boot { .. } => ProviderErrorKind::Transient,
        QemuError::NotRoot => ProviderErrorKind::Auth,
        QemuError::Invalid { .. } | QemuError::Command { .. } | QemuError::State { .. } => {
            ProviderErrorKind::Permanent
        }
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
        tags: {
            let mut tags = t.tags.clone();
            if !t.instance_type.is_empty() {
                tags.insert(TAG_INSTANCE_TYPE.to_string(), t.instance_type.clone());
            }
            tags
        },
        // knit's name is unique: a create repeated by a woken or a new
        // leader gets the VM the first one made.
        client_token: Some(t.name.clone()),
        ..Default::default()
    }
}

/// A VM's device names for its data disks, in order: virtio disks follow
/// the system disk (`vdb`, `vdc`, …), each NVMe disk is a controller of its
/// own (`nvme0n1`, `nvme1n1`, …); the order of the QEMU command line.
pub fn disk_devices(disks: &[knit_qemu::DiskRecord]) -> Vec<String> {
    let (mut virtio, mut nvme) = (0u8, 0u32);
    disks
        .iter()
        .map(|d| match d.interface {
            Interface::Virtio => {
                virtio = virtio.saturating_add(1);
                format!("vd{}", char::from(b'a' + virtio.min(25)))
            }
            Interface::Nvme => {
                nvme += 1;
                format!("nvme{}n1", nvme - 1)
            }
        })
        .collect()
}

/// `ID`, `VERSION_ID`, `PRETTY_NAME` of an os-release text.
fn os_release(text: &str) -> knit_local::OsInfo {
    let mut os = knit_local::OsInfo::default();
    for line in text.lines() {
        if let Some((k, v)) = line.split_once('=') {
            let v = v.trim().trim_matches('"').to_string();
            match k.trim() {
                "ID" => os.id = v,
                "VERSION_ID" => os.version_id = v,
                "PRETTY_NAME" => os.pretty_name = v,
                _ => {}
            }
        }
    }
    os
}

/// What add-existing's preflight reads about a VM. The VM sits on the
/// local cloud's network, so its account, region, zone, VPC, vSwitch,
/// security group and ENI limits are the local cloud's (the same simulated
/// objects a sandbox reports); the OS and swap are read from inside
/// (`os_release`, `swaps`: `None` when the guest agent did not answer, and
/// the OS is then unknown); the disks and the password from the record.
pub fn vm_facts(
    vm: &Vm,
    os_release_text: Option<&str>,
    swaps: Option<&str>,
) -> crate::preflight::InstanceFacts {
    use crate::preflight::{DiskFacts, RuleFacts, SecurityGroupFacts};
    let r = &vm.record;
    let a = knit_local::Attributes::default();
    let os = os_release_text.map(os_release).unwrap_or_default();
    let devices = disk_devices(&r.disks);
    let view = view(vm);
    crate::preflight::InstanceFacts {
        id: r.id.clone(),
        name: view.name.unwrap_or_else(|| r.name.clone()),
        state: view.state,
        ip: Some(r.ip.clone()),
        instance_type: r
            .tags
            .get(TAG_INSTANCE_TYPE)
            .cloned()
            .unwrap_or_else(|| DEFAULT_INSTANCE_TYPE.to_string()),
        account_id: a.account_id,
        region_id: a.region_id,
        zone_id: a.zone_id,
        vpc_id: a.vpc_id,
        v_switch_id: a.v_switch_id,
        security_groups: a
            .security_groups
            .iter()
            .map(|g| SecurityGroupFacts {
                id: g.id.clone(),
                kind: match g.kind {
                    knit_local::SecurityGroupType::Normal => "normal".into(),
                    knit_local::SecurityGroupType::Enterprise => "enterprise".into(),
                },
                rules: g
                    .rules
                    .iter()
                    .map(|x| RuleFacts {
                        direction: x.direction.clone(),
                        protocol: x.protocol.clone(),
                        port_range: x.port_range.clone(),
                        cidr: x.cidr.clone(),
                        policy: x.policy.clone(),
                    })
                    .collect(),
            })
            .collect(),
        // One tap: one network interface.
        eni_count: 1,
        max_enis: a.instance_type_limits.max_enis,
        max_ips_per_eni: a.instance_type_limits.max_ips_per_eni,
        ram_role: None,
        ipv6: false,
        // /proc/swaps has a header line, then one line per active swap.
        swap: swaps.is_some_and(|s| s.lines().skip(1).any(|l| !l.trim().is_empty())),
        os_id: os.id,
        os_version: os.version_id,
        os_name: os.pretty_name,
        tags: r.tags.clone(),
        password_login: r.password_set_at.is_some(),
        data_disks: r
            .disks
            .iter()
            .zip(devices)
            .map(|(d, device)| DiskFacts {
                id: d.id.clone(),
                device: Some(device),
                size_bytes: d.size_bytes,
            })
            .collect(),
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

    fn default_zone(&self) -> Option<String> {
        // The local cloud's instance attributes, unless a template names one.
        Some(knit_local::model::Attributes::default().zone_id)
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
        knit_qemu::base::check_image(&image_dir(image))
            .map_err(|e| ProviderError::refused("qemu", format!("image {image:?}: {e}")).into())
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

    /// From the record, and from inside through the guest agent when the
    /// VM runs (its OS, its swap).
    async fn facts(&self, id: &str) -> Result<crate::preflight::InstanceFacts> {
        let id = id.to_string();
        self.blocking("reading a VM's facts", CALL_TIMEOUT, move |m| {
            let vm = m.describe(&id)?;
            let inside = |path: &str| {
                if !vm.alive {
                    return None;
                }
                match m.read_file(&id, path, FACTS_FILE_MAX_BYTES, FACTS_FILE_TIMEOUT) {
                    Ok(bytes) => Some(String::from_utf8_lossy(&bytes).into_owned()),
                    Err(e) => {
                        tracing::warn!(id = %id, path, error = %e, "preflight facts: cannot read from inside the VM");
                        None
                    }
                }
            };
            let os = inside("/etc/os-release");
            let swaps = inside("/proc/swaps");
            Ok(vm_facts(&vm, os.as_deref(), swaps.as_deref()))
        })
        .await
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

    /// Each QemuError maps to its kind; message and code stay QEMU's.
    #[test]
    fn qemu_errors_map_to_kinds() {
        use crate::provider::ProviderErrorKind as K;
        let cases = vec![
            (
                QemuError::NotFound {
                    kind: "VM",
                    id: "vm-1".into(),
                },
                K::NotFound,
            ),
            (
                QemuError::Busy {
                    what: "vm-1".into(),
                    message: "m".into(),
                },
                K::Transient,
            ),
            (
                QemuError::Timeout {
                    what: "boot".into(),
                    secs: 3,
                },
                K::Transient,
            ),
            (QemuError::NotRoot, K::Auth),
            (
                QemuError::invalid("memory", 1, "must be at least 256"),
                K::Permanent,
            ),
        ];
        crate::provider_error::assert_maps_to_kinds("qemu", cases, QemuError::code, err);
    }
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
            light: false,
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

    /// A VM's record as knit-qemu writes it: NVMe, virtio, NVMe, virtio.
    fn vm(tags: serde_json::Value, password_set_at: Option<u64>) -> Vm {
        let disk = |id: &str, interface: &str| serde_json::json!({"id": id, "interface": interface, "sizeBytes": 1u64 << 30, "snapshot": null});
        let record = serde_json::from_value(serde_json::json!({
            "id": "vm-0123456789ab", "name": "n1", "hostname": "n1", "state": "running",
            "boot": {"image": "/img", "disk": "/img/disk.raw", "kernel": "/img/vmlinuz", "initrd": "/img/initrd.img"},
            "systemDiskBytes": 4u64 << 30, "memoryMib": 1024, "cpus": 1, "bridge": "br0",
            "tap": "kq0123456789ab", "mac": "52:54:00:aa:bb:cc", "ip": "10.9.0.254", "prefix": 24,
            "gateway": "10.9.0.1",
            "disks": [disk("d-1", "nvme"), disk("d-2", "virtio"), disk("d-3", "nvme"), disk("d-4", "virtio")],
            "generation": 1, "tags": tags, "process": null, "accel": null, "createdAt": 0,
            "passwordSetAt": password_set_at,
        }))
        .unwrap();
        Vm {
            record,
            alive: true,
            dir: "/s/vms/vm-0123456789ab".into(),
        }
    }

    #[test]
    fn facts_of_a_vm() {
        let made = vm(
            serde_json::json!({TAG_NAME: "workers-abcde", TAG_INSTANCE_TYPE: "ecs.g7.large"}),
            Some(5),
        );
        let os = "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nNAME=\"Debian GNU/Linux\"\nVERSION_ID=\"12\"\nID=debian\n";
        let swaps = "Filename\tType\tSize\tUsed\tPriority\n/swap file 1048572 0 -2\n";
        let f = vm_facts(&made, Some(os), Some(swaps));
        assert_eq!(f.name, "workers-abcde");
        assert_eq!(f.state, "running");
        assert_eq!(f.ip.as_deref(), Some("10.9.0.254"));
        assert_eq!(f.instance_type, "ecs.g7.large");
        assert_eq!(
            (f.os_id.as_str(), f.os_version.as_str(), f.os_name.as_str()),
            ("debian", "12", "Debian GNU/Linux 12 (bookworm)")
        );
        assert!(f.swap && f.password_login);
        // The local cloud's network: the same simulated objects as a sandbox.
        let local = knit_local::Attributes::default();
        assert_eq!(
            (&f.account_id, &f.region_id, &f.vpc_id, &f.v_switch_id),
            (
                &local.account_id,
                &local.region_id,
                &local.vpc_id,
                &local.v_switch_id
            )
        );
        assert_eq!(f.security_groups[0].id, local.security_groups[0].id);
        assert_eq!(f.eni_count, 1);
        let devices: Vec<_> = f
            .data_disks
            .iter()
            .map(|d| (d.id.as_str(), d.device.as_deref().unwrap()))
            .collect();
        assert_eq!(
            devices,
            [
                ("d-1", "nvme0n1"),
                ("d-2", "vdb"),
                ("d-3", "nvme1n1"),
                ("d-4", "vdc")
            ]
        );

        // Made outside knit, guest agent silent, no swap, no password: the
        // OS is unknown (preflight says so), the type is the default.
        let bare = vm(serde_json::json!({}), None);
        let f = vm_facts(&bare, None, Some("Filename\tType\tSize\tUsed\tPriority\n"));
        assert_eq!(f.instance_type, DEFAULT_INSTANCE_TYPE);
        assert_eq!(f.name, "n1");
        assert!(f.os_id.is_empty() && !f.swap && !f.password_login);
    }

    #[test]
    fn the_template_carries_the_instance_type() {
        let t = InstanceTemplate {
            name: "w-1".into(),
            instance_type: "ecs.g7.large".into(),
            image: "host".into(),
            system_disk_gib: 20,
            data_disks: vec![],
            user_data: String::new(),
            region: "local".into(),
            zone: None,
            vpc: "vpc-local".into(),
            tags: Default::default(),
            light: false,
        };
        assert_eq!(
            vm_template(&t)
                .tags
                .get(TAG_INSTANCE_TYPE)
                .map(String::as_str),
            Some("ecs.g7.large")
        );
    }
}
