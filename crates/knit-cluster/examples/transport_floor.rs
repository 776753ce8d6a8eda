//! Benchmark: what the kubelets' heartbeat cadence costs a server that does
//! nothing but answer it — the transport's floor under the embedded API.
//!
//! The server is built as the embedded API's is: a tokio runtime with one
//! async worker, rustls with ring and an ECDSA P-256 certificate, client
//! certificates verified against a CA, hyper-util's auto builder with
//! knit's [`knit_cluster::conn::HttpLimits`], an axum router, mimalloc.
//! Its two routes answer with fixed JSON bodies of a Lease's and a Node's
//! size: no authentication beyond the handshake, no store, no controllers.
//! The clients, N of them in a child process (this program with `client`),
//! are what the kubelet stand-in is: one ureq agent each over one kept-alive
//! TLS connection with its own client certificate, a Lease renewed (PUT)
//! and a Node read (GET) every 10 s, the N spread over the first 10 s.
//!
//! This process's CPU over the window (after a settle) is the floor: what
//! the same requests cost the embedded API (`heartbeat_bench`) above it is
//! knit's own work. With `KNIT_FLOOR_CLIENT_NETNS=NAME`, the clients run in
//! that network namespace (`ip netns exec`) and reach the server at
//! `KNIT_FLOOR_ADDR` (default 127.0.0.1), as machines reach it through
//! their veths and the local cloud's bridge.
//!
//! Run: `bash bench/transport-floor.sh [N] [WINDOW_SECS]`.

use std::io::Read;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::routing::{get, put};
use hyper_util::rt::TokioIo;
use knit_cluster::conn::HttpLimits;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use tower::ServiceExt;

mod common;
use common::{cpu_seconds, raise_fd_limit};

// The allocator the `knit` binary serves the API with.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A kubelet renews its Lease and checks its Node this often.
const PERIOD: Duration = Duration::from_secs(10);

type Error = Box<dyn std::error::Error + Send + Sync>;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> Result<T, Error> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .map_err(|_| format!("{name}={v}: not a valid value").into()),
        Err(_) => Ok(default),
    }
}

/// A JSON object of `size` bytes (a padding field filled up to it).
fn body_of(size: usize) -> String {
    let head = r#"{"kind":"Fixed","pad":""#;
    let fill = size.saturating_sub(head.len() + 2);
    format!("{head}{}\"}}", "x".repeat(fill))
}

struct Pki {
    ca_pem: String,
    server: (String, String),
    client: (String, String),
}

fn pki(addr: std::net::IpAddr) -> Result<Pki, Error> {
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name
        .push(DnType::CommonName, "transport-floor-ca");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key)?;
    let leaf = |names: Vec<String>, cn: &str| -> Result<(String, String), Error> {
        let key = KeyPair::generate()?;
        let mut p = CertificateParams::new(names)?;
        p.distinguished_name.push(DnType::CommonName, cn);
        let cert = p.signed_by(&key, &ca_cert, &ca_key)?;
        Ok((cert.pem(), key.serialize_pem()))
    };
    Ok(Pki {
        ca_pem: ca_cert.pem(),
        server: leaf(vec![addr.to_string()], "server")?,
        // One client certificate for all: the handshake's verification is
        // once per connection, outside the window.
        client: leaf(Vec::new(), "system:node:floor")?,
    })
}

fn main() -> Result<(), Error> {
    raise_fd_limit();
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("client") {
        return client(&args[2..]);
    }
    let n: usize = args.get(1).map(|v| v.parse()).transpose()?.unwrap_or(1000);
    let window: u64 = args.get(2).map(|v| v.parse()).transpose()?.unwrap_or(60);
    // One async worker, as the embedded API's runtime has.
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?
        .block_on(server(n, window))
}

async fn server(n: usize, window: u64) -> Result<(), Error> {
    let settle: u64 = env_or("KNIT_FLOOR_SETTLE", 20)?;
    let lease_size: usize = env_or("KNIT_FLOOR_LEASE_BYTES", 420)?;
    let node_size: usize = env_or("KNIT_FLOOR_NODE_BYTES", 2600)?;
    let ip: std::net::IpAddr = env_or("KNIT_FLOOR_ADDR", [127, 0, 0, 1].into())?;
    let pki = pki(ip)?;
    let dir = tempfile::tempdir()?;
    for (name, text) in [
        ("ca.pem", &pki.ca_pem),
        ("client.pem", &pki.client.0),
        ("client-key.pem", &pki.client.1),
    ] {
        std::fs::write(dir.path().join(name), text)?;
    }
    let tls = server_tls(&pki)?;
    let lease = body_of(lease_size);
    let node = body_of(node_size);
    let app = axum::Router::new()
        .route(
            "/lease/:n",
            put(move |body: axum::body::Bytes| {
                let lease = lease.clone();
                async move {
                    std::hint::black_box(body);
                    ([("content-type", "application/json")], lease)
                }
            }),
        )
        .route(
            "/node/:n",
            get(move || {
                let node = node.clone();
                async move { ([("content-type", "application/json")], node) }
            }),
        );
    let listener = tokio::net::TcpListener::bind(SocketAddr::new(ip, 0)).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(accept(listener, tokio_rustls::TlsAcceptor::from(tls), app));

    let exe = std::env::current_exe()?;
    let mut cmd = match std::env::var("KNIT_FLOOR_CLIENT_NETNS") {
        Ok(ns) => {
            let mut c = std::process::Command::new("ip");
            c.args(["netns", "exec", &ns]).arg(&exe);
            c
        }
        Err(_) => std::process::Command::new(&exe),
    };
    let mut child = cmd
        .arg("client")
        .arg(addr.to_string())
        .arg(n.to_string())
        .arg(dir.path())
        .arg(lease_size.to_string())
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let mut out = child.stdout.take().ok_or("the clients' stdout")?;
    // The child prints one line when all its connections are up.
    let ready = tokio::task::spawn_blocking(move || {
        let mut b = [0u8; 1];
        let _ = out.read(&mut b);
        out
    })
    .await?;
    let up = Instant::now();
    tokio::time::sleep(Duration::from_secs(settle)).await;
    let (c0, t0) = (cpu_seconds(), Instant::now());
    tokio::time::sleep(Duration::from_secs(window)).await;
    let (c1, t1) = (cpu_seconds(), Instant::now());
    let _ = child.kill();
    let _ = child.wait();
    drop(ready);
    let cpu = (c1 - c0) / (t1 - t0).as_secs_f64() * 100.0;
    println!("| clients | window | requests/s | server CPU (% of one core) | µs per request |");
    println!("|---|---|---|---|---|");
    let rps = 2.0 * n as f64 / PERIOD.as_secs_f64();
    println!(
        "| {n} | {window} s (after {:.0} s) | {rps:.0} | {cpu:.2} % | {:.0} |",
        (t0 - up).as_secs_f64(),
        cpu / 100.0 / rps * 1e6
    );
    Ok(())
}

