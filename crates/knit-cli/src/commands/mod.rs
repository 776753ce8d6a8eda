//! One module per verb group; each prints what its verb shows and returns
//! the exit code.

pub mod apply;
pub mod attach;
pub mod clouds;
pub mod cluster;
pub mod events;
pub mod exec;
pub mod get;
pub mod image;
pub mod local;
pub mod nodes;
pub mod package;
pub mod pools;
pub mod registry;
pub mod server;
pub mod snapshot;
pub mod wait;

use crate::error::Result;
use knit_client::{Client, ClientConfig};
use std::path::PathBuf;

/// `--config`, else `$KNIT_CONFIG`, else `~/.knit/config`.
pub fn config_path(cli_config: &Option<PathBuf>) -> Result<PathBuf> {
    match cli_config {
        Some(p) => Ok(p.clone()),
        None => Ok(ClientConfig::default_path()?),
    }
}

/// A client for the server the config names.
pub fn client(cli_config: &Option<PathBuf>) -> Result<Client> {
    let config = ClientConfig::load(&config_path(cli_config)?)?;
    Ok(Client::new(&config)?)
}

/// Milliseconds since the epoch (for ages).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
