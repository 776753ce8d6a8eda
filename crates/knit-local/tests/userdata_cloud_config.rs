//! The user-data runner on a real sandbox instance: `#cloud-config` applied
//! by the real cloud-init (installed by scripts/setup.sh), in cloud-init's
//! stage order (boothooks, cloud-config modules, scripts, then runcmd),
//! parts it does not run reported as not run, and cloud-init's final status
//! line. Run as root.

mod common;

use common::TestCloud;
use std::time::Duration;

const USER_DATA: &str = r#"userData: |
  Content-Type: multipart/mixed; boundary="==B=="
  MIME-Version: 1.0

  --==B==
  Content-Type: text/cloud-config

  #cloud-config
  write_files:
  - path: /etc/knit-test/written.conf
    content: |
      from write_files
    permissions: '0640'
  - path: /root/deferred
    content: written late
    defer: true
  runcmd:
  - echo "runcmd saw $(cat /etc/knit-test/written.conf)" > /root/runcmd-out
  - [sh, -c, "echo second >> /root/runcmd-out"]
  - [sh, -c, "test -e /root/after && echo after-the-scripts >> /root/runcmd-out"]
  --==B==
  Content-Type: text/x-include-url

  http://example.invalid/more-user-data
  --==B==
  Content-Type: text/cloud-config

  #cloud-config
  users: [{name: someone}]
  write_files:
  - path: /root/never-written
    content: x
  --==B==
  Content-Type: text/x-shellscript

  #!/bin/sh
  echo after > /root/after
  --==B==
  Content-Type: text/cloud-boothook

  #cloud-boothook
  #!/bin/sh
  if test -e /etc/knit-test/written.conf; then when=late; else when=first; fi
  echo "$INSTANCE_ID $when" > /root/boothook
  --==B==--
"#;

#[test]
fn cloud_config_is_applied_and_unhandled_parts_are_reported_not_run() {
    let t = TestCloud::new();
    let id = t
        .create(&format!("systemDiskSize: 1Gi\n{USER_DATA}"))
        .record
        .id;
    let result = t
        .cloud
        .wait_user_data(&id, Duration::from_secs(180))
        .unwrap();
    let parts = result["knit"]["parts"].as_array().unwrap();
    let statuses: Vec<(&str, &str)> = parts
        .iter()
        .map(|p| {
            (
                p["filename"].as_str().unwrap(),
                p["status"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        statuses,
        [
            ("part-001", "succeeded"),
            ("part-002", "not-run"),
            ("part-003", "not-run"),
            ("part-004", "succeeded"),
            ("part-005", "succeeded")
        ],
        "{result}"
    );
    assert_eq!(parts[0]["exitCode"], 0);
    assert_eq!(
        parts[0]["modules"],
        serde_json::json!(["write_files", "runcmd", "write_files_deferred"])
    );
    assert_eq!(t.sh(&id, "cat /root/deferred"), "written late");
    // Applied inside the instance by cloud-init: the file, its mode, and the
    // runcmd commands after it, in order.
    assert_eq!(
        t.sh(&id, "cat /etc/knit-test/written.conf"),
        "from write_files\n"
    );
    assert_eq!(t.sh(&id, "stat -c %a /etc/knit-test/written.conf"), "640\n");
    assert_eq!(
        t.sh(&id, "cat /root/runcmd-out"),
        "runcmd saw from write_files\nsecond\nafter-the-scripts\n"
    );
    // As under cloud-init: the boothook ran before any cloud-config module
    // (it is the last part), with the instance's id; runcmd ran after the
    // script that follows its part (scripts_user runs it last).
    assert_eq!(t.sh(&id, "cat /root/boothook"), format!("{id} first\n"));
    // Not run, and said so: never counted as success.
    assert!(parts[1]["exitCode"].is_null());
    assert!(parts[1]["error"]
        .as_str()
        .unwrap()
        .contains("text/x-include-url"));
    assert!(parts[2]["error"].as_str().unwrap().contains("users"));
    assert!(!t
        .sh_out(&id, "test -e /root/never-written")
        .status
        .success());
    let errors = result["v1"]["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 2, "{result}");
    assert_eq!(result["knit"]["failedPart"], "part-002");
    assert_eq!(t.sh(&id, "cat /root/after"), "after\n");
    // The output log ends with cloud-init's final-message shape.
    let log = t.sh(&id, "cat /var/log/cloud-init-output.log");
    let last = log.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("knit-local user-data runner v. ")
            && last.contains(" finished at ")
            && last.contains(". Datasource DataSourceKnitLocal.  Up ")
            && last.ends_with("Parts: 3 succeeded, 0 failed, 2 not run"),
        "{log}"
    );
}

/// A cloud-config that cloud-init's schema rejects fails its part.
#[test]
fn invalid_cloud_config_fails_its_part() {
    let t = TestCloud::new();
    let id = t
        .create("systemDiskSize: 1Gi\nuserData: |\n  #cloud-config\n  write_files: 5\n")
        .record
        .id;
    let result = t
        .cloud
        .wait_user_data(&id, Duration::from_secs(120))
        .unwrap();
    let part = &result["knit"]["parts"][0];
    assert_eq!(part["status"], "failed", "{result}");
    assert_ne!(part["exitCode"], 0);
    assert!(part["error"]
        .as_str()
        .unwrap()
        .contains("invalid cloud-config"));
    assert!(t
        .sh(&id, "cat /var/log/cloud-init-output.log")
        .contains("write_files: 5 is not of type 'array'"));
}
