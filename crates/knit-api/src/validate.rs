//! Validation of docs/spec.md §4's rules. Every check appends to one list so that a
//! user sees all their mistakes at once.

use crate::config::*;
use crate::error::{ApiError, FieldError};
use std::collections::BTreeMap;
use std::fmt::Display;

/// Collects field errors under a path prefix.
#[derive(Debug, Default)]
pub struct Errors {
    pub list: Vec<FieldError>,
}

impl Errors {
    pub fn add(&mut self, field: impl Into<String>, value: impl Display, rule: impl Into<String>) {
        self.list.push(FieldError {
            field: field.into(),
            value: value.to_string(),
            rule: rule.into(),
        });
    }

    pub fn range(&mut self, field: &str, value: i64, min: i64, max: i64) {
        if value < min || value > max {
            self.add(field, value, format!("must be in [{min}, {max}]"));
        }
    }

    pub fn one_of(&mut self, field: &str, value: &str, allowed: &[&str]) {
        if !allowed.contains(&value) {
            self.add(
                field,
                quoted(value),
                format!("must be one of {}", allowed.join("|")),
            );
        }
    }

    pub fn into_result(self) -> Result<(), ApiError> {
        if self.list.is_empty() {
            Ok(())
        } else {
            Err(ApiError::Invalid(self.list))
        }
    }
}

fn quoted(s: &str) -> String {
    format!("{s:?}")
}

impl NodeConfig {
    pub fn validate(&self) -> Result<(), ApiError> {
        let mut e = Errors::default();
        if self.api_version != API_VERSION {
            e.add(
                "apiVersion",
                quoted(&self.api_version),
                format!("must be {API_VERSION}"),
            );
        }
        if self.kind != "NodeConfig" {
            e.add("kind", quoted(&self.kind), "must be NodeConfig");
        }
        self.cluster.validate("cluster", &mut e);
        self.node.validate("node", &mut e);
        self.kubernetes.validate("kubernetes", &mut e);
        self.kubelet.validate("kubelet", &mut e);
        self.containerd.validate("containerd", &mut e);
        e.one_of("runtime", &self.runtime, crate::config::RUNTIMES);
        self.os.validate("os", &mut e);
        self.data_disk.validate("dataDisk", &mut e);
        if self.join.timeout_seconds < 1 || self.join.timeout_seconds > 3600 {
            e.add(
                "join.timeoutSeconds",
                self.join.timeout_seconds,
                "must be in [1, 3600]",
            );
        }
        e.into_result()
    }
}

impl ClusterAccess {
    pub fn validate(&self, at: &str, e: &mut Errors) {
        if let Some(endpoint) = &self.endpoint {
            if !endpoint.starts_with("https://") {
                e.add(
                    format!("{at}.endpoint"),
                    quoted(endpoint),
                    "must be an https:// URL",
                );
            }
        }
        if let Some(pin) = &self.ca_pin {
            if !is_ca_pin(pin) {
                e.add(
                    format!("{at}.caPin"),
                    quoted(pin),
                    "must be sha256:<64 lowercase hex digits>",
                );
            }
        }
        if let Some(token) = &self.bootstrap_token {
            if !is_bootstrap_token(token) {
                // Never echo a secret back: show its shape only.
                e.add(
                    format!("{at}.bootstrapToken"),
                    format!("<{} chars>", token.len()),
                    "must match [a-z0-9]{6}.[a-z0-9]{16}",
                );
            }
        }
        if let Some(url) = &self.report_url {
            if !(url.starts_with("https://") || url.starts_with("http://")) {
                e.add(
                    format!("{at}.reportUrl"),
                    quoted(url),
                    "must be an http(s):// URL",
                );
            }
        }
    }
}

