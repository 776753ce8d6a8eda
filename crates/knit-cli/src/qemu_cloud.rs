//! The QEMU VMs of a server `knit up --provider qemu` started, and their
//! end in `knit down`: `up` records knit-qemu's settings in the server's
//! state directory (`qemu-provider.json`); `down` releases every VM, tap,
//! process and file of that state directory (after the pools' deletion has
//! removed the server's own), before the local cloud's bridge goes.

use crate::{io, CliError, Result};
use std::path::{Path, PathBuf};

const RECORD: &str = "qemu-provider.json";

#[derive(serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Record {
    state_dir: PathBuf,
    bridge: String,
    subnet: String,
}

/// The provider `knit server --provider qemu` runs with these options.
pub fn provider(
    local: knit_local::Config,
) -> Result<std::sync::Arc<dyn knit_server::provider::Provider>> {
    let cfg = knit_server::provider::qemu::qemu_config(&local)?;
    Ok(std::sync::Arc::new(
        knit_server::provider::qemu::QemuProvider::new(local, cfg)?,
    ))
}

/// Records the VMs' state directory the server started by `up` will use.
pub fn record(server_state: &Path, local: &knit_local::Config) -> Result<()> {
    let cfg = knit_server::provider::qemu::qemu_config(local)?;
    let rec = Record {
        state_dir: cfg.state_dir,
        bridge: cfg.bridge,
        subnet: cfg.subnet,
    };
    let path = server_state.join(RECORD);
    let text = serde_json::to_string_pretty(&rec)
        .map_err(|e| CliError::Failed(format!("{}: {e}", path.display())))?;
    std::fs::write(&path, text).map_err(io(format!("write {}", path.display())))
}

/// Releases the recorded VMs' state directory, if `up` recorded one.
pub fn down(server_state: &Path) -> Result<()> {
    let path = server_state.join(RECORD);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io(format!("read {}", path.display()))(e)),
    };
    let rec: Record = serde_json::from_str(&text)
        .map_err(|e| CliError::Failed(format!("{}: {e}", path.display())))?;
    if rec.state_dir.exists() {
        let machines = knit_qemu::Machines::open(knit_qemu::Config {
            state_dir: rec.state_dir.clone(),
            bridge: rec.bridge,
            subnet: rec.subnet,
            ..knit_qemu::Config::default()
        })
        .map_err(|e| CliError::Failed(format!("QEMU VMs in {}: {e}", rec.state_dir.display())))?;
        let report = machines.down().map_err(|e| {
            CliError::Failed(format!("QEMU VMs in {}: {e}", rec.state_dir.display()))
        })?;
        println!(
            "QEMU VMs in {} removed: {} VM(s), {} process(es), {} tap(s), {} snapshot(s)",
            rec.state_dir.display(),
            report.vms.len(),
            report.processes.len(),
            report.taps.len(),
            report.snapshots.len()
        );
    }
    std::fs::remove_file(&path).map_err(io(format!("remove {}", path.display())))
}
