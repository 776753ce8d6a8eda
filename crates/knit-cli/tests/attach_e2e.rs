//! Adding existing instances to a pool (docs/spec.md §2), end to end: the `knit`
//! binary, a server process, the real local cloud, the real agent and the
//! embedded cluster.
//!
//! - automatic: an instance with a data disk holding files is re-imaged,
//!   its node gets Ready under its own name, the files are still there,
//!   the disk ids changed, the pool's desired count grew by one, and
//!   auto-scaling is refused on the pool afterwards; a failing instance's
//!   dry run lists every failed check;
//! - manual: the printed command run inside an instance (the local cloud's
//!   exec) → node Ready, the instance's own files and user data untouched;
//!   the same command again → refused; the node removed (instance kept) →
//!   the agent's undo run inside it, still running and as it was before the
//!   attach, then attached again with a new command;
//! - diagnosis: an instance whose traffic to the host is dropped fails its
//!   join within the pool's timeout, the message naming the address and
//!   pointing at connectivity and security groups.
//!
//! Needs root and the workspace's binaries beside `knit`. Each test has its
//! own directory, bridge and subnet, released by a guard (server killed by
//! PID, local cloud `down`, firewall rule removed) on success, failure and
//! panic.

mod common;

use common::Env;
use knit_local::Template;
use serde_json::Value;
use std::time::{Duration, Instant};

/// A pool whose nodes get Ready on the local cloud: the kubelet stand-in
/// needs a CNI configuration.
const POOL: &str = "apiVersion: knit.dev/v1alpha1
kind: NodePool
metadata: {name: workers}
spec:
  replicas: 0
  systemDisk: {sizeGiB: 20}
  # An added instance's type must be one of the pool's: the local cloud's
  # default and those the preflight cases use.
  instanceTypes: [local.small, ecs.g7.large, ecs.t1.small, ecs.ebmgn7e.32xlarge]
  preUserData: |
    touch /var/.skip-yum
    mkdir -p /etc/cni/net.d
    echo '{\"cniVersion\":\"1.0.0\",\"name\":\"knit\",\"plugins\":[{\"type\":\"loopback\"}]}' > /etc/cni/net.d/10-knit.conflist
  userData: echo pool user data > /root/pool-user-data
";

/// An instance the user owns: a data disk holding a file, its own user data.
const OWNED: &str = "name: old-web
disks: [{name: data, size: 4Gi, format: ext4}]
userData: |
  #!/bin/bash
  set -e
  mkdir -p /mnt/data
  mount /dev/vdb /mnt/data
  echo precious > /mnt/data/precious.txt
  umount /mnt/data
  echo mine > /root/own-user-data-ran
";

/// A script listing what the agent touches on a machine: some paths with
/// their entries, `/usr/local/bin`, `/etc/fstab`'s checksum (the data-disk
/// phase edits it). Equal before and after = the machine is as it was.
fn machine_snapshot() -> String {
    const WATCHED: &str = "/var/lib/knit /etc/kubernetes /etc/containerd /var/lib/kubelet \
        /var/lib/containerd /run/containerd /run/knit /var/lib/container /opt/cni \
        /etc/cni /var/log/knit /etc/sysctl.d";
    format!(
        "for p in {WATCHED}; do [ -e $p ] && echo \"$p: $(ls -A $p 2>/dev/null | tr '\\n' ' ')\"; done; \
         ls -A /usr/local/bin; sha256sum /etc/fstab"
    )
}

/// No mount and no process of knit's inside the machine (run by `exec`).
const NOTHING_OF_KNIT_RUNS: &str =
    "! grep -E ' /var/lib/(container|containerd|kubelet) ' /proc/self/mounts; \
    ! cat /proc/[0-9]*/comm 2>/dev/null | grep -xE 'containerd|kubelet|knit-agent'";

fn node<'a>(nodes: &'a Value, name: &str) -> Option<&'a Value> {
    nodes["items"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|n| n["name"] == name)
}

/// The node `name` is registered and Ready.
fn assert_ready(env: &Env, name: &str) {
    let nodes = env.json(&["get", "nodes", "-o", "json"]);
    assert_eq!(
        node(&nodes, name).map(|n| n["status"].clone()),
        Some("Ready".into()),
        "{nodes}"
    );
}