pub fn is_ca_pin(pin: &str) -> bool {
    pin.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

pub fn is_bootstrap_token(token: &str) -> bool {
    let ok = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    match token.split_once('.') {
        Some((id, secret)) => ok(id, 6) && ok(secret, 16),
        None => false,
    }
}

impl NodeIdentity {
    pub fn validate(&self, at: &str, e: &mut Errors) {
        if let Some(ip) = &self.ip {
            if ip.parse::<std::net::IpAddr>().is_err() {
                e.add(
                    format!("{at}.ip"),
                    quoted(ip),
                    "must be an IPv4 or IPv6 address",
                );
            }
        }
        if let Some(name) = &self.name {
            if !is_dns_subdomain(name) {
                e.add(
                    format!("{at}.name"),
                    quoted(name),
                    "must be a DNS subdomain: lowercase letters, digits, '-' and '.', at most 253 chars, alphanumeric at both ends",
                );
            }
        }
        if let Some(rule) = &self.custom_name {
            rule.validate(&format!("{at}.customName"), e);
            let v6 = self
                .ip
                .as_deref()
                .and_then(|ip| ip.parse::<std::net::IpAddr>().ok())
                .is_some_and(|ip| ip.is_ipv6());
            if v6 && self.name.is_none() {
                let name = rule.render(self.ip.as_deref().unwrap_or_default());
                e.add(
                    format!("{at}.ip"),
                    quoted(self.ip.as_deref().unwrap_or_default()),
                    format!("is an IPv6 address: the custom node name would be {name:?}, and a node name (a DNS-1123 subdomain) cannot hold ':'; give an IPv4 address or remove customName"),
                );
            }
        }
        validate_labels(&format!("{at}.labels"), &self.labels, e);
        validate_taints(&format!("{at}.taints"), &self.taints, e);
    }
}

/// DNS-1123 subdomain, as Kubernetes requires for object names.
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

impl CustomNodeName {
    /// Rules of docs/spec.md §1.3.1. The total length is checked with the longest IPv4
    /// address (15 chars) and the shortest (7), so a rule valid here is valid
    /// for every node of the pool.
    pub fn validate(&self, at: &str, e: &mut Errors) {
        if self.prefix.is_empty() {
            e.add(format!("{at}.prefix"), quoted(""), "is required");
        } else if let Err(rule) = check_name_part(&self.prefix) {
            e.add(format!("{at}.prefix"), quoted(&self.prefix), rule);
        }
        if !self.suffix.is_empty() {
            if let Err(rule) = check_name_part(&self.suffix) {
                e.add(format!("{at}.suffix"), quoted(&self.suffix), rule);
            }
        }
        let longest = self.prefix.len() + 15 + self.suffix.len();
        if longest > 64 {
            e.add(
                at,
                quoted(&self.render("255.255.255.255")),
                "prefix + node IP + suffix must be at most 64 characters",
            );
        }
        // The name every node of the pool gets must be a node name: the
        // rendered name checked whole, for the shortest and the longest
        // IPv4 address, so that the agent never refuses it.
        for ip in ["1.1.1.1", "255.255.255.255"] {
            let name = self.render(ip);
            if let Err(rule) = CustomNodeName::check_rendered(&name) {
                // The part that brings the capitals, else the rule whole.
                let upper = |p: &str| p.bytes().any(|b| b.is_ascii_uppercase());
                let mut fields: Vec<String> = [("prefix", &self.prefix), ("suffix", &self.suffix)]
                    .into_iter()
                    .filter(|(_, part)| upper(part))
                    .map(|(f, _)| format!("{at}.{f}"))
                    .collect();
                if fields.is_empty() {
                    fields.push(at.to_string());
                }
                for field in fields {
                    e.add(
                        field,
                        quoted(&name),
                        format!("renders node names like this one, which {rule}"),
                    );
                }
                break;
            }
        }
    }

    /// The full-name rule for one concrete name: 2–64 chars, a Kubernetes
    /// node name (a DNS-1123 subdomain: lowercase letters, digits, '-' and
    /// '.', alphanumeric at both ends of every label). An IPv6 address
    /// cannot be part of one (its ':').
    pub fn check_rendered(name: &str) -> Result<(), String> {
        if name.len() < 2 || name.len() > 64 {
            return Err("must be 2 to 64 characters".to_string());
        }
        if name.contains(':') {
            return Err("holds an IPv6 address, whose ':' a node name cannot hold (a DNS-1123 subdomain): give the node an IPv4 address or use no customNodeName".to_string());
        }
        if name.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err("holds upper-case letters: a node name is a DNS-1123 subdomain (lowercase letters, digits, '-' and '.')".to_string());
        }
        let ends_ok =
            |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
        if !ends_ok(name.chars().next()) || !ends_ok(name.chars().last()) {
            return Err("must start and end with a lowercase letter or digit".to_string());
        }
        if !is_dns_subdomain(name) {
            return Err("is not a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', every dot-separated label alphanumeric at both ends)".to_string());
        }
        Ok(())
    }
}

fn check_name_part(part: &str) -> Result<(), String> {
    if !part
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
    {
        return Err("may hold only letters, digits, '-' and '.'".to_string());
    }
    if !part.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return Err("must start with a letter".to_string());
    }
    if part.ends_with('-') || part.ends_with('.') {
        return Err("must not end with '-' or '.'".to_string());
    }
    if part.contains("--") || part.contains("..") || part.contains("-.") || part.contains(".-") {
        return Err("must not hold consecutive '-' or '.'".to_string());
    }
    Ok(())
}

