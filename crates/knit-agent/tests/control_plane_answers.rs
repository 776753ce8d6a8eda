//! The subcommands the control plane runs answer with one JSON document on
//! stdout: the typed answer with exit status 0, or an `AgentFailure` with a
//! failing status (the server tells the two apart by the status).

use knit_api::agent::{AgentFailure, LeaveReport, SystemImages};
use std::process::Command;

fn agent(root: &std::path::Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_knit-agent"))
        .arg("--root")
        .arg(root)
        .args(args)
        .output()
        .unwrap();
    (out.status.success(), String::from_utf8(out.stdout).unwrap())
}

#[test]
fn answers_and_failures_are_json_on_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let images = dir.path().join("etc/kubernetes/images.txt");
    std::fs::create_dir_all(images.parent().unwrap()).unwrap();
    std::fs::write(&images, "# system\nregistry.k8s.io/pause:3.9\n").unwrap();

    let (ok, stdout) = agent(dir.path(), &["snapshot-prepare", "system-images"]);
    assert!(ok, "{stdout}");
    let answer: SystemImages = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(answer.images, ["registry.k8s.io/pause:3.9"]);

    let (ok, stdout) = agent(
        dir.path(),
        &["cache-manifest", "--mount", "/var/lib/container"],
    );
    assert!(!ok, "{stdout}");
    let failure: AgentFailure = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(failure.code, "FailCommand");
    assert!(
        failure
            .message
            .contains("no package cache at /var/lib/container/ack/kubernetes"),
        "{failure:?}"
    );

    let bootstrap = dir.path().join("var/lib/knit/bootstrap");
    std::fs::create_dir_all(&bootstrap).unwrap();
    std::fs::write(bootstrap.join("node-config.yaml"), "x").unwrap();
    let (ok, stdout) = agent(dir.path(), &["leave"]);
    assert!(ok, "{stdout}");
    let report: LeaveReport = serde_json::from_str(stdout.trim()).unwrap();
    assert!(report.failed.is_empty(), "{report:?}");
    assert!(!bootstrap.exists());
}
