//! Renders the kubelet's and containerd's files and command lines from the
//! NodeConfig. Pure functions of their inputs; paths inside the rendered
//! files are host paths (`Host::host_path`) so that under `--root` the
//! processes really run against the tree.

use crate::error::{AgentError, Result};
use crate::host::Host;
use crate::identity::NodeFacts;
use crate::services::ServiceSpec;
use knit_api::{ContainerdConfig, ErrorCode, NodeConfig, USER_DATA_GATE_TAINT};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

pub const KUBELET_CONFIG: &str = "/var/lib/kubelet/config.yaml";
pub const KUBELET_ROOT_DIR: &str = "/var/lib/kubelet";
pub const KUBELET_CERT_DIR: &str = "/var/lib/kubelet/pki";
pub const BOOTSTRAP_KUBECONFIG: &str = "/etc/kubernetes/bootstrap-kubelet.conf";
pub const KUBECONFIG: &str = "/etc/kubernetes/kubelet.conf";
pub const CUSTOMIZED_ARGS: &str = "/etc/kubernetes/kubelet-customized-args.conf";
pub const CLUSTER_CA: &str = "/etc/kubernetes/pki/ca.crt";
pub const CONTAINERD_CONFIG: &str = "/etc/containerd/config.toml";
pub const CONTAINERD_CERTS_D: &str = "/etc/containerd/certs.d";
pub const CONTAINERD_ROOT: &str = "/var/lib/containerd";
pub const CONTAINERD_STATE: &str = "/run/containerd";
pub const CONTAINERD_SOCK: &str = "/run/containerd/containerd.sock";
pub const NVIDIA_RUNTIME: &str = "/usr/bin/nvidia-container-runtime";
pub const STARGZ_SOCK: &str = "/run/containerd-stargz-grpc/containerd-stargz-grpc.sock";
pub const STARGZ_ROOT: &str = "/var/lib/containerd-stargz-grpc";
pub const STARGZ_CONFIG: &str = "/etc/containerd-stargz-grpc/config.toml";
pub const CONTAINERD_LOG: &str = "/var/log/knit/containerd.log";
pub const KUBELET_LOG: &str = "/var/log/knit/kubelet.log";
pub const STARGZ_LOG: &str = "/var/log/knit/containerd-stargz-grpc.log";
/// First line of every hosts.toml the agent writes: marks it as ours.
pub const MANAGED_HEADER: &str = "# Managed by knit-agent; changes are overwritten.";

/// What the node's runtime setup depends on besides the NodeConfig.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuntimeOptions {
    /// systemd manages cgroups (kubelet `cgroupDriver` and runc `SystemdCgroup` agree).
    pub systemd_cgroup: bool,
    pub gpu: bool,
    pub image_acceleration: bool,
}

impl RuntimeOptions {
    pub fn new(config: &NodeConfig, systemd_cgroup: bool) -> RuntimeOptions {
        RuntimeOptions {
            systemd_cgroup,
            gpu: config.components.gpu.enabled,
            image_acceleration: config.components.image_acceleration.enabled,
        }
    }
}

fn string_map(map: &BTreeMap<String, String>) -> Value {
    Value::Object(
        map.iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect(),
    )
}

/// Taints the kubelet registers with: the pool's, plus the user-data gate.
pub fn register_taints(config: &NodeConfig) -> Vec<(String, String, String)> {
    let mut taints: Vec<(String, String, String)> = config
        .node
        .taints
        .iter()
        .map(|t| (t.key.clone(), t.value.clone(), t.effect.clone()))
        .collect();
    if config.user_data.scheduling_gate {
        taints.push((
            USER_DATA_GATE_TAINT.to_string(),
            String::new(),
            "NoSchedule".to_string(),
        ));
    }
    taints
}

