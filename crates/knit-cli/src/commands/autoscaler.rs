//! `knit autoscaler cloud-config`: what cluster-autoscaler's externalgrpc
//! provider needs to reach knit (docs/autoscaling.md). The server issues a
//! client certificate and key from its CA; they and the CA are written to
//! a directory (the key 0600) and the cloud-config naming them is printed
//! (and written beside them as `cloud-config.yaml`).

use crate::error::{io, CliError, Result};
use knit_client::Client;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Subcommand)]
pub enum AutoscalerAction {
    /// Write a client key and certificate knit's CA issued, and the CA,
    /// into --dir, and print cluster-autoscaler's --cloud-config for them
    /// (address, key, cert, cacert).
    CloudConfig {
        /// Where the files go (made 0700). Default ~/.knit/autoscaler.
        #[arg(long)]
        dir: Option<PathBuf>,
        /// The address the autoscaler dials, when not the service's own
        /// (HOST:PORT; the host must be one the server's certificate
        /// names: its listen and advertise addresses, localhost).
        #[arg(long)]
        address: Option<String>,
        /// The directory the files will be at where the autoscaler runs
        /// (a Secret mounted in its pod), for the paths in the
        /// cloud-config. Default: --dir.
        #[arg(long)]
        mount_dir: Option<String>,
    },
}

pub fn run(client: &Client, action: AutoscalerAction) -> Result<ExitCode> {
    match action {
        AutoscalerAction::CloudConfig {
            dir,
            address,
            mount_dir,
        } => cloud_config(client, dir, address, mount_dir),
    }
}

fn default_dir() -> Result<PathBuf> {
    let home = std::env::var_os("HOME")
        .ok_or_else(|| CliError::Usage("HOME is not set: give --dir".to_string()))?;
    Ok(Path::new(&home).join(".knit").join("autoscaler"))
}

fn write(path: &Path, data: &str, mode: u32) -> Result<()> {
    Ok(knit_os::durable::write(path, data.as_bytes(), mode)?)
}

fn text(v: &serde_json::Value, key: &str) -> Result<String> {
    v[key].as_str().map(str::to_string).ok_or_else(|| {
        CliError::Failed(format!(
            "the server's answer has no {key:?}: is the server older than this knit?"
        ))
    })
}

/// The cloud-config YAML (the keys cluster-autoscaler's externalgrpc
/// provider reads).
pub fn cloud_config_yaml(address: &str, dir: &str) -> String {
    let dir = dir.trim_end_matches('/');
    format!(
        "address: {address:?}\nkey: {:?}\ncert: {:?}\ncacert: {:?}\n",
        format!("{dir}/client.key"),
        format!("{dir}/client.pem"),
        format!("{dir}/ca.pem"),
    )
}

fn cloud_config(
    client: &Client,
    dir: Option<PathBuf>,
    address: Option<String>,
    mount_dir: Option<String>,
) -> Result<ExitCode> {
    let dir = match dir {
        Some(d) => d,
        None => default_dir()?,
    };
    let answer = client.autoscaler_client_certificate()?;
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(io(format!("create {}", dir.display())))?;
    }
    let dir = std::fs::canonicalize(&dir).map_err(io(format!("resolve {}", dir.display())))?;
    write(&dir.join("client.key"), &text(&answer, "key")?, 0o600)?;
    write(
        &dir.join("client.pem"),
        &text(&answer, "certificate")?,
        0o644,
    )?;
    write(&dir.join("ca.pem"), &text(&answer, "ca")?, 0o644)?;
    let address = match address {
        Some(a) => a,
        None => text(&answer, "address")?,
    };
    let shown = mount_dir.unwrap_or_else(|| dir.display().to_string());
    let yaml = cloud_config_yaml(&address, &shown);
    write(&dir.join("cloud-config.yaml"), &yaml, 0o644)?;
    print!("{yaml}");
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_cloud_config_names_the_four_keys() {
        let yaml = super::cloud_config_yaml("127.0.0.1:7445", "/etc/knit-autoscaler/");
        let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(&yaml).unwrap();
        assert_eq!(v["address"].as_str(), Some("127.0.0.1:7445"));
        assert_eq!(v["key"].as_str(), Some("/etc/knit-autoscaler/client.key"));
        assert_eq!(v["cert"].as_str(), Some("/etc/knit-autoscaler/client.pem"));
        assert_eq!(v["cacert"].as_str(), Some("/etc/knit-autoscaler/ca.pem"));
    }
}
