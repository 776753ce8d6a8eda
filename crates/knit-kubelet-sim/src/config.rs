//! The parts of `KubeletConfiguration` (kubelet.config.k8s.io/v1beta1) the
//! stand-in acts on. Other fields are accepted and ignored.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::error::SimError;
use crate::flags::Taint;

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Raw {
    kind: Option<String>,
    api_version: Option<String>,
    address: Option<String>,
    port: Option<u16>,
    #[serde(rename = "kubeAPIQPS")]
    kube_api_qps: Option<f64>,
    #[serde(rename = "kubeAPIBurst")]
    kube_api_burst: Option<u32>,
    register_with_taints: Option<Vec<Taint>>,
    container_runtime_endpoint: Option<String>,
    node_lease_duration_seconds: Option<u64>,
    node_status_update_frequency: Option<String>,
    node_status_report_frequency: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct KubeletConfig {
    pub address: String,
    pub port: u16,
    pub kube_api_qps: f64,
    pub kube_api_burst: u32,
    pub register_with_taints: Vec<Taint>,
    pub container_runtime_endpoint: String,
    pub node_lease_duration: Duration,
    pub node_status_update_frequency: Duration,
    pub node_status_report_frequency: Duration,
}

impl Default for KubeletConfig {
    /// kubelet's defaults for v1beta1.
    fn default() -> Self {
        KubeletConfig {
            address: "0.0.0.0".into(),
            port: 10250,
            kube_api_qps: 50.0,
            kube_api_burst: 100,
            register_with_taints: Vec::new(),
            container_runtime_endpoint: "unix:///run/containerd/containerd.sock".into(),
            node_lease_duration: Duration::from_secs(40),
            node_status_update_frequency: Duration::from_secs(10),
            node_status_report_frequency: Duration::from_secs(300),
        }
    }
}

impl KubeletConfig {
    pub fn load(path: &Path) -> Result<KubeletConfig, SimError> {
        let text = std::fs::read_to_string(path).map_err(|e| SimError::io(path, e))?;
        Self::parse(&text).map_err(|message| SimError::Config {
            path: path.display().to_string(),
            message,
        })
    }

    pub fn parse(text: &str) -> Result<KubeletConfig, String> {
        let raw: Raw = serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?;
        if raw.kind.as_deref() != Some("KubeletConfiguration") {
            return Err(format!(
                "kind is {:?}, expected KubeletConfiguration",
                raw.kind
            ));
        }
        if raw.api_version.as_deref() != Some("kubelet.config.k8s.io/v1beta1") {
            return Err(format!(
                "apiVersion is {:?}, expected kubelet.config.k8s.io/v1beta1",
                raw.api_version
            ));
        }
        let d = KubeletConfig::default();
        let duration = |field: &str,
                        v: Option<String>,
                        default: Duration|
         -> Result<Duration, String> {
            match v {
                None => Ok(default),
                Some(s) => knit_api::validate::parse_duration_ms(&s)
                    .filter(|ms| *ms > 0)
                    .map(Duration::from_millis)
                    .ok_or_else(|| format!("{field}: {s:?} is not a positive duration like 10s")),
            }
        };
        let cfg = KubeletConfig {
            address: raw.address.unwrap_or(d.address),
            port: raw.port.unwrap_or(d.port),
            kube_api_qps: raw.kube_api_qps.unwrap_or(d.kube_api_qps),
            kube_api_burst: raw.kube_api_burst.unwrap_or(d.kube_api_burst),
            register_with_taints: raw.register_with_taints.unwrap_or_default(),
            container_runtime_endpoint: raw
                .container_runtime_endpoint
                .unwrap_or(d.container_runtime_endpoint),
            node_lease_duration: raw
                .node_lease_duration_seconds
                .map(Duration::from_secs)
                .unwrap_or(d.node_lease_duration),
            node_status_update_frequency: duration(
                "nodeStatusUpdateFrequency",
                raw.node_status_update_frequency,
                d.node_status_update_frequency,
            )?,
            node_status_report_frequency: duration(
                "nodeStatusReportFrequency",
                raw.node_status_report_frequency,
                d.node_status_report_frequency,
            )?,
        };
        if cfg.kube_api_qps <= 0.0 || cfg.kube_api_burst == 0 {
            return Err("kubeAPIQPS and kubeAPIBurst must be positive".into());
        }
        if cfg.node_lease_duration.is_zero() {
            return Err("nodeLeaseDurationSeconds must be positive".into());
        }
        cfg.address
            .parse::<std::net::IpAddr>()
            .map_err(|_| format!("address {:?} is not an IP address", cfg.address))?;
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_fields_the_agent_writes() {
        let c = KubeletConfig::parse(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\naddress: 127.0.0.1\nport: 10255\nkubeAPIQPS: 5\nkubeAPIBurst: 10\nregisterWithTaints:\n- key: a\n  value: b\n  effect: NoSchedule\nnodeLeaseDurationSeconds: 8\nnodeStatusUpdateFrequency: 2s\ncontainerRuntimeEndpoint: unix:///run/k.sock\nevictionHard: {}\n",
        )
        .unwrap();
        assert_eq!(
            (c.address.as_str(), c.port, c.kube_api_qps, c.kube_api_burst),
            ("127.0.0.1", 10255, 5.0, 10)
        );
        assert_eq!(c.register_with_taints[0].value, "b");
        assert_eq!(c.node_lease_duration, Duration::from_secs(8));
        assert_eq!(c.container_runtime_endpoint, "unix:///run/k.sock");
        assert_eq!(c.node_status_update_frequency, Duration::from_secs(2));
        assert!(KubeletConfig::parse("apiVersion: v1\nkind: Pod\n").is_err());
        assert!(KubeletConfig::parse("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nnodeStatusUpdateFrequency: soon\n").is_err());
    }
}
