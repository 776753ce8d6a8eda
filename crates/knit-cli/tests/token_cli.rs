//! `knit token create|list|revoke` against a real `knit server` (no
//! provider, no cluster), and the roles as the CLI meets them: a viewer's
//! config reads and is refused a change with the server's code; a revoked
//! token is refused; the last admin token cannot be revoked.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn knit_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_knit"))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One `knit server` in a temporary directory, ended (by its PID) on drop.
struct Server {
    dir: tempfile::TempDir,
    child: Child,
}

impl Server {
    fn start() -> Server {
        let dir = tempfile::Builder::new()
            .prefix("knit-tokens-")
            .tempdir()
            .unwrap();
        let log = std::fs::File::create(dir.path().join("server.log")).unwrap();
        let child = Command::new(knit_bin())
            .env("KNIT_CONFIG", dir.path().join("config"))
            .args(["server", "--write-config", "--provider", "none"])
            .args(["--cluster", "none", "--listen"])
            .arg(format!("127.0.0.1:{}", free_port()))
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut server = Server { dir, child };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if server.dir.path().join("config").exists()
                && server.knit(&server.config(), &["get", "pools"]).0
            {
                return server;
            }
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("the server exited ({status}):\n{}", server.log());
            }
            assert!(Instant::now() < deadline, "no server:\n{}", server.log());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("config")
    }

    /// A copy of the admin's client config holding `secret` instead.
    fn config_with(&self, name: &str, secret: &str) -> PathBuf {
        let admin = std::fs::read_to_string(self.dir.path().join("state/admin-token")).unwrap();
        let text = std::fs::read_to_string(self.config()).unwrap();
        assert!(
            text.contains(admin.trim()),
            "the config holds the admin token"
        );
        let path = self.dir.path().join(name);
        std::fs::write(&path, text.replace(admin.trim(), secret)).unwrap();
        path
    }

    /// (success, stdout, stderr) of `knit --config CONFIG ARGS`.
    fn knit(&self, config: &Path, args: &[&str]) -> (bool, String, String) {
        let out = Command::new(knit_bin())
            .arg("--config")
            .arg(config)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn ok(&self, config: &Path, args: &[&str]) -> String {
        let (ok, out, err) = self.knit(config, args);
        assert!(ok, "knit {args:?}:\n{out}\n{err}");
        out
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn tokens_from_the_command_line() {
    let s = Server::start();
    let admin = s.config();

    // The admin token file is the first admin token, marked as this one.
    let list = s.ok(&admin, &["token", "list"]);
    assert!(list.starts_with("ID"), "{list}");
    let first = list.lines().nth(1).expect("one token");
    assert!(first.contains(" *") && first.contains("admin"), "{list}");
    let first_id = first.split_whitespace().next().unwrap().to_string();

    // Create: the secret alone on stdout, what it is on stderr.
    let (ok, secret, err) = s.knit(
        &admin,
        &[
            "token",
            "create",
            "--role",
            "viewer",
            "--ttl",
            "24h",
            "--description",
            "dashboards",
        ],
    );
    assert!(ok, "{err}");
    let secret = secret.trim().to_string();
    assert_eq!(secret.len(), 64, "{secret}");
    assert!(
        err.contains("role viewer") && err.contains("shown only now"),
        "{err}"
    );

    // -o json: every field, never a secret.
    let json: serde_json::Value =
        serde_json::from_str(&s.ok(&admin, &["token", "list", "-o", "json"])).unwrap();
    let items = json["items"].as_array().unwrap();
    assert_eq!(items.len(), 2, "{json}");
    let viewer = items
        .iter()
        .find(|t| t["role"] == "viewer")
        .expect("the viewer token");
    assert_eq!(viewer["description"], "dashboards");
    for field in ["id", "createdMs", "expiresMs", "lastUsedMs"] {
        assert!(viewer.get(field).is_some(), "{field} in {viewer}");
    }
    assert!(
        !json.to_string().contains(&secret),
        "a secret listed: {json}"
    );
    let viewer_id = viewer["id"].as_str().unwrap().to_string();

    // The viewer reads, and is refused a change with the server's code.
    let as_viewer = s.config_with("viewer-config", &secret);
    s.ok(&as_viewer, &["get", "pools"]);
    let (ok, _, err) = s.knit(&as_viewer, &["scale", "pool", "web", "--replicas", "1"]);
    assert!(!ok);
    assert!(
        err.contains("[InsufficientRole]") && err.contains("operator"),
        "{err}"
    );
    let (ok, _, err) = s.knit(&as_viewer, &["token", "list"]);
    assert!(!ok && err.contains("[InsufficientRole]"), "{err}");

    // A duration that is not one is refused before any request.
    let (ok, _, err) = s.knit(
        &admin,
        &["token", "create", "--role", "viewer", "--ttl", "soon"],
    );
    assert!(!ok && err.contains("not a duration"), "{err}");

    // Revoked: refused at once.
    assert!(s
        .ok(&admin, &["token", "revoke", &viewer_id])
        .contains("revoked"));
    let (ok, _, err) = s.knit(&as_viewer, &["get", "pools"]);
    assert!(
        !ok && err.contains("[Unauthorized]") && err.contains("revoked"),
        "{err}"
    );

    // The last admin token is not revoked.
    let (ok, _, err) = s.knit(&admin, &["token", "revoke", &first_id]);
    assert!(!ok && err.contains("[LastAdminToken]"), "{err}");
}
