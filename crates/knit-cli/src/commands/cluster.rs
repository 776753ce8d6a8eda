//! `knit get cluster`.

use super::get::{show, Listing};
use crate::error::Result;
use crate::output::{cell, table, Format};
use knit_api::Cluster;
use knit_client::Client;
use std::process::ExitCode;

pub fn get(c: &Client, name: Option<&str>, format: Option<Format>) -> Result<ExitCode> {
    let listing = Listing {
        what: "cluster",
        name_of: |c: &Cluster| c.metadata.name.clone(),
        table: cluster_table,
    };
    show(listing, vec![c.cluster()?], name, format)
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
