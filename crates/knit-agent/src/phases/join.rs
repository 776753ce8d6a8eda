//! `join`: establish trust in the cluster CA (given, pinned, or discovered
//! from `cluster-info` and checked against the pin), write the bootstrap
//! kubeconfig, start containerd (and wait for its socket) and the kubelet,
//! then wait until the API server knows this node, asking with the
//! kubelet's own client certificate.
//!
//! A rerun resumes: services already running with the same definition are
//! left alone, and only the wait is repeated.

use crate::error::{AgentError, Result};
use crate::host::Host;
use crate::phase::{Ctx, Decision, Phase};
use crate::render;
use crate::services::{self, ServiceSpec};
use crate::tls;
use knit_api::{ErrorCode, PhaseName};
use sha2::{Digest, Sha256};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

const SCOPE: &str = PhaseName::Join.as_str();
const CONTAINERD_READY_TIMEOUT: Duration = Duration::from_secs(60);
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_secs(1);
/// The kubelet usually registers within a second of its start: asked this
/// often for the first [`FAST_POLL_FOR`], the join ends when it did rather
/// than up to a [`POLL`] later.
const FAST_POLL: Duration = Duration::from_millis(100);
const FAST_POLL_FOR: Duration = Duration::from_secs(10);
/// Digest of the files a service reads at start (see `with_config_digest`).
pub const CONFIG_DIGEST_ENV: &str = "KNIT_CONFIG_SHA256";

pub struct Join;

fn join_error(message: impl Into<String>) -> AgentError {
    AgentError::new(ErrorCode::FailJoin, message)
}

/// The cluster CA (PEM), from `cluster.caCert` (checked against `caPin`
/// when both are set) or discovered with the pin.
pub fn resolve_ca(ctx: &Ctx, endpoint: &str) -> Result<String> {
    let cluster = &ctx.config.cluster;
    match (&cluster.ca_cert, &cluster.ca_pin) {
        // Only the pinned certificate of the bundle is trusted.
        (Some(ca), Some(pin)) => tls::check_ca_pin(ca, pin, "cluster.caCert"),
        (Some(ca), None) => Ok(ca.clone()),
        (None, Some(pin)) => {
            // Discovered by an earlier run: reused if it still has the pin.
            if let Some(ca) = ctx.host.read(render::CLUSTER_CA) {
                if let Ok(pinned) = tls::check_ca_pin(&ca, pin, render::CLUSTER_CA) {
                    return Ok(pinned);
                }
            }
            let Some(token) = &cluster.bootstrap_token else {
                return Err(join_error(
                    "cluster.caPin without cluster.caCert needs cluster.bootstrapToken: the CA is \
                     discovered from cluster-info, whose signature is checked with the token",
                ));
            };
            ctx.host.log.line(
                SCOPE,
                &format!("discovering the cluster CA from {endpoint} (pin {pin})"),
            );
            tls::discover_ca(endpoint, pin, token, PROBE_TIMEOUT)
        }
        (None, None) => Err(join_error(
            "cluster.endpoint is set but neither cluster.caCert nor cluster.caPin: \
             the node cannot trust the API server",
        )),
    }
}

/// The kubelet's credentials from the kubeconfig it wrote after TLS bootstrap.
struct KubeletCredentials {
    cert_pem: String,
    key_pem: String,
}

/// `<key>-data` (base64) or `<key>` (a file; relative to `base`, the
/// kubeconfig's directory, as Kubernetes resolves it).
fn read_source(
    doc: &serde_yaml_ng::Value,
    data_key: &str,
    file_key: &str,
    base: &Path,
    what: &str,
) -> std::result::Result<String, String> {
    use base64::Engine;
    if let Some(data) = doc[data_key].as_str() {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .map_err(|e| format!("{what}: {data_key} is not base64: {e}"))?;
        return String::from_utf8(bytes).map_err(|_| format!("{what}: {data_key} is not PEM"));
    }
    if let Some(file) = doc[file_key].as_str() {
        // Written by the kubelet on this host: a host path.
        let path = base.join(file);
        return std::fs::read_to_string(&path)
            .map_err(|e| format!("{what}: {}: {e}", path.display()));
    }
    Err(format!("{what}: neither {data_key} nor {file_key}"))
}

fn kubelet_credentials(host: &Host) -> std::result::Result<Option<KubeletCredentials>, String> {
    let path = render::KUBECONFIG;
    let Some(text) = host.read(path) else {
        return Ok(None);
    };
    let doc: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&text).map_err(|e| format!("{path} is not a kubeconfig: {e}"))?;
    let user = &doc["users"][0]["user"];
    let base = host
        .path(path)
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let what = format!("{path} users[0]");
    Ok(Some(KubeletCredentials {
        cert_pem: read_source(
            user,
            "client-certificate-data",
            "client-certificate",
            &base,
            &what,
        )?,
        key_pem: read_source(user, "client-key-data", "client-key", &base, &what)?,
    }))
}

enum Probe {
    Registered,
    /// Reachable; why the node is not (yet) known.
    Pending(String),
    Unreachable(String),
}