/// Label and taint keys: `[prefix/]name` (docs/spec.md §4.4).
pub fn check_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if name.is_empty() || name.len() > 63 {
        return Err("name part must be 1 to 63 characters".to_string());
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err("name part may hold only [A-Za-z0-9-_.]".to_string());
    }
    if !name.starts_with(|c: char| c.is_ascii_alphanumeric())
        || !name.ends_with(|c: char| c.is_ascii_alphanumeric())
    {
        return Err("name part must start and end with a letter or digit".to_string());
    }
    if let Some(prefix) = prefix {
        if !is_dns_subdomain(prefix) {
            return Err("prefix must be a DNS subdomain of at most 253 characters".to_string());
        }
    }
    Ok(())
}

pub fn check_label_value(value: &str) -> Result<(), String> {
    if value.len() > 63 {
        return Err("must be at most 63 characters".to_string());
    }
    if value.is_empty() {
        return Ok(());
    }
    if !value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err("may hold only [A-Za-z0-9-_.]".to_string());
    }
    if !value.starts_with(|c: char| c.is_ascii_alphanumeric())
        || !value.ends_with(|c: char| c.is_ascii_alphanumeric())
    {
        return Err("must start and end with a letter or digit".to_string());
    }
    Ok(())
}

/// The well-known labels inside `kubernetes.io` a kubelet may set on its
/// own Node (Kubernetes' NodeRestriction), as a cloud controller manager
/// sets them: knit puts the instance type, region and zone on every node.
pub const KUBELET_WELL_KNOWN_LABELS: &[&str] = &[
    "node.kubernetes.io/instance-type",
    "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone",
];

/// Kubernetes reserves these prefixes, except the two node-facing ones and
/// the well-known labels a kubelet may set.
fn reserved_label_prefix(key: &str) -> bool {
    let Some((prefix, _)) = key.rsplit_once('/') else {
        return false;
    };
    if KUBELET_WELL_KNOWN_LABELS.contains(&key) {
        return false;
    }
    let allowed = ["kubelet.kubernetes.io", "node.kubernetes.io"];
    if allowed
        .iter()
        .any(|a| prefix == *a || prefix.ends_with(&format!(".{a}")))
    {
        return false;
    }
    ["kubernetes.io", "k8s.io"]
        .iter()
        .any(|r| prefix == *r || prefix.ends_with(&format!(".{r}")))
}

pub fn validate_labels(at: &str, labels: &BTreeMap<String, String>, e: &mut Errors) {
    for (key, value) in labels {
        if let Err(rule) = check_label_key(key) {
            e.add(format!("{at}[{key}]"), quoted(key), format!("key {rule}"));
        } else if reserved_label_prefix(key) {
            e.add(
                format!("{at}[{key}]"),
                quoted(key),
                "key uses a reserved prefix (kubernetes.io/, k8s.io/); only kubelet.kubernetes.io/, node.kubernetes.io/ and topology.kubernetes.io/region|zone are allowed",
            );
        }
        if let Err(rule) = check_label_value(value) {
            e.add(
                format!("{at}[{key}]"),
                quoted(value),
                format!("value {rule}"),
            );
        }
    }
}

pub fn validate_taints(at: &str, taints: &[Taint], e: &mut Errors) {
    for (i, taint) in taints.iter().enumerate() {
        if let Err(rule) = check_label_key(&taint.key) {
            e.add(format!("{at}[{i}].key"), quoted(&taint.key), rule);
        }
        if let Err(rule) = check_label_value(&taint.value) {
            e.add(format!("{at}[{i}].value"), quoted(&taint.value), rule);
        }
        e.one_of(
            &format!("{at}[{i}].effect"),
            &taint.effect,
            &["NoSchedule", "NoExecute", "PreferNoSchedule"],
        );
    }
}

impl KubernetesPackage {
    pub fn validate(&self, at: &str, e: &mut Errors) {
        if parse_kube_version(&self.version)
            .is_none_or(|(major, minor, _)| major != 1 || minor < 20)
        {
            e.add(
                format!("{at}.version"),
                quoted(&self.version),
                "must be a Kubernetes version 1.20.0 or later, written MAJOR.MINOR.PATCH",
            );
        }
        if let Some(sum) = &self.sha256 {
            if sum.len() != 64 || !sum.bytes().all(|b| b.is_ascii_hexdigit()) {
                e.add(format!("{at}.sha256"), quoted(sum), "must be 64 hex digits");
            }
        }
        if let Some(url) = &self.url {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                e.add(
                    format!("{at}.url"),
                    quoted(url),
                    "must be an http(s):// URL",
                );
            }
        }
        if let Some(dir) = &self.dir {
            if !dir.starts_with('/') {
                e.add(format!("{at}.dir"), quoted(dir), "must be an absolute path");
            }
        }
        e.range(
            &format!("{at}.downloadAttempts"),
            self.download_attempts,
            1,
            10,
        );
    }
}

