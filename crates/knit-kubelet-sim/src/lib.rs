//! knit-kubelet-sim: knit's kubelet stand-in for the local cloud, where no
//! kubelet binary exists. It does toward the API server what kubelet does
//! — TLS bootstrap, Node registration, Lease heartbeats, NodeReady from the
//! container runtime's CRI status and the CNI config — and moves the pods
//! bound to its node through their stages as KWOK does: no container runs.
//! It is not kubelet and says so in `--version` and in its node info.

pub mod certs;
pub mod client;
pub mod config;
pub mod cri;
pub mod error;
pub mod files;
pub mod flags;
pub mod images;
pub mod kubeconfig;
pub mod machine;
pub mod node;
pub mod pods;

use std::time::{Duration, Instant};

use client::Client;
use config::KubeletConfig;
use error::SimError;
use flags::Flags;
use kubeconfig::Kubeconfig;
use node::NodeAgent;

/// How long TLS bootstrap waits for the CSR to be approved.
const CSR_WAIT: Duration = Duration::from_secs(15 * 60);
/// How long start-up retries an API server that cannot be reached.
const CONNECT_RETRY: Duration = Duration::from_secs(15 * 60);

/// The Kubernetes version this binary reports, in a slot that `knit
/// package build --kubernetes-version X` overwrites in the copy it packs
/// (`knit_api::agent::KUBELET_VERSION_STAMP`); built, it holds knit's
/// default version.
#[used]
static VERSION_SLOT: [u8; knit_api::agent::KUBELET_VERSION_SLOT] =
    knit_api::agent::kubelet_version_slot(knit_api::DEFAULT_KUBERNETES_VERSION);

/// The Kubernetes version this stand-in was built as (read from the
/// binary's own bytes, so a stamped copy reports its stamp).
pub fn kubernetes_version() -> String {
    // SAFETY: a plain read of an immutable static; volatile so that the
    // bytes come from the binary as stamped, not from the compiler's copy
    // of the initializer.
    let slot = unsafe { std::ptr::read_volatile(&VERSION_SLOT) };
    knit_api::agent::kubelet_version_of_slot(&slot)
        .unwrap_or(knit_api::DEFAULT_KUBERNETES_VERSION)
        .to_string()
}

pub fn version_line() -> String {
    format!(
        "Kubernetes v{} (knit-kubelet-sim {}: knit's kubelet stand-in for the local cloud; not kubelet, runs no containers)",
        kubernetes_version(),
        env!("CARGO_PKG_VERSION")
    )
}

pub const HELP: &str = "\
knit-kubelet-sim: knit's kubelet stand-in (not kubelet). Invoked like kubelet:

  --bootstrap-kubeconfig=FILE   kubeconfig with server, CA and bootstrap token
  --kubeconfig=FILE             written after TLS bootstrap (default /etc/kubernetes/kubelet.conf)
  --config=FILE                 KubeletConfiguration (kubelet.config.k8s.io/v1beta1)
  --hostname-override=NAME      node name
  --node-ip=IP                  InternalIP address
  --provider-id=ID              spec.providerID
  --node-labels=k=v,...         labels to register with
  --register-with-taints=k=v:Effect,...
  --container-runtime-endpoint=unix:///run/containerd/containerd.sock
  --cert-dir=DIR                client certificates (default /var/lib/kubelet/pki)
  --root-dir=DIR                (accepted; default /var/lib/kubelet)
knit only:
  --cni-conf-dir=DIR            CNI configs to require (default /etc/cni/net.d)
  --lightweight                 no CRI/CNI checks: Ready once registered (load tests)
  --image-list=FILE             system images to ensure through CRI after start
                                (default /etc/kubernetes/images.txt; absent: none)
  --ensure-images=REF,...       only ensure these images through CRI, print the
                                report (JSON) and exit: 0 when all are present
Other kubelet flags are accepted and ignored with a warning.
";

/// Whether an error is worth retrying (the server not up yet) rather than
/// final (refused credentials, a CA that does not match).
fn retryable(e: &SimError) -> bool {
    match e {
        SimError::Transport { failure, .. } => *failure == error::TransportFailure::Unreachable,
        SimError::Api { code, .. } => *code >= 500 || *code == 429,
        _ => false,
    }
}

