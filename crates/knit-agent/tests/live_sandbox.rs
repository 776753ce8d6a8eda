//! The agent live (no `--root`) on a real sandbox machine of the local cloud:
//! its own namespaces, root and network; the host's clock and kernel-wide
//! settings are not its to change. Driven through the `knit-local` CLI built
//! beside `knit-agent` (cargo build --workspace). Run as root.

mod components_support;

use components_support::sandbox::Sandbox;
use components_support::{build_package, VERSION};
use std::path::Path;
use std::process::Output;

impl Sandbox {
    /// The agent, a package and a node config inside the machine.
    fn prepare(&self, extra: &str) {
        self.copy_in(
            Path::new(env!("CARGO_BIN_EXE_knit-agent")),
            "/usr/local/bin/knit-agent",
            "755",
        );
        let work = tempfile::tempdir().unwrap();
        let (tarball, _) = build_package(
            work.path(),
            VERSION,
            &[("bin/kubelet", b"#!/bin/sh\nexec sleep 100000\n")],
        );
        self.copy_in(
            &tarball,
            &format!(
                "/opt/knit-packages/{}",
                tarball.file_name().unwrap().to_string_lossy()
            ),
            "644",
        );
        let config = work.path().join("node.yaml");
        std::fs::write(
            &config,
            format!(
                "apiVersion: knit.dev/v1alpha1\nkind: NodeConfig\n\
                 node: {{region: test, instanceId: i-live, ip: {ip}}}\n\
                 dataDisk: {{enabled: false}}\n\
                 basePackages: {{enabled: false}}\n\
                 kubernetes: {{version: {VERSION}, dir: /opt/knit-packages}}\n{extra}",
                ip = self.ip
            ),
        )
        .unwrap();
        self.copy_in(&config, "/etc/knit/node.yaml", "600");
    }

    fn init(&self, args: &str) -> Output {
        self.sh_out(
            &format!("knit-agent init --config /etc/knit/node.yaml {args}"),
            None,
        )
    }

    fn journal(&self) -> serde_json::Value {
        serde_json::from_str(&self.sh("cat /var/lib/knit/journal.json")).unwrap()
    }
}

fn sysctl(s: &Sandbox, key: &str) -> String {
    s.sh(&format!("cat /proc/sys/{}", key.replace('.', "/")))
        .trim()
        .to_string()
}

/// A whole `init` on a sandbox machine: chronyd runs tracking only (`-x`:
/// the sandbox shares the host's clock, though it holds CAP_SYS_TIME); the
/// pool's kernel settings are in effect before the kubelet's phase (the
/// sandbox's own network namespace starts with forwarding off) and again at
/// the end; the hardening profile's kernel settings are applied, not only
/// written, where the namespace allows, and the rest is said to wait for boot.
#[test]
fn init_on_a_sandbox_machine_syncs_time_and_applies_os_settings_in_order() {
    let s = Sandbox::new("live", "ka", 0, 0);
    if s.sh_out("command -v chronyd", None).status.code() != Some(0) {
        panic!(
            "chronyd is not installed in the machine's image (scripts/setup.sh installs chrony)"
        );
    }
    s.prepare("hardening: {profile: os}\n");
    assert_eq!(sysctl(&s, "net.ipv4.ip_forward"), "0", "a fresh namespace");
    assert_eq!(sysctl(&s, "net.ipv4.conf.all.accept_redirects"), "1");
    let out = s.init("");
    let log = s.sh("cat /var/log/knit-deploy.log");
    assert!(
        out.status.success(),
        "{}{}\n{log}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // time-sync: chronyd runs, with -x.
    let journal = s.journal();
    assert_eq!(
        journal["phases"]["time-sync"]["outcome"], "done",
        "{journal}"
    );
    let pid = s.sh("cat /run/chrony/chronyd.pid").trim().to_string();
    let cmdline = s.sh(&format!("tr '\\0' ' ' < /proc/{pid}/cmdline"));
    assert!(cmdline.contains(" -x"), "{cmdline}");
    assert!(
        journal["phases"]["time-sync"]["reason"]
            .as_str()
            .unwrap()
            .contains("tracking only"),
        "{journal}"
    );

    // OS settings: applied before the components/kubelet phases, and again.
    let started = |phase: &str| journal["phases"][phase]["startedAtMs"].as_u64().unwrap();
    assert_eq!(journal["phases"]["os-config-initial"]["outcome"], "done");
    assert!(started("os-config-initial") <= started("kubernetes-components"));
    assert!(started("kubernetes-components") <= started("join"));
    assert!(started("os-config") >= started("join"));
    let initial = log
        .lines()
        .position(|l| l.contains("[os-config-initial] done"))
        .expect(&log);
    let components = log
        .lines()
        .position(|l| l.contains("[kubernetes-components] start"))
        .expect(&log);
    assert!(initial < components, "{log}");
    assert_eq!(sysctl(&s, "net.ipv4.ip_forward"), "1");

    // Hardening: the network-namespace settings are in effect now; the
    // kernel-wide ones are read-only here and left to boot, with a log line.
    assert_eq!(sysctl(&s, "net.ipv4.conf.all.accept_redirects"), "0");
    assert_eq!(sysctl(&s, "net.ipv4.conf.all.log_martians"), "1");
    let left = log
        .lines()
        .find(|l| l.contains("[hardening] kernel settings not applied now, set at next boot:"))
        .expect(&log);
    assert!(
        left.contains("kernel.kptr_restrict (Read-only file system"),
        "{left}"
    );
    assert!(log.contains("sshd is not running"), "{log}");

    // A rerun finds chronyd running as wanted and leaves it alone.
    let out = s.init("--stop-after time-sync");
    assert!(out.status.success());
    assert_eq!(
        s.journal()["phases"]["time-sync"]["reason"],
        "chronyd is running"
    );
    assert_eq!(s.sh("cat /run/chrony/chronyd.pid").trim(), pid);
}

/// A chronyd that cannot start fails `time-sync` with FailSyncTime and what
/// chronyd said (it used to be started blind and restarted forever).
#[test]
fn a_chronyd_that_cannot_start_is_fail_sync_time() {
    let s = Sandbox::new("live", "ka", 0, 1);
    s.prepare("");
    s.sh("mkdir -p /etc/chrony/conf.d && echo 'no-such-directive 1' > /etc/chrony/conf.d/broken.conf");
    let out = s.init("--stop-after time-sync");
    assert!(!out.status.success());
    assert_eq!(
        s.sh("cat /var/log/knit-deploy-error-code.log").trim(),
        "FailSyncTime"
    );
    let msg = s.sh("cat /var/log/knit-deploy-error-msg.log");
    assert!(msg.contains("chronyd could not be started"), "{msg}");
    assert!(msg.contains("Invalid directive"), "{msg}");
    // Not left restarting in the background.
    assert!(!s
        .sh_out("test -s /run/knit/chronyd.pid", None)
        .status
        .success());
}
