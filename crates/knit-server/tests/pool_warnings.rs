//! Warnings a pool create or update answers with (`warnings`, printed by
//! the CLI as `Warning: …`), against a real server on loopback.

mod support;

use support::TestServer;

fn pool(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: knit.dev/v1alpha1\nkind: NodePool\nmetadata:\n  name: {name}\nspec:\n{spec}"
    )
}

fn warnings(answer: &serde_json::Value) -> Vec<String> {
    answer["warnings"]
        .as_array()
        .unwrap_or_else(|| panic!("no warnings list in {answer}"))
        .iter()
        .map(|w| w.as_str().unwrap().to_string())
        .collect()
}

/// `touch /var/.skip-yum` in userData (as the seed suggests) cannot work:
/// user data runs after base-packages. Create and update both warn, naming
/// the field, the code and `preUserData`; the same line in preUserData
/// does not warn.
#[test]
fn user_data_touching_an_init_marker_warns_at_create_and_update() {
    let mut srv = TestServer::new();
    srv.start(None);
    let late = pool(
        "late",
        "  replicas: 0\n  userData: |\n    #!/bin/bash\n    touch /var/.skip-yum\n",
    );
    let created = srv
        .client()
        .call("POST", "/api/v1/pools", Some(&late))
        .unwrap();
    let w = warnings(&created);
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].starts_with("spec.userData: ")
            && w[0].contains("/var/.skip-yum")
            && w[0].contains("preUserData")
            && w[0].contains("UserDataMarkerTooLate"),
        "{w:?}"
    );
    let updated = srv
        .client()
        .call("PUT", "/api/v1/pools/late", Some(&late))
        .unwrap();
    assert_eq!(warnings(&updated), w);
    let early = pool(
        "early",
        "  replicas: 0\n  preUserData: |\n    #!/bin/bash\n    touch /var/.skip-yum\n",
    );
    let created = srv
        .client()
        .call("POST", "/api/v1/pools", Some(&early))
        .unwrap();
    assert!(warnings(&created).is_empty(), "{created}");
    // A #cloud-config runcmd in preUserData runs after initialization on
    // every runner: it warns, naming bootcmd.
    let runcmd = pool(
        "runcmd",
        "  replicas: 0\n  preUserData: |\n    #cloud-config\n    runcmd:\n    - touch /var/.skip-yum\n",
    );
    let created = srv
        .client()
        .call("POST", "/api/v1/pools", Some(&runcmd))
        .unwrap();
    let w = warnings(&created);
    assert!(
        w.len() == 1
            && w[0].starts_with("spec.preUserData: ")
            && w[0].contains("bootcmd")
            && w[0].contains("PreUserDataRuncmdLate"),
        "{w:?}"
    );
}

/// A snapshot named on a data disk the agent does not mount (with two
/// disks, the first) would never be used: the answer says which disk is
/// the runtime disk.
#[test]
fn a_snapshot_off_the_runtime_disk_warns() {
    let mut srv = TestServer::new();
    srv.start(None);
    let p = pool(
        "two",
        "  replicas: 0\n  dataDisks:\n  - {snapshotId: s-0123456789ab}\n  - {}\n",
    );
    let created = srv
        .client()
        .call("POST", "/api/v1/pools", Some(&p))
        .unwrap();
    let w = warnings(&created);
    assert!(
        w.iter().any(|w| w.contains("spec.dataDisks[0].snapshotId")
            && w.contains("runtime disk")
            && w.contains("spec.dataDisks[1]")),
        "{w:?}"
    );
}
