//! The HA set's knit servers: each one's state directory, the shared
//! mirror and CA, the secrets key, started and waited for.

use super::*;

/// A server's connections per client address behind HAProxy: as many as
/// its listeners hold (the cluster's listener caps it at its total).
const BEHIND_PROXY_PER_ADDRESS: usize = 65_536;

/// The key that seals the secrets the servers share: `--secrets-key-file`
/// when `up` was given one, else the deployment's own, made at the first
/// `up` (0600) and kept.
pub(super) fn secrets_key(opts: &ServerOpts, layout: &Layout) -> Result<PathBuf> {
    if let Some(path) = &opts.secrets_key_file {
        return Ok(path.clone());
    }
    let path = layout.secrets_key_file();
    if !path.exists() {
        let text =
            knit_server::sealed::new_key_text().map_err(|e| CliError::Failed(e.to_string()))?;
        knit_os::durable::write(&path, text.as_bytes(), 0o600)?;
        println!(
            "secrets key made: {} (0600; every server gets it)",
            path.display()
        );
    }
    // Checked here (mode, size) so a bad file stops `up` before any server.
    knit_server::sealed::SecretsKey::load(&path).map_err(|e| CliError::Failed(e.to_string()))?;
    Ok(path)
}

/// Copies `from` to `to` when `to` is missing (0600).
pub(super) fn copy_missing(from: &Path, to: &Path) -> Result<()> {
    if to.exists() || !from.exists() {
        return Ok(());
    }
    let data = std::fs::read(from).map_err(io(format!("read {}", from.display())))?;
    if let Some(parent) = to.parent() {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(io(format!("create {}", parent.display())))?;
    }
    knit_os::durable::write(to, &data, 0o600)?;
    Ok(())
}

/// Server i: its state directory, the shared mirror, server 1's cluster
/// CA, then started with the datastore in its environment and waited for.
pub(super) fn server_up(
    layout: &Layout,
    opts: &ServerOpts,
    plan: &Plan,
    i: u32,
    datastore: &str,
    secrets_key: &Path,
) -> Result<()> {
    let srv = |message: String| CliError::from(HaError::Server { index: i, message });
    let dir = layout.server_dir(i);
    std::fs::create_dir_all(&dir).map_err(io(format!("create {}", dir.display())))?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
        .map_err(io(format!("chmod {}", dir.display())))?;
    let mirror = dir.join("mirror");
    if std::fs::symlink_metadata(&mirror).is_err() {
        std::os::unix::fs::symlink(opts.state_dir.join("mirror"), &mirror)
            .map_err(io(format!("link {}", mirror.display())))?;
    }
    // The API's CA and the admin token come from the datastore (the
    // first server to start stores its own). The embedded Kubernetes
    // API's CA is its own, in its data directory: server 1's, copied
    // before the others' first start, so that every server presents the
    // same CA to nodes and accepts the client certificates any of them
    // signed.
    if i > 1 {
        let first = layout.server_dir(1);
        for f in ["cluster/pki/ca.crt", "cluster/pki/ca.key"] {
            copy_missing(&first.join(f), &dir.join(f))?;
        }
    }
    let ip = server_ip(i);
    let url = format!("https://{ip}:{}", plan.port);
    let name = format!("server-{i}");
    let log_path = dir.join("server.log");
    let mut child = None;
    if let Some(pid) = layout.running_one(&name) {
        println!("knit server {i} already running (pid {pid}) at {url}");
    } else {
        let log = append_log(&log_path)?;
        let exe = std::env::current_exe().map_err(io("find the knit executable"))?;
        let mut cmd = Command::new(exe);
        cmd.arg("server")
            .arg("--state-dir")
            .arg(&dir)
            .args(["--listen", &format!("{ip}:{}", plan.port)])
            .args(["--advertise-address", &plan.advertise])
            .args(["--provider", opts.provider.as_str()])
            .args(["--cluster", &opts.cluster])
            .args(["--cluster-port", &opts.cluster_port.to_string()])
            .args(["--parallelism", &opts.parallelism.to_string()])
            .args(["--lease-ttl", &opts.lease_ttl.to_string()])
            // Behind HAProxy every client has HAProxy's address: the
            // per-address limit is HAProxy's (haproxy.cfg), not the server's.
            .args([
                "--max-connections-per-address",
                &BEHIND_PROXY_PER_ADDRESS.to_string(),
            ])
            .arg("--secrets-key-file")
            .arg(secrets_key)
            .args(["--join-token-ttl", &opts.join_token_ttl.to_string()])
            .arg("--local-state-dir")
            .arg(&opts.local_state_dir)
            .args(["--local-bridge", &opts.local_bridge])
            .args(["--local-subnet", &opts.local_subnet])
            .args([
                "--local-metadata-port",
                &opts.local_metadata_port.to_string(),
            ])
            .args([
                "--console-listen",
                &match plan.console_port {
                    Some(p) => format!("{ip}:{p}"),
                    None => "off".to_string(),
                },
            ])
            .args([
                "--console-session-ttl",
                &opts.console_session_ttl.to_string(),
            ])
            // The URL names the password file (never the password), and
            // goes where an operator's URL with a password would go: the
            // environment (root's to read), not the command line.
            .env("KNIT_DATASTORE", datastore)
            .stdout(log.try_clone().map_err(io("dup log"))?)
            .stderr(log);
        for (flag, value) in [
            ("--region", &opts.region),
            ("--ecs-endpoint", &opts.ecs_endpoint),
            ("--ecs-vswitch", &opts.ecs_vswitch),
            ("--ecs-image", &opts.ecs_image),
        ] {
            if let Some(v) = value {
                cmd.args([flag, v]);
            }
        }
        if !opts.ecs_security_group.is_empty() {
            cmd.args(["--ecs-security-group", &opts.ecs_security_group.join(",")]);
        }
        let c = spawn_recorded(&mut cmd, &layout.pid_file(&name), None)?;
        println!(
            "knit server {i} (pid {}) starting at {url}; log {}",
            c.id(),
            log_path.display()
        );
        child = Some(c);
    }
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Some(Ok(Some(status))) = child.as_mut().map(Child::try_wait) {
            return Err(srv(format!(
                "exited ({status}) at start; see {}",
                log_path.display()
            )));
        }
        if let (Ok(ca), Ok(token)) = (
            std::fs::read_to_string(dir.join("pki/ca.pem")),
            std::fs::read_to_string(dir.join("admin-token")),
        ) {
            let config = ClientConfig {
                server: url.clone(),
                token: token.trim().to_string(),
                ca_cert: ca,
                state_dir: None,
                pid: None,
            };
            if let Ok(c) = Client::new(&config) {
                if c.healthy() {
                    return Ok(());
                }
            }
        }
        if Instant::now() > deadline {
            return Err(srv(format!(
                "did not answer at {url} within {} s; see {}",
                START_TIMEOUT.as_secs(),
                log_path.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