/// `1.31.4` or `v1.31.4` → (1, 31, 4).
pub fn parse_kube_version(v: &str) -> Option<(u32, u32, u32)> {
    let mut it = v.strip_prefix('v').unwrap_or(v).split('.');
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    let patch = it.next()?.parse().ok()?;
    if it.next().is_some() {
        return None;
    }
    Some((major, minor, patch))
}

/// `100ms`, `1s`, `1m30s` → milliseconds (the Go duration subset kubelet takes here).
pub fn parse_duration_ms(s: &str) -> Option<u64> {
    let mut total: u64 = 0;
    let mut rest = s;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit())?;
        let n: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let factor = match &rest[..unit_len] {
            "ms" => 1,
            "s" => 1000,
            "m" => 60_000,
            "h" => 3_600_000,
            _ => return None,
        };
        total = total.checked_add(n.checked_mul(factor)?)?;
        rest = &rest[unit_len..];
    }
    Some(total)
}

/// Kubernetes quantity as bytes, for the forms used here (`100Mi`, `1Gi`, `500M`, `1024`).
pub fn parse_quantity_bytes(s: &str) -> Option<u64> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let n: u64 = s[..split].parse().ok()?;
    let factor: u64 = match &s[split..] {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "K" | "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        _ => return None,
    };
    n.checked_mul(factor)
}

/// An eviction threshold value: a percentage or a quantity.
fn is_threshold(v: &str) -> bool {
    match v.strip_suffix('%') {
        Some(p) => p.parse::<f64>().is_ok_and(|p| (0.0..=100.0).contains(&p)),
        None => parse_quantity_bytes(v).is_some(),
    }
}

const EVICTION_SIGNALS: &[&str] = &[
    "memory.available",
    "nodefs.available",
    "nodefs.inodesFree",
    "imagefs.available",
    "imagefs.inodesFree",
    "containerfs.available",
    "containerfs.inodesFree",
    "pid.available",
];

