//! Pods bound to this node, moved through their stages the way KWOK's pod
//! stages do (no container runs): a pod is made Running at once with the
//! conditions and container statuses a kubelet reports, an IP from the
//! node's `spec.podCIDR` and the node's IP as `hostIP`; a pod marked for
//! deletion is finished when its grace period ends (`deletionTimestamp`):
//! its containers reported terminated, then the object deleted with grace
//! 0 and its UID as precondition, as a kubelet does.
//!
//! Two threads: a watcher (list, then watch `spec.nodeName=<node>` from the
//! list's resourceVersion, again after each end) feeding events to a
//! worker that keeps the pods and acts, waking on events and every second
//! (grace periods end, a podCIDR arrives).

use std::collections::{BTreeMap, HashSet};
use std::net::Ipv4Addr;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use knit_os::time::rfc3339;
use serde_json::{json, Value};
use time::OffsetDateTime;

use crate::client::Client;
use crate::error::SimError;

/// The client of the moment: replaced when the certificate rotates.
pub type SharedClient = Arc<RwLock<Arc<Client>>>;

pub fn current(client: &SharedClient) -> Arc<Client> {
    client.read().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Server-side end of each watch (client-go's reflectors watch 5-10 min).
const WATCH_SECONDS: u64 = 300;
/// How often the worker looks at its pods without an event.
const TICK: Duration = Duration::from_secs(1);

enum Event {
    /// The whole set after a list.
    Listed(Vec<Value>),
    Upsert(Value),
    Gone(String, String),
}

type Key = (String, String);

fn key(p: &Value) -> Key {
    (
        p["metadata"]["namespace"]
            .as_str()
            .unwrap_or("")
            .to_string(),
        p["metadata"]["name"].as_str().unwrap_or("").to_string(),
    )
}

fn pct(s: &str) -> String {
    percent_encode(s)
}

/// Percent-encoding of a query value (RFC 3986 unreserved kept).
fn percent_encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Start the watcher and the worker for `node`.
pub fn start(node: String, client: SharedClient) -> Result<(), SimError> {
    let (tx, rx) = mpsc::channel();
    let (n2, c2) = (node.clone(), client.clone());
    std::thread::Builder::new()
        .name("pod-watch".into())
        .spawn(move || watch_loop(&n2, &c2, &tx))
        .map_err(|e| SimError::io("spawn the pod watcher", e))?;
    std::thread::Builder::new()
        .name("pods".into())
        .spawn(move || Worker::new(node, client).run(&rx))
        .map_err(|e| SimError::io("spawn the pod worker", e))?;
    Ok(())
}

/// List, then watch from the list's version; after a watch ends, watch on
/// from the last version seen; after an error (410 Gone, a refused
/// request, a dropped connection), list again after a pause.
fn watch_loop(node: &str, client: &SharedClient, tx: &Sender<Event>) {
    let selector = pct(&format!("spec.nodeName={node}"));
    let mut backoff = Duration::from_secs(1);
    loop {
        let c = current(client);
        let listed = c.get(&format!("/api/v1/pods?fieldSelector={selector}"));
        let mut rv = match listed {
            Ok(r) if r.ok() => {
                let items = r.body["items"].as_array().cloned().unwrap_or_default();
                if tx.send(Event::Listed(items)).is_err() {
                    return;
                }
                r.body["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or("0")
                    .to_string()
            }
            Ok(r) => {
                let e = r.error("listing this node's pods");
                tracing::warn!(code = e.code(), error = %e, "pod list failed; retrying");
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(30));
                continue;
            }
            Err(e) => {
                tracing::warn!(code = e.code(), error = %e, "pod list failed; retrying");
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(30));
                continue;
            }
        };
        backoff = Duration::from_secs(1);
        // Watch until an error asks for a new list.
        loop {
            let path = format!(
                "/api/v1/pods?fieldSelector={selector}&watch=true&allowWatchBookmarks=true&timeoutSeconds={WATCH_SECONDS}&resourceVersion={rv}"
            );
            let mut relist = false;
            let mut closed = false;
            let result = current(client).stream(&path, |ev| {
                let object = &ev["object"];
                if let Some(v) = object["metadata"]["resourceVersion"].as_str() {
                    if ev["type"] != "ERROR" {
                        rv = v.to_string();
                    }
                }
                let sent = match ev["type"].as_str() {
                    Some("ADDED" | "MODIFIED") => tx.send(Event::Upsert(object.clone())),
                    Some("DELETED") => {
                        let (ns, name) = key(object);
                        tx.send(Event::Gone(ns, name))
                    }
                    Some("BOOKMARK") => Ok(()),
                    _ => {
                        // ERROR (410 Gone: too old a version) and the like.
                        tracing::info!(event = %ev, "pod watch ended by the server; listing again");
                        relist = true;
                        return false;
                    }
                };
                if sent.is_err() {
                    closed = true;
                }
                sent.is_ok()
            });
            if closed {
                return;
            }
            if let Err(e) = result {
                tracing::warn!(code = e.code(), error = %e, "pod watch failed; listing again");
                std::thread::sleep(Duration::from_secs(1));
                relist = true;
            }
            if relist {
                break;
            }
        }
    }
}

struct Worker {
    node: String,
    client: SharedClient,
    pods: BTreeMap<Key, Value>,
    /// The node's pod CIDR and InternalIP, once known.
    pod_cidr: Option<String>,
    host_ip: Option<String>,
    /// Pods whose last action failed: not retried before this tick count.
    retry_at: BTreeMap<Key, u64>,
    ticks: u64,
}

impl Worker {
    fn new(node: String, client: SharedClient) -> Worker {
        Worker {
            node,
            client,
            pods: BTreeMap::new(),
            pod_cidr: None,
            host_ip: None,
            retry_at: BTreeMap::new(),
            ticks: 0,
        }
    }

    fn run(mut self, rx: &Receiver<Event>) {
        loop {
            match rx.recv_timeout(TICK) {
                Ok(Event::Listed(items)) => {
                    self.pods = items.into_iter().map(|p| (key(&p), p)).collect();
                }
                Ok(Event::Upsert(p)) => {
                    // An event older than what the worker's own write
                    // returned does not roll the pod back.
                    let k = key(&p);
                    let older = self.pods.get(&k).is_some_and(|cur| {
                        cur["metadata"]["uid"] == p["metadata"]["uid"] && rv(cur) > rv(&p)
                    });
                    if !older {
                        self.pods.insert(k, p);
                    }
                }
                Ok(Event::Gone(ns, name)) => {
                    self.pods.remove(&(ns.clone(), name.clone()));
                    self.retry_at.remove(&(ns, name));
                }
                Err(RecvTimeoutError::Timeout) => self.ticks += 1,
                Err(RecvTimeoutError::Disconnected) => return,
            }
            self.act();
        }
    }

    fn node_facts(&mut self) {
        if self.pod_cidr.is_some() && self.host_ip.is_some() {
            return;
        }
        let c = current(&self.client);
        match c.get(&format!("/api/v1/nodes/{}", self.node)) {
            Ok(r) if r.ok() => {
                self.pod_cidr = r.body["spec"]["podCIDR"]
                    .as_str()
                    .filter(|s| !s.is_empty())
                    .map(str::to_string);
                self.host_ip = r.body["status"]["addresses"]
                    .as_array()
                    .and_then(|a| a.iter().find(|a| a["type"] == "InternalIP"))
                    .and_then(|a| a["address"].as_str())
                    .map(str::to_string);
            }
            Ok(r) => {
                let e = r.error("reading own node");
                tracing::warn!(code = e.code(), error = %e, "cannot read the node's pod CIDR");
            }
            Err(e) => {
                tracing::warn!(code = e.code(), error = %e, "cannot read the node's pod CIDR")
            }
        }
    }

    fn act(&mut self) {
        let now = OffsetDateTime::now_utc();
        let keys: Vec<Key> = self.pods.keys().cloned().collect();
        for k in keys {
            if self.retry_at.get(&k).is_some_and(|t| *t > self.ticks) {
                continue;
            }
            let Some(pod) = self.pods.get(&k).cloned() else {
                continue;
            };
            if pod["spec"]["nodeName"].as_str() != Some(self.node.as_str()) {
                continue;
            }
            let result = if let Some(ts) = pod["metadata"]["deletionTimestamp"].as_str() {
                let due = parse_time(ts).is_none_or(|t| t <= now);
                if due {
                    self.finish(&k, &pod, now)
                } else {
                    Ok(())
                }
            } else if matches!(phase(&pod), "" | "Pending") {
                self.start_pod(&k, &pod, now)
            } else {
                Ok(())
            };
            match result {
                Ok(()) => {
                    self.retry_at.remove(&k);
                }
                Err(e) => {
                    tracing::warn!(code = e.code(), error = %e, namespace = %k.0, pod = %k.1, "pod step failed; retrying");
                    self.retry_at.insert(k, self.ticks + 2);
                }
            }
        }
    }

    /// Pending → Running, as KWOK's `pod-ready` stage and a kubelet report it.
    fn start_pod(&mut self, k: &Key, pod: &Value, now: OffsetDateTime) -> Result<(), SimError> {
        let host_network = pod["spec"]["hostNetwork"] == true;
        self.node_facts();
        let Some(host_ip) = self.host_ip.clone() else {
            return Ok(()); // the node reports no address yet: next tick
        };
        let ip = if host_network {
            host_ip.clone()
        } else {
            let Some(cidr) = self.pod_cidr.clone() else {
                return Ok(()); // no pod CIDR allocated yet: next tick
            };
            let used: Vec<String> = self
                .pods
                .values()
                .filter(|p| p["spec"]["hostNetwork"] != true)
                .filter(|p| !matches!(phase(p), "Succeeded" | "Failed"))
                .filter_map(|p| p["status"]["podIP"].as_str().map(str::to_string))
                .collect();
            match free_ip(&cidr, &used) {
                Some(ip) => ip,
                None => {
                    tracing::warn!(pod = %k.1, pod_cidr = %cidr, "no pod IP left in the node's pod CIDR; the pod stays Pending");
                    return Ok(());
                }
            }
        };
        let status = running_status(pod, &host_ip, &ip, now);
        let path = format!("/api/v1/namespaces/{}/pods/{}/status", k.0, k.1);
        let r = current(&self.client).patch(&path, &json!({"status": status}))?;
        match r.code {
            200 => {
                tracing::info!(namespace = %k.0, pod = %k.1, pod_ip = %ip, "pod running (no container runs: the stand-in only reports it)");
                self.pods.insert(k.clone(), r.body);
                Ok(())
            }
            404 => {
                self.pods.remove(k);
                Ok(())
            }
            _ => Err(r.error("reporting a pod running")),
        }
    }

    /// The grace period is over: containers terminated, then the object
    /// deleted with grace 0 (the kubelet's final delete).
    fn finish(&mut self, k: &Key, pod: &Value, now: OffsetDateTime) -> Result<(), SimError> {
        let c = current(&self.client);
        let base = format!("/api/v1/namespaces/{}/pods/{}", k.0, k.1);
        if !matches!(phase(pod), "Succeeded" | "Failed") {
            let status = terminated_status(pod, now);
            let r = c.patch(&format!("{base}/status"), &json!({"status": status}))?;
            match r.code {
                200 => {}
                404 => {
                    self.pods.remove(k);
                    return Ok(());
                }
                _ => return Err(r.error("reporting a pod's containers terminated")),
            }
        }
        let uid = pod["metadata"]["uid"].as_str().unwrap_or("");
        let r = c.delete(
            &base,
            &json!({"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0,
                    "preconditions": {"uid": uid}}),
        )?;
        match r.code {
            200 | 404 => {
                tracing::info!(namespace = %k.0, pod = %k.1, "pod finished and deleted after its grace period");
                self.pods.remove(k);
                Ok(())
            }
            // Another pod of the same name now (the UID differs): not ours to delete.
            409 => {
                self.pods.remove(k);
                Ok(())
            }
            _ => Err(r.error("deleting a finished pod")),
        }
    }
}

fn rv(p: &Value) -> u64 {
    p["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn phase(p: &Value) -> &str {
    p["status"]["phase"].as_str().unwrap_or("")
}

fn parse_time(s: &str) -> Option<OffsetDateTime> {
    knit_os::time::parse_rfc3339(s).ok()
}

/// The lowest address after the gateway (`.1`, which the bridge CNI's
/// host-local IPAM keeps) that none of `used` holds; `None` when full.
pub fn free_ip(pod_cidr: &str, used: &[String]) -> Option<String> {
    let (ip, len) = pod_cidr.trim().split_once('/')?;
    let ip: Ipv4Addr = ip.parse().ok()?;
    let len: u32 = len.parse().ok().filter(|l| *l <= 30)?;
    let net = u32::from(ip) & (u32::MAX << (32 - len));
    let size = 1u64 << (32 - len);
    let used: HashSet<&str> = used.iter().map(String::as_str).collect();
    (2..size - 1)
        .map(|i| Ipv4Addr::from(net + i as u32).to_string())
        .find(|a| !used.contains(a.as_str()))
}

/// A stable, container-runtime-like ID for a container of a pod.
fn container_id(uid: &str, name: &str) -> String {
    // FNV-1a, four rounds with different seeds: 64 hex digits.
    let mut out = String::new();
    for seed in 0u64..4 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ seed;
        for b in uid.bytes().chain([b'/']).chain(name.bytes()) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        out.push_str(&format!("{h:016x}"));
    }
    format!("containerd://{out}")
}

fn condition(t: &str, status: &str, now: &str) -> Value {
    json!({"type": t, "status": status, "lastProbeTime": null, "lastTransitionTime": now})
}

/// What a kubelet reports once a pod's containers are running and ready.
pub fn running_status(pod: &Value, host_ip: &str, pod_ip: &str, now: OffsetDateTime) -> Value {
    let at = rfc3339(now);
    let uid = pod["metadata"]["uid"].as_str().unwrap_or("");
    let containers = |field: &str, running: bool| -> Vec<Value> {
        pod["spec"][field]
            .as_array()
            .map(|cs| {
                cs.iter()
                    .map(|c| {
                        let name = c["name"].as_str().unwrap_or("");
                        let state = if running {
                            json!({"running": {"startedAt": at}})
                        } else {
                            json!({"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": at, "finishedAt": at,
                                                   "containerID": container_id(uid, name)}})
                        };
                        json!({"name": name, "image": c["image"], "imageID": "",
                               "containerID": container_id(uid, name),
                               "ready": running, "started": running, "restartCount": 0,
                               "state": state, "lastState": {}})
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut status = json!({
        "phase": "Running",
        "conditions": [
            condition("PodReadyToStartContainers", "True", &at),
            condition("Initialized", "True", &at),
            condition("Ready", "True", &at),
            condition("ContainersReady", "True", &at),
            condition("PodScheduled", "True", &at),
        ],
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "startTime": at,
        "containerStatuses": containers("containers", true),
    });
    let init = containers("initContainers", false);
    if !init.is_empty() {
        status["initContainerStatuses"] = json!(init);
    }
    status
}

/// What a kubelet reports when a deleted pod's containers have stopped
/// (SIGTERM honoured within the grace period, exit code 0).
pub fn terminated_status(pod: &Value, now: OffsetDateTime) -> Value {
    let at = rfc3339(now);
    let statuses: Vec<Value> = pod["status"]["containerStatuses"]
        .as_array()
        .map(|cs| {
            cs.iter()
                .map(|c| {
                    let mut c = c.clone();
                    let started = c["state"]["running"]["startedAt"].clone();
                    c["ready"] = json!(false);
                    c["started"] = json!(false);
                    c["state"] = json!({"terminated": {"exitCode": 0, "reason": "Completed",
                        "startedAt": started, "finishedAt": at, "containerID": c["containerID"]}});
                    c
                })
                .collect()
        })
        .unwrap_or_default();
    json!({
        "phase": "Succeeded",
        "conditions": [
            {"type": "PodReadyToStartContainers", "status": "False", "lastProbeTime": null, "lastTransitionTime": at},
            {"type": "Ready", "status": "False", "reason": "PodCompleted", "lastProbeTime": null, "lastTransitionTime": at},
            {"type": "ContainersReady", "status": "False", "reason": "PodCompleted", "lastProbeTime": null, "lastTransitionTime": at},
        ],
        "containerStatuses": statuses,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_ips_skip_network_and_gateway() {
        assert_eq!(free_ip("172.20.1.0/24", &[]).as_deref(), Some("172.20.1.2"));
        let used = vec!["172.20.1.2".to_string(), "172.20.1.3".to_string()];
        assert_eq!(
            free_ip("172.20.1.0/24", &used).as_deref(),
            Some("172.20.1.4")
        );
        let all: Vec<String> = (2..255).map(|i| format!("172.20.1.{i}")).collect();
        assert_eq!(free_ip("172.20.1.0/24", &all), None);
        assert_eq!(free_ip("nonsense", &[]), None);
    }

    #[test]
    fn running_then_terminated_as_a_kubelet_reports() {
        let pod = json!({"metadata": {"uid": "u1"},
            "spec": {"containers": [{"name": "app", "image": "img:1"}], "initContainers": [{"name": "init", "image": "i:1"}]}});
        let now = OffsetDateTime::now_utc();
        let s = running_status(&pod, "10.0.0.5", "172.20.0.2", now);
        assert_eq!(s["phase"], "Running");
        let types: Vec<&str> = s["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["type"].as_str().unwrap())
            .collect();
        for t in ["PodScheduled", "Initialized", "ContainersReady", "Ready"] {
            assert!(types.contains(&t), "{t}");
        }
        let c = &s["containerStatuses"][0];
        assert_eq!(
            (c["ready"].as_bool(), c["name"].as_str()),
            (Some(true), Some("app"))
        );
        assert!(c["state"]["running"]["startedAt"].is_string());
        assert!(c["containerID"]
            .as_str()
            .unwrap()
            .starts_with("containerd://"));
        assert_eq!(
            s["initContainerStatuses"][0]["state"]["terminated"]["reason"],
            "Completed"
        );
        let mut running = pod.clone();
        running["status"] = s;
        let t = terminated_status(&running, now);
        assert_eq!(t["phase"], "Succeeded");
        assert_eq!(
            t["containerStatuses"][0]["state"]["terminated"]["exitCode"],
            0
        );
        assert_eq!(container_id("u1", "app"), container_id("u1", "app"));
        assert_ne!(container_id("u1", "app"), container_id("u2", "app"));
        assert_eq!(pct("spec.nodeName=n-1"), "spec.nodeName%3Dn-1");
    }
}