/// `KubeletConfiguration` (kubelet.config.k8s.io/v1beta1) as YAML.
pub fn kubelet_config(
    host: &Host,
    config: &NodeConfig,
    options: RuntimeOptions,
) -> std::result::Result<String, knit_api::ser::SerializeError> {
    let k = &config.kubelet;
    let mut doc = Map::new();
    let mut set = |key: &str, value: Value| {
        doc.insert(key.to_string(), value);
    };
    set("apiVersion", json!("kubelet.config.k8s.io/v1beta1"));
    set("kind", json!("KubeletConfiguration"));
    set("address", json!(k.address));
    set("port", json!(k.port));
    set("readOnlyPort", json!(k.read_only_port));
    set(
        "authentication",
        json!({
            "anonymous": {"enabled": false},
            "webhook": {"enabled": true, "cacheTTL": "2m0s"},
            "x509": {"clientCAFile": host.host_path(CLUSTER_CA)},
        }),
    );
    set(
        "authorization",
        json!({
            "mode": "Webhook",
            "webhook": {"cacheAuthorizedTTL": "5m0s", "cacheUnauthorizedTTL": "30s"},
        }),
    );
    set(
        "cgroupDriver",
        json!(if options.systemd_cgroup {
            "systemd"
        } else {
            "cgroupfs"
        }),
    );
    set(
        "containerRuntimeEndpoint",
        json!(format!("unix://{}", host.host_path(CONTAINERD_SOCK))),
    );
    set("rotateCertificates", json!(true));
    set("eventRecordQPS", json!(k.event_record_qps));
    set("eventBurst", json!(k.event_burst));
    set("kubeAPIQPS", json!(k.kube_api_qps));
    set("kubeAPIBurst", json!(k.kube_api_burst));
    set("registryPullQPS", json!(k.registry_pull_qps));
    set("registryBurst", json!(k.registry_burst));
    set(
        "imageGCHighThresholdPercent",
        json!(k.image_gc_high_threshold_percent),
    );
    set(
        "imageGCLowThresholdPercent",
        json!(k.image_gc_low_threshold_percent),
    );
    set("containerLogMaxFiles", json!(k.container_log_max_files));
    set("containerLogMaxSize", json!(k.container_log_max_size));
    set("cpuManagerPolicy", json!(k.cpu_manager_policy));
    set("memoryManagerPolicy", json!(k.memory_manager_policy));
    set("topologyManagerPolicy", json!(k.topology_manager_policy));
    set("podPidsLimit", json!(k.pod_pids_limit));
    set("serializeImagePulls", json!(k.serialize_image_pulls));
    set("cpuCFSQuota", json!(k.cpu_cfs_quota));
    set("cpuCFSQuotaPeriod", json!(k.cpu_cfs_quota_period));
    set("maxPods", json!(k.max_pods));
    if !k.allowed_unsafe_sysctls.is_empty() {
        set("allowedUnsafeSysctls", json!(k.allowed_unsafe_sysctls));
    }
    for (key, map) in [
        ("evictionHard", &k.eviction_hard),
        ("evictionSoft", &k.eviction_soft),
        ("evictionSoftGracePeriod", &k.eviction_soft_grace_period),
        ("kubeReserved", &k.kube_reserved),
        ("systemReserved", &k.system_reserved),
    ] {
        if !map.is_empty() {
            set(key, string_map(map));
        }
    }
    if !k.feature_gates.is_empty() {
        set("featureGates", json!(k.feature_gates));
    }
    if !k.reserved_memory.is_empty() {
        let reserved: Vec<Value> = k
            .reserved_memory
            .iter()
            .map(|r| json!({"numaNode": r.numa_node, "limits": string_map(&r.limits)}))
            .collect();
        set("reservedMemory", Value::Array(reserved));
    }
    let taints = register_taints(config);
    if !taints.is_empty() {
        let taints: Vec<Value> = taints
            .iter()
            .map(|(key, value, effect)| {
                let mut t = json!({"key": key, "effect": effect});
                if !value.is_empty() {
                    t["value"] = json!(value);
                }
                t
            })
            .collect();
        set("registerWithTaints", Value::Array(taints));
    }
    // An error, never an empty file: a kubelet reading an empty config
    // runs on its defaults, not the pool's.
    knit_api::ser::yaml("the KubeletConfiguration", &Value::Object(doc))
}

/// The kubeconfig the kubelet uses for TLS bootstrap.
pub fn bootstrap_kubeconfig(
    endpoint: &str,
    ca_pem: &str,
    token: &str,
) -> std::result::Result<String, knit_api::ser::SerializeError> {
    use base64::Engine;
    let ca_data = base64::engine::general_purpose::STANDARD.encode(ca_pem.as_bytes());
    let doc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kubernetes", "cluster": {
            "server": endpoint,
            "certificate-authority-data": ca_data,
        }}],
        "users": [{"name": "kubelet-bootstrap", "user": {"token": token}}],
        "contexts": [{"name": "kubelet-bootstrap", "context": {
            "cluster": "kubernetes",
            "user": "kubelet-bootstrap",
        }}],
        "current-context": "kubelet-bootstrap",
    });
    knit_api::ser::yaml("the bootstrap kubeconfig", &doc)
}

/// The user's extra kubelet flags, `--k=v` each, in key order.
pub fn customized_args_list(config: &NodeConfig) -> Vec<String> {
    config
        .kubelet
        .customized_args
        .iter()
        .map(|(k, v)| format!("--{k}={v}"))
        .collect()
}

