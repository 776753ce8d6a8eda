//! `knit get cluster`.

use super::get::{show, GetOpts, Listing};
use crate::error::{io, CliError, Result};
use crate::output::{cell, table};
use knit_api::Cluster;
use knit_client::Client;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

pub fn get(c: &Client, name: Option<&str>, opts: &GetOpts) -> Result<ExitCode> {
    let listing = Listing {
        what: "cluster",
        kind: "cluster",
        name_of: |c: &Cluster| c.metadata.name.clone(),
        labels: None,
        table: cluster_table,
    };
    show(listing, || Ok(vec![c.cluster()?]), name, opts)
}

fn cluster_table(items: &[&Cluster], _wide: bool) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|c| {
            let s = &c.spec;
            vec![
                cell(&c.metadata.name),
                cell(&s.kubernetes_version),
                cell(&s.region),
                cell(&s.edition),
                s.effective_node_quota().to_string(),
                cell(&s.network.plugin),
                cell(&s.api_server),
            ]
        })
        .collect();
    table(
        &[
            "NAME",
            "VERSION",
            "REGION",
            "EDITION",
            "QUOTA",
            "NETWORK",
            "API-SERVER",
        ],
        &rows,
    )
}

/// Where `knit server` keeps its state when no flag or config says.
const DEFAULT_STATE_DIR: &str = "/var/lib/knit/server";

/// The admin kubeconfig files a server in `state_dir` may have written, in
/// the order they are preferred: under `knit up --ha` the servers' own
/// directories (`ha/server-1/` first), else the one server's `cluster/`.
pub fn kubeconfig_candidates(state_dir: &Path, ha: bool) -> Vec<PathBuf> {
    let single = state_dir.join("cluster/admin.kubeconfig");
    let mut servers: Vec<(u32, PathBuf)> = std::fs::read_dir(state_dir.join("ha"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name();
            let n: u32 = name.to_str()?.strip_prefix("server-")?.parse().ok()?;
            Some((n, e.path().join("cluster/admin.kubeconfig")))
        })
        .collect();
    servers.sort();
    let servers = servers.into_iter().map(|(_, p)| p);
    if ha {
        servers.chain([single]).collect()
    } else {
        std::iter::once(single).chain(servers).collect()
    }
}

/// `knit kubeconfig`: the embedded cluster's admin kubeconfig, where the
/// mode keeps it (the state directory's `cluster/`, or `ha/server-N/cluster/`
/// under `knit up --ha`); its path, or with `raw` its contents.
pub fn kubeconfig(
    cli_config: &Option<PathBuf>,
    state_dir: Option<&Path>,
    raw: bool,
) -> Result<ExitCode> {
    let state_dir = match state_dir {
        Some(d) => d.to_path_buf(),
        None => super::config_path(cli_config)
            .ok()
            .and_then(|p| knit_client::ClientConfig::load(&p).ok())
            .and_then(|c| c.state_dir)
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR)),
    };
    let ha = super::server::ha::present(&state_dir);
    let candidates = kubeconfig_candidates(&state_dir, ha);
    let Some(found) = candidates.iter().find(|p| p.is_file()) else {
        return Err(CliError::Failed(format!(
            "no admin kubeconfig under {} (looked for {}): the server there serves no embedded cluster (--cluster none or an external one), or has not started; give --state-dir for another server",
            state_dir.display(),
            candidates
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    };
    if raw {
        let text =
            std::fs::read_to_string(found).map_err(io(format!("read {}", found.display())))?;
        print!("{text}");
    } else {
        println!("{}", found.display());
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ha_servers_kubeconfig_first_under_ha() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for sub in [
            "ha/server-2/cluster",
            "ha/server-1/cluster",
            "ha/server-10/cluster",
        ] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        let ha = kubeconfig_candidates(d, true);
        assert_eq!(ha[0], d.join("ha/server-1/cluster/admin.kubeconfig"));
        assert_eq!(ha[1], d.join("ha/server-2/cluster/admin.kubeconfig"));
        assert_eq!(ha[2], d.join("ha/server-10/cluster/admin.kubeconfig"));
        assert_eq!(ha[3], d.join("cluster/admin.kubeconfig"));
        let single = kubeconfig_candidates(d, false);
        assert_eq!(single[0], d.join("cluster/admin.kubeconfig"));
    }
}
