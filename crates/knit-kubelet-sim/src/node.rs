//! The node's life toward the API server: register the Node (labels,
//! taints, addresses, node info), heartbeat its Lease, and post NodeReady
//! from the runtime checks.

use std::time::{Duration, Instant};

use knit_os::time::rfc3339;
use serde_json::{json, Value};
use time::OffsetDateTime;

use crate::client::Client;
use crate::config::KubeletConfig;
use crate::cri::{Health, Runtime};
use crate::error::SimError;
use crate::flags::{Flags, Taint};

const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases";

pub struct NodeAgent {
    pub name: String,
    flags: Flags,
    cfg: KubeletConfig,
    runtime: Option<Runtime>,
    uid: Option<String>,
    lease: Option<Value>,
    last_report: Option<Instant>,
    runtime_version: Option<String>,
    /// The last status this process posted (or found posted) was Ready.
    reported_ready: bool,
}

pub fn micro_time(t: OffsetDateTime) -> String {
    t.format(time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:6]Z"
    ))
    .unwrap_or_default()
}

impl NodeAgent {
    pub fn new(name: String, flags: Flags, cfg: KubeletConfig) -> Result<NodeAgent, SimError> {
        let runtime = if flags.lightweight {
            None
        } else {
            // The flag wins over the config file, as in kubelet.
            let endpoint = flags
                .container_runtime_endpoint
                .as_deref()
                .unwrap_or(&cfg.container_runtime_endpoint);
            Some(Runtime::new(endpoint)?)
        };
        Ok(NodeAgent {
            name,
            flags,
            cfg,
            runtime,
            uid: None,
            lease: None,
            last_report: None,
            runtime_version: None,
            reported_ready: false,
        })
    }

    fn taints(&self) -> Vec<Taint> {
        // The flag wins over the config file, as in kubelet.
        if self.flags.register_with_taints.is_empty() {
            self.cfg.register_with_taints.clone()
        } else {
            self.flags.register_with_taints.clone()
        }
    }

    fn health(&mut self) -> Health {
        match &self.runtime {
            None => Health {
                runtime_version: None,
                problems: Vec::new(),
            },
            Some(rt) => {
                let h = rt.check(&self.flags.cni_conf_dir);
                if h.runtime_version.is_some() {
                    self.runtime_version = h.runtime_version.clone();
                }
                h
            }
        }
    }

    /// kubelet's `fastStatusUpdateOnce`: until the node has been reported
    /// Ready, readiness is checked locally (no API call) often, and a
    /// status update is due as soon as it is ready.
    pub fn reported_ready(&self) -> bool {
        self.reported_ready
    }

    pub fn became_ready(&mut self) -> bool {
        !self.reported_ready && self.health().problems.is_empty()
    }

    fn ready_condition(&self, h: &Health) -> Value {
        let now = rfc3339(OffsetDateTime::now_utc());
        let (status, reason, message) = if h.problems.is_empty() {
            let how = if self.flags.lightweight {
                "knit-kubelet-sim (lightweight mode: runtime not checked) is posting ready status"
            } else {
                "knit-kubelet-sim is posting ready status: container runtime and CNI ready"
            };
            ("True", "KubeletReady", how.to_string())
        } else {
            ("False", "KubeletNotReady", h.problems.join(", "))
        };
        json!({"type": "Ready", "status": status, "reason": reason, "message": message,
               "lastHeartbeatTime": now, "lastTransitionTime": now})
    }

    fn addresses(&self) -> Vec<Value> {
        let mut a = Vec::new();
        if let Some(ip) = &self.flags.node_ip {
            a.push(json!({"type": "InternalIP", "address": ip}));
        }
        a.push(json!({"type": "Hostname", "address": self.name}));
        a
    }