/// `/etc/kubernetes/kubelet-customized-args.conf`, an environment file.
pub fn customized_args_file(config: &NodeConfig) -> String {
    let joined = customized_args_list(config).join(" ");
    let escaped: String = joined
        .chars()
        .flat_map(|c| match c {
            '\\' | '"' | '$' | '`' => vec!['\\', c],
            c => vec![c],
        })
        .collect();
    format!("KUBELET_CUSTOMIZED_ARGS=\"{escaped}\"\n")
}

/// The kubelet's full command line.
pub fn kubelet_command(
    host: &Host,
    config: &NodeConfig,
    node: &NodeFacts,
    kubelet_bin: &str,
) -> Vec<String> {
    let mut args = vec![
        kubelet_bin.to_string(),
        format!(
            "--bootstrap-kubeconfig={}",
            host.host_path(BOOTSTRAP_KUBECONFIG)
        ),
        format!("--kubeconfig={}", host.host_path(KUBECONFIG)),
        format!("--config={}", host.host_path(KUBELET_CONFIG)),
        format!("--hostname-override={}", node.name),
        format!("--node-ip={}", node.ip),
        format!("--provider-id={}", node.node_id),
    ];
    if !config.node.labels.is_empty() {
        let labels: Vec<String> = config
            .node
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        args.push(format!("--node-labels={}", labels.join(",")));
    }
    let taints = register_taints(config);
    if !taints.is_empty() {
        let taints: Vec<String> = taints
            .iter()
            .map(|(k, v, e)| format!("{k}={v}:{e}"))
            .collect();
        args.push(format!("--register-with-taints={}", taints.join(",")));
    }
    if config.has_runtime() {
        args.push(format!(
            "--container-runtime-endpoint=unix://{}",
            host.host_path(CONTAINERD_SOCK)
        ));
    } else {
        // `runtime: none`: the kubelet stand-in's mode without CRI or CNI
        // (a real kubelet has none and does not start).
        args.push("--lightweight".to_string());
    }
    args.push(format!("--cert-dir={}", host.host_path(KUBELET_CERT_DIR)));
    args.push(format!("--root-dir={}", host.host_path(KUBELET_ROOT_DIR)));
    args.extend(customized_args_list(config));
    args
}

/// A TOML basic string.
fn toml_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// containerd's `config.toml` (version 2).
pub fn containerd_config(
    host: &Host,
    config: &ContainerdConfig,
    options: RuntimeOptions,
) -> String {
    let cri = "plugins.\"io.containerd.grpc.v1.cri\"";
    let snapshotter = if options.image_acceleration {
        "stargz"
    } else {
        "overlayfs"
    };
    let mut t = format!(
        "{MANAGED_HEADER}\n\
         version = 2\n\
         root = {root}\n\
         state = {state}\n\
         oom_score = -999\n\n\
         [grpc]\n  address = {sock}\n  max_recv_message_size = 16777216\n  max_send_message_size = 16777216\n\n\
         [plugins.\"io.containerd.internal.v1.opt\"]\n  path = {opt}\n\n\
         [{cri}]\n  sandbox_image = {sandbox}\n  max_concurrent_downloads = {downloads}\n  \
         ignore_image_defined_volumes = {ignore}\n\n\
         [{cri}.containerd]\n  snapshotter = \"{snapshotter}\"\n  default_runtime_name = \"runc\"\n  \
         disable_snapshot_annotations = {annotations}\n\n\
         [{cri}.containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n\n\
         [{cri}.containerd.runtimes.runc.options]\n  SystemdCgroup = {systemd}\n\n",
        root = toml_str(&host.host_path(CONTAINERD_ROOT)),
        state = toml_str(&host.host_path(CONTAINERD_STATE)),
        sock = toml_str(&host.host_path(CONTAINERD_SOCK)),
        opt = toml_str(&host.host_path("/opt/containerd")),
        sandbox = toml_str(&config.sandbox_image),
        downloads = config.max_concurrent_downloads,
        ignore = config.ignore_image_defined_volumes,
        // Remote snapshotters need the image annotations.
        annotations = !options.image_acceleration,
        systemd = options.systemd_cgroup,
    );
    if options.gpu {
        t.push_str(&format!(
            "[{cri}.containerd.runtimes.nvidia]\n  runtime_type = \"io.containerd.runc.v2\"\n\n\
             [{cri}.containerd.runtimes.nvidia.options]\n  BinaryName = {bin}\n  SystemdCgroup = {systemd}\n\n",
            bin = toml_str(&host.host_path(NVIDIA_RUNTIME)),
            systemd = options.systemd_cgroup,
        ));
    }
    t.push_str(&format!(
        "[{cri}.cni]\n  bin_dir = {bin}\n  conf_dir = {conf}\n\n\
         [{cri}.registry]\n  config_path = {certs}\n",
        bin = toml_str(&host.host_path("/opt/cni/bin")),
        conf = toml_str(&host.host_path("/etc/cni/net.d")),
        certs = toml_str(&host.host_path(CONTAINERD_CERTS_D)),
    ));
    if options.image_acceleration {
        t.push_str(&format!(
            "\n[proxy_plugins]\n  [proxy_plugins.stargz]\n    type = \"snapshot\"\n    address = {}\n",
            toml_str(&host.host_path(STARGZ_SOCK))
        ));
    }
    t
}

