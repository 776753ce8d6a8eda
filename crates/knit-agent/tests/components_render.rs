//! The files kubernetes-components renders, read back after a real `init`
//! of a node tree: KubeletConfiguration values, customized args, containerd
//! config (mirrors, insecure registries, downloads, paths) and limits.

mod components_support;

use components_support::*;
use knit_agent::render;
use knit_api::{Limit, ReservedMemory};

fn rendered_node() -> (Node, knit_api::NodeConfig) {
    let node = Node::new();
    let dir = node.path("/opt/knit-packages");
    std::fs::create_dir_all(&dir).unwrap();
    build_package(
        &dir,
        VERSION,
        &[
            ("bin/kubelet", b"#!/bin/sh\n"),
            ("bin/containerd", b"#!/bin/sh\n"),
        ],
    );
    let mut config = base_config();
    config.kubernetes.dir = Some("/opt/knit-packages".into());
    let k = &mut config.kubelet;
    k.max_pods = 64;
    k.event_record_qps = 9;
    k.kube_api_burst = 40;
    k.image_gc_high_threshold_percent = 90;
    k.container_log_max_size = "50Mi".into();
    k.cpu_manager_policy = "static".into();
    k.pod_pids_limit = 4096;
    k.read_only_port = 10255;
    k.serialize_image_pulls = true;
    k.cpu_cfs_quota_period = "50ms".into();
    k.allowed_unsafe_sysctls = vec!["net.core.somaxconn".into()];
    k.eviction_soft
        .insert("memory.available".into(), "500Mi".into());
    k.eviction_soft_grace_period
        .insert("memory.available".into(), "1m".into());
    k.kube_reserved.insert("cpu".into(), "200m".into());
    k.system_reserved.insert("memory".into(), "512Mi".into());
    k.feature_gates.insert("GracefulNodeShutdown".into(), true);
    k.reserved_memory.push(ReservedMemory {
        numa_node: 0,
        limits: [("memory".to_string(), "1Gi".to_string())].into(),
    });
    k.customized_args.insert("v".into(), "3".into());
    k.customized_args
        .insert("node-status-update-frequency".into(), "4s".into());
    config.node.taints.push(knit_api::Taint {
        key: "dedicated".into(),
        value: String::new(),
        effect: "NoSchedule".into(),
    });
    config.user_data.scheduling_gate = true;
    let c = &mut config.containerd;
    c.max_concurrent_downloads = 7;
    c.ignore_image_defined_volumes = false;
    c.sandbox_image = "mirror.local/pause:3.10".into();
    c.limit_no_file = Limit::Number(65536);
    c.limit_core = Limit::Number(0);
    c.registry_mirrors.insert(
        "docker.io".into(),
        vec![
            "https://mirror-a.local".into(),
            "http://mirror-b.local:5000/".into(),
        ],
    );
    c.insecure_registries = vec!["reg.local:5000".into()];
    node.init(&config).expect("init");
    (node, config)
}

#[test]
fn kubelet_configuration_holds_the_pool_values() {
    let (node, _) = rendered_node();
    let text = std::fs::read_to_string(node.path(render::KUBELET_CONFIG)).unwrap();
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
    let root = node.root().display().to_string();
    assert_eq!(doc["apiVersion"], "kubelet.config.k8s.io/v1beta1");
    assert_eq!(doc["kind"], "KubeletConfiguration");
    assert_eq!(doc["maxPods"], 64);
    assert_eq!(doc["eventRecordQPS"], 9);
    assert_eq!(doc["eventBurst"], 10, "defaults kept");
    assert_eq!(doc["kubeAPIBurst"], 40);
    assert_eq!(doc["imageGCHighThresholdPercent"], 90);
    assert_eq!(doc["containerLogMaxSize"], "50Mi");
    assert_eq!(doc["cpuManagerPolicy"], "static");
    assert_eq!(doc["podPidsLimit"], 4096);
    assert_eq!(doc["readOnlyPort"], 10255);
    assert_eq!(doc["serializeImagePulls"], true);
    assert_eq!(doc["cpuCFSQuotaPeriod"], "50ms");
    assert_eq!(doc["allowedUnsafeSysctls"][0], "net.core.somaxconn");
    assert_eq!(doc["evictionHard"]["memory.available"], "300Mi");
    assert_eq!(doc["evictionSoft"]["memory.available"], "500Mi");
    assert_eq!(doc["evictionSoftGracePeriod"]["memory.available"], "1m");
    assert_eq!(doc["kubeReserved"]["cpu"], "200m");
    assert_eq!(doc["systemReserved"]["memory"], "512Mi");
    assert_eq!(doc["featureGates"]["GracefulNodeShutdown"], true);
    assert_eq!(doc["reservedMemory"][0]["numaNode"], 0);
    assert_eq!(doc["reservedMemory"][0]["limits"]["memory"], "1Gi");
    assert_eq!(doc["registerWithTaints"][0]["key"], "dedicated");
    assert_eq!(
        doc["registerWithTaints"][1]["key"],
        "knit.dev/user-data-pending"
    );
    assert_eq!(doc["registerWithTaints"][1]["effect"], "NoSchedule");
    assert_eq!(doc["authentication"]["anonymous"]["enabled"], false);
    assert_eq!(doc["authorization"]["mode"], "Webhook");
    assert_eq!(
        doc["authentication"]["x509"]["clientCAFile"]
            .as_str()
            .unwrap(),
        format!("{root}/etc/kubernetes/pki/ca.crt")
    );
    // No systemd here: cgroupfs, matching containerd's runc options.
    assert_eq!(doc["cgroupDriver"], "cgroupfs");
    let args = std::fs::read_to_string(node.path(render::CUSTOMIZED_ARGS)).unwrap();
    assert_eq!(
        args,
        "KUBELET_CUSTOMIZED_ARGS=\"--node-status-update-frequency=4s --v=3\"\n"
    );
}

