//! The local cloud `knit up` starts with its server, and its end in
//! `knit down`.
//!
//! `up` records where the cloud lives (its state directory, bridge and
//! subnet) in the server's state directory, `local-cloud.json`, so that
//! `down` brings down exactly that cloud after the server has stopped —
//! even when `up` was given other places than the defaults. The record
//! stays when something could not be released, so that `down` (or
//! `knit local down`) can try again.

use crate::{io, CliError, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

const RECORD: &str = "local-cloud.json";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Record {
    state_dir: PathBuf,
    bridge: String,
    subnet: String,
    metadata_port: u16,
}

impl Record {
    fn config(&self) -> knit_local::Config {
        knit_local::Config {
            state_dir: self.state_dir.clone(),
            bridge: self.bridge.clone(),
            subnet: self.subnet.clone(),
            metadata_port: self.metadata_port,
            helper: None,
        }
    }
}

/// Records the local cloud the server started by `up` will use.
pub fn record(server_state: &Path, cloud: &knit_local::Config) -> Result<()> {
    let rec = Record {
        state_dir: cloud.state_dir.clone(),
        bridge: cloud.bridge.clone(),
        subnet: cloud.subnet.clone(),
        metadata_port: cloud.metadata_port,
    };
    let path = server_state.join(RECORD);
    let text = serde_json::to_string_pretty(&rec)
        .map_err(|e| CliError::Failed(format!("{}: {e}", path.display())))?;
    std::fs::write(&path, text).map_err(io(format!("write {}", path.display())))
}

/// Brings down the local cloud recorded for `server_state` (call it once
/// the server has stopped) and prints what was removed.
pub fn down(server_state: &Path) -> Result<()> {
    let path = server_state.join(RECORD);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            println!("no local cloud recorded by `knit up` here; `knit local down` removes one");
            return Ok(());
        }
        Err(e) => return Err(io(format!("read {}", path.display()))(e)),
    };
    let rec: Record = serde_json::from_str(&text)
        .map_err(|e| CliError::Failed(format!("{}: {e}", path.display())))?;
    // Opening a missing state directory would make one: nothing to remove.
    if !rec.state_dir.exists() {
        println!("local cloud in {} is already gone", rec.state_dir.display());
        return remove_record(&path);
    }
    let cloud = knit_local::Cloud::open(rec.config()).map_err(|e| {
        CliError::Failed(format!("local cloud in {}: {e}", rec.state_dir.display()))
    })?;
    let bridge_was_up = Path::new("/sys/class/net").join(&rec.bridge).exists();
    let report = cloud.down().map_err(|e| {
        CliError::Failed(format!("local cloud in {}: {e}", rec.state_dir.display()))
    })?;
    let bridge = match (
        bridge_was_up,
        Path::new("/sys/class/net").join(&rec.bridge).exists(),
    ) {
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

fn remove_record(path: &Path) -> Result<()> {
    std::fs::remove_file(path).map_err(io(format!("remove {}", path.display())))
}
