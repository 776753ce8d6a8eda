//! Sends phase events to the control plane. Reporting never fails a phase:
//! an event that cannot be delivered is kept and retried with the next one.

use crate::identity::NodeFacts;
use crate::tls;
use knit_api::{NodeConfig, PhaseEvent};
use std::sync::Mutex;
use std::time::Duration;

pub struct Reporter {
    target: Option<(String, String, ureq::Agent)>,
    pending: Mutex<Vec<PhaseEvent>>,
}

impl Reporter {
    pub fn new(config: &NodeConfig, _node: &NodeFacts) -> Reporter {
        let target = match (&config.cluster.report_url, &config.cluster.report_token) {
            (Some(url), Some(token)) => {
                let agent = tls::http_agent(
                    config.cluster.control_plane_ca_cert.as_deref(),
                    Duration::from_secs(5),
                );
                match agent {
                    Ok(agent) => Some((url.clone(), token.clone(), agent)),
                    Err(e) => {
                        tracing::warn!("phase reports disabled: {e}");
                        None
                    }
                }
            }
            _ => None,
        };
        Reporter {
            target,
            pending: Mutex::new(Vec::new()),
        }
    }

    pub fn send(&self, event: PhaseEvent) {
        if self.target.is_none() {
            return;
        }
        if let Ok(mut pending) = self.pending.lock() {
            pending.push(event);
        }
        self.flush();
    }

    /// Delivers queued events in order; stops at the first failure.
    pub fn flush(&self) {
        let Some((url, token, agent)) = &self.target else {
            return;
        };
        let Ok(mut pending) = self.pending.lock() else {
            return;
        };
        while let Some(event) = pending.first() {
            let result = agent
                .post(url)
                .set("Authorization", &format!("Bearer {token}"))
                .send_json(event);
            match result {
                Ok(_) => {
                    pending.remove(0);
                }
                Err(e) => {
                    tracing::warn!("cannot report phase event to {url}: {e}");
                    break;
                }
            }
        }
    }
}
