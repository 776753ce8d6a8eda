//! Shared by the components and join tests: a node tree under a temp dir
//! whose services and mounts are cleaned up on drop (also on panic), a real
//! HTTP/HTTPS server on a loopback ephemeral port, package tarballs built
//! on the fly, and a test PKI.
#![allow(dead_code)] // each test file uses a part of it

pub mod sandbox;

use knit_agent::engine::{self, InitOptions};
use knit_agent::host::Host;
use knit_agent::journal::Journal;
use knit_agent::services;
use knit_agent::AgentError;
use knit_api::{NodeConfig, PhaseName};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub const VERSION: &str = "1.31.4";
pub const NODE: &str = "cn-test.i-0001";

/// The supervisor runs as `knit-agent supervise`; the test binary is not it.
pub fn use_agent_binary() {
    if std::env::var_os(services::AGENT_EXE_ENV).is_none() {
        std::env::set_var(services::AGENT_EXE_ENV, env!("CARGO_BIN_EXE_knit-agent"));
    }
}

pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// A node tree. Drop stops every service started in it and detaches every
/// mount below it, then removes it.
pub struct Node {
    pub dir: tempfile::TempDir,
    pub host: Host,
}

impl Node {
    pub fn new() -> Node {
        use_agent_binary();
        let dir = tempfile::Builder::new()
            .prefix("knit-c-")
            .tempdir()
            .expect("tempdir");
        let host = Host::new(dir.path());
        Node { dir, host }
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    pub fn path(&self, abs: &str) -> PathBuf {
        self.host.path(abs)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.path("/var/log/knit-deploy.log")).unwrap_or_default()
    }

    pub fn journal(&self) -> Journal {
        Journal::load(&self.host).expect("journal")
    }

    /// `init` up to `join`: the phases after it are not under test here.
    pub fn init(&self, config: &NodeConfig) -> Result<Journal, AgentError> {
        self.init_forcing(config, None)
    }

    pub fn init_forcing(
        &self,
        config: &NodeConfig,
        force_phase: Option<PhaseName>,
    ) -> Result<Journal, AgentError> {
        let options = InitOptions {
            force_phase,
            stop_after: Some(PhaseName::Join),
        };
        engine::init(&self.host, config, &options)
    }

