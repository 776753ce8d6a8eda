//! kubelet's command line, as the node agent writes it: `--name=value` or
//! `--name value`. Flags the stand-in does not use are ignored with a
//! warning, so any kubelet command line (including the customized args
//! file's) starts it.

use std::path::PathBuf;

use crate::error::SimError;

#[derive(Debug, Clone, Default)]
pub struct Flags {
    pub bootstrap_kubeconfig: Option<PathBuf>,
    pub kubeconfig: PathBuf,
    pub config: Option<PathBuf>,
    pub hostname_override: Option<String>,
    pub node_ip: Option<String>,
    pub provider_id: Option<String>,
    pub node_labels: Vec<(String, String)>,
    pub register_with_taints: Vec<Taint>,
    /// When absent: the config file's `containerRuntimeEndpoint`, then
    /// containerd's default socket.
    pub container_runtime_endpoint: Option<String>,
    pub cert_dir: PathBuf,
    pub root_dir: PathBuf,
    /// Where CNI configs are looked for (knit: kubelet's fixed default).
    pub cni_conf_dir: PathBuf,
    /// knit: no CRI or CNI checks (Ready once registered), for load tests.
    pub lightweight: bool,
    /// knit: the system images to ensure after start (the package's
    /// `images.txt`, which the node agent installs here).
    pub image_list: PathBuf,
    /// knit: ensure these images (comma-separated) through CRI, print the
    /// report as JSON on stdout and exit (no API server involved); the
    /// snapshot builder pulls business images with it.
    pub ensure_images: Option<Vec<String>>,
    pub version: bool,
    pub help: bool,
    /// Flags seen but not used, for the warning.
    pub ignored: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
pub struct Taint {
    pub key: String,
    #[serde(default)]
    pub value: String,
    pub effect: String,
}

const BOOL_FLAGS: &[&str] = &["lightweight", "version", "help"];

pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Flags, SimError> {
    let mut f = Flags {
        kubeconfig: "/etc/kubernetes/kubelet.conf".into(),
        cert_dir: "/var/lib/kubelet/pki".into(),
        root_dir: "/var/lib/kubelet".into(),
        cni_conf_dir: "/etc/cni/net.d".into(),
        image_list: "/etc/kubernetes/images.txt".into(),
        ..Flags::default()
    };
    let mut args = args.into_iter().peekable();
    while let Some(arg) = args.next() {
        let Some(body) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) else {
            return Err(SimError::Flags(format!(
                "unexpected argument {arg:?} (flags start with --)"
            )));
        };
        let (name, inline) = match body.split_once('=') {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None => (body.to_string(), None),
        };
        let known = is_known(&name);
        let value = match inline {
            Some(v) => v,
            None if BOOL_FLAGS.contains(&name.as_str()) => "true".into(),
            None => match args.peek() {
                Some(next) if !next.starts_with('-') => args.next().unwrap_or_default(),
                _ if known => return Err(SimError::Flags(format!("flag --{name} needs a value"))),
                _ => String::new(),
            },
        };
        if !known {
            f.ignored.push(name);
            continue;
        }
        apply(&mut f, &name, value)?;
    }
    Ok(f)
}

fn is_known(name: &str) -> bool {
    BOOL_FLAGS.contains(&name)
        || [
            "bootstrap-kubeconfig",
            "kubeconfig",
            "config",
            "hostname-override",
            "node-ip",
            "provider-id",
            "node-labels",
            "register-with-taints",
            "container-runtime-endpoint",
            "cert-dir",
            "root-dir",
            "cni-conf-dir",
            "image-list",
            "ensure-images",
        ]
        .contains(&name)
}

fn apply(f: &mut Flags, name: &str, value: String) -> Result<(), SimError> {
    let boolean = |v: &str| match v {
        "true" | "" => Ok(true),
        "false" => Ok(false),
        other => Err(SimError::Flags(format!(
            "--{name}={other}: expected true or false"
        ))),
    };
    match name {
        "bootstrap-kubeconfig" => f.bootstrap_kubeconfig = Some(value.into()),
        "kubeconfig" => f.kubeconfig = value.into(),
        "config" => f.config = Some(value.into()),
        "hostname-override" => f.hostname_override = Some(value),
        "node-ip" => {
            value
                .parse::<std::net::IpAddr>()
                .map_err(|_| SimError::Flags(format!("--node-ip={value}: not an IP address")))?;
            f.node_ip = Some(value)
        }
        "provider-id" => f.provider_id = Some(value),
        "node-labels" => f.node_labels = parse_labels(&value)?,
        "register-with-taints" => f.register_with_taints = parse_taints(&value)?,
        "container-runtime-endpoint" => f.container_runtime_endpoint = Some(value),
        "cert-dir" => f.cert_dir = value.into(),
        "root-dir" => f.root_dir = value.into(),
        "cni-conf-dir" => f.cni_conf_dir = value.into(),
        "image-list" => f.image_list = value.into(),
        "ensure-images" => {
            f.ensure_images = Some(
                value
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect(),
            )
        }
        "lightweight" => f.lightweight = boolean(&value)?,
        "version" => f.version = boolean(&value)?,
        "help" => f.help = boolean(&value)?,
        _ => {}
    }
    Ok(())
}