fn server_tls(pki: &Pki) -> Result<Arc<rustls::ServerConfig>, Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in knit_os::pem::certificates(pki.ca_pem.as_bytes(), "the CA")? {
        roots.add(c)?;
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .allow_unauthenticated()
    .build()?;
    let certs = knit_os::pem::certificates(pki.server.0.as_bytes(), "the server certificate")?;
    let key = knit_os::pem::private_key(pki.server.1.as_bytes(), "the server key")?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// The embedded API's accept loop without its admission gate and shutdown.
async fn accept(
    listener: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    app: axum::Router,
) {
    let http = HttpLimits::default();
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let acceptor = acceptor.clone();
        let app = app.clone();
        tokio::spawn(async move {
            let Ok(Ok(tls)) =
                tokio::time::timeout(http.handshake_timeout, acceptor.accept(tcp)).await
            else {
                return;
            };
            let alpn = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
            let svc =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    app.clone().oneshot(req.map(axum::body::Body::new))
                });
            let builder = http.builder(alpn.as_deref().or(Some(b"http/1.1")));
            let _ = builder
                .serve_connection_with_upgrades(TokioIo::new(tls), svc)
                .await;
        });
    }
}

/// The child: N clients, each a thread with its own agent (one kept-alive
/// connection), renewing and reading every PERIOD from its offset.
fn client(args: &[String]) -> Result<(), Error> {
    let [target, n, dir, lease_size] = args else {
        return Err("client TARGET N DIR LEASE_BYTES".into());
    };
    let n: usize = n.parse()?;
    let lease_size: usize = lease_size.parse()?;
    let dir = std::path::Path::new(dir);
    let read = |f: &str| std::fs::read_to_string(dir.join(f));
    let roots = knit_os::pem::roots(read("ca.pem")?.as_bytes(), "the CA")?;
    let certs = knit_os::pem::certificates(read("client.pem")?.as_bytes(), "the client")?;
    let key = knit_os::pem::private_key(read("client-key.pem")?.as_bytes(), "the client key")?;
    let tls = Arc::new(
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_client_auth_cert(certs, key)?,
    );
    let body = body_of(lease_size);
    let start = Instant::now();
    let (up_tx, up_rx) = std::sync::mpsc::channel();
    for i in 0..n {
        let agent = ureq::AgentBuilder::new()
            .tls_config(tls.clone())
            .timeout_connect(Duration::from_secs(10))
            .timeout(Duration::from_secs(30))
            .build();
        let base = format!("https://{target}");
        let body = body.clone();
        let up = up_tx.clone();
        std::thread::Builder::new()
            .stack_size(128 * 1024)
            .spawn(move || {
                let offset = PERIOD.mul_f64(i as f64 / n as f64);
                let mut next = start + offset;
                let mut first = true;
                loop {
                    std::thread::sleep(next.saturating_duration_since(Instant::now()));
                    let round = heartbeat(&agent, &base, i, &body);
                    if let Err(e) = round {
                        eprintln!("client {i}: {e}");
                    }
                    if first {
                        let _ = up.send(());
                        first = false;
                    }
                    next += PERIOD;
                }
            })?;
    }
    for _ in 0..n {
        up_rx.recv()?;
    }
    println!("up");
    // The threads run until the server ends this process.
    loop {
        std::thread::park();
    }
}

/// One client's renewal and read, each response read whole.
fn heartbeat(agent: &ureq::Agent, base: &str, i: usize, lease: &str) -> Result<(), String> {
    let fail = |e: &dyn std::fmt::Display| e.to_string();
    agent
        .put(&format!("{base}/lease/{i}"))
        .set("content-type", "application/json")
        .send_string(lease)
        .map_err(|e| fail(&e))?
        .into_string()
        .map_err(|e| fail(&e))?;
    agent
        .get(&format!("{base}/node/{i}"))
        .call()
        .map_err(|e| fail(&e))?
        .into_string()
        .map_err(|e| fail(&e))?;
    Ok(())
}
