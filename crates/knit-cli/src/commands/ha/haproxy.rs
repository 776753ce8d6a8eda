//! HAProxy in front of the servers: its configuration, its program, and
//! restarting it when the configuration changed.

use super::*;

/// HAProxy's configuration: TCP mode (TLS goes through to the servers,
/// client certificates included) on the API and Kubernetes API ports,
/// each server checked over TLS against the shared CA every second; when
/// every check fails, the servers unchecked as backups.
pub(super) fn haproxy_config(layout: &Layout, plan: &Plan) -> String {
    let first = layout.server_dir(1);
    let mut cfg = format!(
        "# Written by `knit up --ha {n}`; rewritten by each `knit up --ha`.\n\
         global\n\
         \x20   log stderr format raw local0 info\n\
         \x20   maxconn 4096\n\
         \n\
         defaults\n\
         \x20   mode tcp\n\
         \x20   log global\n\
         \x20   option tcplog\n\
         \x20   option dontlognull\n\
         \x20   # A connection that fails goes to another server at its first retry.\n\
         \x20   option redispatch 1\n\
         \x20   retries 3\n\
         \x20   timeout connect 3s\n\
         \x20   timeout check 3s\n\
         \x20   # Watches and long polls stay open: idle connections last an hour.\n\
         \x20   timeout client 1h\n\
         \x20   timeout server 1h\n\
         \x20   default-server inter 1s fall 2 rise 2 on-marked-down shutdown-sessions\n",
        n = plan.n
    );
    let mut section = |name: &str, port: u16, ca: PathBuf| {
        cfg.push_str(&format!("\nfrontend {name}\n"));
        for ip in &plan.front {
            cfg.push_str(&format!("    bind {ip}:{port}\n"));
        }
        cfg.push_str(&format!(
            "    default_backend {name}\n\nbackend {name}\n    balance roundrobin\n    option httpchk GET /healthz\n    http-check expect status 200\n    option allbackups\n"
        ));
        for i in 1..=plan.n {
            cfg.push_str(&format!(
                "    server server-{i} {}:{port} check check-ssl verify required ca-file {}\n",
                server_ip(i),
                ca.display()
            ));
        }
        // Fail open: when every health check fails at once (a loaded host
        // can time them all out), clients are still sent to the servers,
        // as Envoy's panic threshold does, instead of every connection
        // being closed; a server that is really gone refuses the connect
        // and `redispatch` tries the next.
        for i in 1..=plan.n {
            cfg.push_str(&format!(
                "    server server-{i}-fail-open {}:{port} backup\n",
                server_ip(i)
            ));
        }
    };
    section("knit-api", plan.port, first.join("pki/ca.pem"));
    if let Some(cp) = plan.cluster_port {
        section("kubernetes-api", cp, first.join("cluster/pki/ca.crt"));
    }
    cfg
}

/// HAProxy's program, or the package to install.
pub(super) fn haproxy_bin() -> Result<PathBuf> {
    crate::commands::package::which("haproxy").ok_or_else(|| {
        HaError::Proxy(
            "haproxy is not installed: install Debian's haproxy package (scripts/setup.sh --ha)"
                .into(),
        )
        .into()
    })
}

/// HAProxy in front of the servers; restarted when its configuration
/// changed (another N, other addresses).
pub(super) fn proxy_up(layout: &Layout, plan: &Plan) -> Result<()> {
    let px = |m: String| CliError::from(HaError::Proxy(m));
    let bin = haproxy_bin()?;
    let cfg_path = layout.haproxy_cfg();
    let cfg = haproxy_config(layout, plan);
    let same = std::fs::read_to_string(&cfg_path).is_ok_and(|old| old == cfg);
    if let Some(pid) = layout.running_one("haproxy") {
        if same {
            println!("HAProxy already running (pid {pid})");
            return Ok(());
        }
        stop_group(
            layout,
            &[Running {
                name: "haproxy".into(),
                pid,
            }],
            libc::SIGTERM,
        )?;
    }
    knit_server::durable::write(&cfg_path, cfg.as_bytes(), 0o600)?;
    let check = run_bounded(
        Command::new(&bin)
            .arg("-c")
            .arg("-f")
            .arg(&cfg_path)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
        Duration::from_secs(20),
    )
    .map_err(|e| px(format!("haproxy -c: {e}")))?;
    if !check.status.success() {
        return Err(px(format!(
            "{} refused by haproxy -c: {}{}",
            cfg_path.display(),
            String::from_utf8_lossy(&check.stdout).trim(),
            String::from_utf8_lossy(&check.stderr).trim()
        )));
    }
    let log_path = layout.root.join("haproxy.log");
    let log = append_log(&log_path)?;
    let mut cmd = Command::new(&bin);
    // -db: in the foreground (no fork), so the recorded PID is HAProxy's.
    cmd.arg("-db")
        .arg("-f")
        .arg(&cfg_path)
        .stdout(log.try_clone().map_err(io("dup log"))?)
        .stderr(log);
    let mut child = spawn_recorded(&mut cmd, &layout.pid_file("haproxy"), None)?;
    let fronts: Vec<String> = plan
        .front
        .iter()
        .flat_map(|ip| {
            std::iter::once(format!("{ip}:{}", plan.port))
                .chain(plan.cluster_port.map(|cp| format!("{ip}:{cp}")))
        })
        .collect();
    println!(
        "HAProxy (pid {}) on {} → servers {}; log {}",
        child.id(),
        fronts.join(", "),
        (1..=plan.n)
            .map(|i| server_ip(i).to_string())
            .collect::<Vec<_>>()
            .join(", "),
        log_path.display()
    );
    // Bound: every front address accepts a connection.
    let deadline = Instant::now() + START_TIMEOUT;
    for addr in &fronts {
        let addr: SocketAddr = addr
            .parse()
            .map_err(|_| px(format!("{addr}: not an address")))?;
        while std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(px(format!(
                    "exited ({status}) at start; see {}",
                    log_path.display()
                )));
            }
            if Instant::now() > deadline {
                return Err(px(format!(
                    "not listening on {addr} within {} s; see {}",
                    START_TIMEOUT.as_secs(),
                    log_path.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::server::ha::tests::plan_of;

    #[test]
    fn haproxy_holds_the_listen_addresses_and_nodes_use_the_gateway() {
        let p = plan_of(&["--ha", "2"]).unwrap();
        assert_eq!(p.port, 7443);
        assert_eq!(p.cluster_port, Some(6443));
        assert_eq!(p.advertise, "10.213.0.1");
        assert_eq!(p.client_url, "https://127.0.0.1:7443");
        assert_eq!(
            p.front,
            vec![
                "127.0.0.1".parse::<IpAddr>().unwrap(),
                "10.213.0.1".parse().unwrap()
            ]
        );
        let layout = Layout::new(Path::new("/s"));
        let cfg = haproxy_config(&layout, &p);
        for line in [
            "bind 127.0.0.1:7443",
            "bind 10.213.0.1:7443",
            "bind 10.213.0.1:6443",
            "server server-1 127.0.2.1:7443 check check-ssl verify required ca-file /s/ha/server-1/pki/ca.pem",
            "server server-2 127.0.2.2:6443 check check-ssl verify required ca-file /s/ha/server-1/cluster/pki/ca.crt",
            "server server-1-fail-open 127.0.2.1:7443 backup",
            "server server-2-fail-open 127.0.2.2:6443 backup",
            "option allbackups",
            "mode tcp",
        ] {
            assert!(cfg.contains(line), "{line:?} not in:\n{cfg}");
        }
    }
}