impl KubeletConfig {
    pub fn validate(&self, at: &str, e: &mut Errors) {
        let f = |name: &str| format!("{at}.{name}");
        e.range(&f("eventRecordQPS"), self.event_record_qps, 1, 50);
        e.range(&f("eventBurst"), self.event_burst, 1, 100);
        e.range(&f("kubeAPIQPS"), self.kube_api_qps, 1, 50);
        e.range(&f("kubeAPIBurst"), self.kube_api_burst, 1, 100);
        e.range(&f("registryPullQPS"), self.registry_pull_qps, 1, 50);
        e.range(&f("registryBurst"), self.registry_burst, 1, 100);
        for (burst_name, burst, qps_name, qps) in [
            (
                "eventBurst",
                self.event_burst,
                "eventRecordQPS",
                self.event_record_qps,
            ),
            (
                "kubeAPIBurst",
                self.kube_api_burst,
                "kubeAPIQPS",
                self.kube_api_qps,
            ),
            (
                "registryBurst",
                self.registry_burst,
                "registryPullQPS",
                self.registry_pull_qps,
            ),
        ] {
            if burst < qps {
                e.add(
                    f(burst_name),
                    burst,
                    format!("must be >= {qps_name} ({qps})"),
                );
            }
        }
        e.range(
            &f("imageGCHighThresholdPercent"),
            self.image_gc_high_threshold_percent,
            60,
            95,
        );
        e.range(
            &f("imageGCLowThresholdPercent"),
            self.image_gc_low_threshold_percent,
            30,
            90,
        );
        if self.image_gc_high_threshold_percent <= self.image_gc_low_threshold_percent {
            e.add(
                f("imageGCHighThresholdPercent"),
                self.image_gc_high_threshold_percent,
                format!(
                    "must be greater than imageGCLowThresholdPercent ({})",
                    self.image_gc_low_threshold_percent
                ),
            );
        }
        e.range(
            &f("containerLogMaxFiles"),
            self.container_log_max_files,
            2,
            10,
        );
        if parse_quantity_bytes(&self.container_log_max_size).is_none_or(|b| b == 0) {
            e.add(
                f("containerLogMaxSize"),
                quoted(&self.container_log_max_size),
                "must be a positive quantity such as 100Mi",
            );
        }
        e.one_of(
            &f("cpuManagerPolicy"),
            &self.cpu_manager_policy,
            &["none", "static"],
        );
        e.one_of(
            &f("memoryManagerPolicy"),
            &self.memory_manager_policy,
            &["None", "Static"],
        );
        e.one_of(
            &f("topologyManagerPolicy"),
            &self.topology_manager_policy,
            &["none", "restricted", "best-effort", "single-numa-node"],
        );
        if self.pod_pids_limit < -1 || self.pod_pids_limit == 0 {
            e.add(
                f("podPidsLimit"),
                self.pod_pids_limit,
                "must be -1 (unlimited) or positive",
            );
        }
        e.range(&f("readOnlyPort"), self.read_only_port, 0, 65535);
        e.range(&f("port"), self.port, 1, 65535);
        e.range(&f("maxPods"), self.max_pods, 1, 2000);
        match parse_duration_ms(&self.cpu_cfs_quota_period) {
            Some(ms) if (1..=1000).contains(&ms) => {}
            _ => e.add(
                f("cpuCFSQuotaPeriod"),
                quoted(&self.cpu_cfs_quota_period),
                "must be a duration in [1ms, 1s]",
            ),
        }
        for (i, sysctl) in self.allowed_unsafe_sysctls.iter().enumerate() {
            let prefixes = [
                "kernel.shm",
                "kernel.msg",
                "kernel.sem",
                "fs.mqueue.",
                "net.",
            ];
            if !prefixes.iter().any(|p| sysctl.starts_with(p)) {
                e.add(
                    format!("{at}.allowedUnsafeSysctls[{i}]"),
                    quoted(sysctl),
                    "must start with kernel.shm, kernel.msg, kernel.sem, fs.mqueue. or net.",
                );
            }
        }
        for (name, map) in [
            ("evictionHard", &self.eviction_hard),
            ("evictionSoft", &self.eviction_soft),
        ] {
            for (signal, value) in map {
                if !EVICTION_SIGNALS.contains(&signal.as_str()) {
                    e.add(
                        format!("{at}.{name}[{signal}]"),
                        quoted(signal),
                        format!(
                            "must be an eviction signal: {}",
                            EVICTION_SIGNALS.join(", ")
                        ),
                    );
                }
                if !is_threshold(value) {
                    e.add(
                        format!("{at}.{name}[{signal}]"),
                        quoted(value),
                        "must be a percentage (e.g. 10%) or a quantity (e.g. 300Mi)",
                    );
                }
            }
        }
        for (signal, grace) in &self.eviction_soft_grace_period {
            if !self.eviction_soft.contains_key(signal) {
                e.add(
                    format!("{at}.evictionSoftGracePeriod[{signal}]"),
                    quoted(grace),
                    "needs a matching evictionSoft threshold",
                );
            }
            if parse_duration_ms(grace).is_none() {
                e.add(
                    format!("{at}.evictionSoftGracePeriod[{signal}]"),
                    quoted(grace),
                    "must be a duration such as 1m30s",
                );
            }
        }
        for signal in self.eviction_soft.keys() {
            if !self.eviction_soft_grace_period.contains_key(signal) {
                e.add(
                    format!("{at}.evictionSoft[{signal}]"),
                    quoted(signal),
                    "needs a matching evictionSoftGracePeriod",
                );
            }
        }
        for (name, map) in [
            ("kubeReserved", &self.kube_reserved),
            ("systemReserved", &self.system_reserved),
        ] {
            for (resource, quantity) in map {
                if !["cpu", "memory", "ephemeral-storage", "pid"].contains(&resource.as_str()) {
                    e.add(
                        format!("{at}.{name}[{resource}]"),
                        quoted(resource),
                        "must be one of cpu|memory|ephemeral-storage|pid",
                    );
                }
                let cpu_ok = resource == "cpu"
                    && quantity
                        .strip_suffix('m')
                        .unwrap_or(quantity)
                        .parse::<f64>()
                        .is_ok();
                if !cpu_ok && parse_quantity_bytes(quantity).is_none() {
                    e.add(
                        format!("{at}.{name}[{resource}]"),
                        quoted(quantity),
                        "must be a quantity",
                    );
                }
            }
        }
        for flag in self.customized_args.keys() {
            if flag.starts_with('-') || flag.is_empty() || flag.contains(char::is_whitespace) {
                e.add(
                    format!("{at}.customizedArgs[{flag}]"),
                    quoted(flag),
                    "must be a flag name without leading dashes or spaces",
                );
            }
        }
    }
}