fn registry_server(registry: &str, scheme: &str) -> String {
    // Docker Hub's registry API is not served at its image-name host.
    if registry == "docker.io" {
        format!("{scheme}://registry-1.docker.io")
    } else {
        format!("{scheme}://{registry}")
    }
}

/// The control plane's CA for containerd: named (`ca = …`) by the
/// `hosts.toml` entries of mirrors at the control plane's own address
/// (node-absolute; `ca` names it as the host sees it).
pub const CONTROL_PLANE_REGISTRY_CA: &str = "/etc/containerd/knit-control-plane-ca.crt";

/// The control plane as a registry mirror: its origin and the CA file
/// (as containerd opens it) that verifies it.
#[derive(Debug, Clone, Copy)]
pub struct ControlPlaneMirror<'a> {
    pub origin: &'a str,
    pub ca_file: &'a str,
}

/// `scheme://host[:port]` of a URL (no path, no final `/`).
pub fn url_origin(url: &str) -> Option<&str> {
    let (scheme, rest) = url.split_once("://")?;
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    (!scheme.is_empty() && end > 0).then(|| &url[..scheme.len() + 3 + end])
}

/// One `hosts.toml` per registry with mirrors or marked insecure, keyed by
/// the `certs.d` directory name (the registry host). A mirror whose origin
/// is `control_plane`'s (the control plane's registry) is verified with
/// the CA file it names (`ca = …`), and only that mirror: the control
/// plane's CA is trusted for nothing else.
pub fn registry_hosts(
    config: &ContainerdConfig,
    control_plane: Option<ControlPlaneMirror<'_>>,
) -> Result<BTreeMap<String, String>> {
    let mut registries: Vec<&String> = config.registry_mirrors.keys().collect();
    registries.extend(config.insecure_registries.iter());
    registries.sort();
    registries.dedup();
    let mut files = BTreeMap::new();
    for registry in registries {
        if registry.contains('/') || registry == "." || registry == ".." {
            return Err(AgentError::new(
                ErrorCode::FailInstallComponents,
                format!(
                    "containerd registry {registry:?} is not a host[:port]; cannot name {CONTAINERD_CERTS_D}/<registry>"
                ),
            ));
        }
        let insecure = config.insecure_registries.contains(registry);
        let mut text = format!(
            "{MANAGED_HEADER}\nserver = {}\n",
            toml_str(&registry_server(registry, "https"))
        );
        let host_entry = |url: &str, capabilities: &str, skip_verify: bool| {
            let mut entry = format!(
                "\n[host.{}]\n  capabilities = {capabilities}\n",
                toml_str(url.trim_end_matches('/'))
            );
            if skip_verify {
                entry.push_str("  skip_verify = true\n");
            } else if let Some(cp) = control_plane
                .filter(|cp| url.starts_with("https://") && url_origin(url) == Some(cp.origin))
            {
                entry.push_str(&format!("  ca = {}\n", toml_str(cp.ca_file)));
            }
            entry
        };
        for mirror in config.registry_mirrors.get(registry).into_iter().flatten() {
            text.push_str(&host_entry(
                mirror,
                "[\"pull\", \"resolve\"]",
                insecure && mirror.starts_with("https://"),
            ));
        }
        if insecure {
            // TLS without verification first, then plain HTTP.
            let all = "[\"pull\", \"resolve\", \"push\"]";
            text.push_str(&host_entry(&registry_server(registry, "https"), all, true));
            text.push_str(&host_entry(&registry_server(registry, "http"), all, false));
        }
        files.insert(registry.clone(), text);
    }
    Ok(files)
}

fn limit(value: &knit_api::Limit) -> Option<u64> {
    value.value().map(|n| n.max(0) as u64)
}