#[test]
fn automatic_and_manual_attach_with_the_embedded_cluster() {
    let mut env = Env::builder().cluster(true).build();
    env.start(true);
    std::fs::write(env.path("pool.yaml"), POOL).unwrap();
    env.knit_ok(&["create", "-f", env.path("pool.yaml").to_str().unwrap()]);

    // ---- preflight: a bad instance, every failure listed, nothing changed.
    let bad = env.instance(
        "name: bad-1\nattributes: {swap: true, vpcId: vpc-other, tags: {scaling-group: asg-9}}\n",
    );
    let (ok, out, _) = env.knit(&[
        "attach",
        "--pool",
        "workers",
        "--instances",
        &bad,
        "--dry-run",
        "-o",
        "json",
    ]);
    assert!(!ok, "a failing dry run exits non-zero");
    let v: Value = serde_json::from_str(&out).unwrap();
    let codes: Vec<&str> = v["preflight"][0]["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["status"] == "error")
        .map(|r| r["code"].as_str().unwrap())
        .collect();
    assert_eq!(
        codes,
        [
            "PreflightVpcMismatch",
            "PreflightInScalingGroup",
            "PreflightSwapOn"
        ],
        "{v}"
    );
    let (ok, out, err) = env.knit(&["attach", "--pool", "workers", "--instances", &bad]);
    assert!(!ok && out.contains("fix: turn swap off"), "{out}{err}");
    assert_eq!(
        env.pool()["spec"]["replicas"],
        0,
        "a refused attach changes nothing"
    );

    // ---- automatic mode.
    let id = env.instance(OWNED);
    let before = env.cloud().describe(&id).unwrap();
    let old_disk = before.data_disks[0].id.clone();
    let started = Instant::now();
    let out = env.knit_ok(&[
        "attach",
        "--pool",
        "workers",
        "--instances",
        &id,
        "--format-data-disk",
        "--keep-instance-name",
        "--wait",
        "--timeout",
        "300",
    ]);
    // A measurement, not an assertion.
    eprintln!(
        "automatic attach to Ready: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(
        out.contains(&format!("{old_disk} -> ")),
        "old -> new disk ids shown: {out}"
    );
    let after = env.cloud().describe(&id).unwrap();
    assert_ne!(
        after.data_disks[0].id, old_disk,
        "re-imaged: the data disk has a new id"
    );
    let nodes = env.json(&["get", "nodes", "-o", "json"]);
    let n =
        node(&nodes, "old-web").unwrap_or_else(|| panic!("node named after the instance: {nodes}"));
    assert_eq!(n["status"], "Ready", "{n}");
    // The files on the data disk are still there, now under the runtime mount.
    let (ok, text) = env.exec(
        &id,
        "cat /var/lib/container/precious.txt && mountpoint -q /var/lib/kubelet",
    );
    assert!(ok && text.contains("precious"), "{text}");
    // The pool's user data replaced the instance's (the system disk is new).
    let (ok, text) = env.exec(
        &id,
        "cat /root/pool-user-data; test ! -e /root/own-user-data-ran",
    );
    assert!(ok && text.contains("pool user data"), "{text}");
    let pool = env.pool();
    assert_eq!(pool["spec"]["replicas"], 1, "desired count +1");
    assert_eq!(
        pool["metadata"]["labels"]["knit.dev/added-instances"],
        "true"
    );
    // Auto-scaling cannot be enabled on it any more, and says why.
    let scaling = POOL.replace(
        "  replicas: 0\n",
        "  type: auto-scaling\n  replicas: 1\n  scaling: {min: 1, max: 3}\n",
    );
    std::fs::write(env.path("scaling.yaml"), scaling).unwrap();
    let (ok, out, err) = env.knit(&["apply", "-f", env.path("scaling.yaml").to_str().unwrap()]);
    assert!(!ok && err.contains("holds instances added"), "{out}{err}");

    // ---- manual mode.
    let id2 = env.instance(
        "name: old-db\nuserData: |\n  #!/bin/bash\n  echo mine > /root/own-user-data-ran\n",
    );
    let (ok, machine_before) = env.exec(
        &id2,
        &format!("echo keep me > /root/precious; {}", machine_snapshot()),
    );
    assert!(ok, "{machine_before}");
    let ud_before = env.cloud().user_data_result(&id2).unwrap();
    let tpl_before = env
        .cloud()
        .describe(&id2)
        .unwrap()
        .record
        .template
        .user_data;
    let command = env.knit_ok(&[
        "attach-script",
        "--pool",
        "workers",
        "--keep-instance-name",
        "--expires",
        "10m",
    ]);
    let command = command.trim();
    assert!(
        command.starts_with("echo ") && command.ends_with("| base64 -d | bash"),
        "{command}"
    );
    // Refused machines do not spend the command: the machine-side check
    // (swap) stops before the server, the server-side one (VPC) answers 422.
    let (ok, text) = env.exec(&bad, command);
    assert!(!ok && text.contains("PreflightSwapOn"), "{text}");
    let far = env.instance("name: far\nattributes: {vpcId: vpc-other}\n");
    let (ok, text) = env.exec(&far, command);
    assert!(
        !ok && text.contains("PreflightVpcMismatch") && text.contains("HTTP 422"),
        "{text}"
    );
    // Daemons the agent starts must not hold exec's pipes: log to a file.
    let started = Instant::now();
    let (ok, text) = env.exec(
        &id2,
        &format!("{command} > /root/attach.log 2>&1; rc=$?; cat /root/attach.log; exit $rc"),
    );
    // A measurement, not an assertion.
    eprintln!(
        "manual attach command to its end (agent done): {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(
        ok,
        "the attach command failed:\n{text}\n{}",
        env.server_log_tail()
    );
    env.scale_wait("workers", 2);
    assert_ready(&env, "old-db");
    let (ok, text) = env.exec(
        &id2,
        "cat /root/precious /root/own-user-data-ran; test ! -e /root/pool-user-data",
    );
    assert!(
        ok && text.contains("keep me") && text.contains("mine"),
        "{text}"
    );
    assert_eq!(
        env.cloud().user_data_result(&id2).unwrap(),
        ud_before,
        "user data not run again"
    );
    assert_eq!(
        env.cloud()
            .describe(&id2)
            .unwrap()
            .record
            .template
            .user_data,
        tpl_before
    );
    // The same command again: single use.
    let (ok, text) = env.exec(
        &id2,
        &format!("{command} > /root/attach2.log 2>&1; rc=$?; cat /root/attach2.log; exit $rc"),
    );
    assert!(!ok && text.contains("already used"), "{text}");
    // A refused second run leaves the node's own agent files alone.
    let (ok, text) = env.exec(
        &id2,
        "test -x /var/lib/knit/bootstrap/knit-agent && test -s /var/lib/knit/bootstrap/node-config.yaml",
    );
    assert!(ok, "the second run removed the node's agent files: {text}");
    assert_eq!(env.pool()["spec"]["replicas"], 2);

    // ---- a node removed (instance kept) and attached again is Ready.
    env.knit_ok(&["delete", "node", "old-web", "--release=false"]);
    let deadline = Instant::now() + Duration::from_secs(120);
    while env.cloud().describe(&id).unwrap().record.state.to_string() != "stopped" {
        assert!(Instant::now() < deadline, "old-web was not stopped");
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(env.pool()["spec"]["replicas"], 1);
    env.knit_ok(&[
        "attach",
        "--pool",
        "workers",
        "--instances",
        &id,
        "--format-data-disk",
        "--keep-instance-name",
        "--wait",
        "--timeout",
        "300",
    ]);
    assert_ready(&env, "old-web");
    let (ok, text) = env.exec(&id, "cat /var/lib/container/precious.txt");
    assert!(ok && text.contains("precious"), "{text}");
    assert_eq!(env.pool()["spec"]["replicas"], 2);

    // ---- the manual-mode node removed (instance kept): the agent's undo
    // runs inside it and it stays running, as it was before the attach.
    env.knit_ok(&["delete", "node", "old-db"]);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let mine = store_instance(&env, &id2);
        if mine["state"] == "Detached" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "old-db never Detached: {mine}\n{}",
            env.server_log_tail()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let events = env.knit_ok(&["get", "events"]);
    assert_eq!(
        env.cloud().describe(&id2).unwrap().record.state.to_string(),
        "running",
        "a manual-mode machine is left running:\n{events}"
    );
    assert!(
        events.contains("keeps it running") && !events.contains("UndoFailed"),
        "{events}"
    );
    let (ok, text) = env.exec(
        &id2,
        &format!("cat /root/precious /root/own-user-data-ran; {NOTHING_OF_KNIT_RUNS}"),
    );
    assert!(
        ok && text.contains("keep me") && text.contains("mine"),
        "{text}"
    );
    let (ok, machine_after) = env.exec(&id2, &machine_snapshot());
    assert!(ok, "{machine_after}");
    assert_eq!(
        machine_after, machine_before,
        "the machine is not as it was before the attach"
    );
    assert_eq!(env.pool()["spec"]["replicas"], 1);
    // Attached again with a new command: Ready again.
    let command = env.knit_ok(&[
        "attach-script",
        "--pool",
        "workers",
        "--keep-instance-name",
        "--expires",
        "10m",
    ]);
    let (ok, text) = env.exec(
        &id2,
        &format!(
            "{} > /root/attach3.log 2>&1; rc=$?; cat /root/attach3.log; exit $rc",
            command.trim()
        ),
    );
    assert!(
        ok,
        "attaching it again failed:\n{text}\n{}",
        env.server_log_tail()
    );
    env.scale_wait("workers", 2);
    assert_ready(&env, "old-db");
}

#[test]
fn an_instance_that_cannot_reach_the_api_server_fails_with_a_diagnosis() {
    // The embedded cluster, so that the manual-mode agent below really
    // tries (and fails) to join an API server.
    let mut env = Env::builder().cluster(true).build();
    env.start(true);
    let pool = POOL.replace(
        "  replicas: 0\n",
        "  replicas: 0\n  joinTimeoutSeconds: 60\n",
    );
    std::fs::write(env.path("pool.yaml"), pool).unwrap();
    env.knit_ok(&["create", "-f", env.path("pool.yaml").to_str().unwrap()]);
    let id = env.instance("name: cut-off\n");
    let ip = env.cloud().describe(&id).unwrap().record.private_ip;
    // Cut the instance off from the host (control plane and API server):
    // its packets to the gateway are dropped. The address survives the re-image.
    let rule: Vec<String> = [
        "INPUT",
        "-s",
        &format!("{ip}/32"),
        "-d",
        &env.gateway,
        "-j",
        "DROP",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    env.iptables_insert(rule);
    env.knit_ok(&["attach", "--pool", "workers", "--instances", &id]);

    // Manual mode: a machine that reaches the control plane but not the API
    // server. The command's agent fails its join; the command undoes the
    // agent's work, prints the diagnosis and how to retry, and the control
    // plane undoes the add.
    let m = env.instance("name: cut-manual\ndisks: [{name: data, size: 2Gi}]\n");
    let mip = env.cloud().describe(&m).unwrap().record.private_ip;
    // What the machine looked like before: a file of its own and what
    // `machine_snapshot` lists.
    let snapshot = machine_snapshot();
    let (ok, before) = env.exec(&m, &format!("echo keep me > /root/precious; {snapshot}"));
    assert!(ok, "{before}");
    let api_port = env.cluster_port.unwrap().to_string();
    env.iptables_insert(
        [
            "INPUT",
            "-s",
            &format!("{mip}/32"),
            "-d",
            &env.gateway,
            "-p",
            "tcp",
            "--dport",
            &api_port,
            "-j",
            "DROP",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
    );
    let replicas_before = env.pool()["spec"]["replicas"].clone();
    let command = env.knit_ok(&[
        "attach-script",
        "--pool",
        "workers",
        "--format-data-disk",
        "--expires",
        "10m",
    ]);
    let (ok, text) = env.exec(
        &m,
        &format!(
            "{} > /root/attach.log 2>&1; rc=$?; cat /root/attach.log; exit $rc",
            command.trim()
        ),
    );
    assert!(!ok, "the command must fail:\n{text}");
    for needle in [
        "undoing what the agent did",
        "back as it was",
        &env.gateway,
        "connectivity",
        "security-group",
        "knit attach-script",
    ] {
        assert!(text.contains(needle), "{needle:?} missing in:\n{text}");
    }
    // The machine is as before: same paths, same content, its own file, no
    // mount and no process of knit's.
    let (ok, after) = env.exec(&m, &format!("rm /root/attach.log; {snapshot}"));
    assert!(ok, "{after}");
    assert_eq!(after, before, "the machine is not as it was");
    let (ok, text) = env.exec(&m, &format!("cat /root/precious; {NOTHING_OF_KNIT_RUNS}"));
    assert!(ok && text.contains("keep me"), "{text}");
    // The control plane undid the add.
    let mine = store_instance(&env, &m);
    assert_eq!(mine["state"], "Detached", "{mine}");
    let why = mine["lastError"].as_str().unwrap_or_default();
    assert!(
        why.contains("rolled the machine back") && why.contains("connectivity"),
        "{why}"
    );
    assert_eq!(env.pool()["spec"]["replicas"], replicas_before);
    assert!(env.knit_ok(&["get", "events"]).contains("AttachFailed"));

    let deadline = Instant::now() + Duration::from_secs(180);
    let failed = loop {
        let v = env.json(&["get", "instances", "-o", "json"]);
        let mine = v["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["providerId"] == id.as_str())
            .cloned()
            .unwrap();
        if mine["state"] == "Failed" {
            break mine;
        }
        assert!(
            Instant::now() < deadline,
            "never failed: {mine}\n{}",
            env.server_log_tail()
        );
        std::thread::sleep(Duration::from_secs(2));
    };
    let message = failed["lastError"].as_str().unwrap_or_default();
    // The API server's real address and port, not docs/spec.md §2.3's 6443.
    let api_address = format!("{}:{api_port}", env.gateway);
    for needle in [
        "not initialized 60 s",
        &api_address,
        "connectivity",
        "security-group",
    ] {
        assert!(message.contains(needle), "{needle:?} missing in: {message}");
    }
}

/// Every instance-attribute check against real local-cloud instances, each
/// failing exactly one check (the others pass), through one dry run.
#[test]
fn each_preflight_check_fails_alone_on_a_real_instance() {
    let mut env = Env::builder().cluster(false).build();
    env.start(false);
    std::fs::write(env.path("pool.yaml"), POOL).unwrap();
    env.knit_ok(&["create", "-f", env.path("pool.yaml").to_str().unwrap()]);
    let cluster = |spec: &str| {
        std::fs::write(
            env.path("cluster.yaml"),
            format!("apiVersion: knit.dev/v1alpha1\nkind: Cluster\nmetadata: {{name: knit}}\nspec: {spec}\n"),
        )
        .unwrap();
        env.knit_ok(&["apply", "-f", env.path("cluster.yaml").to_str().unwrap()]);
    };
    // Room for the whole batch (the basic edition's quota is 10).
    cluster("{nodeQuota: 50}");
    let cloud = env.cloud();
    let make = |attrs: &str| {
        cloud
            .create(&Template::parse(attrs).unwrap())
            .unwrap()
            .record
            .id
    };
    let run = |cases: &[(&str, &str, &str)]| {
        let ids: Vec<String> = cases.iter().map(|(a, _, _)| make(a)).collect();
        let (ok, out, err) = env.knit(&[
            "attach",
            "--pool",
            "workers",
            "--instances",
            &ids.join(","),
            "--dry-run",
            "-o",
            "json",
        ]);
        let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}{err}"));
        for ((attrs, status, code), id) in cases.iter().zip(&ids) {
            let report = v["preflight"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["instance"] == id.as_str())
                .unwrap();
            let failed: Vec<(String, String)> = report["results"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|r| r["status"] == "error" || r["status"] == "warning")
                .map(|r| {
                    (
                        r["status"].as_str().unwrap().into(),
                        r["code"].as_str().unwrap().into(),
                    )
                })
                .collect();
            let want: Vec<(String, String)> = if code.is_empty() {
                vec![]
            } else {
                vec![(status.to_string(), code.to_string())]
            };
            assert_eq!(failed, want, "instance {attrs:?}: {report}");
        }
        ok
    };
    let flannel = [
        ("name: good", "", ""),
        ("attributes: {accountId: other}", "error", "PreflightAccountMismatch"),
        ("attributes: {regionId: cn-x}", "error", "PreflightRegionMismatch"),
        ("attributes: {vpcId: vpc-2}", "error", "PreflightVpcMismatch"),
        ("attributes: {tags: {ack.aliyun.com: c-123}}", "error", "PreflightInOtherCluster"),
        ("attributes: {tags: {scaling-group: asg-1}}", "error", "PreflightInScalingGroup"),
        ("attributes: {swap: true}", "error", "PreflightSwapOn"),
        ("instanceType: ecs.t1.small", "error", "PreflightInstanceTypeUnsupported"),
        ("instanceType: ecs.ebmgn7e.32xlarge", "warning", "PreflightMigReset"),
        ("instanceType: ecs.c7.xlarge", "error", "PreflightInstanceTypeNotInPool"),
        (
            "attributes: {securityGroups: [{id: sg-e, type: enterprise, rules: [{direction: egress, protocol: tcp, portRange: 6443/6443, cidr: 0.0.0.0/0}]}]}",
            "error",
            "PreflightSecurityGroupType",
        ),
        (
            "attributes: {securityGroups: [{id: sg-1, rules: [{direction: egress, protocol: tcp, portRange: 6443/6443, cidr: 0.0.0.0/0, policy: drop}]}]}",
            "error",
            "PreflightSecurityGroupBlocksApiServer",
        ),
        (
            "attributes: {securityGroups: [{id: sg-1, rules: [{direction: ingress, protocol: all, cidr: 0.0.0.0/0, policy: drop}]}]}",
            "error",
            "PreflightSecurityGroupConflict",
        ),
        (
            "attributes: {securityGroups: [{id: a}, {id: b}, {id: c}, {id: d}, {id: e}, {id: f}]}",
            "error",
            "PreflightSecurityGroupQuota",
        ),
    ];
    assert!(!run(&flannel), "a dry run with errors exits non-zero");
    // Terway, dual stack.
    cluster("{nodeQuota: 50, network: {plugin: terway, ipv6: true}}");
    let ok_attrs = "ramRole: KnitWorkerRole, ipv6: true";
    let terway = [
        (format!("attributes: {{{ok_attrs}}}"), "", ""),
        (
            format!(
                "attributes: {{{ok_attrs}, instanceTypeLimits: {{maxEnis: 2, maxIpsPerEni: 5}}}}"
            ),
            "error",
            "PreflightTerwayMaxPods",
        ),
        (
            format!("attributes: {{{ok_attrs}, enis: {{count: 2}}}}"),
            "error",
            "PreflightTerwaySecondaryEni",
        ),
        (
            "attributes: {ipv6: true}".to_string(),
            "error",
            "PreflightRamRole",
        ),
        (
            "attributes: {ramRole: KnitWorkerRole}".to_string(),
            "error",
            "PreflightNoIpv6",
        ),
    ];
    let terway: Vec<(&str, &str, &str)> = terway
        .iter()
        .map(|(a, s, c)| (a.as_str(), *s, *c))
        .collect();
    assert!(!run(&terway));
    // The good one alone passes.
    assert!(run(&terway[..1]), "a clean dry run exits 0");
    // Cluster-wide checks: the node quota and the API server whitelist.
    let good = [terway[0], terway[0]];
    cluster("{nodeQuota: 1, network: {plugin: terway, ipv6: true}}");
    assert!(!run(&good.map(|(a, _, _)| (
        a,
        "error",
        "PreflightNodeQuota"
    ))));
    cluster("{apiServerWhitelist: [192.168.0.0/16], network: {plugin: terway, ipv6: true}}");
    assert!(!run(&good.map(|(a, _, _)| (
        a,
        "error",
        "PreflightNotWhitelisted"
    ))));
    assert_eq!(env.pool()["spec"]["replicas"], 0, "dry runs change nothing");
}

/// A child process this test started, killed (by its PID) and reaped when
/// the test ends, however it ends.
struct ChildGuard(std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The store's record of the instance the provider knows as `id`.
fn store_instance(env: &Env, id: &str) -> Value {
    env.store_instances()
        .into_iter()
        .rev()
        .find(|i| i["providerId"] == id)
        .unwrap_or_else(|| panic!("{id} is not in the store"))
}

/// A server killed with SIGKILL right after it stopped an instance it was
/// attaching (automatic mode), restarted over the same store: it resumes
/// the attach (re-image, join), the node gets Ready and the desired count
/// was raised exactly once. Then the pool is deleted: the added instance is
/// removed from the pool and kept (stopped), never released.
#[test]
fn a_server_killed_mid_attach_resumes_it_after_a_restart() {
    let mut env = Env::builder()
        .cluster(true)
        .env("KNIT_SERVER_PAUSE_AT", "attach-after-stop")
        .build();
    env.start(true);
    std::fs::write(env.path("pool.yaml"), POOL).unwrap();
    env.knit_ok(&["create", "-f", env.path("pool.yaml").to_str().unwrap()]);
    let id = env.instance("name: resumed\n");

    // The request waits at the pause point; run it beside the test.
    let attach = env
        .cmd()
        .args(["attach", "--pool", "workers", "--instances", &id])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let attach = ChildGuard(attach);
    let deadline = Instant::now() + Duration::from_secs(120);
    while !env.server_log().contains("paused at attach-after-stop") {
        assert!(
            Instant::now() < deadline,
            "the server never reached the pause point:\n{}",
            env.server_log_tail()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let mid = store_instance(&env, &id);
    assert_eq!(mid["state"], "Creating", "{mid}");
    assert_eq!(mid["added"], true, "{mid}");
    assert_eq!(env.pool()["spec"]["replicas"], 1);
    assert_eq!(
        env.cloud().describe(&id).unwrap().record.state.to_string(),
        "stopped",
        "killed after the stop, before the re-image"
    );

    env.kill_server();
    drop(attach);
    env.start_server();

    let deadline = Instant::now() + Duration::from_secs(300);
    let node = loop {
        let name = store_instance(&env, &id)["name"].clone();
        let ready = env
            .nodes_of("workers")
            .into_iter()
            .find(|n| n["instance"] == name && n["status"] == "Ready");
        if let Some(n) = ready {
            break n;
        }
        assert!(
            Instant::now() < deadline,
            "the resumed attach never got Ready: {}\n{}",
            store_instance(&env, &id),
            env.server_log_tail()
        );
        std::thread::sleep(Duration::from_secs(2));
    };
    let done = store_instance(&env, &id);
    assert_eq!(done["state"], "Running", "{done}");
    assert_eq!(env.pool()["spec"]["replicas"], 1, "the count raised once");
    let ours: Vec<Value> = env
        .store_instances()
        .into_iter()
        .filter(|i| i["pool"] == "workers")
        .collect();
    assert_eq!(ours.len(), 1, "{ours:?}");
    let events = env.knit_ok(&["get", "events"]);
    assert!(events.contains("AttachResuming"), "{events}");
    eprintln!("resumed attach: node {} Ready", node["name"]);

    // Deleting the pool keeps the machine the user brought.
    env.knit_ok(&["delete", "pool", "workers"]);
    let deadline = Instant::now() + Duration::from_secs(120);
    while env.knit(&["get", "pools", "workers"]).0 {
        assert!(
            Instant::now() < deadline,
            "the pool was never removed:\n{}",
            env.server_log_tail()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let kept = store_instance(&env, &id);
    assert_eq!(kept["state"], "Detached", "{kept}");
    let at_cloud = env
        .cloud()
        .describe(&id)
        .expect("the instance still exists");
    assert_eq!(at_cloud.record.state.to_string(), "stopped");
    let events = env.knit_ok(&["get", "events"]);
    assert!(events.contains("KeepingAdded"), "{events}");

    // Deleting the cluster (knit down) keeps it as well: the local cloud
    // that holds it is not taken down with the server.
    let out = env.knit_ok(&["down", "--timeout", "120"]);
    assert!(
        out.contains("added by attach") && out.contains(&id),
        "{out}"
    );
    assert!(
        env.cloud().describe(&id).is_ok(),
        "the added instance did not survive knit down"
    );
}

/// `openssl passwd -6` of `password` with the salt of `hash` (the password
/// on stdin): equal to `hash` when it verifies the password.
fn sha512_crypt(password: &str, hash: &str) -> String {
    use std::io::Write;
    let salt = hash.split('$').nth(2).expect("a $6$salt$ hash");
    let mut child = std::process::Command::new("openssl")
        .args(["passwd", "-6", "-salt", salt, "-stdin"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("openssl");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(format!("{password}\n").as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Automatic mode without `--keep-instance-name`, on an instance that logs
/// in by password: the instance is renamed to its node name (the pool's
/// rule, `<region>.<instance id>`), hostname included; the node is Ready
/// under that name; the new password is root's inside the instance only,
/// and no log, event or record holds it.
#[test]
fn automatic_attach_renames_the_instance_and_sets_the_new_password() {
    let mut env = Env::builder().cluster(true).build();
    env.start(true);
    std::fs::write(env.path("pool.yaml"), POOL).unwrap();
    env.knit_ok(&["create", "-f", env.path("pool.yaml").to_str().unwrap()]);
    let host_shadow = std::fs::read("/etc/shadow").unwrap();
    let id = env.instance("name: owned-pw\nattributes:\n  login: {password: Old-pass-1}\n");
    let password = format!("N3w-pass!{}", std::process::id() % 100_000);

    let (ok, out, err) = env.knit(&["attach", "--pool", "workers", "--instances", &id]);
    assert!(
        !ok && format!("{out}{err}").contains("PreflightPasswordRequired"),
        "{out}{err}"
    );
    // The password on the command line is refused (issue 30): it comes
    // from a file only its owner reads.
    let (ok, out, err) = env.knit(&[
        "attach",
        "--pool",
        "workers",
        "--instances",
        &id,
        "--password",
        &password,
    ]);
    assert!(
        !ok && err.contains("--password-file PATH") && !format!("{out}{err}").contains(&password),
        "{out}{err}"
    );
    let password_file = env.path("new-password");
    std::fs::write(&password_file, format!("{password}\n")).unwrap();
    env.knit_ok(&[
        "attach",
        "--pool",
        "workers",
        "--instances",
        &id,
        "--password-file",
        password_file.to_str().unwrap(),
        "--wait",
        "--timeout",
        "300",
    ]);
    let node_name = format!("local.{id}");
    let nodes = env.json(&["get", "nodes", "-o", "json"]);
    let n = node(&nodes, &node_name)
        .unwrap_or_else(|| panic!("node named by the pool's rule: {nodes}"));
    assert_eq!(n["status"], "Ready", "{n}");

    // Renamed at the cloud, and inside.
    let after = env.cloud().describe(&id).unwrap();
    assert_eq!(
        after.record.template.name.as_deref(),
        Some(node_name.as_str())
    );
    assert_eq!(after.record.hostname, node_name);
    let (ok, text) = env.exec(&id, "cat /proc/sys/kernel/hostname /etc/hostname");
    assert!(ok, "{text}");
    assert_eq!(text, format!("{node_name}\n{node_name}\n"));

    // The new password is root's, in the instance's own /etc/shadow.
    assert!(after.record.password_set_at.is_some());
    let (ok, hash) = env.exec(&id, "awk -F: '$1 == \"root\" {print $2}' /etc/shadow");
    let hash = hash.trim().to_string();
    assert!(ok && hash.starts_with("$6$"), "{hash}");
    assert_eq!(sha512_crypt(&password, &hash), hash, "the hash verifies");
    assert_eq!(
        std::fs::read("/etc/shadow").unwrap(),
        host_shadow,
        "the host's /etc/shadow changed"
    );

    // Never in the server's log, its events or the local cloud's records.
    assert!(!env.server_log().contains(&password), "server log");
    let events = env.knit_ok(&["get", "events"]);
    assert!(!events.contains(&password), "events");
    let local = env.local_config().state_dir;
    let mut stack = vec![local, env.state_dir()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let p = e.path();
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                stack.push(p);
            } else if ft.is_file() && is_record(&p) {
                let bytes = std::fs::read(&p).unwrap_or_default();
                assert!(
                    !String::from_utf8_lossy(&bytes).contains(&password),
                    "{} holds the password",
                    p.display()
                );
            }
        }
    }
}

/// Records and logs (not disk images, tarballs or binaries).
fn is_record(p: &std::path::Path) -> bool {
    let name = p.file_name().unwrap_or_default().to_string_lossy();
    name.starts_with("knit.db")
        || p.extension()
            .is_some_and(|x| x == "json" || x == "log" || x == "yaml")
}
