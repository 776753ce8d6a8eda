//! What the control plane asks a node's agent, and the agent's typed answers.
//!
//! The server never reaches into a node's files by path: it runs
//! `knit-agent <subcommand>` through the provider's exec and parses the JSON
//! the agent prints on stdout (one document). A subcommand that fails exits
//! non-zero and prints an [`AgentFailure`] instead. The node-name rule lives
//! here too, so that the server's expectation and the agent's choice cannot
//! drift apart.

use crate::CustomNodeName;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Where the knit stub puts what it fetched (the agent, the control plane's
/// CA, the NodeConfig), inside the instance.
pub const BOOTSTRAP_DIR: &str = "/var/lib/knit/bootstrap";
/// The agent's executable the stub installs (what the server runs).
pub const AGENT_EXE: &str = "/var/lib/knit/bootstrap/knit-agent";
/// The snapshot builder's image pulls log here (the kubelet's stderr), so
/// that the server can show how far they are while they run.
pub const IMAGES_LOG: &str = "/var/log/knit/snapshot-images.log";

/// The node ID (and provider ID): `<region>.<instance-id>`, lowercased.
pub fn node_id(region: &str, instance_id: &str) -> String {
    format!("{region}.{instance_id}").to_lowercase()
}

/// The node name by the pool's rule: the custom name from the node's IP,
/// else the node ID. `None` when the fact the rule needs is not known yet
/// (no IP for a custom name, no instance id).
pub fn node_name_by_rule(
    custom: Option<&CustomNodeName>,
    ip: Option<&str>,
    region: &str,
    instance_id: Option<&str>,
) -> Option<String> {
    match (custom, ip, instance_id) {
        (Some(rule), Some(ip), _) => Some(rule.render(ip)),
        (None, _, Some(id)) => Some(node_id(region, id)),
        _ => None,
    }
}

/// A machine-facing subcommand that failed: exit status non-zero, this on
/// stdout. `code` is the agent's error code (`FailCommand`, …).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentFailure {
    pub code: String,
    pub message: String,
}

/// `knit-agent cache-manifest --mount <dir>`: the package cache on the data
/// disk mounted at `<dir>` and its manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CacheManifestReport {
    /// The cache directory (node-absolute).
    pub cache: String,
    /// The manifest file (node-absolute).
    pub manifest_file: String,
    pub manifest: CacheManifest,
}

/// `knit-cache.json` beside the cached files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CacheManifest {
    pub version: String,
    /// Empty when the package came unpacked from a local directory.
    pub tarball_sha256: String,
    /// Path relative to the cache → sha256 (hex).
    pub files: BTreeMap<String, String>,
}

/// `knit-agent snapshot-prepare stop-kubelet`: the kubelet is stopped (it
/// cannot register the Node again); containerd keeps running.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeletStopped {
    /// `systemd` or `supervisor`: who ran it.
    pub service_manager: String,
}

/// `knit-agent snapshot-prepare verify-package --mount <dir>`: every file of
/// the package cache matches its manifest's sha256.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PackageVerified {
    pub cache: String,
    pub kubernetes_version: String,
    /// How many files were checked.
    pub files: usize,
}

/// `knit-agent snapshot-prepare system-images`: the system images the node
/// pulls (`/etc/kubernetes/images.txt`, comments and blanks left out).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SystemImages {
    pub images: Vec<String>,
}

/// `knit-agent snapshot-prepare pull-images`: what became of the pulls
/// through CRI (`kubelet --ensure-images`) within their deadline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "camelCase")]
pub enum ImagePull {
    /// Every image is present.
    #[serde(rename_all = "camelCase")]
    Pulled { report: ImageReport },
    /// The deadline passed; the pulls were ended.
    #[serde(rename_all = "camelCase")]
    TimedOut { last_log_line: String },
    /// The kubelet exited non-zero: its report when it printed one, and the
    /// last line of its log.
    #[serde(rename_all = "camelCase")]
    Failed {
        exit_code: i32,
        report: Option<ImageReport>,
        last_log_line: String,
    },
}

/// The kubelet's image report (`--ensure-images` prints it on stdout).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ImageReport {
    pub images: Vec<ImageOutcome>,
    pub hit: u64,
    pub miss: u64,
    pub failed: u64,
    pub bytes_pulled: u64,
}

/// One image of an [`ImageReport`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ImageOutcome {
    pub image: String,
    pub repo_digests: Vec<String>,
    /// Why it is not present, after every attempt failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One path a snapshot's data disk keeps, relative to its mount target