impl ContainerdConfig {
    pub fn validate(&self, at: &str, e: &mut Errors) {
        let f = |name: &str| format!("{at}.{name}");
        e.range(
            &f("maxConcurrentDownloads"),
            self.max_concurrent_downloads,
            1,
            20,
        );
        check_limit(&f("limitCore"), &self.limit_core, 0, e);
        check_limit(&f("limitNoFile"), &self.limit_no_file, 1024, e);
        check_limit(&f("limitMemLock"), &self.limit_mem_lock, 65536, e);
        for (registry, mirrors) in &self.registry_mirrors {
            if registry.is_empty()
                || registry.contains('/') && !registry.contains(':') && registry.contains("://")
            {
                e.add(
                    format!("{at}.registryMirrors"),
                    quoted(registry),
                    "key must be a registry host",
                );
            }
            if mirrors.is_empty() {
                e.add(
                    format!("{at}.registryMirrors[{registry}]"),
                    "[]",
                    "must list at least one mirror",
                );
            }
            for (i, mirror) in mirrors.iter().enumerate() {
                if !(mirror.starts_with("http://") || mirror.starts_with("https://")) {
                    e.add(
                        format!("{at}.registryMirrors[{registry}][{i}]"),
                        quoted(mirror),
                        "must be an http:// or https:// URL",
                    );
                }
            }
        }
        for (i, registry) in self.insecure_registries.iter().enumerate() {
            if registry.is_empty()
                || registry.contains("://")
                || registry.contains(char::is_whitespace)
            {
                e.add(
                    format!("{at}.insecureRegistries[{i}]"),
                    quoted(registry),
                    "must be a registry host[:port] without scheme",
                );
            }
        }
        if self.sandbox_image.is_empty() {
            e.add(f("sandboxImage"), quoted(""), "must name an image");
        }
    }
}

fn check_limit(field: &str, limit: &Limit, min: i64, e: &mut Errors) {
    match limit {
        Limit::Number(n) if *n < min => {
            e.add(field, n, format!("must be >= {min} or \"infinity\""))
        }
        Limit::Text(t) if t != "infinity" => e.add(
            field,
            quoted(t),
            format!("must be a number >= {min} or \"infinity\""),
        ),
        _ => {}
    }
}

/// Keys whose values must be non-negative integers.
const INTEGER_SYSCTLS: &[&str] = &[
    "fs.file-max",
    "fs.nr_open",
    "fs.inotify.max_user_watches",
    "fs.inotify.max_user_instances",
    "kernel.pid_max",
    "vm.max_map_count",
    "net.core.somaxconn",
    "net.core.netdev_max_backlog",
    "net.core.rmem_max",
    "net.core.wmem_max",
    "net.ipv4.tcp_max_syn_backlog",
    "net.ipv4.neigh.default.gc_thresh2",
    "net.ipv4.neigh.default.gc_thresh3",
];

impl OsConfig {
    pub fn validate(&self, at: &str, e: &mut Errors) {
        for (key, value) in &self.sysctl {
            let key_ok = !key.is_empty()
                && key.contains('.')
                && key
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-/".contains(c));
            if !key_ok {
                e.add(
                    format!("{at}.sysctl"),
                    quoted(key),
                    "key must be a sysctl name like net.core.somaxconn",
                );
            }
            if value.is_empty() || value.contains('\n') {
                e.add(
                    format!("{at}.sysctl[{key}]"),
                    quoted(value),
                    "must be a single-line, non-empty value",
                );
            }
            if INTEGER_SYSCTLS.contains(&key.as_str()) && value.parse::<u64>().is_err() {
                e.add(
                    format!("{at}.sysctl[{key}]"),
                    quoted(value),
                    "must be a non-negative integer",
                );
            }
            if [
                "net.ipv4.tcp_slow_start_after_idle",
                "net.ipv4.ip_forward",
                "net.bridge.bridge-nf-call-iptables",
            ]
            .contains(&key.as_str())
                && !["0", "1"].contains(&value.as_str())
            {
                e.add(
                    format!("{at}.sysctl[{key}]"),
                    quoted(value),
                    "must be 0 or 1",
                );
            }
        }
        let all = self.effective_sysctls();
        let num = |k: &str| all.get(k).and_then(|v| v.parse::<u64>().ok());
        if let (Some(nr_open), Some(file_max)) = (num("fs.nr_open"), num("fs.file-max")) {
            if nr_open >= file_max {
                e.add(
                    format!("{at}.sysctl[fs.nr_open]"),
                    nr_open,
                    format!("must be less than fs.file-max ({file_max})"),
                );
            }
        }
        if let Some(v) = &self.transparent_huge_page.enabled {
            e.one_of(
                &format!("{at}.transparentHugePage.enabled"),
                v,
                &["always", "never", "madvise"],
            );
        }
        if let Some(v) = &self.transparent_huge_page.defrag {
            e.one_of(
                &format!("{at}.transparentHugePage.defrag"),
                v,
                &["always", "defer", "madvise", "defer+madvise", "never"],
            );
        }
    }
}