    /// Links the host's containerd into the tree, where the agent looks for it.
    pub fn link_host_containerd(&self) {
        let bin = self.path("/usr/bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::os::unix::fs::symlink("/usr/bin/containerd", bin.join("containerd")).unwrap();
    }

    pub fn supervisor_pid(&self, name: &str) -> Option<i32> {
        self.host
            .read(&services::pid_file(name))
            .and_then(|t| t.trim().parse().ok())
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Ok(entries) = std::fs::read_dir(self.path(services::RUN_DIR)) {
            for entry in entries.flatten() {
                let file = entry.file_name().to_string_lossy().into_owned();
                if let Some(name) = file.strip_suffix(".pid") {
                    if !name.ends_with(".main") {
                        let _ = services::stop(&self.host, name);
                    }
                }
            }
        }
        let root = self.root().to_string_lossy().into_owned();
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut points: Vec<String> = mountinfo
            .lines()
            .filter_map(|l| l.split_whitespace().nth(4).map(String::from))
            .filter(|p| p.starts_with(&format!("{root}/")))
            .collect();
        points.reverse();
        for point in points {
            let _ = nix::mount::umount2(point.as_str(), nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

/// A minimal config for a node under a tree: identity fixed, no host-wide phases.
pub fn base_config() -> NodeConfig {
    let mut config = NodeConfig::default();
    config.node.region = Some("cn-test".into());
    config.node.instance_id = Some("i-0001".into());
    config.node.ip = Some("10.0.0.7".into());
    config.time_sync.enabled = false;
    config.base_packages.enabled = false;
    config
}

/// A package tarball `kubernetes-<version>-linux-amd64.tar.gz` in `dir`,
/// with `pkg/kubernetes/<rel>` for each file and a `knit-package.json`
/// listing their digests. Returns (tarball path, its sha256).
pub fn build_package(dir: &Path, version: &str, files: &[(&str, &[u8])]) -> (PathBuf, String) {
    let mut hashes = BTreeMap::new();
    for (rel, data) in files {
        hashes.insert(rel.to_string(), sha256_hex(data));
    }
    let manifest = serde_json::json!({
        "version": version,
        "containerdVersion": "1.6.20",
        "files": hashes,
    });
    let path = dir.join(format!("kubernetes-{version}-linux-amd64.tar.gz"));
    let file = std::fs::File::create(&path).unwrap();
    let mut tar = tar::Builder::new(flate2::write::GzEncoder::new(
        file,
        flate2::Compression::fast(),
    ));
    let mut add = |rel: &str, data: &[u8], mode: u32| {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(mode);
        header.set_cksum();
        tar.append_data(&mut header, format!("pkg/kubernetes/{rel}"), data)
            .unwrap();
    };
    for (rel, data) in files {
        add(rel, data, 0o755);
    }
    add("images.txt", b"registry.k8s.io/pause:3.10\n", 0o644);
    add(
        "knit-package.json",
        serde_json::to_string_pretty(&manifest).unwrap().as_bytes(),
        0o644,
    );
    tar.into_inner().unwrap().finish().unwrap();
    let sha = sha256_hex(&std::fs::read(&path).unwrap());
    (path, sha)
}

/// A kubelet stand-in for the tests: it logs its arguments and, once the
/// test drops a client certificate into its `--cert-dir` (what TLS bootstrap
/// would produce), writes `--kubeconfig` pointing at it, as the kubelet does.
pub const KUBELET_SCRIPT: &[u8] = br#"#!/bin/sh
for a in "$@"; do
  case "$a" in
    --kubeconfig=*) kc="${a#--kubeconfig=}" ;;
    --cert-dir=*) certs="${a#--cert-dir=}" ;;
  esac
done
echo "kubelet stand-in started: $*"
while true; do
  if [ -f "$certs/kubelet-client-current.pem" ] && [ ! -f "$kc" ]; then
    printf 'apiVersion: v1\nkind: Config\nusers:\n- name: default-auth\n  user:\n    client-certificate: %s\n    client-key: %s\n' \
      "$certs/kubelet-client-current.pem" "$certs/kubelet-client-current.pem" > "$kc"
  fi
  sleep 0.2
done
"#;

// ---------------------------------------------------------------- HTTP(S)

pub struct Request {
    pub method: String,
    pub path: String,
    /// Common name of the verified client certificate, if one was presented.
    pub client_cn: Option<String>,
}

pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Response {
    pub fn ok(body: impl Into<Vec<u8>>) -> Response {
        Response {
            status: 200,
            body: body.into(),
        }
    }

    pub fn status(status: u16) -> Response {
        Response {
            status,
            body: Vec::new(),
        }
    }
}

type Handler = Arc<dyn Fn(&Request) -> Response + Send + Sync>;

/// A real HTTP/1.1 server on 127.0.0.1 (TLS when given a config), one
/// thread per connection. Every request path is recorded.
pub struct Server {
    pub addr: SocketAddr,
    pub requests: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    pub fn start(
        listener: TcpListener,
        tls: Option<Arc<rustls::ServerConfig>>,
        handler: impl Fn(&Request) -> Response + Send + Sync + 'static,
    ) -> Server {
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let handler: Handler = Arc::new(handler);
        let thread = {
            let (requests, stop) = (requests.clone(), stop.clone());
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    let (handler, requests, tls) = (handler.clone(), requests.clone(), tls.clone());
                    std::thread::spawn(move || {
                        let _ = serve(stream, tls, &handler, &requests);
                    });
                }
            })
        };
        Server {
            addr,
            requests,
            stop,
            thread: Some(thread),
        }
    }

    pub fn http(handler: impl Fn(&Request) -> Response + Send + Sync + 'static) -> Server {
        Server::start(TcpListener::bind("127.0.0.1:0").unwrap(), None, handler)
    }

    pub fn url(&self, scheme: &str) -> String {
        format!("{scheme}://{}", self.addr)
    }

    pub fn count(&self, path: &str) -> usize {
        self.requests
            .lock()
            .unwrap()
            .iter()
            .filter(|p| p.as_str() == path)
            .count()
    }

    pub fn total(&self) -> usize {
        self.requests.lock().unwrap().len()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn read_head(stream: &mut impl Read) -> std::io::Result<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte)? == 0 {
            break;
        }
        head.push(byte[0]);
    }
    Ok(String::from_utf8_lossy(&head).into_owned())
}

