//! A headless Chromium driven over WebDriver (chromedriver on a free
//! loopback port), and a plain HTTPS agent for the console's security
//! checks. Chromium and chromedriver are Debian's (`scripts/setup.sh`
//! installs them); a machine without them fails the test, never skips it.
//!
//! chromedriver runs in a process group of its own, which the Chromium it
//! starts inherits. Cleanup on drop (so also on panic) kills that group,
//! whose id is chromedriver's PID. When the test process dies without
//! dropping it (SIGTERM from the test runner ends the process after the
//! environment's release; SIGKILL), a small guardian started beside
//! chromedriver sees the pipe from the test process close and kills the
//! group: a killed chromedriver alone would leave Chromium running.

use fantoccini::{Client, ClientBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
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

/// chromedriver and the Chromium it starts (one process group), ended on
/// drop, or by the guardian when the test process dies.
pub struct Driver {
    child: Child,
    guardian: Guardian,
    pub port: u16,
    profile: tempfile::TempDir,
}

/// `bash` waiting on a pipe only the test process holds (its end is
/// close-on-exec): at end of file, the test process is gone, and it kills
/// chromedriver's process group, then removes the profile directory once
/// no process names it (Chromium's crash reporter, outside the group, ends
/// by itself; at most 5 s). In a group of its own and deaf to the
/// usual termination signals, so a signal to the test's group (the test
/// runner's) does not end it before it has done that.
struct Guardian {
    child: Child,
    /// Held, never written: dropped with the test process.
    _pipe: ChildStdin,
}

impl Guardian {
    fn start(group: u32, profile: &Path) -> Guardian {
        // `read` returns at end of file; the group id is chromedriver's PID,
        // and the group lives on while Chromium does (bash: dash's kill
        // takes no negative process-group id). Command lines are read with
        // builtins, the guardian's own left out.
        const SCRIPT: &str = r#"trap '' HUP INT TERM
read -r _
kill -KILL -- "-$0" 2>/dev/null
for _ in {1..50}; do
  busy=
  for c in /proc/[0-9]*/cmdline; do
    [[ $c == "/proc/$$/cmdline" ]] && continue
    mapfile -d '' a < "$c" 2>/dev/null || continue
    [[ "${a[*]}" == *"$1"* ]] && { busy=1; break; }
  done
  [[ -z $busy ]] && break
  sleep 0.1
done
rm -rf -- "$1"
exit 0"#;
        let mut child = Command::new("bash")
            .args(["-c", SCRIPT])
            .arg(group.to_string())
            .arg(profile)
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start the browser's guardian (bash): {e}"));
        let pipe = child.stdin.take().expect("the guardian's stdin");
        Guardian { child, _pipe: pipe }
    }
}

impl Driver {
    /// Starts chromedriver on a free loopback port and waits until it
    /// takes connections. Its log goes to `log`.
    pub fn start(log: &Path) -> Driver {
        require_chromium();
        let port = super::free_port();
        let out = std::fs::File::create(log).unwrap();
        let profile = tempfile::Builder::new()
            .prefix("knit-console-chromium-")
            .tempdir()
            .unwrap();
        // A process group of its own (id = its PID), inherited by Chromium:
        // one kill ends both, and nothing else. Chromium's configuration
        // goes to the profile directory (not the user's): its crash
        // reporter, which leaves the group and ends by itself once Chromium
        // is gone, then names that directory too. Its temporary files
        // (singleton socket, scoped dirs) too: killed, it removes none.
        let child = Command::new(CHROMEDRIVER)
            .env("XDG_CONFIG_HOME", profile.path())
            .env("TMPDIR", profile.path())
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("start {CHROMEDRIVER}: {e}"));
        let guardian = Guardian::start(child.id(), profile.path());
        let driver = Driver {
            child,
            guardian,
            port,
            profile,
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

    /// chromedriver's PID, also the id of the process group it and its
    /// Chromium run in.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The profile directory of this driver's Chromium (named on each of
    /// its processes' command lines).
    pub fn profile(&self) -> &Path {
        self.profile.path()
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
        // The guardian first (it would kill the group once more, by then
        // perhaps a reused id), then the group while chromedriver is not
        // yet reaped, so its PID (the group's id) cannot be reused.
        let _ = self.guardian.child.kill();
        let _ = self.guardian.child.wait();
        let group = self.child.id() as libc::pid_t;
        // SAFETY: kill(2) on the process group of the chromedriver this
        // Driver started (its PID, not yet reaped): it and its Chromium.
        unsafe { libc::kill(-group, libc::SIGKILL) };
        let _ = self.child.wait();
        // Chromium's processes in that group, reparented, go on their own
        // once killed; wait (briefly) so the profile directory can go.
        let profile = self.profile.path().to_string_lossy().into_owned();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !pids_with(&profile).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Processes whose command line contains `needle`.
pub fn pids_with(needle: &str) -> Vec<u32> {
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
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
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
