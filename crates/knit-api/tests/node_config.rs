//! NodeConfig parsing and docs/spec.md §4 validation: every error named with its
//! field, value and rule, all at once.

use knit_api::{ApiError, FieldError, NodeConfig};

fn errors(yaml: &str) -> Vec<FieldError> {
    match NodeConfig::from_yaml(yaml) {
        Err(ApiError::Invalid(list)) => list,
        other => panic!("expected validation errors, got {other:?}"),
    }
}

fn doc(body: &str) -> String {
    format!("apiVersion: knit.dev/v1alpha1\nkind: NodeConfig\n{body}")
}

fn has(list: &[FieldError], field: &str, rule_part: &str) -> bool {
    list.iter()
        .any(|e| e.field == field && e.rule.contains(rule_part))
}

#[test]
fn minimal_document_is_valid_with_defaults() {
    let config = NodeConfig::from_yaml(&doc("dataDisk: {enabled: true}\n")).expect("valid");
    assert!(config.data_disk.enabled);
    assert_eq!(config.data_disk.mount_target, "/var/lib/container");
    assert_eq!(config.data_disk.fs_type.as_str(), "ext4");
    assert_eq!(config.kubelet.event_record_qps, 5);
    assert_eq!(
        config
            .kubelet
            .eviction_hard
            .get("memory.available")
            .map(String::as_str),
        Some("300Mi")
    );
    assert_eq!(config.containerd.limit_no_file.render(), "1048576");
    assert_eq!(
        config
            .os
            .effective_sysctls()
            .get("fs.file-max")
            .map(String::as_str),
        Some("2097152")
    );
    // JSON is accepted too, and the document round-trips.
    let json =
        r#"{"apiVersion":"knit.dev/v1alpha1","kind":"NodeConfig","dataDisk":{"enabled":true}}"#;
    assert_eq!(NodeConfig::from_yaml(json).expect("json"), config);
    assert_eq!(
        NodeConfig::from_yaml(&config.to_yaml().expect("written")).expect("round trip"),
        config
    );
}

