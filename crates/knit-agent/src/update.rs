//! `knit-agent update`: a pool's change applied to this node in place (the
//! control plane's rollout runs it through the provider's exec). The
//! change — the kubelet's settings, the Kubernetes package — is written
//! into the node's NodeConfig (so that a later `init`, after a reboot,
//! keeps it), then `init` runs again: `kubernetes-components` sees the
//! configuration or the version differ and re-renders the kubelet's
//! configuration (and installs the new version's binaries from the
//! mirror), `join` sees the kubelet not running with them and restarts
//! it, then waits for the node to be registered. Every other phase finds
//! itself done.

use crate::engine::{self, InitOptions};
use crate::error::{AgentError, Result};
use crate::files::write_atomic;
use crate::host::Host;
use crate::services;
use base64::Engine as _;
use knit_api::agent::{NodeUpdate, NodeUpdated};
use knit_api::{ErrorCode, NodeConfig};

/// How long after `init` the kubelet's new process may take to show.
const RESTART_SEEN_WITHIN: std::time::Duration = std::time::Duration::from_secs(15);

/// The update sent as `--update`: base64 (standard) of its JSON.
pub fn decode(arg: &str) -> Result<NodeUpdate> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(arg.trim())
        .map_err(|e| {
            AgentError::new(ErrorCode::FailConfig, format!("--update: not base64 ({e})"))
        })?;
    serde_json::from_slice(&bytes).map_err(|e| {
        AgentError::new(
            ErrorCode::FailConfig,
            format!("--update: not a NodeUpdate document ({e})"),
        )
    })
}

/// The base64 form [`decode`] reads.
pub fn encode(update: &NodeUpdate) -> Result<String> {
    let json = knit_api::ser::json_vec("the NodeUpdate", update)
        .map_err(|e| AgentError::new(ErrorCode::FailConfig, e.to_string()))?;
    Ok(base64::engine::general_purpose::STANDARD.encode(json))
}

/// `config` with `update` applied; validated as `init` validates it.
pub fn apply(config: &NodeConfig, update: &NodeUpdate) -> Result<NodeConfig> {
    let mut next = config.clone();
    if let Some(kubelet) = &update.kubelet {
        next.kubelet = kubelet.clone();
    }
    if let Some(package) = &update.kubernetes {
        next.kubernetes.version = package.version.clone();
        if package.url.is_some() {
            next.kubernetes.url = package.url.clone();
        }
        next.kubernetes.sha256 = package.sha256.clone();
    }
    next.validate().map_err(|e| {
        AgentError::new(
            ErrorCode::FailConfig,
            format!("the updated NodeConfig does not validate: {e}"),
        )
    })?;
    Ok(next)
}

/// Applies `update` to the NodeConfig at `config_path` (node-absolute) and
/// runs `init` again.
pub fn run(host: &Host, config_path: &str, update: &NodeUpdate) -> Result<NodeUpdated> {
    let path = host.path(config_path);
    let text = std::fs::read_to_string(&path).map_err(|e| {
        AgentError::new(
            ErrorCode::FailConfig,
            format!("cannot read config {}: {e}", path.display()),
        )
    })?;
    let config = NodeConfig::from_yaml(&text)
        .map_err(|e| AgentError::new(ErrorCode::FailConfig, format!("{}: {e}", path.display())))?;
    let next = apply(&config, update)?;
    host.log.line(
        "update",
        &format!(
            "updating in place: {}{}",
            if update.kubelet.is_some() {
                "the kubelet's settings "
            } else {
                ""
            },
            update
                .kubernetes
                .as_ref()
                .map(|k| format!("Kubernetes {} -> {}", config.kubernetes.version, k.version))
                .unwrap_or_default()
        ),
    );
    // Written before init runs: a reboot midway resumes with the update.
    let text = next
        .to_yaml()
        .map_err(|e| AgentError::new(ErrorCode::FailConfig, e.to_string()))?;
    write_atomic(&path, text.as_bytes(), 0o600)?;
    let before = services::main_pid(host, "kubelet");
    let journal = engine::init(
        host,
        &next,
        &InitOptions {
            force_phase: None,
            stop_after: None,
        },
    )?;
    // The supervisor writes the new kubelet's pid once it started it.
    let deadline = std::time::Instant::now() + RESTART_SEEN_WITHIN;
    let restarted = loop {
        let after = services::main_pid(host, "kubelet");
        if after.is_some() && after != before {
            break true;
        }
        if std::time::Instant::now() >= deadline {
            break false;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let kubelet = host.host_path(&format!("{}/kubelet", crate::package::BIN_DIR));
    let kubelet_version = host
        .run(
            ErrorCode::FailCommand,
            &kubelet,
            &["--version"],
            std::time::Duration::from_secs(10),
        )
        .map(|out| out.stdout.trim().to_string())
        .unwrap_or_default();
    Ok(NodeUpdated {
        node: journal.node_name.unwrap_or_default(),
        kubernetes_version: next.kubernetes.version,
        kubelet_restarted: restarted,
        kubelet_version,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use knit_api::config::KubernetesPackage;

    #[test]
    fn an_update_round_trips_and_is_applied_validated() {
        let kubelet = knit_api::config::KubeletConfig {
            event_record_qps: 8,
            ..knit_api::config::KubeletConfig::default()
        };
        let update = NodeUpdate {
            kubelet: Some(kubelet),
            kubernetes: Some(KubernetesPackage {
                version: "1.32.0".into(),
                url: Some("https://10.0.0.1:7443/mirror/pkg/kubernetes/x.tar.gz".into()),
                sha256: Some("ab".repeat(32)),
                ..KubernetesPackage::default()
            }),
        };
        let back = decode(&encode(&update).unwrap()).unwrap();
        assert_eq!(back, update);
        let config = NodeConfig::default();
        let next = apply(&config, &update).unwrap();
        assert_eq!(next.kubelet.event_record_qps, 8);
        assert_eq!(next.kubernetes.version, "1.32.0");
        assert_eq!(next.node, config.node, "the rest kept");
        // A bad value is refused naming the field, the config untouched.
        let mut bad = update.clone();
        if let Some(k) = bad.kubelet.as_mut() {
            k.event_burst = -5;
        }
        let e = apply(&config, &bad).unwrap_err();
        assert!(e.message.contains("kubelet.eventBurst"), "{e}");
        let e = decode("not base64!").unwrap_err();
        assert!(e.message.contains("--update"), "{e}");
        let e =
            decode(&base64::engine::general_purpose::STANDARD.encode(b"{\"x\":1}")).unwrap_err();
        assert!(e.message.contains("NodeUpdate"), "{e}");
    }
}