/// (the agent's `snapshot-prepare clean` removes every other path).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kept {
    pub path: &'static str,
    /// Kept with what is under it; `false`: the directory stays, empty.
    pub with_content: bool,
    pub what: &'static str,
}

/// Everything a snapshot's data disk keeps. Parents of these paths stay as
/// directories (nothing else in them); every other path goes.
pub const SNAPSHOT_KEEP: &[Kept] = &[
    Kept {
        path: "ack/kubernetes",
        with_content: true,
        what: "knit's package cache: the Kubernetes package and knit-cache.json",
    },
    Kept {
        path: "containerd/io.containerd.content.v1.content/blobs",
        with_content: true,
        what: "containerd's content store: image indexes, manifests, configs, layers",
    },
    Kept {
        path: "containerd/io.containerd.snapshotter.v1.overlayfs",
        with_content: true,
        what: "the images' unpacked layers (committed snapshots; containers' snapshots are deleted through containerd first)",
    },
    Kept {
        path: "containerd/io.containerd.metadata.v1.bolt/meta.db",
        with_content: true,
        what: "containerd's metadata: images, content, snapshots (containers, tasks and leases deleted through containerd first)",
    },
    Kept {
        path: "lost+found",
        with_content: false,
        what: "the filesystem's own directory (ext4), left empty",
    },
];

/// Whether `rel` (relative to the disk's mount target) may be on a
/// snapshot's data disk: a kept path, under one kept with its content, or
/// a parent directory of one.
pub fn snapshot_keeps(rel: &str) -> bool {
    SNAPSHOT_KEEP.iter().any(|k| {
        rel == k.path
            || (k.with_content && rel.starts_with(k.path) && rel[k.path.len()..].starts_with('/'))
            || (k.path.starts_with(rel) && k.path[rel.len()..].starts_with('/'))
    })
}

/// `knit-agent snapshot-prepare clean --mount <dir>`: everything on the
/// data disk but the image store and the package cache removed (the
/// [`SNAPSHOT_KEEP`]), the disk synced and trimmed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BuilderCleaned {
    /// Bytes used on the data disk mounted at `<dir>` (as `df` counts them).
    pub used_bytes: u64,
    /// containerd's version (`containerd --version`); empty when unknown.
    pub containerd_version: String,
    /// The kept paths found on the disk (relative to `<dir>`).
    #[serde(default)]
    pub kept: Vec<String>,
    /// How many paths were removed (top-most only), and the first of them.
    #[serde(default)]
    pub removed_count: u64,
    #[serde(default)]
    pub removed: Vec<String>,
    /// How many tasks, containers, leases and active snapshots containerd
    /// deleted.
    #[serde(default)]
    pub runtime_deleted: u64,
    /// The freed blocks were discarded (`fstrim`).
    #[serde(default)]
    pub trimmed: bool,
}

/// `knit-agent leave`: the machine put back as it was before `init` (the
/// undo ledger replayed), then the bootstrap files removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaveReport {
    pub undone: Vec<String>,
    /// What could not be undone; non-empty means the command failed.
    pub failed: Vec<String>,
}

/// A pool's change applied to a node in place (`knit-agent update
/// --update <base64 of this JSON>`, run by the control plane's rollout):
/// written into the node's NodeConfig, then `init` runs again and
/// re-renders, reinstalls and restarts only what changed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeUpdate {
    /// The kubelet's settings, whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubelet: Option<crate::config::KubeletConfig>,
    /// The Kubernetes package to run: version, mirror URL, sha256.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<crate::config::KubernetesPackage>,
}

