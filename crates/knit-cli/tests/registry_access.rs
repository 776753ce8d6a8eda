//! `knit registry up` off loopback: instances may only pull. On the address
//! instances reach (here that of a bridge of the test's own, like the local
//! cloud's bridge) push and delete answer 405 and pulls work; seeding goes
//! through the loopback writer `up` starts beside it; `down` stops both.
//! Run as root (the bridge).

use std::process::Command;

fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A bridge of ours (no ports) with one unused 10.x.y.1/32; deleted on drop.
struct TestBridge {
    name: String,
    addr: String,
}

impl TestBridge {
    fn new() -> TestBridge {
        let pid = std::process::id();
        let name = format!("kc{pid:x}");
        let routes = run("ip", &["-4", "route", "show", "table", "all"]);
        let addrs = run("ip", &["-4", "-o", "addr", "show"]);
        let addr = (0..250 * 250)
            .map(|i| (pid as usize * 7 + i) % (250 * 250))
            .map(|c| format!("10.{}.{}.1", 1 + c / 250, c % 250))
            .find(|a| {
                let prefix = &a[..a.len() - 1];
                !routes.contains(prefix) && !addrs.contains(prefix)
            })
            .expect("no free 10.x.y.1");
        run("ip", &["link", "add", &name, "type", "bridge"]);
        let d = TestBridge { name, addr };
        run(
            "ip",
            &["addr", "add", &format!("{}/32", d.addr), "dev", &d.name],
        );
        run("ip", &["link", "set", &d.name, "up"]);
        d
    }
}

impl Drop for TestBridge {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.name])
            .status();
    }
}

/// `knit registry down` on drop (also on panic): `up` started processes
/// that are no children of ours.
struct Down(String);

impl Drop for Down {
    fn drop(&mut self) {
        let _ = Command::new(env!("CARGO_BIN_EXE_knit"))
            .args(["registry", "down", "--state-dir", &self.0])
            .status();
    }
}

fn knit(args: &[&str]) -> String {
    run(env!("CARGO_BIN_EXE_knit"), args)
}

/// HTTP status of `curl -X method url`.
fn status(method: &str, url: &str) -> String {
    let mut args = vec![
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "--max-time",
        "10",
        "-X",
        method,
        "-H",
        "Accept: application/vnd.docker.distribution.manifest.v2+json",
    ];
    if matches!(method, "PUT" | "POST") {
        args.extend([
            "-H",
            "Content-Type: application/vnd.docker.distribution.manifest.v2+json",
            "--data-binary",
            "{}",
        ]);
    }
    args.push(url);
    run("curl", &args)
}

/// Runs and is not a zombie (an exited process whose parent, here
/// whoever adopted it, has not reaped it yet).
fn alive(pid: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X'))
    })
}

#[test]
fn registry_up_off_loopback_is_pull_only_and_seeds_through_loopback() {
    let bridge = TestBridge::new();
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("server").to_string_lossy().into_owned();
    let port = std::net::TcpListener::bind((bridge.addr.as_str(), 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let up = knit(&[
        "registry",
        "up",
        "--state-dir",
        &state,
        "--address",
        &bridge.addr,
        "--port",
        &port,
        "--image",
        "knit/app:1=1M",
    ]);
    let _down = Down(state.clone());
    let listen = format!("{}:{port}", bridge.addr);
    assert!(
        up.contains(&format!(" on {listen}; pull only there")),
        "{up}"
    );
    assert!(up.contains("pushed knit/app:1 "), "{up}");
    let st: serde_json::Value = serde_json::from_str(&knit(&[
        "registry",
        "status",
        "--state-dir",
        &state,
        "-o",
        "json",
    ]))
    .unwrap();
    assert_eq!(st["running"], true, "{st}");
    assert_eq!(st["listen"], listen.as_str(), "{st}");
    let push = st["push"].as_str().unwrap().to_string();
    assert!(push.starts_with("http://127.0.0.1:"), "{st}");
    assert_eq!(st["repositories"], serde_json::json!(["knit/app"]), "{st}");
    let pids = [st["pid"].as_u64().unwrap(), st["pushPid"].as_u64().unwrap()];

    let pull = format!("http://{listen}");
    assert_eq!(
        status("GET", &format!("{pull}/v2/knit/app/manifests/1")),
        "200"
    );
    for (method, path) in [
        ("POST", "/v2/knit/evil/blobs/uploads/"),
        ("PUT", "/v2/knit/app/manifests/2"),
        ("DELETE", "/v2/knit/app/manifests/1"),
    ] {
        assert_eq!(
            status(method, &format!("{pull}{path}")),
            "405",
            "{method} {path}"
        );
    }
    // The writer asks for its credential (issue 30): without it a push is
    // 401; the status names the credential's file, never the token.
    for (method, path) in [
        ("POST", "/v2/knit/evil/blobs/uploads/"),
        ("PUT", "/v2/knit/app/manifests/2"),
    ] {
        assert_eq!(
            status(method, &format!("{push}{path}")),
            "401",
            "{method} {path} at the writer without its credential"
        );
    }
    let token_file = st["pushCredential"].as_str().unwrap().to_string();
    let token = std::fs::read_to_string(&token_file).unwrap();
    assert!(!st.to_string().contains(token.trim()), "{st}");
    // A second `up` seeds through the recorded writer, starting nothing.
    let again = knit(&[
        "registry",
        "up",
        "--state-dir",
        &state,
        "--image",
        "knit/more:1=64K",
    ]);
    assert!(again.contains("already running"), "{again}");
    assert!(again.contains("pushed knit/more:1 "), "{again}");
    assert_eq!(
        status("GET", &format!("{pull}/v2/knit/more/manifests/1")),
        "200"
    );

    let down = knit(&["registry", "down", "--state-dir", &state]);
    for pid in pids {
        assert!(
            down.contains(&format!("registry (pid {pid}) stopped")),
            "{down}"
        );
        assert!(!alive(pid), "{pid} still runs");
    }
}
