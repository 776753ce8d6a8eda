//! Adding existing instances through the `Provider` seam: a real server on
//! loopback (TLS, SQLite, a temporary state directory) over a provider that
//! records every call. Checks what attach asks of the cloud: the pool's
//! image for the re-image (checked before anything is touched), the rename
//! to the node name when the instance does not keep its own (automatic and
//! manual mode), and the new password set after the re-image and never kept.

mod support;

use knit_server::preflight::InstanceFacts;
use std::path::PathBuf;
use std::sync::Arc;
use support::{instance, FakeCloud, TestServer};

struct Harness {
    srv: TestServer,
    cloud: Arc<FakeCloud>,
}

impl Harness {
    fn new() -> Harness {
        let mut srv = TestServer::new();
        let cloud = Arc::new(FakeCloud::default());
        srv.start(Some(cloud.clone()));
        srv.write_agent_checksum();
        Harness { srv, cloud }
    }

    fn add(&self, id: &str, name: &str, ip: &str, password_login: bool) {
        self.cloud.add(InstanceFacts {
            password_login,
            ..instance(id, name, ip)
        });
    }

    fn pool(&self, name: &str, extra: &str) {
        let yaml = format!(
            "apiVersion: knit.dev/v1alpha1\nkind: NodePool\nmetadata:\n  name: {name}\nspec:\n  replicas: 0\n{extra}"
        );
        self.srv
            .client()
            .call("POST", "/api/v1/pools", Some(&yaml))
            .unwrap();
    }

    fn attach(&self, pool: &str, body: &serde_json::Value) -> (u16, serde_json::Value) {
        let (status, text) = self
            .srv
            .client()
            .raw(
                "POST",
                &format!("/api/v1/pools/{pool}/attach"),
                Some(&body.to_string()),
            )
            .unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
        )
    }

    /// Every file the server keeps (database, attach records, logs …).
    fn state_files(&self) -> Vec<(PathBuf, Vec<u8>)> {
        let mut out = Vec::new();
        let mut stack = vec![self.srv.dir.path().to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                let ft = e.file_type().unwrap();
                if ft.is_dir() {
                    stack.push(e.path());
                } else if ft.is_file() {
                    out.push((e.path(), std::fs::read(e.path()).unwrap()));
                }
            }
        }
        out
    }
}

/// Index of the first call starting with `prefix`.
fn at(calls: &[String], prefix: &str) -> usize {
    calls
        .iter()
        .position(|c| c.starts_with(prefix))
        .unwrap_or_else(|| panic!("no call {prefix:?} in {calls:#?}"))
}

fn image_dir(h: &Harness) -> PathBuf {
    let image = h.srv.dir.path().join("pool-image");
    std::fs::create_dir_all(image.join("usr/bin")).unwrap();
    image
}

