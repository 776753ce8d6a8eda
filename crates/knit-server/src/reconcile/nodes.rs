//! Node statuses copied from the cluster into the store.

use crate::cluster::seam::CLUSTER_CALL_TIMEOUT;
use crate::control::ControlPlane;
use crate::error::Result;
use knit_api::state::EventType;

impl ControlPlane {
    /// Copies each node's Ready condition from the cluster; every change
    /// is an event.
    pub async fn sync_node_statuses(&self) -> Result<()> {
        let statuses: std::collections::HashMap<String, String> = crate::provider::within(
            "cluster",
            "listing node statuses",
            CLUSTER_CALL_TIMEOUT,
            self.cluster.node_statuses(),
        )
        .await?
        .into_iter()
        .collect();
        if statuses.is_empty() {
            return Ok(());
        }
        for (name, recorded) in self.store.node_statuses()? {
            // The cluster gives the three words of knit_api::state::NodeStatus; another is no news.
            let Some(status) = statuses
                .get(&name)
                .and_then(|s| s.parse::<knit_api::state::NodeStatus>().ok())
            else {
                continue;
            };
            if status != recorded {
                self.store.set_node_status(&name, status)?;
                let kind = if status == knit_api::state::NodeStatus::Ready {
                    EventType::Normal
                } else {
                    EventType::Warning
                };
                self.store.add_event(
                    kind,
                    "Node",
                    &name,
                    &format!("Node{status}"),
                    &format!("{recorded} -> {status}"),
                )?;
            }
        }
        Ok(())
    }
}