fn with_retry<T>(what: &str, mut f: impl FnMut() -> Result<T, SimError>) -> Result<T, SimError> {
    let start = Instant::now();
    loop {
        match f() {
            Ok(v) => return Ok(v),
            Err(e) if retryable(&e) && start.elapsed() < CONNECT_RETRY => {
                tracing::warn!(code = e.code(), error = %e, "{what} failed; retrying");
                std::thread::sleep(Duration::from_secs(2));
            }
            Err(e) => return Err(e),
        }
    }
}

fn node_name(flags: &Flags) -> Result<String, SimError> {
    let name = match &flags.hostname_override {
        Some(n) => n.clone(),
        None => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map_err(|e| SimError::io("/proc/sys/kernel/hostname", e))?
            .trim()
            .to_string(),
    }
    .to_lowercase();
    if !knit_api::validate::is_dns_subdomain(&name) {
        return Err(SimError::Flags(format!(
            "node name {name:?} is not a DNS subdomain"
        )));
    }
    Ok(name)
}

/// A client for kubelet.conf, bootstrapping it first when it is missing or
/// its certificate is no longer valid.
fn client_credentials(
    flags: &Flags,
    cfg: &KubeletConfig,
    name: &str,
) -> Result<Kubeconfig, SimError> {
    credentials(flags, cfg, name, false)
}

/// Like `client_credentials`; with `refused`, the existing certificate was
/// refused by the server and is not used again.
fn credentials(
    flags: &Flags,
    cfg: &KubeletConfig,
    name: &str,
    refused: bool,
) -> Result<Kubeconfig, SimError> {
    if flags.kubeconfig.exists() && !refused {
        match Kubeconfig::load(&flags.kubeconfig) {
            Ok(kc)
                if certs::load_current(&flags.cert_dir).is_some()
                    && kc.client_cert_pem.is_some() =>
            {
                tracing::info!(kubeconfig = %flags.kubeconfig.display(), "using existing client certificate");
                return Ok(kc);
            }
            Ok(_) => {
                tracing::info!("existing kubeconfig has no valid client certificate; bootstrapping")
            }
            Err(e) => tracing::warn!(error = %e, "existing kubeconfig unreadable; bootstrapping"),
        }
    }
    let boot_path = flags.bootstrap_kubeconfig.as_ref().ok_or_else(|| {
        SimError::Flags(
            "no valid --kubeconfig and no --bootstrap-kubeconfig to bootstrap one".into(),
        )
    })?;
    let boot = Kubeconfig::load(boot_path)?;
    let client = Client::new(&boot, cfg.kube_api_qps, cfg.kube_api_burst)?;
    tracing::info!(
        server = client.server(),
        node = name,
        "TLS bootstrap with the bootstrap token"
    );
    let (cert, key) = with_retry("TLS bootstrap", || certs::request(&client, name, CSR_WAIT))?;
    let current = certs::store(&flags.cert_dir, &cert, &key)?;
    kubeconfig::write_kubelet_conf(&flags.kubeconfig, &boot.server, &boot.ca_pem, &current)?;
    tracing::info!(kubeconfig = %flags.kubeconfig.display(), "wrote kubelet kubeconfig");
    Kubeconfig::load(&flags.kubeconfig)
}

/// Jitter in [0, 1) for the rotation deadline, different per process.
fn jitter() -> f64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    ((nanos ^ std::process::id().wrapping_mul(2_654_435_761)) % 1000) as f64 / 1000.0
}