impl DataDiskConfig {
    pub fn validate(&self, at: &str, e: &mut Errors) {
        if !self.mount_target.starts_with('/')
            || self.mount_target == "/"
            || self.mount_target.contains("..")
        {
            e.add(
                format!("{at}.mountTarget"),
                quoted(&self.mount_target),
                "must be an absolute path other than / without '..'",
            );
        }
        if let Some(device) = &self.device {
            if !device.starts_with("/dev/") {
                e.add(
                    format!("{at}.device"),
                    quoted(device),
                    "must be a path under /dev/",
                );
            }
        }
        if self.device.is_some() && self.serial.is_some() {
            e.add(
                format!("{at}.serial"),
                "set",
                "give either device or serial, not both",
            );
        }
    }
}

/// Marker files that steer initialization (docs/spec.md §1.3), with the agent phase
/// that reads them. Only pre-user-data runs before that phase.
pub const INIT_MARKERS: &[(&str, &str)] = &[
    ("/var/.skip-auto-fdisk", "data-disk"),
    ("/var/.keep-container-data", "data-disk"),
    ("/var/.skip-yum", "base-packages"),
    ("/var/.skip-security-fix", "base-packages"),
];

/// A pool document accepted, but probably not doing what its author meant.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Warning {
    /// Stable code, e.g. `UserDataMarkerTooLate`.
    pub code: String,
    /// Dotted path of the field, e.g. `spec.userData`.
    pub field: String,
    pub message: String,
}

impl Display for Warning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}: {}", self.code, self.field, self.message)
    }
}

/// Warnings for a pool's `userData` that touches an initialization marker:
/// user data runs after the node is initialized (docs/spec.md §1.4), when the
/// phase reading the marker has already run, so the marker has no effect.
/// The place for it is `preUserData`, which runs before initialization.
/// Comment lines are ignored; one warning per marker. Pure: callers (pool
/// create and update) decide how to show them.
pub fn userdata_marker_warnings(user_data: &str) -> Vec<Warning> {
    let code_lines: Vec<&str> = user_data
        .lines()
        .filter(|l| {
            let t = l.trim_start();
            !t.starts_with('#') || t.starts_with("#!") || t.starts_with("#cloud-config")
        })
        .collect();
    INIT_MARKERS
        .iter()
        .filter(|(marker, _)| code_lines.iter().any(|l| mentions_path(l, marker)))
        .map(|(marker, phase)| Warning {
            code: "UserDataMarkerTooLate".to_string(),
            field: "spec.userData".to_string(),
            message: format!(
                "userData touches {marker}, but user data runs after initialization, when the \
                 {phase} phase that reads this marker has already run: it has no effect there. \
                 Create the marker in preUserData, which runs before initialization \
                 (e.g. `touch {marker}`)"
            ),
        })
        .collect()
}

/// A warning for a `#cloud-config` pre-user-data with `runcmd`: on every
/// runner that key runs after knit's initialization (cloud-init's
/// `scripts_user` runs its script after every script part, knit's runner
/// keeps that order), so it cannot prepare the node; `bootcmd` runs first.
pub fn pre_user_data_runcmd_warnings(pre_user_data: &str) -> Vec<Warning> {
    let cloud_config = pre_user_data
        .lines()
        .any(|l| l.trim_end() == "#cloud-config");
    let runcmd = pre_user_data.lines().any(|l| l.starts_with("runcmd:"));
    if !(cloud_config && runcmd) {
        return Vec::new();
    }
    vec![Warning {
        code: "PreUserDataRuncmdLate".to_string(),
        field: "spec.preUserData".to_string(),
        message: "preUserData's #cloud-config runcmd runs after knit's initialization, not \
                  before it: cloud-init runs runcmd's script after every script part (knit's \
                  runner keeps that order). Put what must come before initialization in \
                  bootcmd, or in a shell script part"
            .to_string(),
    }]
}

/// `path` occurs in `line` as a whole path (not a prefix of a longer name).
fn mentions_path(line: &str, path: &str) -> bool {
    line.match_indices(path).any(|(at, _)| {
        line[at + path.len()..]
            .chars()
            .next()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || "-_.".contains(c)))
    })
}

#[cfg(test)]
mod marker_warning_tests {
    use super::*;