#[test]
fn containerd_configuration_mirrors_and_insecure_registries() {
    let (node, config) = rendered_node();
    let root = node.root().display().to_string();
    let toml = std::fs::read_to_string(node.path(render::CONTAINERD_CONFIG)).unwrap();
    for line in [
        "version = 2".to_string(),
        format!("root = \"{root}/var/lib/containerd\""),
        format!("state = \"{root}/run/containerd\""),
        format!("  address = \"{root}/run/containerd/containerd.sock\""),
        "  sandbox_image = \"mirror.local/pause:3.10\"".to_string(),
        "  max_concurrent_downloads = 7".to_string(),
        "  ignore_image_defined_volumes = false".to_string(),
        "  SystemdCgroup = false".to_string(),
        format!("  config_path = \"{root}/etc/containerd/certs.d\""),
    ] {
        assert!(
            toml.lines().any(|l| l == line),
            "missing {line:?} in\n{toml}"
        );
    }
    assert!(!toml.contains("proxy_plugins"), "no stargz unless asked");

    let docker =
        std::fs::read_to_string(node.path("/etc/containerd/certs.d/docker.io/hosts.toml")).unwrap();
    assert!(
        docker.contains("server = \"https://registry-1.docker.io\""),
        "{docker}"
    );
    let a = docker
        .find("[host.\"https://mirror-a.local\"]")
        .expect(&docker);
    let b = docker
        .find("[host.\"http://mirror-b.local:5000\"]")
        .expect(&docker);
    assert!(a < b, "mirrors in the configured order");
    assert!(!docker.contains("skip_verify"), "{docker}");

    let insecure =
        std::fs::read_to_string(node.path("/etc/containerd/certs.d/reg.local:5000/hosts.toml"))
            .unwrap();
    assert!(insecure.contains("[host.\"https://reg.local:5000\"]\n  capabilities = [\"pull\", \"resolve\", \"push\"]\n  skip_verify = true\n"), "{insecure}");
    assert!(
        insecure.contains("[host.\"http://reg.local:5000\"]"),
        "{insecure}"
    );

    let spec = render::containerd_service(&node.host, &config.containerd, "/usr/bin/containerd");
    assert_eq!(spec.limit_nofile, Some(65536));
    assert_eq!(spec.limit_core, Some(0));
    assert_eq!(spec.limit_memlock, None, "infinity");

    // A registry dropped from the config loses its managed hosts.toml; a
    // directory someone else wrote stays.
    let foreign = node.path("/etc/containerd/certs.d/other.local/hosts.toml");
    std::fs::create_dir_all(foreign.parent().unwrap()).unwrap();
    std::fs::write(&foreign, "server = \"https://other.local\"\n").unwrap();
    let mut config = config;
    config.containerd.insecure_registries.clear();
    node.init(&config).expect("rerun with fewer registries");
    assert!(!node.path("/etc/containerd/certs.d/reg.local:5000").exists());
    assert!(node
        .path("/etc/containerd/certs.d/docker.io/hosts.toml")
        .exists());
    assert!(foreign.exists());
}