/// `--ensure-images`: the images through CRI, the report on stdout; an
/// error when any is missing.
pub fn ensure_only(flags: &Flags, list: &[String]) -> Result<(), SimError> {
    let cfg = match &flags.config {
        Some(p) => KubeletConfig::load(p)?,
        None => KubeletConfig::default(),
    };
    let endpoint = flags
        .container_runtime_endpoint
        .clone()
        .unwrap_or(cfg.container_runtime_endpoint);
    let socket = endpoint.strip_prefix("unix://").ok_or_else(|| {
        SimError::Flags(format!(
            "--container-runtime-endpoint={endpoint}: only unix:// sockets are supported"
        ))
    })?;
    let report = images::ensure(std::path::Path::new(socket), list);
    let json = serde_json::to_string(&report).map_err(|e| SimError::Flags(e.to_string()))?;
    println!("{json}");
    if report.failed > 0 {
        let why: Vec<String> = report
            .images
            .iter()
            .filter_map(|i| i.error.as_ref().map(|e| format!("{}: {e}", i.image)))
            .collect();
        return Err(SimError::Flags(format!(
            "{} image(s) not present: {}",
            report.failed,
            why.join("; ")
        )));
    }
    Ok(())
}

/// Run until killed: bootstrap, register, then heartbeat and report.
pub fn run(flags: Flags) -> Result<(), SimError> {
    for f in &flags.ignored {
        tracing::warn!(flag = %f, "flag not used by the kubelet stand-in; ignored");
    }
    let cfg = match &flags.config {
        Some(p) => KubeletConfig::load(p)?,
        None => KubeletConfig::default(),
    };
    tracing::info!(address = %cfg.address, port = cfg.port, qps = cfg.kube_api_qps, burst = cfg.kube_api_burst, "{}", version_line());
    let name = node_name(&flags)?;
    let mut kc = client_credentials(&flags, &cfg, &name)?;
    let (qps, burst) = (cfg.kube_api_qps, cfg.kube_api_burst);
    let mut client = std::sync::Arc::new(Client::new(&kc, qps, burst)?);
    let mut agent = NodeAgent::new(name.clone(), flags.clone(), cfg.clone())?;
    match with_retry("registering the node", || agent.register(&client)) {
        // The server revokes a node's certificates when its Node is
        // deleted: a machine joined again (new bootstrap token) must not
        // keep failing on the old one.
        Err(SimError::Api { code: 401, .. }) if flags.bootstrap_kubeconfig.is_some() => {
            tracing::warn!("the API server refused the existing client certificate (401; revoked when this node was removed?); bootstrapping again");
            kc = credentials(&flags, &cfg, &name, true)?;
            client = std::sync::Arc::new(Client::new(&kc, qps, burst)?);
            with_retry("registering the node", || agent.register(&client))?;
        }
        other => other?,
    }

    // The pods bound to this node, on threads of their own with the
    // client of the moment (replaced below when the certificate rotates).
    // One client (one connection pool, one rate limit) for both.
    let shared: pods::SharedClient = std::sync::Arc::new(std::sync::RwLock::new(client.clone()));
    pods::start(name.clone(), shared.clone())?;

    let mut images = start_image_ensure(&flags, &cfg)?;
    let mut image_report: Option<images::ImageReport> = None;

    let jitter = jitter();
    let mut times = cert_times(&kc, jitter)?;
    let mut next_lease = Instant::now();
    let mut next_status = Instant::now();
    // Bounded: a node that never gets ready falls back to the normal period.
    let mut fast_checks_left: u32 = 10 * 60 * 5;
    loop {
        let now = Instant::now();
        if now >= next_lease {
            if let Err(e) = agent.renew_lease(&client) {
                tracing::warn!(code = e.code(), error = %e, "lease renewal failed");
            }
            next_lease = now + agent.lease_interval();
        }
        // Not yet reported Ready: check often and report at once (kubelet's
        // fast status update at start-up), not a full period later.
        if now < next_status && fast_checks_left > 0 {
            fast_checks_left -= 1;
            if agent.became_ready() {
                next_status = now;
            }
        }
        if now >= next_status {
            if let Err(e) = agent.sync_status(&client) {
                tracing::warn!(code = e.code(), error = %e, "node status update failed");
            }
            next_status = now + agent.status_interval();
        }
        if let Some(rx) = &images {
            if let Ok(report) = rx.try_recv() {
                image_report = Some(report);
            }
        }
        if let Some(report) = &image_report {
            // Published once; retried on the next turn when the API refused.
            match agent.publish_images(&client, report) {
                Ok(()) => image_report = None,
                Err(e) => {
                    tracing::warn!(code = e.code(), error = %e, "publishing the image report failed")
                }
            }
        }
        let now_utc = time::OffsetDateTime::now_utc();
        if let Some((rotate_at, expires)) = times.filter(|(r, _)| now_utc >= *r) {
            let fresh = if now_utc < expires {
                rotate(&flags, &client, &name, &kc)
            } else {
                // Too late to renew with the old certificate: like kubelet,
                // fall back to the bootstrap credentials.
                tracing::warn!(%rotate_at, %expires, "client certificate expired before rotation; bootstrapping again");
                client_credentials(&flags, &cfg, &name)
            };
            match fresh {
                Ok(fresh) => {
                    client = std::sync::Arc::new(Client::new(&fresh, qps, burst)?);
                    *shared.write().unwrap_or_else(|p| p.into_inner()) = client.clone();
                    times = cert_times(&fresh, jitter)?;
                    kc = fresh;
                }
                Err(e) => {
                    tracing::warn!(code = e.code(), error = %e, "client certificate renewal failed; retrying")
                }
            }
        }
        let wake = next_lease.min(next_status);
        let step = if fast_checks_left > 0 && !agent.reported_ready() {
            Duration::from_millis(200)
        } else {
            Duration::from_secs(1)
        };
        let pause = wake.saturating_duration_since(Instant::now()).min(step);
        match &images {
            // The image report ends the pause: published as it arrives,
            // not up to a turn (a second once Ready) later.
            Some(rx) if image_report.is_none() => match rx.recv_timeout(pause) {
                Ok(report) => image_report = Some(report),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                // Its one report was taken (or the thread ended).
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => images = None,
            },
            _ => std::thread::sleep(pause),
        }
    }
}