#[test]
fn automatic_attach_renames_reimages_with_the_pools_image_and_sets_the_password() {
    let h = Harness::new();
    let image = image_dir(&h);
    h.pool(
        "workers",
        &format!(
            "  image: {}\n  customNodeName: {{prefix: worker, suffix: a}}\n",
            image.display()
        ),
    );
    h.add("i-aaaa00000001", "old-web", "10.213.0.7", true);
    h.add("i-aaaa00000002", "old-db", "10.213.0.8", true);
    let password = "N3w-pass!x7";

    // Password login and no new password: refused by the preflight, nothing
    // asked of the cloud but the image check.
    let (status, body) = h.attach(
        "workers",
        &serde_json::json!({"instances": ["i-aaaa00000001"]}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["passed"], false, "{body}");
    assert!(
        body.to_string().contains("PreflightPasswordRequired"),
        "{body}"
    );
    assert!(
        h.cloud.calls().iter().all(|c| c.starts_with("check-image")),
        "{:#?}",
        h.cloud.calls()
    );

    let (status, body) = h.attach(
        "workers",
        &serde_json::json!({"instances": ["i-aaaa00000001"], "password": password}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["passed"], true, "{body}");
    let node = "worker10.213.0.7a";
    assert_eq!(body["attached"][0]["nodeName"], node, "{body}");
    let calls = h.cloud.calls();
    let image_s = image.display().to_string();
    // Renamed to its node name before anything is stopped, re-imaged with
    // the pool's image, then the password set in the new system.
    let rename = at(&calls, &format!("rename i-aaaa00000001 {node}"));
    let stop = at(&calls, "stop i-aaaa00000001");
    let reimage = at(&calls, &format!("reimage i-aaaa00000001 {image_s}"));
    let password_set = at(&calls, "set-password i-aaaa00000001");
    assert!(
        rename < stop && stop < reimage && reimage < password_set,
        "{calls:#?}"
    );
    assert_eq!(
        *h.cloud.passwords.lock().unwrap(),
        vec![password.to_string()]
    );
    assert_eq!(h.srv.replicas("workers"), 1);

    // Keeping its name: no rename; its node name is its own.
    let (status, body) = h.attach(
        "workers",
        &serde_json::json!({"instances": ["i-aaaa00000002"], "password": password, "keepInstanceName": true}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["attached"][0]["nodeName"], "old-db", "{body}");
    let calls = h.cloud.calls();
    assert!(
        !calls.iter().any(|c| c.starts_with("rename i-aaaa00000002")),
        "{calls:#?}"
    );
    at(&calls, &format!("reimage i-aaaa00000002 {image_s}"));
    at(&calls, "set-password i-aaaa00000002");
    assert_eq!(h.srv.replicas("workers"), 2);

    // The password is in no event, answer or file of the server.
    let events = h.srv.client().get("/api/v1/events").unwrap().to_string();
    assert!(!events.contains(password), "an event holds the password");
    assert!(!body.to_string().contains(password));
    for (path, bytes) in h.state_files() {
        assert!(
            !String::from_utf8_lossy(&bytes).contains(password),
            "{} holds the password",
            path.display()
        );
    }
}

#[test]
fn a_pool_image_that_does_not_exist_is_refused_before_anything_is_touched() {
    let h = Harness::new();
    h.pool("gone", "  image: /nonexistent-knit-pool-image\n");
    h.add("i-bbbb00000001", "web", "10.213.0.9", false);
    for dry_run in [false, true] {
        let (status, body) = h.attach(
            "gone",
            &serde_json::json!({"instances": ["i-bbbb00000001"], "dryRun": dry_run}),
        );
        assert_eq!(status, 422, "{body}");
        let text = body.to_string();
        assert!(
            text.contains("pool.spec.image")
                && text.contains("/nonexistent-knit-pool-image")
                && text.contains("must be a root filesystem directory"),
            "{text}"
        );
    }
    let calls = h.cloud.calls();
    assert!(
        calls.iter().all(|c| c.starts_with("check-image")),
        "{calls:#?}"
    );
    assert_eq!(h.srv.replicas("gone"), 0);
    assert_eq!(h.cloud.state("i-bbbb00000001"), "running");
}

/// The attach token inside a printed manual-mode script.
fn attach_token(script: &str) -> String {
    let start = script.find("knitattach.").expect("token in script");
    script[start..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '.')
        .collect()
}

#[test]
fn manual_attach_renames_the_instance_unless_it_keeps_its_name() {
    let facts = r#"{"osId":"debian","osVersion":"12","osName":"Debian GNU/Linux 12","swap":false}"#;
    for keep in [false, true] {
        // A server each: the machine is found by the caller's address, and
        // here every call comes from loopback.
        let h = Harness::new();
        h.pool("hand", "");
        h.add("i-cccc00000001", "my-box", "127.0.0.1", false);
        let script = h
            .srv
            .client()
            .call(
                "POST",
                "/api/v1/pools/hand/attach-script",
                Some(&serde_json::json!({"keepInstanceName": keep}).to_string()),
            )
            .unwrap();
        let token = attach_token(script["script"].as_str().unwrap());
        let (status, text) = h
            .srv
            .client()
            .with_token(&token)
            .raw("POST", "/attach/v1/manual", Some(facts))
            .unwrap();
        assert_eq!(status, 200, "{text}");
        assert_eq!(h.srv.replicas("hand"), 1);
        let calls = h.cloud.calls();
        if keep {
            assert!(!calls.iter().any(|c| c.starts_with("rename")), "{calls:#?}");
        } else {
            // The pool's default rule: <region>.<instance id>.
            at(&calls, "rename i-cccc00000001 local.i-cccc00000001");
        }
        assert!(
            !calls
                .iter()
                .any(|c| c.starts_with("stop") || c.starts_with("reimage")),
            "manual mode keeps the OS: {calls:#?}"
        );
    }
}
