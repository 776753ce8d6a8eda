//! One module per verb group; each prints what its verb shows and returns
//! the exit code.

pub mod apply;
pub mod attach;
pub mod autoscaler;
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
pub mod rollout;
pub mod server;
pub mod server_config;
pub mod snapshot;
pub mod token;
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
pub use knit_os::time::now_ms;

/// A `--timeout` (and other durations) as kubectl takes them: `90s`,
/// `10m`, `1h30m` (humantime's forms), or a plain number of seconds.
pub fn seconds(text: &str) -> std::result::Result<u64, String> {
    let text = text.trim();
    if let Ok(n) = text.parse::<u64>() {
        return Ok(n);
    }
    let d = humantime::parse_duration(text).map_err(|e| {
        format!("{text:?} is not a duration ({e}): give seconds (90) or a duration like 90s, 10m, 1h30m")
    })?;
    if d.subsec_nanos() != 0 {
        return Err(format!(
            "{text:?} is not a whole number of seconds: give 90s, 10m, 1h30m"
        ));
    }
    Ok(d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::seconds;

    #[test]
    fn durations_in_kubectl_forms_and_plain_seconds() {
        assert_eq!(seconds("900"), Ok(900));
        assert_eq!(seconds("90s"), Ok(90));
        assert_eq!(seconds("10m"), Ok(600));
        assert_eq!(seconds("1h30m"), Ok(5400));
        assert_eq!(seconds("2h"), Ok(7200));
        for bad in ["", "ten", "10x", "-5", "1500ms"] {
            let e = seconds(bad).expect_err(bad);
            assert!(e.contains("90s, 10m"), "{bad}: {e}");
        }
    }
}
