//! `knit-agent restart-services` (node repair's first action), run as the
//! server runs it: containerd and kubelet, started under the agent's own
//! supervisor in a temporary root, are stopped and started again with the
//! definitions init recorded; the old processes are gone, nothing else is
//! touched. Only processes this test started are stopped (by PID, on drop).

mod components_support;

use components_support::*;
use knit_agent::services::{self, ServiceSpec};
use std::process::Command;
use std::time::Duration;

const SERVICES: [&str; 2] = ["containerd", "kubelet"];

/// A stand-in for the real binary: a long sleep with a marker in its
/// environment, so that the restarted process is seen to get the same
/// definition.
fn stand_in(name: &str) -> ServiceSpec {
    ServiceSpec {
        name: name.to_string(),
        exec: vec![
            "/bin/sh".into(),
            "-c".into(),
            "echo \"started $KNIT_TEST_MARK\"; exec sleep 100000".into(),
        ],
        env: vec![("KNIT_TEST_MARK".into(), format!("{name}-definition"))],
        limit_nofile: None,
        limit_core: None,
        limit_memlock: None,
        log_file: format!("/var/log/knit/{name}.log"),
    }
}

fn restart_services(node: &Node) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_knit-agent"))
        .args(["--root", &node.root().to_string_lossy(), "restart-services"])
        .output()
        .unwrap()
}

fn main_pid(node: &Node, name: &str) -> i32 {
    let mut pid = None;
    wait_for(
        &format!("{name}'s process"),
        Duration::from_secs(30),
        || {
            pid = services::main_pid(&node.host, name);
            pid.is_some()
        },
    );
    pid.unwrap()
}

#[test]
fn restart_services_restarts_containerd_and_kubelet_with_their_definitions() {
    let node = Node::new();
    let mut before = Vec::new();
    for name in SERVICES {
        services::ensure_running(&node.host, &stand_in(name)).expect("start");
        before.push((
            name,
            node.supervisor_pid(name).unwrap(),
            main_pid(&node, name),
        ));
    }

    let out = restart_services(&node);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout, "restarted containerd\nrestarted kubelet\n");

    for (name, supervisor, main) in before {
        assert!(services::is_running(&node.host, name), "{name}");
        let new_supervisor = node.supervisor_pid(name).unwrap();
        assert_ne!(new_supervisor, supervisor, "{name}: a new supervisor");
        assert!(!pid_alive(supervisor), "{name}: the old supervisor is gone");
        assert!(!pid_alive(main), "{name}: the old process is gone");
        let new_main = main_pid(&node, name);
        assert_ne!(new_main, main, "{name}");
        // Started again from the recorded definition (its environment).
        let marker = format!("started {name}-definition");
        wait_for("the restart in the log", Duration::from_secs(30), || {
            std::fs::read_to_string(node.path(&format!("/var/log/knit/{name}.log")))
                .is_ok_and(|t| t.matches(marker.as_str()).count() == 2)
        });
    }
    let log = node.log();
    assert!(
        log.contains("restarting containerd (node repair)")
            && log.contains("restarting kubelet (node repair)"),
        "{log}"
    );
}

#[test]
fn restart_services_on_a_machine_init_never_set_up_fails_naming_the_service() {
    let node = Node::new();
    let out = restart_services(&node);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("service containerd") && stderr.contains("did knit-agent init start it?"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
}