/// Labels in the `kubernetes.io`/`k8s.io` namespaces kubelet may set on
/// itself; the API server's NodeRestriction enforces the same rule.
const KUBELET_LABELS: &[&str] = &[
    "kubernetes.io/hostname",
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
    "beta.kubernetes.io/instance-type",
    "node.kubernetes.io/instance-type",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
];

fn kubelet_may_set(key: &str) -> bool {
    let Some((prefix, _)) = key.rsplit_once('/') else {
        return true;
    };
    let in_domain = |d: &str| prefix == d || prefix.ends_with(&format!(".{d}"));
    if in_domain("node-restriction.kubernetes.io") {
        return false;
    }
    if !in_domain("kubernetes.io") && !in_domain("k8s.io") {
        return true;
    }
    KUBELET_LABELS.contains(&key)
        || in_domain("kubelet.kubernetes.io")
        || in_domain("node.kubernetes.io")
}

/// `k=v,k2=v2`, validated as Kubernetes label keys and values; like kubelet,
/// labels it may not set on its own Node are refused at start.
pub fn parse_labels(s: &str) -> Result<Vec<(String, String)>, SimError> {
    let mut out = Vec::new();
    for item in s.split(',').filter(|i| !i.is_empty()) {
        let (k, v) = item
            .split_once('=')
            .ok_or_else(|| SimError::Flags(format!("--node-labels: {item:?} is not key=value")))?;
        knit_api::validate::check_label_key(k)
            .map_err(|e| SimError::Flags(format!("--node-labels: key {k:?}: {e}")))?;
        knit_api::validate::check_label_value(v)
            .map_err(|e| SimError::Flags(format!("--node-labels: value {v:?}: {e}")))?;
        out.push((k.to_string(), v.to_string()));
    }
    let refused: Vec<&str> = out
        .iter()
        .map(|(k, _)| k.as_str())
        .filter(|k| !kubelet_may_set(k))
        .collect();
    if !refused.is_empty() {
        return Err(SimError::Flags(format!(
            "unknown 'kubernetes.io' or 'k8s.io' labels specified with --node-labels: {refused:?}; \
             --node-labels in the 'kubernetes.io' namespace must begin with an allowed prefix \
             (kubelet.kubernetes.io, node.kubernetes.io) or be in the specifically allowed set"
        )));
    }
    Ok(out)
}

/// `key=value:Effect,key:Effect` as kubelet's `--register-with-taints`.
pub fn parse_taints(s: &str) -> Result<Vec<Taint>, SimError> {
    let mut out = Vec::new();
    for item in s.split(',').filter(|i| !i.is_empty()) {
        let bad = |why: &str| SimError::Flags(format!("--register-with-taints: {item:?}: {why}"));
        let (kv, effect) = item
            .rsplit_once(':')
            .ok_or_else(|| bad("missing :Effect"))?;
        if !["NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&effect) {
            return Err(bad(
                "effect must be NoSchedule, PreferNoSchedule or NoExecute",
            ));
        }
        let (key, value) = kv.split_once('=').unwrap_or((kv, ""));
        knit_api::validate::check_label_key(key).map_err(|e| bad(&e))?;
        knit_api::validate::check_label_value(value).map_err(|e| bad(&e))?;
        out.push(Taint {
            key: key.into(),
            value: value.into(),
            effect: effect.into(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &[&str]) -> Vec<String> {
        s.iter().map(|a| a.to_string()).collect()
    }

    #[test]
    fn kubelet_command_line_with_unknown_flags() {
        let f = parse(args(&[
            "--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf",
            "--kubeconfig",
            "/etc/kubernetes/kubelet.conf",
            "--hostname-override=n1",
            "--node-ip=10.0.0.5",
            "--node-labels=pool=a,node.kubernetes.io/role=worker",
            "--register-with-taints=knit.dev/user-data-pending:NoSchedule,dedicated=gpu:NoExecute",
            "--max-pods=64",
            "--rotate-certificates",
            "--v=2",
            "--lightweight",
        ]))
        .unwrap();
        assert_eq!(f.hostname_override.as_deref(), Some("n1"));
        assert_eq!(
            f.node_labels[1],
            ("node.kubernetes.io/role".into(), "worker".into())
        );
        assert_eq!(
            f.register_with_taints[0],
            Taint {
                key: "knit.dev/user-data-pending".into(),
                value: "".into(),
                effect: "NoSchedule".into()
            }
        );
        assert_eq!(f.register_with_taints[1].value, "gpu");
        assert_eq!(f.ignored, vec!["max-pods", "rotate-certificates", "v"]);
        assert!(f.lightweight);
        assert_eq!(f.cni_conf_dir, std::path::PathBuf::from("/etc/cni/net.d"));
    }

    #[test]
    fn bad_values_are_refused() {
        assert!(parse(args(&["--node-ip=nope"])).is_err());
        assert!(parse(args(&["--register-with-taints=a=b:Sometimes"])).is_err());
        assert!(parse(args(&["--node-labels=-bad=x"])).is_err());
        let err = parse(args(&["--node-labels=node-role.kubernetes.io/master="])).unwrap_err();
        assert!(
            err.to_string().contains("node-role.kubernetes.io/master"),
            "{err}"
        );
        assert!(parse(args(&[
            "--node-labels=topology.kubernetes.io/zone=z1,example.com/a=b"
        ]))
        .is_ok());
        assert!(parse(args(&["--kubeconfig"])).is_err());
        assert!(parse(args(&["stray"])).is_err());
    }
}