/// PATH for services: the package's binaries first.
fn service_path(host: &Host) -> String {
    [
        "/usr/local/sbin",
        "/usr/local/bin",
        "/usr/sbin",
        "/usr/bin",
        "/sbin",
        "/bin",
    ]
    .iter()
    .map(|dir| host.host_path(dir))
    .chain(
        // Under --root the tree may lack runc and the shims: the host's follow.
        (!host.is_live())
            .then(|| {
                ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin"].map(String::from)
            })
            .into_iter()
            .flatten(),
    )
    .collect::<Vec<_>>()
    .join(":")
}

pub fn containerd_service(host: &Host, config: &ContainerdConfig, bin: &str) -> ServiceSpec {
    ServiceSpec {
        name: "containerd".to_string(),
        exec: vec![
            bin.to_string(),
            "--config".to_string(),
            host.host_path(CONTAINERD_CONFIG),
        ],
        env: vec![("PATH".to_string(), service_path(host))],
        limit_nofile: limit(&config.limit_no_file),
        limit_core: limit(&config.limit_core),
        limit_memlock: limit(&config.limit_mem_lock),
        log_file: CONTAINERD_LOG.to_string(),
    }
}

pub fn kubelet_service(host: &Host, exec: Vec<String>) -> ServiceSpec {
    ServiceSpec {
        name: "kubelet".to_string(),
        exec,
        env: vec![("PATH".to_string(), service_path(host))],
        limit_nofile: Some(1_048_576),
        limit_core: None,
        limit_memlock: None,
        log_file: KUBELET_LOG.to_string(),
    }
}

pub fn stargz_service(host: &Host, bin: &str) -> ServiceSpec {
    ServiceSpec {
        name: "containerd-stargz-grpc".to_string(),
        exec: vec![
            bin.to_string(),
            format!("--address={}", host.host_path(STARGZ_SOCK)),
            format!("--root={}", host.host_path(STARGZ_ROOT)),
            format!("--config={}", host.host_path(STARGZ_CONFIG)),
        ],
        env: vec![("PATH".to_string(), service_path(host))],
        limit_nofile: Some(1_048_576),
        limit_core: None,
        limit_memlock: None,
        log_file: STARGZ_LOG.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_control_plane_ca_verifies_the_control_plane_mirror_only() {
        assert_eq!(
            url_origin("https://10.0.0.1:7443/report/v1/events"),
            Some("https://10.0.0.1:7443")
        );
        assert_eq!(
            url_origin("https://10.0.0.1:7443"),
            Some("https://10.0.0.1:7443")
        );
        assert_eq!(url_origin("https:///x"), None);
        assert_eq!(url_origin("10.0.0.1:7443"), None);
        let mut c = ContainerdConfig::default();
        c.registry_mirrors.insert(
            "registry.k8s.io".into(),
            vec!["https://10.0.0.1:7443/".into()],
        );
        c.registry_mirrors.insert(
            "docker.io".into(),
            vec![
                "https://10.0.0.1:7444".into(),
                "http://10.0.0.1:7443".into(),
            ],
        );
        let cp = ControlPlaneMirror {
            origin: "https://10.0.0.1:7443",
            ca_file: "/etc/containerd/knit-control-plane-ca.crt",
        };
        let files = registry_hosts(&c, Some(cp)).unwrap();
        assert!(
            files["registry.k8s.io"].contains(
                "[host.\"https://10.0.0.1:7443\"]\n  capabilities = [\"pull\", \"resolve\"]\n  ca = \"/etc/containerd/knit-control-plane-ca.crt\"\n"
            ),
            "{}",
            files["registry.k8s.io"]
        );
        assert!(
            !files["docker.io"].contains("ca ="),
            "{}",
            files["docker.io"]
        );
        let files = registry_hosts(&c, None).unwrap();
        assert!(!files["registry.k8s.io"].contains("ca ="));
    }

    #[test]
    fn toml_strings_are_escaped() {
        assert_eq!(toml_str("a\"b\\c"), "\"a\\\"b\\\\c\"");
    }

    #[test]
    fn customized_args_escape_shell_specials() {
        let mut config = NodeConfig::default();
        config
            .kubelet
            .customized_args
            .insert("v".into(), "2".into());
        config
            .kubelet
            .customized_args
            .insert("a".into(), "x\"$y".into());
        assert_eq!(
            customized_args_file(&config),
            "KUBELET_CUSTOMIZED_ARGS=\"--a=x\\\"\\$y --v=2\"\n"
        );
    }
}