/// Starts ensuring the system images on a thread of its own, so a long
/// pull never delays heartbeats; the report arrives on the channel.
fn start_image_ensure(
    flags: &Flags,
    cfg: &KubeletConfig,
) -> Result<Option<std::sync::mpsc::Receiver<images::ImageReport>>, SimError> {
    if flags.lightweight {
        return Ok(None);
    }
    let Some(list) = images::read_list(&flags.image_list)? else {
        tracing::info!(list = %flags.image_list.display(), "no image list: no system images to ensure");
        return Ok(None);
    };
    let endpoint = flags
        .container_runtime_endpoint
        .clone()
        .unwrap_or_else(|| cfg.container_runtime_endpoint.clone());
    let socket = std::path::PathBuf::from(
        endpoint
            .strip_prefix("unix://")
            .ok_or_else(|| {
                SimError::Flags(format!(
                    "--container-runtime-endpoint={endpoint}: only unix:// sockets are supported"
                ))
            })?
            .to_string(),
    );
    let root_dir = flags.root_dir.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("images".into())
        .spawn(move || {
            let report = images::ensure(&socket, &list);
            if let Err(e) = images::write_report(&root_dir, &report) {
                tracing::warn!(code = e.code(), error = %e, "cannot write the image report");
            }
            let _ = tx.send(report);
        })
        .map_err(|e| SimError::io("spawn the image thread", e))?;
    Ok(Some(rx))
}

/// When to rotate the client certificate, and when it expires.
fn cert_times(
    kc: &Kubeconfig,
    jitter: f64,
) -> Result<Option<(time::OffsetDateTime, time::OffsetDateTime)>, SimError> {
    Ok(kc
        .client_cert_pem
        .as_deref()
        .map(certs::Credentials::from_bundle)
        .transpose()?
        .map(|c| (c.rotation_deadline(jitter), c.not_after)))
}

