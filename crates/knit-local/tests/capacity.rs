//! The local cloud's per-type capacity: a create of a type whose capacity
//! is used up is refused as OutOfCapacity (what knit's instance type
//! fallback reads as "no stock"), nothing made; lifting it lets the type be
//! made again (checked up to the refusal, which comes before any machine).

mod common;

use common::TestCloud;
use knit_local::Template;

#[test]
fn a_type_past_its_capacity_is_refused_and_nothing_is_made() {
    let c = TestCloud::new();
    assert!(c.cloud.capacity().unwrap().is_empty());
    c.cloud.set_capacity("ecs.g7.large", Some(0)).unwrap();
    c.cloud.set_capacity("ecs.c7.large", Some(3)).unwrap();
    let caps = c.cloud.capacity().unwrap();
    assert_eq!(caps.get("ecs.g7.large"), Some(&0));
    assert_eq!(caps.get("ecs.c7.large"), Some(&3));

    let e = c
        .cloud
        .create(&Template::parse("instanceType: ecs.g7.large\n").unwrap())
        .expect_err("no capacity");
    assert_eq!(e.code(), "LocalOutOfCapacity");
    let text = e.to_string();
    assert!(
        text.starts_with("OutOfCapacity: instance type ecs.g7.large") && text.contains("0 of 0"),
        "{text}"
    );
    assert!(c.cloud.list().unwrap().is_empty());

    // Lifted: the type is no longer limited.
    c.cloud.set_capacity("ecs.g7.large", None).unwrap();
    assert_eq!(c.cloud.capacity().unwrap().get("ecs.g7.large"), None);
    // The command line sets and prints the same.
    let out = c.cli(&["capacity", "ecs.r7.large", "2"]);
    assert!(out.status.success(), "{out:?}");
    let out = c.cli(&["capacity"]);
    let printed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(printed["ecs.r7.large"], 2);
    assert_eq!(printed["ecs.c7.large"], 3);
}

/// A host whose per-user inotify limit would be passed by one more machine
/// refuses the create before anything is made. The limit is shown as 5 to
/// knit-local only: it runs in a private mount namespace where a file is
/// bound over the sysctl (the host's setting is not touched).
#[test]
fn a_host_out_of_inotify_instances_refuses_the_machine() {
    let c = TestCloud::new();
    let limit = c.dir.join("max_user_instances");
    std::fs::write(&limit, "5\n").unwrap();
    let template = c.dir.join("template.yaml");
    std::fs::write(&template, "instanceType: ecs.g7.large\n").unwrap();
    let out = std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg("mount --bind \"$1\" /proc/sys/fs/inotify/max_user_instances && shift && exec \"$@\"")
        .args(["sh", limit.to_str().unwrap(), common::BIN])
        .args(["create", "-f", template.to_str().unwrap()])
        .env("KNIT_LOCAL_STATE_DIR", &c.dir)
        .env("KNIT_LOCAL_BRIDGE", &c.bridge)
        .env("KNIT_LOCAL_SUBNET", &c.subnet)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("unshare (util-linux)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        stderr.contains("LocalHostOutOfCapacity")
            && stderr.contains("OutOfCapacity: this host cannot carry another machine")
            && stderr.contains("fs.inotify.max_user_instances")
            && stderr.contains("of 5"),
        "{stderr}"
    );
    assert!(c.cloud.list().unwrap().is_empty());
}