#[test]
fn unknown_fields_and_wrong_kind_are_rejected() {
    match NodeConfig::from_yaml(&doc("dataDisk: {enabled: true, size: 3}\n")) {
        Err(ApiError::Parse { message, .. }) => {
            assert!(message.contains("unknown field `size`"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    let list = errors("apiVersion: v1\nkind: Pod\n");
    assert!(has(&list, "apiVersion", "knit.dev/v1alpha1"));
    assert!(has(&list, "kind", "NodeConfig"));
}

#[test]
fn kubelet_ranges_and_relations_all_reported() {
    let list = errors(&doc(
        "kubelet:\n  eventRecordQPS: 51\n  eventBurst: 4\n  kubeAPIQPS: 20\n  kubeAPIBurst: 10\n  registryPullQPS: 0\n  registryBurst: 101\n  imageGCHighThresholdPercent: 70\n  imageGCLowThresholdPercent: 75\n  containerLogMaxFiles: 1\n  containerLogMaxSize: lots\n  cpuManagerPolicy: dynamic\n  memoryManagerPolicy: none\n  topologyManagerPolicy: strict\n  cpuCFSQuotaPeriod: 2s\n  allowedUnsafeSysctls: [kernel.panic, net.core.somaxconn]\n  evictionSoftGracePeriod: {memory.available: 1m}\n  evictionHard: {memory.free: 1Gi}\n",
    ));
    for (field, rule) in [
        ("kubelet.eventRecordQPS", "[1, 50]"),
        ("kubelet.eventBurst", ">= eventRecordQPS"),
        ("kubelet.kubeAPIBurst", ">= kubeAPIQPS"),
        ("kubelet.registryPullQPS", "[1, 50]"),
        ("kubelet.registryBurst", "[1, 100]"),
        (
            "kubelet.imageGCHighThresholdPercent",
            "greater than imageGCLowThresholdPercent",
        ),
        ("kubelet.containerLogMaxFiles", "[2, 10]"),
        ("kubelet.containerLogMaxSize", "quantity"),
        ("kubelet.cpuManagerPolicy", "none|static"),
        ("kubelet.memoryManagerPolicy", "None|Static"),
        ("kubelet.topologyManagerPolicy", "single-numa-node"),
        ("kubelet.cpuCFSQuotaPeriod", "[1ms, 1s]"),
        ("kubelet.allowedUnsafeSysctls[0]", "kernel.shm"),
        (
            "kubelet.evictionSoftGracePeriod[memory.available]",
            "evictionSoft",
        ),
        ("kubelet.evictionHard[memory.free]", "eviction signal"),
    ] {
        assert!(
            has(&list, field, rule),
            "missing {field} / {rule} in {list:#?}"
        );
    }
    assert!(!list
        .iter()
        .any(|e| e.field == "kubelet.allowedUnsafeSysctls[1]"));
    // The message names field, value and rule.
    let shown = ApiError::Invalid(list).to_string();
    assert!(
        shown.contains("kubelet.eventRecordQPS: value 51 must be in [1, 50]"),
        "{shown}"
    );
}

#[test]
fn containerd_limits_and_mirrors() {
    let list = errors(&doc(
        "containerd:\n  maxConcurrentDownloads: 0\n  limitNoFile: 100\n  limitMemLock: lots\n  limitCore: -1\n  registryMirrors: {docker.io: [ftp://mirror]}\n  insecureRegistries: [\"http://reg:5000\"]\n",
    ));
    assert!(has(&list, "containerd.maxConcurrentDownloads", "[1, 20]"));
    assert!(has(&list, "containerd.limitNoFile", ">= 1024"));
    assert!(has(&list, "containerd.limitMemLock", "infinity"));
    assert!(has(&list, "containerd.limitCore", ">= 0"));
    assert!(has(
        &list,
        "containerd.registryMirrors[docker.io][0]",
        "http:// or https://"
    ));
    assert!(has(
        &list,
        "containerd.insecureRegistries[0]",
        "without scheme"
    ));
    let ok = NodeConfig::from_yaml(&doc(
        "containerd:\n  limitNoFile: infinity\n  limitMemLock: 65536\n  registryMirrors: {docker.io: [\"http://10.213.0.1:5000\"]}\n  insecureRegistries: [\"10.213.0.1:5000\"]\n",
    ));
    assert!(ok.is_ok(), "{ok:?}");
}

#[test]
fn sysctl_and_thp() {
    let list = errors(&doc(
        "os:\n  sysctl: {fs.nr_open: \"3000000\", vm.max_map_count: many, net.ipv4.ip_forward: \"2\", \"bad key\": \"1\"}\n  transparentHugePage: {enabled: sometimes, defrag: defer+madvise}\n",
    ));
    assert!(has(&list, "os.sysctl[fs.nr_open]", "less than fs.file-max"));
    assert!(has(
        &list,
        "os.sysctl[vm.max_map_count]",
        "non-negative integer"
    ));
    assert!(has(&list, "os.sysctl[net.ipv4.ip_forward]", "0 or 1"));
    assert!(has(&list, "os.sysctl", "sysctl name"));
    assert!(has(
        &list,
        "os.transparentHugePage.enabled",
        "always|never|madvise"
    ));
    assert!(!list
        .iter()
        .any(|e| e.field == "os.transparentHugePage.defrag"));
}

#[test]
fn labels_taints_and_custom_names() {
    let list = errors(&doc(
        "node:\n  labels: {\"kubernetes.io/role\": x, \"node.kubernetes.io/pool\": ok, \"topology.kubernetes.io/zone\": local-a, \"topology.kubernetes.io/rack\": r1, \"-bad\": v, good: \"-v\"}\n  taints: [{key: dedicated, value: gpu, effect: NoWhere}]\n  customName: {prefix: \"1abc\", suffix: \"x-\"}\n",
    ));
    assert!(has(
        &list,
        "node.labels[kubernetes.io/role]",
        "reserved prefix"
    ));
    assert!(!list
        .iter()
        .any(|e| e.field == "node.labels[node.kubernetes.io/pool]"));
    // The well-known labels a kubelet may set, and no other key of
    // topology.kubernetes.io/.
    assert!(!list
        .iter()
        .any(|e| e.field == "node.labels[topology.kubernetes.io/zone]"));
    assert!(has(
        &list,
        "node.labels[topology.kubernetes.io/rack]",
        "reserved prefix"
    ));
    assert!(has(&list, "node.labels[-bad]", "start and end"));
    assert!(has(&list, "node.labels[good]", "value must start and end"));
    assert!(has(
        &list,
        "node.taints[0].effect",
        "NoSchedule|NoExecute|PreferNoSchedule"
    ));
    assert!(has(&list, "node.customName.prefix", "start with a letter"));
    assert!(has(&list, "node.customName.suffix", "must not end"));

    let too_long = errors(&doc(&format!(
        "node:\n  customName: {{prefix: a{}}}\n",
        "b".repeat(49)
    )));
    assert!(has(&too_long, "node.customName", "at most 64"));
    let doubled = errors(&doc("node:\n  customName: {prefix: \"a..b\"}\n"));
    assert!(has(&doubled, "node.customName.prefix", "consecutive"));
    let missing = errors(&doc("node:\n  customName: {suffix: test}\n"));
    assert!(has(&missing, "node.customName.prefix", "required"));
    // docs/spec.md §1.3.1's example.
    let ok = NodeConfig::from_yaml(&doc(
        "node:\n  customName: {prefix: aliyun.com, suffix: test}\n",
    ))
    .expect("valid");
    assert_eq!(
        ok.node.custom_name.expect("rule").render("192.168.1.55"),
        "aliyun.com192.168.1.55test"
    );
}

#[test]
fn cluster_access_and_package() {
    let list = errors(&doc(
        "cluster: {endpoint: \"http://x:6443\", caPin: \"sha256:XYZ\", bootstrapToken: \"secret-token\"}\nkubernetes: {version: \"1.19.3\", sha256: abc, dir: relative}\ndataDisk: {mountTarget: /, device: vdb}\njoin: {timeoutSeconds: 0}\n",
    ));
    assert!(has(&list, "cluster.endpoint", "https://"));
    assert!(has(&list, "cluster.caPin", "sha256:<64"));
    let token = list
        .iter()
        .find(|e| e.field == "cluster.bootstrapToken")
        .expect("token error");
    assert!(
        !token.value.contains("secret"),
        "a token is never echoed back"
    );
    assert!(has(&list, "kubernetes.version", "1.20.0 or later"));
    assert!(has(&list, "kubernetes.sha256", "64 hex"));
    assert!(has(&list, "kubernetes.dir", "absolute"));
    assert!(has(&list, "dataDisk.mountTarget", "other than /"));
    assert!(has(&list, "dataDisk.device", "/dev/"));
    assert!(has(&list, "join.timeoutSeconds", "[1, 3600]"));
}
