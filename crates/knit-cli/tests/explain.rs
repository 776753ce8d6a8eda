//! `knit explain`: the reference of the API objects from the binary, no
//! server needed (issue 28 item 8).

use std::process::Command;

fn knit(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_knit"))
        .args(args)
        .env("KNIT_CONFIG", "/nonexistent/knit-config")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn explain_prints_a_field_its_default_and_the_fields_under_it() {
    let (ok, out, err) = knit(&["explain", "nodepool.spec.drain"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("FIELD:    spec.drain\nTYPE:     object"),
        "{out}"
    );
    assert!(out.contains("How a node of the pool is drained"), "{out}");
    assert!(
        out.contains("onTimeout\t<string>\tdefault \"wait\""),
        "{out}"
    );
    let (ok, out, _) = knit(&["explain", "cluster.network"]);
    assert!(ok && out.contains("podCidr\t<string>"), "{out}");
    // What docs/reference.md holds is what the binary prints.
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/reference.md"),
    )
    .unwrap();
    assert!(doc.contains("| `spec.drain.onTimeout` | string | `\"wait\"` |"));
    // An unknown field names the known ones; an unknown kind the kinds.
    let (ok, _, err) = knit(&["explain", "nodepool.spec.nope"]);
    assert!(!ok && err.contains("spec.drain"), "{err}");
    let (ok, _, err) = knit(&["explain", "widget"]);
    assert!(!ok && err.contains("nodepool, cluster"), "{err}");
}
