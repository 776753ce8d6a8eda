//! Bounded fuzzing of the parsers that take outside input: NodeConfig,
//! NodePool and Cluster documents (YAML or JSON from users and nodes), the
//! agent's phase report body, and the small scalar parsers behind them.
//!
//! Every property is "never panics, and an answer is either a valid value or
//! an error that names a field and a rule". The seed is fixed so a CI run is
//! repeatable; `KNIT_FUZZ_SEED=<u64>` explores another part of the space and
//! `KNIT_FUZZ_CASES=<n>` runs longer (both are printed on failure by
//! proptest together with the smallest failing input).

use knit_api::validate::{
    is_dns_subdomain, parse_duration_ms, parse_kube_version, parse_quantity_bytes,
};
use knit_api::{parse_cidr, ApiError, Cluster, NodeConfig, NodePool, PhaseEvent};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};

fn config() -> Config {
    let seed = std::env::var("KNIT_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x6b6e_6974);
    let cases = std::env::var("KNIT_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(256);
    Config {
        cases,
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: None,
        ..Config::default()
    }
}

const POOL: &str = "apiVersion: knit.dev/v1alpha1
kind: NodePool
metadata: {name: workers}
spec:
  replicas: 3
  joinTimeoutSeconds: 900
  dataDisks:
  - {sizeGiB: 40, interface: nvme}
  labels: {knit.dev/example: \"true\"}
  taints:
  - {key: dedicated, value: gpu, effect: NoSchedule}
  userData: |
    echo hello
";

const NODE_CONFIG: &str = "apiVersion: knit.dev/v1alpha1
kind: NodeConfig
dataDisk: {enabled: true, fsType: xfs}
kubelet: {eventRecordQPS: 5, maxPods: 110}
os:
  sysctls: {net.ipv4.ip_forward: \"1\"}
";

const CLUSTER: &str = "apiVersion: knit.dev/v1alpha1
kind: Cluster
metadata: {name: default}
spec: {kubernetesVersion: 1.31.4}
";

/// Values that have broken parsers elsewhere: out-of-range numbers, path
/// tricks, empty and huge strings, the wrong YAML kinds, control characters.
fn nasty_scalar() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("-1".to_string()),
        Just("0".to_string()),
        Just("1e309".to_string()),
        Just("9223372036854775808".to_string()),
        Just("-9223372036854775809".to_string()),
        Just("0x10".to_string()),
        Just("\"../evil\"".to_string()),
        Just("\"x/../victim\"".to_string()),
        Just("\"\"".to_string()),
        Just("null".to_string()),
        Just("[]".to_string()),
        Just("{}".to_string()),
        Just("\"\\u0000\"".to_string()),
        Just("~".to_string()),
        Just("&a [*a]".to_string()),
        Just("!!binary aGVsbG8=".to_string()),
        "[a-zA-Z0-9./%:_-]{0,80}".prop_map(|s| format!("{s:?}")),
        (0usize..4000).prop_map(|n| format!("\"{}\"", "a".repeat(n))),
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|n| n.to_string()),
    ]
}

/// A valid document with one value replaced by a nasty one, one line
/// dropped, or one line duplicated.
fn mutate(doc: &'static str) -> impl Strategy<Value = String> {
    let lines: Vec<&'static str> = doc.lines().collect();
    let n = lines.len();
    (0..n, 0u8..3, nasty_scalar()).prop_map(move |(at, how, value)| {
        let mut out: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
        match how {
            0 => {
                let line = &out[at];
                // Replace what follows the last `: ` (a value), if any.
                if let Some(i) = line.rfind(": ") {
                    out[at] = format!("{}: {value}", &line[..i]);
                } else {
                    out[at] = format!("{line} {value}");
                }
            }
            1 => {
                out.remove(at);
            }
            _ => {
                let dup = out[at].clone();
                out.insert(at, dup);
            }
        }
        out.join("\n") + "\n"
    })
}

/// An error for a parsed-but-invalid document names every field and rule.
fn check_errors(e: &ApiError) -> Result<(), TestCaseError> {
    if let ApiError::Invalid(list) = e {
        prop_assert!(!list.is_empty(), "Invalid with no field errors");
        for f in list {
            prop_assert!(!f.field.is_empty(), "field error without a field: {f:?}");
            prop_assert!(!f.rule.is_empty(), "field error without a rule: {f:?}");
        }
    }
    prop_assert!(!e.to_string().is_empty());
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn any_text_is_a_document_or_a_clear_error(text in "\\PC{0,400}") {
        for r in [
            NodeConfig::from_yaml(&text).map(|_| ()),
            NodePool::from_yaml(&text).map(|_| ()),
            Cluster::from_yaml(&text).map(|_| ()),
        ] {
            if let Err(e) = r {
                check_errors(&e)?;
            }
        }
    }

    #[test]
    fn mutated_pools_parse_or_name_the_field(doc in mutate(POOL)) {
        match NodePool::from_yaml(&doc) {
            Ok(pool) => {
                prop_assert!(pool.validate().is_ok());
                prop_assert!(is_dns_subdomain(&pool.metadata.name), "{}", pool.metadata.name);
                // What was accepted survives a round trip through JSON, as
                // the API stores and serves it.
                let json = serde_json::to_string(&pool).map_err(|e| TestCaseError::fail(e.to_string()))?;
                let again = NodePool::from_yaml(&json);
                prop_assert!(again.is_ok(), "{json}: {again:?}");
            }
            Err(e) => check_errors(&e)?,
        }
    }

    #[test]
    fn mutated_node_configs_parse_or_name_the_field(doc in mutate(NODE_CONFIG)) {
        match NodeConfig::from_yaml(&doc) {
            Ok(c) => {
                let again = NodeConfig::from_yaml(&c.to_yaml().expect("a NodeConfig writes as YAML"));
                prop_assert_eq!(again.ok(), Some(c));
            }
            Err(e) => check_errors(&e)?,
        }
    }

    #[test]
    fn mutated_clusters_parse_or_name_the_field(doc in mutate(CLUSTER)) {
        if let Err(e) = Cluster::from_yaml(&doc) {
            check_errors(&e)?;
        }
    }

    #[test]
    fn report_bodies_parse_or_are_refused(
        node in prop_oneof![Just("n1".to_string()), "\\PC{0,64}"],
        phase in prop_oneof![Just("join".to_string()), Just("data-disk".to_string()), "[a-z-]{0,20}"],
        outcome in prop_oneof![Just("done".to_string()), Just("failed".to_string()), "[a-z]{0,10}"],
        at in prop_oneof![any::<i64>().prop_map(serde_json::Value::from), Just(serde_json::Value::Null), any::<f64>().prop_map(serde_json::Value::from)],
        extra in proptest::option::of("\\PC{0,200}"),
    ) {
        let mut body = serde_json::json!({
            "node": node, "instanceId": "i-1", "phase": phase, "outcome": outcome, "atMs": at,
        });
        if let Some(reason) = extra {
            body["reason"] = reason.into();
        }
        let text = body.to_string();
        if let Ok(ev) = serde_json::from_str::<PhaseEvent>(&text) {
            let again: PhaseEvent = serde_json::from_str(
                &serde_json::to_string(&ev).map_err(|e| TestCaseError::fail(e.to_string()))?,
            ).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(again, ev);
        }
    }

    #[test]
    fn scalar_parsers_never_panic(s in "\\PC{0,40}") {
        let _ = parse_duration_ms(&s);
        let _ = parse_quantity_bytes(&s);
        let _ = parse_kube_version(&s);
        let _ = parse_cidr(&s);
        if is_dns_subdomain(&s) {
            // The rule, checked independently of the implementation.
            prop_assert!(s.len() <= 253);
            prop_assert!(s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.'));
            prop_assert!(s.starts_with(|c: char| c.is_ascii_alphanumeric()));
            prop_assert!(s.ends_with(|c: char| c.is_ascii_alphanumeric()));
        }
    }
}

/// A YAML alias bomb ("billion laughs") is refused, not expanded.
#[test]
fn yaml_alias_bomb_is_refused() {
    let mut doc = String::from(
        "apiVersion: knit.dev/v1alpha1\nkind: NodePool\na0: &a0 [x, x, x, x, x, x, x, x, x, x]\n",
    );
    for i in 1..10 {
        let prev = format!("*a{}", i - 1);
        doc.push_str(&format!("a{i}: &a{i} [{}]\n", vec![prev; 10].join(", ")));
    }
    doc.push_str("metadata: {name: bomb}\nspec: {replicas: 1}\n");
    assert!(NodePool::from_yaml(&doc).is_err());
}
