//! Server-side printing (`meta.k8s.io/v1 Table`), which `kubectl get` asks
//! for: the columns kube-apiserver prints for each kind, `-o wide` ones with
//! priority 1.

use serde_json::{json, Value};

use crate::resources::ResourceDef;
use crate::util::{human_age, parse_time};

/// What each row carries besides its cells (`includeObject`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Include {
    None,
    Metadata,
    Object,
}

impl Include {
    pub fn parse(s: Option<&str>) -> Include {
        match s {
            Some("None") => Include::None,
            Some("Object") => Include::Object,
            _ => Include::Metadata,
        }
    }
}

fn col(name: &str, ty: &str, priority: u8, description: &str) -> Value {
    let format = if name == "Name" { "name" } else { "" };
    json!({"name": name, "type": ty, "format": format, "description": description, "priority": priority})
}

fn age(obj: &Value) -> String {
    human_age(
        obj["metadata"]["creationTimestamp"]
            .as_str()
            .and_then(parse_time),
    )
}

pub fn table(def: &ResourceDef, items: &[Value], rv: u64, include: Include) -> Value {
    let columns = columns(def.kind);
    let rows: Vec<Value> = items
        .iter()
        .map(|o| {
            let mut row = json!({"cells": cells(def.kind, o)});
            match include {
                Include::None => {}
                Include::Object => row["object"] = o.clone(),
                Include::Metadata => {
                    row["object"] = json!({
                        "kind": "PartialObjectMetadata",
                        "apiVersion": "meta.k8s.io/v1",
                        "metadata": o["metadata"],
                    })
                }
            }
            row
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": rv.to_string()},
        "columnDefinitions": columns,
        "rows": rows,
    })
}

fn columns(kind: &str) -> Vec<Value> {
    let name = col(
        "Name",
        "string",
        0,
        "Name must be unique within a namespace.",
    );
    let age = col("Age", "string", 0, "CreationTimestamp is a timestamp representing the server time when this object was created.");
    match kind {
        "Node" => vec![
            name,
            col("Status", "string", 0, "The status of the node"),
            col("Roles", "string", 0, "The roles of the node"),
            age,
            col(
                "Version",
                "string",
                0,
                "Kubelet Version reported by the node.",
            ),
            col(
                "Internal-IP",
                "string",
                1,
                "List of internal IPs of the node.",
            ),
            col(
                "External-IP",
                "string",
                1,
                "List of external IPs of the node.",
            ),
            col(
                "OS-Image",
                "string",
                1,
                "OS Image reported by the node from /etc/os-release.",
            ),
            col(
                "Kernel-Version",
                "string",
                1,
                "Kernel Version reported by the node from 'uname -r'.",
            ),
            col(
                "Container-Runtime",
                "string",
                1,
                "Container Runtime Version reported by the node.",
            ),
        ],
        "CertificateSigningRequest" => vec![
            name,
            age,
            col(
                "SignerName",
                "string",
                0,
                "Name of the signer that will issue the certificate.",
            ),
            col(
                "Requestor",
                "string",
                0,
                "Name of the user who created the request.",
            ),
            col(
                "RequestedDuration",
                "string",
                0,
                "Requested validity duration of the certificate.",
            ),
            col(
                "Condition",
                "string",
                0,
                "Approval and issuance state of the request.",
            ),
        ],
        "Lease" => vec![
            name,
            col("Holder", "string", 0, "Holder identity of the lease."),
            age,
        ],
        "Secret" => vec![
            name,
            col("Type", "string", 0, "The type of the secret"),
            col("Data", "string", 0, "The number of entries in the data"),
            age,
        ],
        "ConfigMap" => vec![
            name,
            col("Data", "string", 0, "Number of data entries"),
            age,
        ],
        "Namespace" => vec![
            name,
            col("Status", "string", 0, "The status of the namespace"),
            age,
        ],
        "Pod" => vec![
            name,
            col("Ready", "string", 0, "The aggregate readiness state of this pod for accepting traffic."),
            col("Status", "string", 0, "The aggregate status of the containers in this pod."),
            col("Restarts", "string", 0, "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted."),
            age,
            col("IP", "string", 1, "IP address allocated to the pod. Routable at least within the cluster. Empty if not yet allocated."),
            col("Node", "string", 1, "NodeName is a request to schedule this pod onto a specific node."),
            col("Nominated Node", "string", 1, "nominatedNodeName is set only when this pod preempts other pods on the node."),
            col("Readiness Gates", "string", 1, "If specified, all readiness gates will be evaluated for pod readiness."),
        ],
        // kube-apiserver's Event columns: the wide ones (priority 1) shown
        // by `kubectl get events -o wide`.
        "Event" => vec![
            col("Last Seen", "string", 0, "The time at which the most recent occurrence of this event was recorded."),
            col("Type", "string", 0, "Type of this event (Normal, Warning), new types could be added in the future."),
            col("Reason", "string", 0, "This should be a short, machine understandable string that gives the reason for the transition into the object's current status."),
            col("Object", "string", 0, "The object that this event is about."),
            col("Subobject", "string", 1, "If referring to a piece of an object instead of an entire object, this string should contain a valid JSON/Go field access statement."),
            col("Source", "string", 1, "The component reporting this event. Should be a short machine understandable string."),
            col("Message", "string", 0, "A human-readable description of the status of this operation."),
            col("First Seen", "string", 1, "The time at which the event was first recorded. (Time of server receipt is in TypeMeta.)"),
            col("Count", "integer", 1, "The number of times this event has occurred."),
            col("Name", "string", 1, "Name must be unique within a namespace."),
        ],
        "PodDisruptionBudget" => vec![
            name,
            col("Min Available", "string", 0, "The minimum number of pods that must be available simultaneously."),
            col("Max Unavailable", "string", 0, "The maximum number of pods that may be unavailable simultaneously."),
            col("Allowed Disruptions", "integer", 0, "Calculated number of pods that may be disrupted at this time."),
            age,
        ],
        _ => vec![name, age],
    }
}

