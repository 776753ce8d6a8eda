//! The clouds `knit up` starts with its server, and their end in
//! `knit down`: the local cloud (bridge, metadata server, instances) and,
//! with `--provider qemu`, the QEMU VMs on its bridge.
//!
//! `up` records where each cloud lives in the server's state directory
//! (`local-cloud.json`, `qemu-provider.json`), so that `down` brings down
//! exactly those clouds after the server has stopped — even when `up` was
//! given other places than the defaults. A record stays when something
//! could not be released, so that `down` (or `knit local down`) can try
//! again.

use crate::error::{io, CliError, Result};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

const LOCAL_RECORD: &str = "local-cloud.json";
const QEMU_RECORD: &str = "qemu-provider.json";

/// Where a cloud lives: its state directory, bridge and subnet (and, for
/// the local cloud, its metadata server's port).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Record {
    state_dir: PathBuf,
    bridge: String,
    subnet: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    metadata_port: Option<u16>,
}

fn write_record(server_state: &Path, file: &str, rec: &impl Serialize) -> Result<()> {
    let path = server_state.join(file);
    let text = serde_json::to_string_pretty(rec)
        .map_err(|e| CliError::Failed(format!("{}: {e}", path.display())))?;
    std::fs::write(&path, text).map_err(io(format!("write {}", path.display())))
}

/// The record and its path; `None` when `up` wrote none.
fn read_record<T: DeserializeOwned>(
    server_state: &Path,
    file: &str,
) -> Result<Option<(PathBuf, T)>> {
    let path = server_state.join(file);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(format!("read {}", path.display()))(e)),
    };
    let rec = serde_json::from_str(&text)
        .map_err(|e| CliError::Failed(format!("{}: {e}", path.display())))?;
    Ok(Some((path, rec)))
}

fn remove_record(path: &Path) -> Result<()> {
    std::fs::remove_file(path).map_err(io(format!("remove {}", path.display())))
}

/// Records the clouds the server started by `up` will use (before it
/// runs: `knit down` removes what it made).
pub fn record(
    server_state: &Path,
    provider: knit_server::provider::ProviderKind,
    cloud: &knit_local::Config,
) -> Result<()> {
    if !provider.on_local_bridge() {
        return Ok(());
    }
    let local = Record {
        state_dir: cloud.state_dir.clone(),
        bridge: cloud.bridge.clone(),
        subnet: cloud.subnet.clone(),
        metadata_port: Some(cloud.metadata_port),
    };
    write_record(server_state, LOCAL_RECORD, &local)?;
    #[cfg(feature = "qemu")]
    if provider == knit_server::provider::ProviderKind::Qemu {
        let cfg = knit_server::provider::qemu::qemu_config(cloud)?;
        let vms = Record {
            state_dir: cfg.state_dir,
            bridge: cfg.bridge,
            subnet: cfg.subnet,
            metadata_port: None,
        };
        write_record(server_state, QEMU_RECORD, &vms)?;
    }
    Ok(())
}

/// Brings down the clouds recorded for `server_state` (call it once the
/// server has stopped) and prints what was removed. VMs first: their taps
/// are on the local cloud's bridge.
pub fn down(server_state: &Path) -> Result<()> {
    qemu_down(server_state)?;
    local_down(server_state)
}

/// The provider `knit server --provider qemu` runs with these options.
#[cfg(feature = "qemu")]
pub fn qemu_provider(
    local: knit_local::Config,
) -> Result<std::sync::Arc<dyn knit_server::provider::Provider>> {
    let cfg = knit_server::provider::qemu::qemu_config(&local)?;
    Ok(std::sync::Arc::new(
        knit_server::provider::qemu::QemuProvider::new(local, cfg)?,
    ))
}

/// Without QEMU built in: VMs recorded by a knit with it are refused
/// (only such a knit can remove them), naming the feature.
#[cfg(not(feature = "qemu"))]
fn qemu_down(server_state: &Path) -> Result<()> {
    let Some((_, rec)) = read_record::<Record>(server_state, QEMU_RECORD)? else {
        return Ok(());
    };
    knit_server::features::require(
        knit_server::features::Feature::Qemu,
        &format!("removing the QEMU VMs in {}", rec.state_dir.display()),
    )?;
    Ok(())
}