/// New key and CSR authenticated with the current certificate; the server
/// approves a node renewing its own identity.
fn rotate(
    flags: &Flags,
    client: &Client,
    name: &str,
    kc: &Kubeconfig,
) -> Result<Kubeconfig, SimError> {
    tracing::info!(
        node = name,
        "rotating the client certificate before it expires"
    );
    let (cert, key) = certs::request(client, name, CSR_WAIT)?;
    let current = certs::store(&flags.cert_dir, &cert, &key)?;
    kubeconfig::write_kubelet_conf(&flags.kubeconfig, &kc.server, &kc.ca_pem, &current)?;
    tracing::info!("client certificate rotated");
    Kubeconfig::load(&flags.kubeconfig)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_transient_failures_are_retried() {
        let transport = |failure| SimError::Transport {
            what: "GET /".into(),
            // The words do not decide: the kind read from the error does.
            message: "invalid peer certificate: UnknownIssuer".into(),
            failure,
        };
        let api = |code| SimError::Api {
            what: "POST /".into(),
            code,
            message: String::new(),
        };
        assert!(retryable(&transport(error::TransportFailure::Unreachable)));
        assert!(!retryable(&transport(
            error::TransportFailure::CertificateRejected
        )));
        assert!(retryable(&api(503)));
        assert!(retryable(&api(429)));
        assert!(!retryable(&api(401)));
        assert!(!retryable(&api(403)));
    }

    /// A TLS server on loopback with its own self-signed certificate,
    /// answering each connection's request with `200 {}`; its address and
    /// its certificate (PEM).
    fn tls_server(connections: usize) -> (std::net::SocketAddr, String) {
        use std::io::{Read, Write};
        let made = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()])
            .expect("a self-signed certificate");
        let cert_pem = made.cert.pem();
        let key: rustls_pki_types::PrivateKeyDer =
            rustls_pki_types::PrivatePkcs8KeyDer::from(made.key_pair.serialize_der()).into();
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_no_client_auth()
            .with_single_cert(vec![made.cert.der().clone()], key)
            .expect("server config");
        let config = std::sync::Arc::new(config);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let addr = listener.local_addr().expect("its address");
        std::thread::spawn(move || {
            for stream in listener.incoming().take(connections) {
                let Ok(mut tcp) = stream else { continue };
                let _ = tcp.set_read_timeout(Some(Duration::from_secs(10)));
                let Ok(conn) = rustls::ServerConnection::new(config.clone()) else {
                    continue;
                };
                let mut tls = rustls::StreamOwned::new(conn, &mut tcp);
                let mut buf = [0u8; 4096];
                // A refused handshake ends here with an error; that is the
                // client's side to report.
                if tls.read(&mut buf).is_ok() {
                    let _ = tls.write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}",
                    );
                    let _ = tls.flush();
                }
            }
        });
        (addr, cert_pem)
    }

    fn client_for(server: &str, ca_pem: &str) -> Client {
        let kc = Kubeconfig {
            server: server.to_string(),
            ca_pem: ca_pem.to_string(),
            token: None,
            client_cert_pem: None,
            client_key_pem: None,
        };
        Client::new(&kc, 100.0, 100).expect("a client")
    }

    /// Over real TLS: a server whose certificate the kubeconfig's CA did
    /// not sign is a CertificateRejected (not retried), a closed port is
    /// Unreachable (retried), and the right CA gets the answer.
    #[test]
    fn a_refused_certificate_is_told_from_an_absent_server() {
        let (addr, cert_pem) = tls_server(2);
        let server = format!("https://{addr}");
        let other = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()])
            .expect("another certificate");

        let e = client_for(&server, &other.cert.pem())
            .call("GET", "/version", None, None)
            .err()
            .expect("a certificate the CA did not sign is refused");
        assert!(
            matches!(
                &e,
                SimError::Transport {
                    failure: error::TransportFailure::CertificateRejected,
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(!retryable(&e), "{e}");
        assert_eq!(e.code(), "SimApiUnreachable");

        let reply = client_for(&server, &cert_pem)
            .call("GET", "/version", None, None)
            .expect("the right CA gets the answer");
        assert_eq!(reply.code, 200);

        // A port nobody listens on (bound, then released).
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a loopback port");
        let e = client_for(&format!("https://{closed}"), &cert_pem)
            .call("GET", "/version", None, None)
            .err()
            .expect("nobody listens");
        assert!(
            matches!(
                &e,
                SimError::Transport {
                    failure: error::TransportFailure::Unreachable,
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(retryable(&e), "{e}");
    }

    #[test]
    fn version_names_the_stand_in() {
        let v = version_line();
        assert!(v.starts_with(&format!(
            "Kubernetes v{}",
            knit_api::DEFAULT_KUBERNETES_VERSION
        )));
        assert!(v.contains("knit-kubelet-sim") && v.contains("not kubelet"));
    }
}