    fn node_info(&self) -> Value {
        let read = |p: &str| {
            std::fs::read_to_string(p)
                .map(|s| s.trim().to_string())
                .unwrap_or_default()
        };
        let os_image = read("/etc/os-release")
            .lines()
            .find_map(|l| l.strip_prefix("PRETTY_NAME="))
            .map(|v| v.trim_matches('"').to_string())
            .unwrap_or_else(|| "Linux".into());
        let machine_id = read("/etc/machine-id");
        json!({
            "machineID": machine_id,
            "systemUUID": machine_id,
            "bootID": read("/proc/sys/kernel/random/boot_id"),
            "kernelVersion": read("/proc/sys/kernel/osrelease"),
            "osImage": os_image,
            "containerRuntimeVersion": self.runtime_version.clone().unwrap_or_default(),
            // Build metadata names the stand-in: it is not kubelet.
            "kubeletVersion": format!("v{}+knit-kubelet-sim", crate::kubernetes_version()),
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": go_arch(),
        })
    }

    /// What the machine has, as cAdvisor reads it: the host's CPUs and
    /// memory bounded by the node's cgroup (a local cloud machine's is its
    /// instance type's size).
    fn capacity(&self) -> Value {
        let size = crate::machine::size();
        json!({"cpu": size.cpu_quantity(), "memory": size.memory_quantity(), "pods": "110"})
    }