    #[test]
    fn a_runcmd_in_cloud_config_pre_user_data_warns_and_bootcmd_does_not() {
        let w = pre_user_data_runcmd_warnings("#cloud-config\nruncmd:\n- touch /var/.skip-yum\n");
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].field, "spec.preUserData");
        assert!(w[0].message.contains("bootcmd"), "{w:?}");
        assert!(pre_user_data_runcmd_warnings("#cloud-config\nbootcmd:\n- touch /x\n").is_empty());
        assert!(pre_user_data_runcmd_warnings("#!/bin/sh\necho runcmd:\n").is_empty());
    }

    #[test]
    fn touching_a_marker_in_user_data_names_pre_user_data() {
        let w = userdata_marker_warnings("#!/bin/bash\ntouch /var/.skip-yum\necho done\n");
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(w[0].code, "UserDataMarkerTooLate");
        assert_eq!(w[0].field, "spec.userData");
        assert!(w[0].message.contains("/var/.skip-yum"));
        assert!(w[0].message.contains("preUserData"));
        assert!(w[0].message.contains("base-packages"));

        let cloud_config =
            "#cloud-config\nwrite_files:\n- path: /var/.keep-container-data\n  content: ''\n";
        let w = userdata_marker_warnings(cloud_config);
        assert_eq!(w.len(), 1);
        assert!(w[0].message.contains("data-disk"));

        let both = "touch /var/.skip-auto-fdisk; : > /var/.skip-security-fix\n";
        assert_eq!(userdata_marker_warnings(both).len(), 2);
    }

    #[test]
    fn no_warning_without_a_marker_or_in_comments_or_longer_names() {
        assert!(userdata_marker_warnings("").is_empty());
        assert!(userdata_marker_warnings("#!/bin/sh\necho hi\n").is_empty());
        assert!(userdata_marker_warnings("# touch /var/.skip-yum in preUserData\n").is_empty());
        assert!(userdata_marker_warnings("touch /var/.skip-yum-not-a-marker\n").is_empty());
    }
}

#[cfg(test)]
mod node_name_tests {
    use super::*;
    use crate::NodeIdentity;

    fn rule(prefix: &str, suffix: &str) -> CustomNodeName {
        CustomNodeName {
            prefix: prefix.into(),
            suffix: suffix.into(),
        }
    }

    /// Issue 27 (1): capitals in a custom name's prefix or suffix are
    /// refused at the pool (before: accepted, then every node of the pool
    /// failed FailSetNodeIdentity), naming the field and the rendered name.
    #[test]
    fn capitals_in_a_custom_name_are_refused_naming_the_field() {
        let mut e = Errors::default();
        rule("Node", "").validate("spec.customNodeName", &mut e);
        let errors = e.into_result().unwrap_err();
        let ApiError::Invalid(list) = errors else {
            panic!("{errors}")
        };
        assert_eq!(list.len(), 1, "{list:?}");
        assert_eq!(list[0].field, "spec.customNodeName.prefix");
        assert_eq!(list[0].value, "\"Node1.1.1.1\"");
        assert!(list[0].rule.contains("upper-case"), "{}", list[0].rule);
        assert!(list[0].rule.contains("DNS-1123"), "{}", list[0].rule);

        let mut e = Errors::default();
        rule("node", "Pool").validate("spec.customNodeName", &mut e);
        let ApiError::Invalid(list) = e.into_result().unwrap_err() else {
            panic!()
        };
        assert_eq!(list[0].field, "spec.customNodeName.suffix");

        let mut e = Errors::default();
        rule("node", "pool-a").validate("spec.customNodeName", &mut e);
        assert!(e.into_result().is_ok());
    }

    #[test]
    fn an_ipv6_address_in_a_node_name_is_refused() {
        assert!(CustomNodeName::check_rendered("nodefd00::5")
            .unwrap_err()
            .contains("IPv6"));
        let identity = NodeIdentity {
            ip: Some("fd00::5".into()),
            custom_name: Some(rule("node", "")),
            ..NodeIdentity::default()
        };
        let mut e = Errors::default();
        identity.validate("node", &mut e);
        let ApiError::Invalid(list) = e.into_result().unwrap_err() else {
            panic!()
        };
        assert_eq!(list[0].field, "node.ip");
        assert!(list[0].rule.contains("\"nodefd00::5\""), "{}", list[0].rule);
        let v4 = NodeIdentity {
            ip: Some("10.0.0.5".into()),
            ..identity
        };
        let mut e = Errors::default();
        v4.validate("node", &mut e);
        assert!(e.into_result().is_ok());
    }
}