/// Releases every VM, tap, process and file of the recorded VMs' state
/// directory, if `up` recorded one.
#[cfg(feature = "qemu")]
fn qemu_down(server_state: &Path) -> Result<()> {
    let Some((path, rec)) = read_record::<Record>(server_state, QEMU_RECORD)? else {
        return Ok(());
    };
    if rec.state_dir.exists() {
        let failed = |e: knit_qemu::QemuError| {
            CliError::Failed(format!("QEMU VMs in {}: {e}", rec.state_dir.display()))
        };
        let machines = knit_qemu::Machines::open(knit_qemu::Config {
            state_dir: rec.state_dir.clone(),
            bridge: rec.bridge.clone(),
            subnet: rec.subnet.clone(),
            ..knit_qemu::Config::default()
        })
        .map_err(failed)?;
        let report = machines.down().map_err(failed)?;
        println!(
            "QEMU VMs in {} removed: {} VM(s), {} process(es), {} tap(s), {} snapshot(s)",
            rec.state_dir.display(),
            report.vms.len(),
            report.processes.len(),
            report.taps.len(),
            report.snapshots.len()
        );
    }
    remove_record(&path)
}

fn local_down(server_state: &Path) -> Result<()> {
    let Some((path, rec)) = read_record::<Record>(server_state, LOCAL_RECORD)? else {
        println!("no local cloud recorded by `knit up` here; `knit local down` removes one");
        return Ok(());
    };
    // Opening a missing state directory would make one: nothing to remove.
    if !rec.state_dir.exists() {
        println!("local cloud in {} is already gone", rec.state_dir.display());
        return remove_record(&path);
    }
    let failed = |e: knit_local::LocalError| {
        CliError::Failed(format!("local cloud in {}: {e}", rec.state_dir.display()))
    };
    let cloud = knit_local::Cloud::open(knit_local::Config {
        state_dir: rec.state_dir.clone(),
        bridge: rec.bridge.clone(),
        subnet: rec.subnet.clone(),
        metadata_port: rec.metadata_port.unwrap_or_default(),
        helper: None,
    })
    .map_err(failed)?;
    let bridge_up = || Path::new("/sys/class/net").join(&rec.bridge).exists();
    let bridge_was_up = bridge_up();
    let report = cloud.down().map_err(failed)?;
    let bridge = match (bridge_was_up, bridge_up()) {
        (true, false) => format!("bridge {} removed", rec.bridge),
        (_, true) => format!("bridge {} still there", rec.bridge),
        (false, false) => format!("no bridge {}", rec.bridge),
    };
    println!(
        "local cloud in {} down: {bridge}; {} instance(s), {} process(es) ended (instances and the \
         metadata server), {} loop device(s) detached, {} mount(s) removed, {} link(s) deleted, \
         {} network namespace(s)",
        rec.state_dir.display(),
        report.instances,
        report.processes_killed,
        report.loop_devices,
        report.mounts,
        report.links,
        report.namespaces,
    );
    if !report.errors.is_empty() {
        return Err(CliError::Failed(format!(
            "local cloud: {} leftover(s) could not be released (its state is kept; run `knit down` \
             or `knit local down` again): {}",
            report.errors.len(),
            report.errors.join("; ")
        )));
    }
    remove_record(&path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The local cloud's record keeps the file `knit up` has always
    /// written (a `down` of a newer knit reads an older `up`'s record).
    #[test]
    fn local_record_format() {
        let dir = tempfile::tempdir().unwrap();
        let cloud = knit_local::Config {
            state_dir: "/var/lib/knit/local".into(),
            bridge: "knit0".into(),
            subnet: "10.213.0.0/24".into(),
            metadata_port: 80,
            helper: None,
        };
        record(
            dir.path(),
            knit_server::provider::ProviderKind::Local,
            &cloud,
        )
        .unwrap();
        let text = std::fs::read_to_string(dir.path().join(LOCAL_RECORD)).unwrap();
        assert_eq!(
            text,
            "{\n  \"stateDir\": \"/var/lib/knit/local\",\n  \"bridge\": \"knit0\",\n  \"subnet\": \"10.213.0.0/24\",\n  \"metadataPort\": 80\n}"
        );
        assert!(!dir.path().join(QEMU_RECORD).exists());
        let (_, rec) = read_record::<Record>(dir.path(), LOCAL_RECORD)
            .unwrap()
            .unwrap();
        assert_eq!(rec.metadata_port, Some(80));
    }
}