fn cells(kind: &str, o: &Value) -> Vec<Value> {
    let name = json!(o["metadata"]["name"]);
    match kind {
        "Node" => {
            let addr = |t: &str| {
                o["status"]["addresses"]
                    .as_array()
                    .and_then(|a| a.iter().find(|x| x["type"] == t))
                    .and_then(|x| x["address"].as_str())
                    .unwrap_or("<none>")
                    .to_string()
            };
            let info = &o["status"]["nodeInfo"];
            let s = |v: &Value| {
                v.as_str()
                    .filter(|x| !x.is_empty())
                    .unwrap_or("<unknown>")
                    .to_string()
            };
            vec![
                name,
                json!(node_status(o)),
                json!(node_roles(o)),
                json!(age(o)),
                json!(s(&info["kubeletVersion"])),
                json!(addr("InternalIP")),
                json!(addr("ExternalIP")),
                json!(s(&info["osImage"])),
                json!(s(&info["kernelVersion"])),
                json!(s(&info["containerRuntimeVersion"])),
            ]
        }
        "CertificateSigningRequest" => {
            let duration = o["spec"]["expirationSeconds"]
                .as_i64()
                .map(|s| format!("{}m", s / 60))
                .unwrap_or_else(|| "<none>".into());
            vec![
                name,
                json!(age(o)),
                json!(o["spec"]["signerName"]),
                json!(o["spec"]["username"]),
                json!(duration),
                json!(csr_condition(o)),
            ]
        }
        "Lease" => vec![
            name,
            json!(o["spec"]["holderIdentity"].as_str().unwrap_or("")),
            json!(age(o)),
        ],
        "Secret" => vec![
            name,
            json!(o["type"].as_str().unwrap_or("Opaque")),
            json!(o["data"].as_object().map_or(0, |d| d.len())),
            json!(age(o)),
        ],
        "ConfigMap" => vec![
            name,
            json!(o["data"].as_object().map_or(0, |d| d.len())),
            json!(age(o)),
        ],
        "Namespace" => vec![
            name,
            json!(o["status"]["phase"].as_str().unwrap_or("Active")),
            json!(age(o)),
        ],
        "Pod" => {
            let statuses = o["status"]["containerStatuses"].as_array();
            let total = o["spec"]["containers"].as_array().map_or(0, |c| c.len());
            let ready = statuses.map_or(0, |s| s.iter().filter(|c| c["ready"] == true).count());
            let restarts: i64 = statuses.map_or(0, |s| {
                s.iter().filter_map(|c| c["restartCount"].as_i64()).sum()
            });
            let status = if !o["metadata"]["deletionTimestamp"].is_null() {
                "Terminating".to_string()
            } else {
                o["status"]["reason"]
                    .as_str()
                    .or(o["status"]["phase"].as_str())
                    .unwrap_or("Unknown")
                    .to_string()
            };
            let none = |v: &Value| {
                v.as_str()
                    .filter(|s| !s.is_empty())
                    .unwrap_or("<none>")
                    .to_string()
            };
            vec![
                name,
                json!(format!("{ready}/{total}")),
                json!(status),
                json!(restarts.to_string()),
                json!(age(o)),
                json!(none(&o["status"]["podIP"])),
                json!(none(&o["spec"]["nodeName"])),
                json!(none(&o["status"]["nominatedNodeName"])),
                json!("<none>"),
            ]
        }
        "Event" => {
            let at = |k: &str| o[k].as_str().and_then(parse_time);
            let count = o["count"].as_i64().unwrap_or(1);
            let first = at("firstTimestamp").or_else(|| at("eventTime"));
            let last = at("lastTimestamp").or(first);
            let last_seen = if count > 1 {
                format!("{} (x{count} over {})", human_age(last), human_age(first))
            } else {
                human_age(last)
            };
            let involved = &o["involvedObject"];
            let kind = involved["kind"].as_str().unwrap_or("").to_lowercase();
            let object = match involved["name"].as_str().filter(|n| !n.is_empty()) {
                Some(n) => format!("{kind}/{n}"),
                None => kind,
            };
            let source = &o["source"];
            let source = match (
                source["component"].as_str().unwrap_or(""),
                source["host"].as_str().filter(|h| !h.is_empty()),
            ) {
                (c, Some(h)) => format!("{c}, {h}"),
                (c, None) => c.to_string(),
            };
            vec![
                json!(last_seen),
                json!(o["type"].as_str().unwrap_or("")),
                json!(o["reason"].as_str().unwrap_or("")),
                json!(object),
                json!(involved["fieldPath"].as_str().unwrap_or("")),
                json!(source),
                json!(o["message"].as_str().unwrap_or("").trim()),
                json!(human_age(first)),
                json!(count),
                name,
            ]
        }
        "PodDisruptionBudget" => vec![
            name,
            json!(crate::pods::budget_cell(&o["spec"]["minAvailable"])),
            json!(crate::pods::budget_cell(&o["spec"]["maxUnavailable"])),
            json!(o["status"]["disruptionsAllowed"].as_i64().unwrap_or(0)),
            json!(age(o)),
        ],
        _ => vec![name, json!(age(o))],
    }
}