fn respond(stream: &mut impl Write, response: Response) -> std::io::Result<()> {
    write!(
        stream,
        "HTTP/1.1 {} X\r\nContent-Length: {}\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n",
        response.status,
        response.body.len()
    )?;
    stream.write_all(&response.body)?;
    stream.flush()
}

fn serve(
    stream: TcpStream,
    tls: Option<Arc<rustls::ServerConfig>>,
    handler: &Handler,
    requests: &Mutex<Vec<String>>,
) -> std::io::Result<()> {
    let handle = |head: String, client_cn: Option<String>| {
        let mut first = head.lines().next().unwrap_or("").split_whitespace();
        let request = Request {
            method: first.next().unwrap_or("").to_string(),
            path: first.next().unwrap_or("").to_string(),
            client_cn,
        };
        requests.lock().unwrap().push(request.path.clone());
        handler(&request)
    };
    match tls {
        None => {
            let mut stream = stream;
            let head = read_head(&mut stream)?;
            respond(&mut stream, handle(head, None))
        }
        Some(config) => {
            let conn = rustls::ServerConnection::new(config).map_err(std::io::Error::other)?;
            let mut tls = rustls::StreamOwned::new(conn, stream);
            let head = read_head(&mut tls)?;
            let cn = tls
                .conn
                .peer_certificates()
                .and_then(|certs| certs.first())
                .and_then(|der| {
                    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
                    let cn = cert.subject().iter_common_name().next()?;
                    cn.as_str().ok().map(String::from)
                });
            let response = handle(head, cn);
            respond(&mut tls, response)?;
            tls.conn.send_close_notify();
            let _ = tls.flush();
            Ok(())
        }
    }
}

// ---------------------------------------------------------------- PKI

pub struct Pki {
    pub ca_pem: String,
    pub ca_der: Vec<u8>,
    ca_cert: rcgen::Certificate,
    ca_key: rcgen::KeyPair,
}

impl Pki {
    pub fn new(name: &str) -> Pki {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = params.self_signed(&ca_key).unwrap();
        Pki {
            ca_pem: ca_cert.pem(),
            ca_der: ca_cert.der().to_vec(),
            ca_cert,
            ca_key,
        }
    }

    /// (cert PEM, key PEM) for a leaf signed by this CA.
    fn leaf(&self, cn: &str, server: bool) -> (rcgen::Certificate, rcgen::KeyPair) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        if server {
            params.subject_alt_names =
                vec![rcgen::SanType::IpAddress("127.0.0.1".parse().unwrap())];
            params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        } else {
            params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        }
        let cert = params.signed_by(&key, &self.ca_cert, &self.ca_key).unwrap();
        (cert, key)
    }

    /// The kubelet's `kubelet-client-current.pem`: certificate then key.
    pub fn client_pem(&self, cn: &str) -> String {
        let (cert, key) = self.leaf(cn, false);
        format!("{}{}", cert.pem(), key.serialize_pem())
    }

    /// A TLS server config for 127.0.0.1 that asks for (but does not
    /// require) a client certificate of this CA.
    pub fn server_config(&self) -> Arc<rustls::ServerConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let (cert, key) = self.leaf("kube-apiserver", true);
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca_cert.der().clone()).unwrap();
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .allow_unauthenticated()
        .build()
        .unwrap();
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
        Arc::new(
            rustls::ServerConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_client_cert_verifier(verifier)
                .with_single_cert(vec![cert.der().clone()], key)
                .unwrap(),
        )
    }
}

/// `sha256:<hex>` of the CA's public key, computed by openssl as kubeadm's
/// documentation does: an oracle independent of the agent's code.
pub fn openssl_pin(ca_pem: &str, dir: &Path) -> String {
    let pem = dir.join("pin-ca.pem");
    std::fs::write(&pem, ca_pem).unwrap();
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "openssl x509 -pubkey -noout -in {} | openssl pkey -pubin -outform der | sha256sum",
            pem.display()
        ))
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "openssl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let hex = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    format!("sha256:{hex}")
}

/// Waits for `check` (generous deadline; failing it fails the test).
pub fn wait_for(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Running: not ended, not a zombie.
pub fn pid_alive(pid: i32) -> bool {
    knit_os::proc::stat(pid).is_some_and(|s| s.running())
}
