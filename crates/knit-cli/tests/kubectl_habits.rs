//! kubectl's habits in `knit` (issue 28, item 5), against a real `knit
//! server` with no provider and no cluster (pools are stored, no machine
//! is made): `get -o yaml|json | apply -f -` round trips, `-o name`,
//! `-o jsonpath=`, `-l`, `--no-headers`, `-w`, `diff -f`, `apply
//! --dry-run=server`, `completion`, `kubeconfig`, human `--timeout`s and
//! an error code printed once; and the server's log as a log collector
//! wants it (no colour codes in a file, `--log-format json`).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
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

/// One `knit server --provider none --cluster none` in a temporary
/// directory, ended (by its PID) on drop.
struct Server {
    dir: tempfile::TempDir,
    child: Child,
}

impl Server {
    fn start() -> Server {
        Server::start_with(&[])
    }

    fn start_with(extra: &[&str]) -> Server {
        let dir = tempfile::Builder::new()
            .prefix("knit-habits-")
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
            .args(extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut server = Server { dir, child };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if server.dir.path().join("config").exists() && server.knit(&["get", "pools"]).0 {
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

    fn cmd(&self) -> Command {
        let mut c = Command::new(knit_bin());
        c.env("KNIT_CONFIG", self.dir.path().join("config"));
        c
    }

    fn run(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut child = self
            .cmd()
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut input = child.stdin.take().unwrap();
        input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
        drop(input);
        child.wait_with_output().unwrap()
    }

    /// (success, stdout, stderr)
    fn knit(&self, args: &[&str]) -> (bool, String, String) {
        self.knit_in(args, None)
    }

    fn knit_in(&self, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
        let out = self.run(args, stdin);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn ok(&self, args: &[&str], stdin: Option<&str>) -> String {
        let (ok, out, err) = self.knit_in(args, stdin);
        assert!(ok, "knit {args:?}:\n{out}\n{err}");
        out
    }

    fn file(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const POOL: &str = "apiVersion: knit.dev/v1alpha1
kind: NodePool
metadata:
  name: web
  labels: {tier: web}
spec:
  replicas: 0
  login: {password: Secret-1234}
";

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn kubectl_habits() {
    let s = Server::start();
    s.ok(&["apply", "-f", "-"], Some(POOL));
    s.ok(
        &["apply", "-f", "-"],
        Some(
            &POOL
                .replace("name: web", "name: db")
                .replace("tier: web", "tier: db"),
        ),
    );

    // get -o yaml|json | apply -f -: the server's fields are ignored, the
    // password (never shown) kept; a list round-trips too.
    for args in [
        &["get", "pool", "web", "-o", "yaml"][..],
        &["get", "pool", "web", "-o", "json"],
        &["get", "pools", "-o", "yaml"],
    ] {
        let doc = s.ok(args, None);
        assert!(doc.contains("creationTimestampMs") && doc.contains("status"));
        let out = s.ok(&["apply", "-f", "-"], Some(&doc));
        assert!(out.contains("nodepool/web configured"), "{args:?}: {out}");
    }
    let login = s.ok(
        &[
            "get",
            "pool",
            "web",
            "-o",
            "jsonpath={.spec.login.passwordSet}",
        ],
        None,
    );
    assert_eq!(login, "true\n", "the stored password was kept");

    // A genuinely unknown field is still refused, its code printed once.
    let (ok, _, err) = s.knit_in(
        &["apply", "-f", "-"],
        Some(&POOL.replace("replicas: 0", "replicaz: 0")),
    );
    assert!(!ok);
    assert!(err.contains("unknown field `replicaz`"), "{err}");
    assert_eq!(err.matches("ConfigParse").count(), 1, "once: {err}");
    let (ok, _, err) = s.knit(&["describe", "pool", "nope"]);
    assert!(!ok);
    assert_eq!(err.trim(), "error [NotFound]: pool \"nope\" not found");

    // -o name, -o jsonpath, -l, --no-headers.
    assert_eq!(
        s.ok(&["get", "pools", "-o", "name"], None),
        "nodepool/db\nnodepool/web\n"
    );
    assert_eq!(
        s.ok(
            &["get", "pools", "-o", "jsonpath={.items[*].metadata.name}"],
            None
        ),
        "db web\n"
    );
    assert_eq!(
        s.ok(
            &[
                "get",
                "pools",
                "-o",
                r#"jsonpath={range .items[*]}{.metadata.name}={.metadata.labels.tier}{"\n"}{end}"#
            ],
            None
        ),
        "db=db\nweb=web\n"
    );
    assert_eq!(
        s.ok(&["get", "pools", "-l", "tier=web", "-o", "name"], None),
        "nodepool/web\n"
    );
    assert_eq!(
        s.ok(
            &["get", "pools", "-l", "tier notin (web)", "-o", "name"],
            None
        ),
        "nodepool/db\n"
    );
    let rows = s.ok(&["get", "pools", "-l", "tier", "--no-headers"], None);
    assert_eq!(rows.lines().count(), 2, "{rows}");
    assert!(!rows.contains("NAME"), "{rows}");
    let (ok, _, err) = s.knit(&["get", "events", "-l", "a=b"]);
    assert!(!ok && err.contains("have no labels"), "{err}");

    // diff: 1 and the change when apply would change something, 0 when not.
    let live = s.ok(&["get", "pool", "web", "-o", "yaml"], None);
    let same = s.file("same.yaml", &live);
    let changed = s.file("changed.yaml", &live.replace("replicas: 0", "replicas: 2"));
    let out = s.run(&["diff", "-f", path_str(&same)], None);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let out = s.run(&["diff", "-f", path_str(&changed)], None);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let diff = String::from_utf8_lossy(&out.stdout);
    assert!(
        diff.contains("-  replicas: 0") && diff.contains("+  replicas: 2"),
        "{diff}"
    );

    // --dry-run=server: checked by the server, nothing stored.
    let out = s.ok(
        &["apply", "--dry-run=server", "-f", path_str(&changed)],
        None,
    );
    assert!(out.contains("(server dry run)"), "{out}");
    let new = POOL.replace("name: web", "name: fresh");
    s.ok(&["create", "--dry-run=server", "-f", "-"], Some(&new));
    assert_eq!(
        s.ok(
            &["get", "pool", "web", "-o", "jsonpath={.spec.replicas}"],
            None
        ),
        "0\n"
    );
    assert_eq!(
        s.ok(&["get", "pools", "-o", "name"], None),
        "nodepool/db\nnodepool/web\n"
    );
    let (ok, _, err) = s.knit_in(
        &["apply", "--dry-run=server", "-f", "-"],
        Some(&POOL.replace("replicas: 0", "replicas: -1")),
    );
    assert!(
        !ok && err.contains("spec.replicas"),
        "refused by the server: {err}"
    );

    // -w: the list, then the pool that changes.
    let mut watch = s
        .cmd()
        .args(["get", "pools", "-w", "--no-headers"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let stdout = watch.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let first: Vec<String> = (0..2)
        .map(|_| rx.recv_timeout(Duration::from_secs(20)).unwrap())
        .collect();
    assert!(first[1].starts_with("web "), "{first:?}");
    s.ok(&["scale", "pool", "web", "--replicas", "1"], None);
    let changed_line = rx.recv_timeout(Duration::from_secs(20)).unwrap();
    let _ = watch.kill();
    let _ = watch.wait();
    let cols: Vec<&str> = changed_line.split_whitespace().collect();
    assert_eq!((cols[0], cols[2]), ("web", "1"), "{changed_line}");

    // Human durations on --timeout; a bad one says the forms.
    // (No --wait: without a provider no instance ever goes.)
    s.ok(
        &["scale", "pool", "web", "--replicas", "0", "--timeout", "2m"],
        None,
    );
    let (ok, _, err) = s.knit(&[
        "scale",
        "pool",
        "web",
        "--replicas",
        "0",
        "--timeout",
        "ten",
    ]);
    assert!(!ok && err.contains("90s, 10m"), "{err}");

    // completion and kubeconfig.
    assert!(s.ok(&["completion", "bash"], None).contains("_knit()"));
    assert!(s
        .ok(&["completion", "fish"], None)
        .contains("complete -c knit"));
    let state = s.dir.path().join("state");
    let (ok, _, err) = s.knit(&["kubeconfig"]);
    assert!(!ok && err.contains("no admin kubeconfig"), "{err}");
    let ha = state.join("ha/server-1/cluster");
    std::fs::create_dir_all(&ha).unwrap();
    std::fs::write(
        ha.join("admin.kubeconfig"),
        "apiVersion: v1\nkind: Config\n",
    )
    .unwrap();
    assert_eq!(
        s.ok(&["kubeconfig"], None).trim(),
        ha.join("admin.kubeconfig").display().to_string()
    );
    assert_eq!(
        s.ok(&["kubeconfig", "--raw"], None),
        "apiVersion: v1\nkind: Config\n"
    );
}

/// The server's log written to a file has no terminal colour codes, and
/// with `--log-format json` every line of it is one JSON object.
#[test]
fn the_server_log_is_plain_in_a_file_and_json_on_request() {
    let text = Server::start();
    let log = text.log();
    assert!(log.contains("knit server on"), "{log}");
    assert!(!log.contains('\x1b'), "colour codes in a file:\n{log}");
    drop(text);

    let json = Server::start_with(&["--log-format", "json"]);
    let log = json.log();
    assert!(log.lines().count() >= 2, "{log}");
    for line in log.lines() {
        let record: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(
            record["level"].is_string() && record["fields"]["message"].is_string(),
            "{line}"
        );
    }
    assert!(log.contains("knit server on"), "{log}");
}