/// `Ready`, `NotReady`, `Unknown`, with `,SchedulingDisabled` when cordoned.
pub fn node_status(o: &Value) -> String {
    let ready = o["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
        .and_then(|c| c["status"].as_str());
    let mut s = match ready {
        Some("True") => "Ready".to_string(),
        Some("False") => "NotReady".to_string(),
        _ => "Unknown".to_string(),
    };
    if o["spec"]["unschedulable"] == json!(true) {
        s.push_str(",SchedulingDisabled");
    }
    s
}

fn node_roles(o: &Value) -> String {
    let mut roles: Vec<&str> = o["metadata"]["labels"]
        .as_object()
        .map(|l| {
            l.keys()
                .filter_map(|k| k.strip_prefix("node-role.kubernetes.io/"))
                .filter(|r| !r.is_empty())
                .collect()
        })
        .unwrap_or_default();
    roles.sort_unstable();
    if roles.is_empty() {
        "<none>".into()
    } else {
        roles.join(",")
    }
}

fn csr_condition(o: &Value) -> String {
    let conds = o["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut parts: Vec<String> = conds
        .iter()
        .filter(|c| c["status"] != "False")
        .filter_map(|c| c["type"].as_str().map(str::to_string))
        .collect();
    if parts.is_empty() {
        parts.push("Pending".into());
    }
    if o["status"]["certificate"]
        .as_str()
        .is_some_and(|c| !c.is_empty())
    {
        parts.push("Issued".into());
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_rows_carry_status_and_wide_columns() {
        let def = crate::resources::by_kind("Node").unwrap();
        let n = json!({
            "metadata": {"name": "n1", "labels": {"node-role.kubernetes.io/worker": ""}},
            "spec": {"unschedulable": true},
            "status": {"conditions": [{"type": "Ready", "status": "True"}],
                       "addresses": [{"type": "InternalIP", "address": "10.0.0.5"}]}
        });
        let t = table(def, &[n], 7, Include::Metadata);
        let cells = &t["rows"][0]["cells"];
        assert_eq!(cells[1], "Ready,SchedulingDisabled");
        assert_eq!(cells[2], "worker");
        assert_eq!(cells[5], "10.0.0.5");
        assert_eq!(t["columnDefinitions"][5]["priority"], 1);
        assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
    }
}