/// `knit-agent update`'s answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeUpdated {
    pub node: String,
    /// The Kubernetes version installed now.
    pub kubernetes_version: String,
    /// Whether the kubelet runs as another process than before (it was
    /// restarted).
    pub kubelet_restarted: bool,
    /// What the installed kubelet says of itself (`kubelet --version`,
    /// e.g. `Kubernetes v1.32.0`); empty when it could not be asked.
    #[serde(default)]
    pub kubelet_version: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn node_name_rule() {
        let rule = CustomNodeName {
            prefix: "n-".into(),
            suffix: ".x".into(),
        };
        assert_eq!(
            node_name_by_rule(Some(&rule), Some("10.0.0.5"), "cn-hangzhou", Some("i-1")),
            Some("n-10.0.0.5.x".to_string())
        );
        assert_eq!(
            node_name_by_rule(None, None, "cn-Hangzhou", Some("I-AbC")),
            Some("cn-hangzhou.i-abc".to_string())
        );
        assert_eq!(node_name_by_rule(Some(&rule), None, "r", Some("i")), None);
        assert_eq!(node_name_by_rule(None, Some("10.0.0.5"), "r", None), None);
    }

    /// The kubelet stand-in's report (its field names) parses, extra fields
    /// ignored; the pull outcome's tag and fields keep their names.
    #[test]
    fn image_pull_json() {
        let report: ImageReport = serde_json::from_value(json!({
            "images": [{"image": "a:1", "cached": true, "sizeBytes": 3, "bytesPulled": 0,
                        "repoDigests": ["a@sha256:00"], "pullMillis": 1}],
            "hit": 1, "miss": 0, "failed": 0, "bytesPulled": 0, "totalMillis": 5
        }))
        .unwrap();
        assert_eq!(report.images[0].repo_digests, ["a@sha256:00"]);
        let pull = ImagePull::Failed {
            exit_code: 1,
            report: None,
            last_log_line: "x".into(),
        };
        assert_eq!(
            serde_json::to_value(&pull).unwrap(),
            json!({"outcome": "failed", "exitCode": 1, "report": null, "lastLogLine": "x"})
        );
        let back: ImagePull =
            serde_json::from_value(json!({"outcome": "timedOut", "lastLogLine": ""})).unwrap();
        assert_eq!(
            back,
            ImagePull::TimedOut {
                last_log_line: String::new()
            }
        );
    }

    /// `knit-cache.json` as the agent has always written it.
    #[test]
    fn cache_manifest_json() {
        let m: CacheManifest = serde_json::from_value(json!({
            "version": "1.31.4", "tarballSha256": "ab", "files": {"bin/kubelet": "00"}
        }))
        .unwrap();
        assert_eq!(
            serde_json::to_value(&m).unwrap(),
            json!({"version": "1.31.4", "tarballSha256": "ab", "files": {"bin/kubelet": "00"}})
        );
    }
}

/// The slot in knit-kubelet-sim's binary that holds the Kubernetes version
/// it reports (`--version`, the Node's `status.nodeInfo.kubeletVersion`):
/// this marker, the version, then NUL bytes, [`KUBELET_VERSION_SLOT`]
/// bytes in all. `knit package build --kubernetes-version X` writes X into
/// the copy it packs, as a real kubelet's version is fixed when it is built
/// (Go's `-ldflags -X`), so the stand-in reports the version it was built as.
pub const KUBELET_VERSION_STAMP: &str = "knit-kubelet-version-stamp:";
pub const KUBELET_VERSION_SLOT: usize = 64;

/// The slot holding `version` (cut to fit), made at compile time.
pub const fn kubelet_version_slot(version: &str) -> [u8; KUBELET_VERSION_SLOT] {
    let mut out = [0u8; KUBELET_VERSION_SLOT];
    let marker = KUBELET_VERSION_STAMP.as_bytes();
    let version = version.as_bytes();
    let mut i = 0;
    while i < marker.len() {
        out[i] = marker[i];
        i += 1;
    }
    let mut j = 0;
    while j < version.len() && i < KUBELET_VERSION_SLOT {
        out[i] = version[j];
        i += 1;
        j += 1;
    }
    out
}

/// The version in a slot: the bytes after the marker up to the first NUL,
/// when they are a version (`MAJOR.MINOR.PATCH`).
pub fn kubelet_version_of_slot(slot: &[u8; KUBELET_VERSION_SLOT]) -> Option<&str> {
    let rest = &slot[KUBELET_VERSION_STAMP.len()..];
    let end = rest.iter().position(|b| *b == 0).unwrap_or(rest.len());
    let version = std::str::from_utf8(&rest[..end]).ok()?;
    crate::validate::parse_kube_version(version).map(|_| version)
}

#[cfg(test)]
mod version_slot_tests {
    use super::*;

    #[test]
    fn a_slot_holds_its_version() {
        const SLOT: [u8; KUBELET_VERSION_SLOT] = kubelet_version_slot("1.31.4");
        assert!(SLOT.starts_with(KUBELET_VERSION_STAMP.as_bytes()));
        assert_eq!(kubelet_version_of_slot(&SLOT), Some("1.31.4"));
        assert_eq!(kubelet_version_of_slot(&kubelet_version_slot("x")), None);
        let long = "1.31.4".repeat(20);
        assert_eq!(kubelet_version_of_slot(&kubelet_version_slot(&long)), None);
    }
}
