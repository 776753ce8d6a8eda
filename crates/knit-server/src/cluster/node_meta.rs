//! What the control plane reads of a Node to keep its labels and taints in
//! step with its pool (`crate::reconcile::node_sync`): its labels, its
//! annotations and its taints as the API holds them, read from a Node's
//! JSON the same way for the embedded API and an external cluster.

use serde_json::Value;
use std::collections::BTreeMap;

/// One registered Node's metadata, as read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeMeta {
    pub name: String,
    /// The object's resourceVersion when read: a patch that replaces the
    /// taint list carries it, so a concurrent change is a conflict.
    pub resource_version: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// `spec.taints` as read, each whole (`timeAdded` and any other field
    /// kept when the list is written back).
    pub taints: Vec<Value>,
}

fn string_map(v: &Value) -> BTreeMap<String, String> {
    v.as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))
        .collect()
}

impl NodeMeta {
    /// From a Node object (`None` when it has no name).
    pub fn from_node(node: &Value) -> Option<NodeMeta> {
        let meta = &node["metadata"];
        Some(NodeMeta {
            name: meta["name"].as_str()?.to_string(),
            resource_version: meta["resourceVersion"].as_str().map(str::to_string),
            labels: string_map(&meta["labels"]),
            annotations: string_map(&meta["annotations"]),
            taints: node["spec"]["taints"]
                .as_array()
                .cloned()
                .unwrap_or_default(),
        })
    }

    /// Every Node of a NodeList.
    pub fn from_list(list: &Value) -> Vec<NodeMeta> {
        list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(NodeMeta::from_node)
            .collect()
    }
}

/// How a patch of one Node ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodePatched {
    Patched,
    /// The Node is not registered (any more).
    NotFound,
    /// The Node changed since it was read (409): read it again.
    Conflict,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_node_is_read_whole_and_a_list_item_by_item() {
        let node = json!({
            "metadata": {"name": "n1", "resourceVersion": "42",
                         "labels": {"a": "1", "n": 5}, "annotations": {"x": "y"}},
            "spec": {"taints": [{"key": "k", "effect": "NoExecute", "timeAdded": "2024-01-01T00:00:00Z"}]}
        });
        let m = NodeMeta::from_node(&node).unwrap();
        assert_eq!(m.name, "n1");
        assert_eq!(m.resource_version.as_deref(), Some("42"));
        assert_eq!(
            m.labels.len(),
            1,
            "a value that is no string is not a label"
        );
        assert_eq!(m.annotations["x"], "y");
        assert_eq!(m.taints[0]["timeAdded"], "2024-01-01T00:00:00Z");
        let list = json!({"items": [node, {"metadata": {}}, {"metadata": {"name": "n2"}}]});
        let names: Vec<_> = NodeMeta::from_list(&list)
            .into_iter()
            .map(|m| m.name)
            .collect();
        assert_eq!(names, ["n1", "n2"]);
    }
}
