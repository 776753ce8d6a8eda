//! A headless Chromium driven over WebDriver (chromedriver on a free
//! loopback port), and a plain HTTPS agent for the console's security
//! checks. Chromium and chromedriver are Debian's (`scripts/setup.sh`
//! installs them); a machine without them fails the test, never skips it.
//!
//! Cleanup on drop (so also on panic): the Chromium processes whose command
//! line names this browser's own profile directory, then chromedriver, each
//! by PID.

use fantoccini::{Client, ClientBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const CHROMIUM: &str = "chromium";
pub const CHROMEDRIVER: &str = "chromedriver";

/// Panics with what to install when Chromium or chromedriver is missing.
pub fn require_chromium() {
    for bin in [CHROMIUM, CHROMEDRIVER] {
        assert!(
            super::on_path(bin),
            "`{bin}` is not installed: the console's browser test needs Debian's chromium and \
             chromium-driver (apt-get install -y chromium chromium-driver; scripts/setup.sh does it)"
        );
    }
}

/// chromedriver and the Chromium it starts, ended by PID on drop.
pub struct Driver {
    child: Child,
    pub port: u16,
    profile: tempfile::TempDir,
}

impl Driver {
    /// Starts chromedriver on a free loopback port and waits until it
    /// takes connections. Its log goes to `log`.
    pub fn start(log: &Path) -> Driver {
        require_chromium();
        let port = super::free_port();
        let out = std::fs::File::create(log).unwrap();
        let child = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("start {CHROMEDRIVER}: {e}"));
        let driver = Driver {
            child,
            port,
            profile: tempfile::Builder::new()
                .prefix("knit-console-chromium-")
                .tempdir()
                .unwrap(),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "chromedriver did not listen on {port}: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        driver
    }

    /// A WebDriver session on a fresh headless Chromium. The server's
    /// self-signed certificate is accepted here, in the test only.
    pub async fn session(&self) -> Client {
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            "--ignore-certificate-errors",
            "--window-size=1280,1000",
        ]
        .iter()
        .map(|a| a.to_string())
        .chain([format!("--user-data-dir={}", self.profile.path().display())])
        .collect::<Vec<_>>();
        let caps = serde_json::json!({
            "browserName": "chrome",
            "acceptInsecureCerts": true,
            "goog:chromeOptions": {"args": args},
        });
        let serde_json::Value::Object(caps) = caps else {
            unreachable!()
        };
        ClientBuilder::new(HttpConnector::new())
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{}", self.port))
            .await
            .unwrap_or_else(|e| panic!("WebDriver session: {e}"))
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // Chromium first (chromedriver's children would outlive a killed
        // chromedriver), found by the profile directory only this run uses.
        let profile = self.profile.path().to_string_lossy().into_owned();
        for pid in pids_with(&profile) {
            // SAFETY: kill(2) on a process whose command line names our
            // own temporary profile directory.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Processes whose command line contains `needle`.
fn pids_with(needle: &str) -> Vec<u32> {
    let me = std::process::id();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|raw| String::from_utf8_lossy(&raw).contains(needle))
                .unwrap_or(false)
        })
        .collect()
}

/// An HTTPS agent trusting only `ca_pem`, following no redirect: what a
/// script (or another site's form) sends, without a browser's help.
pub fn https_agent(ca_pem: &str) -> ureq::Agent {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    ureq::AgentBuilder::new()
        .tls_config(Arc::new(config))
        .redirects(0)
        .timeout(Duration::from_secs(30))
        .build()
}

/// Status, `Location` and `Set-Cookie` of an answer, and its body; every
/// HTTP status is an answer here.
pub struct Answer {
    pub status: u16,
    pub location: Option<String>,
    pub set_cookie: Option<String>,
    pub body: String,
}

pub fn answer(outcome: Result<ureq::Response, ureq::Error>) -> Answer {
    let response = match outcome {
        Ok(r) | Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("request failed: {e}"),
    };
    Answer {
        status: response.status(),
        location: response.header("location").map(str::to_string),
        set_cookie: response.header("set-cookie").map(str::to_string),
        body: response.into_string().unwrap_or_default(),
    }
}

/// Where the test's screenshots go: `target/console-artifacts/`.
pub fn artifacts_dir() -> PathBuf {
    let target = super::knit()
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("target"));
    let dir = target.join("console-artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