fn probe(ctx: &Ctx, endpoint: &str, ca: &str) -> Probe {
    let base = endpoint.trim_end_matches('/');
    let credentials = match kubelet_credentials(ctx.host) {
        Ok(c) => c,
        Err(e) => return Probe::Pending(e),
    };
    let Some(credentials) = credentials else {
        // No client certificate yet: only reachability can be checked.
        let agent = match tls::http_agent(Some(ca), PROBE_TIMEOUT) {
            Ok(agent) => agent,
            Err(e) => return Probe::Unreachable(e.to_string()),
        };
        return match agent.get(&format!("{base}/healthz")).call() {
            Ok(_) | Err(ureq::Error::Status(..)) => Probe::Pending(format!(
                "the kubelet has not completed TLS bootstrap ({} absent)",
                ctx.host.host_path(render::KUBECONFIG)
            )),
            Err(e) => Probe::Unreachable(e.to_string()),
        };
    };
    let agent = match tls::client_cert_agent(
        ca,
        &credentials.cert_pem,
        &credentials.key_pem,
        PROBE_TIMEOUT,
    ) {
        Ok(agent) => agent,
        Err(e) => return Probe::Pending(format!("kubelet credentials unusable: {e}")),
    };
    let url = format!("{base}/api/v1/nodes/{}", ctx.node.name);
    match agent.get(&url).call() {
        Ok(_) => Probe::Registered,
        Err(ureq::Error::Status(404, _)) => {
            Probe::Pending(format!("node {} is not registered yet", ctx.node.name))
        }
        Err(ureq::Error::Status(code, _)) => Probe::Pending(format!(
            "GET {url} with the kubelet's certificate answered HTTP {code}"
        )),
        Err(e) => Probe::Unreachable(e.to_string()),
    }
}

