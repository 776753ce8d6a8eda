//! Instances may only pull: a registry started on an address other than
//! loopback (here that of a bridge of the test's own, like the local
//! cloud's bridge) refuses every push and delete there, serves pulls, and
//! takes pushes on its loopback writer over the same storage. Run as root
//! (the bridge).

use knit_registry::{Access, Registry};
use sha2::{Digest, Sha256};
use std::process::Command;
use std::time::Duration;

fn ip(args: &[&str]) -> String {
    let out = Command::new("ip").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A bridge of ours (no ports) with one 10.x.y.1/32 no host route uses;
/// deleted on drop (also on panic).
struct TestBridge {
    name: String,
    addr: String,
}

impl TestBridge {
    fn new() -> TestBridge {
        let pid = std::process::id();
        let name = format!("kr{pid:x}");
        let routes = ip(&["-4", "route", "show", "table", "all"]);
        let addrs = ip(&["-4", "-o", "addr", "show"]);
        let addr = (0..250 * 250)
            .map(|i| (pid as usize + i) % (250 * 250))
            .map(|c| format!("10.{}.{}.1", 1 + c / 250, c % 250))
            .find(|a| {
                let prefix = &a[..a.len() - 1];
                !routes.contains(prefix) && !addrs.contains(prefix)
            })
            .expect("no free 10.x.y.1");
        ip(&["link", "add", &name, "type", "bridge"]);
        let d = TestBridge { name, addr };
        ip(&["addr", "add", &format!("{}/32", d.addr), "dev", &d.name]);
        ip(&["link", "set", &d.name, "up"]);
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

fn free_port(ip: &str) -> u16 {
    std::net::TcpListener::bind((ip, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The status `method url` gets, and the body.
fn call(method: &str, url: &str, body: Option<&[u8]>) -> (u16, Vec<u8>) {
    let req = ureq::request(method, url)
        .timeout(Duration::from_secs(10))
        .set("Accept", knit_registry::MANIFEST_TYPE)
        .set("Content-Type", knit_registry::MANIFEST_TYPE);
    let r = match body {
        Some(b) => req.send_bytes(b),
        None => req.call(),
    };
    let resp = match r {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{method} {url}: {e}"),
    };
    let status = resp.status();
    let mut buf = Vec::new();
    std::io::Read::read_to_end(&mut resp.into_reader(), &mut buf).unwrap();
    (status, buf)
}

#[test]
fn the_rule_is_writes_on_loopback_only() {
    assert_eq!(
        knit_registry::access_for("127.0.0.1:5000"),
        Access::ReadWrite
    );
    assert_eq!(knit_registry::access_for("[::1]:5000"), Access::ReadWrite);
    assert_eq!(
        knit_registry::access_for("10.213.0.1:5000"),
        Access::PullOnly
    );
    assert_eq!(knit_registry::access_for("0.0.0.0:5000"), Access::PullOnly);
    let dir = tempfile::tempdir().unwrap();
    let e = knit_registry::prepare(dir.path(), "10.213.0.1:5000", Access::ReadWrite)
        .expect_err("a writer off loopback must be refused");
    assert!(e.to_string().contains("10.213.0.1:5000"), "{e}");
    assert!(e.to_string().contains("loopback"), "{e}");
}

#[test]
fn off_loopback_it_serves_pulls_and_refuses_push_and_delete() {
    let bridge = TestBridge::new();
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("{}:{}", bridge.addr, free_port(&bridge.addr));
    let reg = Registry::start(&dir.path().join("registry"), &addr).unwrap();
    assert_eq!(reg.addr(), addr);
    assert_eq!(reg.pids().len(), 2, "a pull listener and a loopback writer");
    let push = reg.push_url();
    assert!(
        push.contains("@127.0.0.1:"),
        "the writer, with its credential: {push}"
    );

    // Seeding from the host goes through the writer.
    let image =
        knit_registry::seed(&push, &dir.path().join("work"), "knit/app:1", 2, 64 << 10).unwrap();
    let pull = reg.url();

    // Pulls work where instances reach it: manifest and every blob, by digest.
    let (status, manifest) = call("GET", &format!("{pull}/v2/knit/app/manifests/1"), None);
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&manifest));
    assert_eq!(manifest, image.manifest);
    for blob in image.layers.iter().chain(std::iter::once(&image.config)) {
        let (status, bytes) = call(
            "GET",
            &format!("{pull}/v2/knit/app/blobs/{}", blob.digest),
            None,
        );
        assert_eq!(status, 200);
        assert_eq!(
            format!("sha256:{}", hex::encode(Sha256::digest(&bytes))),
            blob.digest
        );
    }
    assert_eq!(
        knit_registry::manifest_digest(&pull, "knit/app:1").unwrap(),
        image.manifest_digest
    );
    assert!(reg.blob_gets() >= 3, "{}", reg.log_text());

    // Every write there is refused, and changes nothing.
    let blob = &image.layers[0].digest;
    let m = &image.manifest_digest;
    for (method, path, body) in [
        ("POST", "/v2/knit/evil/blobs/uploads/".to_string(), None),
        (
            "PUT",
            "/v2/knit/app/manifests/2".to_string(),
            Some(&image.manifest[..]),
        ),
        (
            "PUT",
            "/v2/knit/app/manifests/1".to_string(),
            Some(&b"{}"[..]),
        ),
        ("DELETE", format!("/v2/knit/app/manifests/{m}"), None),
        ("DELETE", format!("/v2/knit/app/blobs/{blob}"), None),
    ] {
        let (status, text) = call(method, &format!("{pull}{path}"), body);
        assert_eq!(
            status,
            405,
            "{method} {path} from the instances' side: {}",
            String::from_utf8_lossy(&text)
        );
    }
    let e = knit_registry::push(&pull, "knit/evil:1", &image).unwrap_err();
    assert!(e.to_string().contains("405"), "{e}");
    assert_eq!(knit_registry::catalog(&pull).unwrap(), vec!["knit/app"]);
    let (status, after) = call("GET", &format!("{pull}/v2/knit/app/manifests/1"), None);
    assert_eq!((status, after), (200, image.manifest.clone()));

    // The writer takes them (it is loopback, the host's).
    let (status, _) = call("DELETE", &format!("{push}/v2/knit/app/manifests/{m}"), None);
    assert_eq!(status, 202);
    drop(reg);
}