    /// Create the Node (NotReady until the first status check); an existing
    /// Node is taken over, as kubelet does after a restart.
    pub fn register(&mut self, client: &Client) -> Result<(), SimError> {
        let mut labels = serde_json::Map::new();
        labels.insert("kubernetes.io/hostname".into(), json!(self.name));
        labels.insert("kubernetes.io/os".into(), json!("linux"));
        labels.insert("kubernetes.io/arch".into(), json!(go_arch()));
        labels.insert("beta.kubernetes.io/os".into(), json!("linux"));
        labels.insert("beta.kubernetes.io/arch".into(), json!(go_arch()));
        for (k, v) in &self.flags.node_labels {
            labels.insert(k.clone(), json!(v));
        }
        let mut spec = json!({"taints": self.taints()});
        if let Some(p) = &self.flags.provider_id {
            spec["providerID"] = json!(p);
        }
        let not_ready = Health {
            runtime_version: None,
            problems: vec!["container runtime status check may not have completed yet".into()],
        };
        let capacity = self.capacity();
        let node = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name, "labels": labels,
                         "annotations": {"volumes.kubernetes.io/controller-managed-attach-detach": "true"}},
            "spec": spec,
            "status": {
                "conditions": [self.ready_condition(&not_ready)],
                "addresses": self.addresses(),
                "nodeInfo": self.node_info(),
                "capacity": capacity,
                "allocatable": capacity,
                "daemonEndpoints": {"kubeletEndpoint": {"Port": self.cfg.port}},
            },
        });
        let r = client.post("/api/v1/nodes", &node)?;
        let r = match r.code {
            201 => r,
            409 => {
                tracing::info!(node = %self.name, "node already registered; taking it over");
                client.get(&format!("/api/v1/nodes/{}", self.name))?
            }
            _ => return Err(r.error("registering the node")),
        };
        if !r.ok() {
            return Err(r.error("reading the registered node"));
        }
        self.uid = r.body["metadata"]["uid"].as_str().map(str::to_string);
        tracing::info!(node = %self.name, "node registered (NotReady until the first status check)");
        Ok(())
    }

    /// Post the Ready condition when it changed, or at least every
    /// nodeStatusReportFrequency.
    pub fn sync_status(&mut self, client: &Client) -> Result<(), SimError> {
        let h = self.health();
        // resourceVersion=0, as kubelet's first try reads its Node: any
        // version, from the API server's cache (kube-apiserver's watch
        // cache), not a read of the datastore every 10 s per node.
        let r = client.get(&format!("/api/v1/nodes/{}?resourceVersion=0", self.name))?;
        if !r.ok() {
            return Err(r.error("reading own node"));
        }
        let mut want = self.ready_condition(&h);
        let current = r.body["status"]["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
            .cloned()
            .unwrap_or(Value::Null);
        let same = ["status", "reason", "message"]
            .iter()
            .all(|k| current[k] == want[k]);
        let due = self
            .last_report
            .is_none_or(|t| t.elapsed() >= self.cfg.node_status_report_frequency);
        if same && !due {
            self.reported_ready = want["status"] == "True";
            return Ok(());
        }
        if current["status"] == want["status"] {
            if let Some(t) = current.get("lastTransitionTime") {
                want["lastTransitionTime"] = t.clone();
            }
        }
        // nodeInfo with every status update, as a kubelet's does: a kubelet
        // restarted as another version (an in-place upgrade) reports it
        // on a Node registered before.
        let mut info = self.node_info();
        if self.runtime_version.is_none() {
            if let Some(o) = info.as_object_mut() {
                o.remove("containerRuntimeVersion");
            }
        }
        let status = json!({"conditions": [want], "addresses": self.addresses(), "nodeInfo": info});
        let p = client.patch(
            &format!("/api/v1/nodes/{}/status", self.name),
            &json!({"status": status}),
        )?;
        if !p.ok() {
            return Err(p.error("updating node status"));
        }
        self.last_report = Some(Instant::now());
        self.reported_ready = want["status"] == "True";
        if !same {
            tracing::info!(node = %self.name, ready = %want["status"], reason = %want["reason"], message = %want["message"], "node Ready condition changed");
        }
        Ok(())
    }

    /// The image summary as an annotation, and `status.images` as kubelet
    /// reports them.
    pub fn publish_images(
        &self,
        client: &Client,
        report: &crate::images::ImageReport,
    ) -> Result<(), SimError> {
        // status.images first: the annotation is the "report complete" mark
        // readers wait for.
        let p = client.patch(
            &format!("/api/v1/nodes/{}/status", self.name),
            &json!({"status": {"images": report.node_images()}}),
        )?;
        if !p.ok() {
            return Err(p.error("updating node images"));
        }
        let p = client.patch(
            &format!("/api/v1/nodes/{}", self.name),
            &json!({"metadata": {"annotations": {crate::images::ANNOTATION: report.annotation()}}}),
        )?;
        if !p.ok() {
            return Err(p.error("annotating own node"));
        }
        tracing::info!(node = %self.name, summary = %report.annotation(), "image report published");
        Ok(())
    }

    /// Renew (or create) the node Lease in kube-node-lease.
    pub fn renew_lease(&mut self, client: &Client) -> Result<(), SimError> {
        let now = micro_time(OffsetDateTime::now_utc());
        let path = format!("{LEASES}/{}", self.name);
        let lease = match self.lease.take() {
            Some(l) => l,
            None => {
                let r = client.get(&path)?;
                match r.code {
                    200 => r.body,
                    404 => {
                        let mut meta = json!({"name": self.name, "namespace": "kube-node-lease"});
                        if let Some(uid) = &self.uid {
                            meta["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "Node", "name": self.name, "uid": uid}]);
                        }
                        let body = json!({
                            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
                            "spec": {"holderIdentity": self.name, "leaseDurationSeconds": self.cfg.node_lease_duration.as_secs(), "renewTime": now},
                        });
                        let c = client.post(LEASES, &body)?;
                        if !c.ok() {
                            return Err(c.error("creating the node lease"));
                        }
                        self.lease = Some(c.body);
                        return Ok(());
                    }
                    _ => return Err(r.error("reading the node lease")),
                }
            }
        };
        let mut next = lease;
        next["spec"]["renewTime"] = json!(now);
        next["spec"]["holderIdentity"] = json!(self.name);
        next["spec"]["leaseDurationSeconds"] = json!(self.cfg.node_lease_duration.as_secs());
        let r = client.put(&path, &next)?;
        if r.ok() {
            self.lease = Some(r.body);
            Ok(())
        } else {
            // 409: someone else wrote it; re-read on the next renewal.
            Err(r.error("renewing the node lease"))
        }
    }

    /// kubelet renews at a quarter of the lease duration.
    pub fn lease_interval(&self) -> Duration {
        (self.cfg.node_lease_duration / 4).max(Duration::from_millis(250))
    }

    pub fn status_interval(&self) -> Duration {
        self.cfg.node_status_update_frequency
    }
}

fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn micro_time_has_six_fraction_digits() {
        let t = micro_time(OffsetDateTime::UNIX_EPOCH + time::Duration::microseconds(1_500_001));
        assert_eq!(t, "1970-01-01T00:00:01.500001Z");
    }
}