/// `host:port` of an endpoint URL, for messages.
fn endpoint_port(endpoint: &str) -> String {
    let rest = endpoint.split_once("://").map_or(endpoint, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or(rest);
    match authority.rsplit_once(':') {
        Some((_, port)) if port.bytes().all(|b| b.is_ascii_digit()) => port.to_string(),
        _ => "443".to_string(),
    }
}

fn wait_for_socket(host: &Host, socket: &str, timeout: Duration) -> Result<()> {
    let path = host.path(socket);
    let deadline = Instant::now() + timeout;
    loop {
        match UnixStream::connect(&path) {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() > deadline => {
                return Err(join_error(format!(
                    "containerd did not answer on {} within {}s ({e}); see {}",
                    path.display(),
                    timeout.as_secs(),
                    host.host_path(render::CONTAINERD_LOG)
                )))
            }
            // A connect to a unix socket is cheap: asked often, the kubelet
            // starts as soon as containerd answers.
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// Services restart when a file they read only at start changes: its digest
/// is part of their definition (an environment variable), as a changed unit
/// file would be.
fn with_config_digest(host: &Host, mut spec: ServiceSpec, files: &[&str]) -> ServiceSpec {
    let mut hasher = Sha256::new();
    for file in files {
        hasher.update(file.as_bytes());
        hasher.update([0]);
        hasher.update(host.read(file).unwrap_or_default().as_bytes());
        hasher.update([0]);
    }
    spec.env.push((
        CONFIG_DIGEST_ENV.to_string(),
        hex::encode(hasher.finalize()),
    ));
    spec
}

/// containerd's (none with `runtime: none`) and the kubelet's definitions,
/// from the installed files.
fn desired_services(ctx: &Ctx) -> Result<(Option<ServiceSpec>, ServiceSpec)> {
    let host = ctx.host;
    let containerd = if ctx.config.has_runtime() {
        let program = host.find_program("containerd").ok_or_else(|| {
            join_error("containerd is not installed (the kubernetes-components phase installs it)")
        })?;
        Some(with_config_digest(
            host,
            render::containerd_service(host, &ctx.config.containerd, &host.host_path(&program)),
            &[render::CONTAINERD_CONFIG],
        ))
    } else {
        None
    };
    let kubelet = format!("{}/kubelet", crate::package::BIN_DIR);
    if !host.path(&kubelet).is_file() {
        return Err(join_error(format!(
            "{} is missing (the kubernetes-components phase installs it)",
            host.host_path(&kubelet)
        )));
    }
    let exec = render::kubelet_command(host, ctx.config, &ctx.node, &host.host_path(&kubelet));
    let kubelet = with_config_digest(
        host,
        render::kubelet_service(host, exec),
        // The installed version's stamp too: a kubelet binary swapped by
        // an in-place upgrade restarts it (`knit-agent update`).
        &[
            render::KUBELET_CONFIG,
            render::CLUSTER_CA,
            crate::phases::components::STAMP_FILE,
        ],
    );
    Ok((containerd, kubelet))
}

fn start_services(ctx: &Ctx) -> Result<()> {
    let host = ctx.host;
    let (containerd, kubelet) = desired_services(ctx)?;
    // Made here rather than by the services, so that the undo ledger knows
    // which of them did not exist before (`knit-agent reset --undo`).
    for dir in [
        render::CONTAINERD_ROOT,
        render::CONTAINERD_STATE,
        render::KUBELET_ROOT_DIR,
    ] {
        host.create_dir(dir).map_err(|e| join_error(e.message))?;
    }
    if let Some(containerd) = &containerd {
        services::ensure_running(host, containerd).map_err(|e| join_error(e.message))?;
        wait_for_socket(host, render::CONTAINERD_SOCK, CONTAINERD_READY_TIMEOUT)?;
    }
    services::ensure_running(host, &kubelet).map_err(|e| join_error(e.message))?;
    Ok(())
}

impl Phase for Join {
    fn name(&self) -> PhaseName {
        PhaseName::Join
    }

    fn inspect(&self, ctx: &Ctx) -> Result<Decision> {
        let Some(endpoint) = &ctx.config.cluster.endpoint else {
            return Ok(Decision::Skip(
                "cluster.endpoint is not set: this node joins no cluster".to_string(),
            ));
        };
        let (containerd, kubelet) = match desired_services(ctx) {
            Ok(specs) => specs,
            Err(e) => return Ok(Decision::Run(e.message)),
        };
        let stale: Vec<String> = containerd
            .iter()
            .chain([&kubelet])
            .filter(|spec| !services::runs_as(ctx.host, spec))
            .map(|spec| spec.name.clone())
            .collect();
        if !stale.is_empty() {
            return Ok(Decision::Run(format!(
                "{} not running with the current configuration",
                stale.join(" and ")
            )));
        }
        let Some(ca) = ctx.host.read(render::CLUSTER_CA) else {
            return Ok(Decision::Run(format!("{} missing", render::CLUSTER_CA)));
        };
        Ok(match probe(ctx, endpoint, &ca) {
            Probe::Registered => Decision::Done(format!(
                "node {} is registered at {endpoint}",
                ctx.node.name
            )),
            Probe::Pending(why) => Decision::Run(why),
            Probe::Unreachable(e) => Decision::Run(format!("{endpoint} unreachable: {e}")),
        })
    }

    fn run(&self, ctx: &mut Ctx) -> Result<String> {
        let host = ctx.host;
        let Some(endpoint) = ctx.config.cluster.endpoint.clone() else {
            return Ok("cluster.endpoint is not set".to_string());
        };
        let ca = resolve_ca(ctx, &endpoint)?;
        host.write_file(render::CLUSTER_CA, ca.as_bytes(), 0o644)?;
        match &ctx.config.cluster.bootstrap_token {
            Some(token) => host.write_file(
                render::BOOTSTRAP_KUBECONFIG,
                render::bootstrap_kubeconfig(&endpoint, &ca, token)
                    .map_err(|e| join_error(e.to_string()))?
                    .as_bytes(),
                0o600,
            )?,
            None if !host.exists(render::KUBECONFIG) => {
                return Err(join_error(format!(
                    "cluster.bootstrapToken is not set and {} does not exist: \
                     the kubelet has no credentials to join {endpoint}",
                    host.host_path(render::KUBECONFIG)
                )))
            }
            None => {}
        }
        start_services(ctx)?;
        let timeout = Duration::from_secs(ctx.config.join.timeout_seconds.max(1) as u64);
        host.log.line(
            SCOPE,
            &format!(
                "waiting up to {}s for node {} to register at {endpoint}",
                timeout.as_secs(),
                ctx.node.name
            ),
        );
        let started = Instant::now();
        let deadline = started + timeout;
        loop {
            let expired = Instant::now() >= deadline;
            match probe(ctx, &endpoint, &ca) {
                Probe::Registered => {
                    return Ok(format!("node {} registered at {endpoint}", ctx.node.name))
                }
                Probe::Unreachable(e) if expired => {
                    return Err(join_error(format!(
                        "cannot reach the API server at {endpoint} ({e}) within {}s: check that this node has a route \
                         to it and that security-group/firewall rules allow TCP {} from the node; \
                         containerd and the kubelet keep running, rerun `knit-agent init` to resume",
                        timeout.as_secs(),
                        endpoint_port(&endpoint)
                    )))
                }
                Probe::Pending(why) if expired => {
                    return Err(join_error(format!(
                        "node {} did not register at {endpoint} within {}s: {why}; see the kubelet log {}",
                        ctx.node.name,
                        timeout.as_secs(),
                        host.host_path(render::KUBELET_LOG)
                    )))
                }
                Probe::Unreachable(_) | Probe::Pending(_) => {}
            }
            let poll = if started.elapsed() < FAST_POLL_FOR {
                FAST_POLL
            } else {
                POLL
            };
            std::thread::sleep(poll.min(deadline.saturating_duration_since(Instant::now())));
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn endpoint_ports() {
        assert_eq!(super::endpoint_port("https://10.0.0.1:6443"), "6443");
        assert_eq!(super::endpoint_port("https://api.example/"), "443");
    }
}
