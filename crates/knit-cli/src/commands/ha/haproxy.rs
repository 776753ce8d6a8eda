//! HAProxy in front of the servers: its configuration, its program, and
//! restarting it when the configuration changed.

use super::template::{self, Scope, Value};
use super::*;

/// HAProxy's configuration: TCP mode (TLS goes through to the servers,
/// client certificates included) on the API and Kubernetes API ports,
/// each server checked over TLS against the shared CA every second; when
/// every check fails, the servers unchecked as backups. The per-address
/// connection limit a server keeps by default is kept here instead: behind
/// HAProxy every client has HAProxy's address. The text is
/// haproxy.cfg beside this file; every value put in it is one checked word.
pub(super) fn haproxy_config(layout: &Layout, plan: &Plan) -> Result<String> {
    let first = layout.server_dir(1);
    let word = |s: String| Value::Word(s);
    let section = |name: &str, port: u16, ca: PathBuf| {
        let binds = plan
            .front
            .iter()
            .map(|ip| Scope::from([("address", word(format!("{ip}:{port}")))]))
            .collect();
        let servers = (1..=plan.n)
            .map(|i| {
                Scope::from([
                    ("id", word(format!("server-{i}"))),
                    ("address", word(format!("{}:{port}", server_ip(i)))),
                ])
            })
            .collect();
        Scope::from([
            ("name", word(name.to_string())),
            ("bind", Value::List(binds)),
            ("server", Value::List(servers)),
            ("ca_file", word(ca.to_string_lossy().into_owned())),
        ])
    };
    let mut sections = vec![section("knit-api", plan.port, first.join("pki/ca.pem"))];
    if let Some(cp) = plan.cluster_port {
        sections.push(section(
            "kubernetes-api",
            cp,
            first.join("cluster/pki/ca.crt"),
        ));
    }
    let scope = Scope::from([
        ("servers", word(plan.n.to_string())),
        (
            "per_address",
            word(
                knit_server::ConnectionLimits::default()
                    .max_per_address
                    .to_string(),
            ),
        ),
        ("section", Value::List(sections)),
    ]);
    template::render(TEMPLATE, &scope, haproxy_word).map_err(|e| match e {
        template::TemplateError::Word { name, value, rule } => HaError::ProxyConfig {
            field: name,
            value,
            rule,
        }
        .into(),
        e => HaError::Proxy(format!("haproxy.cfg: {e}")).into(),
    })
}

/// HAProxy's configuration, filled by [`haproxy_config`].
const TEMPLATE: &str = include_str!("haproxy.cfg");

/// A value haproxy.cfg takes as one word as it is: HAProxy splits a line
/// at spaces and tabs, reads quotes and backslashes as escapes, `$` in
/// quotes as a variable and `#` as a comment; a newline would start a
/// directive of its own; in a `bind` a ',' adds an address and an '@' names
/// a family. None of those (nor any other character outside this set) is
/// allowed, so nothing needs escaping.
fn haproxy_word(value: &str) -> std::result::Result<(), &'static str> {
    const RULE: &str = "must be one word of haproxy.cfg: 1 to 4096 of ASCII letters, digits and . _ - / : [ ] + ~ (no space, tab, newline, quote, backslash, '$', '#', ',' or '@')";
    let ok = !value.is_empty()
        && value.len() <= 4096
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-/:[]+~".contains(c));
    if ok {
        Ok(())
    } else {
        Err(RULE)
    }
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
    let cfg = haproxy_config(layout, plan)?;
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
    knit_os::durable::write(&cfg_path, cfg.as_bytes(), 0o600)?;
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
        let cfg = haproxy_config(&layout, &p).unwrap();
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
            "tcp-request connection reject if { sc0_conn_cur gt 128 }",
        ] {
            assert!(cfg.contains(line), "{line:?} not in:\n{cfg}");
        }
    }

    /// The template gives the configuration `knit up --ha` wrote when it
    /// was built by `format!` (kept in testdata/ from that code), byte for
    /// byte, plus each frontend's per-address connection limit: two servers
    /// on two addresses with the Kubernetes API, three on one address, and
    /// three without the Kubernetes API.
    #[test]
    fn the_template_writes_what_the_format_code_wrote() {
        let layout = Layout::new(Path::new("/var/lib/knit/local"));
        let p = plan_of(&["--ha", "2"]).unwrap();
        assert_eq!(
            haproxy_config(&layout, &p).unwrap(),
            include_str!("testdata/haproxy-ha2.cfg")
        );
        let mut p = plan_of(&[
            "--ha",
            "3",
            "--cluster-port",
            "0",
            "--listen",
            "127.0.0.1:7443",
        ])
        .unwrap();
        let three = include_str!("testdata/haproxy-ha3.cfg");
        assert_eq!(haproxy_config(&layout, &p).unwrap(), three);
        p.cluster_port = None;
        let (api_only, _) = three.split_once("\nfrontend kubernetes-api").unwrap();
        assert_eq!(haproxy_config(&layout, &p).unwrap(), api_only);
    }

    /// A value that could end the word, the line or the directive it is in
    /// (a state directory with a space, a newline, '#', a quote …) is
    /// refused with the field, the value and the rule: nothing is written.
    #[test]
    fn a_value_that_could_inject_config_is_refused() {
        let p = plan_of(&["--ha", "2"]).unwrap();
        for dir in [
            "/s p",
            "/s\nserver evil 10.0.0.1:7443",
            "/s#x",
            "/s\"x",
            "/s'x",
            "/s\\x",
            "/s$x",
            "/s\tx",
            "/sé",
            "/s,x",
            "/s@x",
        ] {
            let layout = Layout::new(Path::new(dir));
            let e = haproxy_config(&layout, &p).unwrap_err();
            let text = e.to_string();
            assert!(text.contains("ca_file"), "{dir:?}: {text}");
            assert!(
                text.contains(&format!("{:?}", format!("{dir}/ha/server-1/pki/ca.pem"))),
                "{dir:?}: {text}"
            );
            assert!(text.contains("one word of haproxy.cfg"), "{dir:?}: {text}");
        }
        for ok in ["/var/lib/knit", "/srv/knit-1.2_a", "/x/[v]:+~"] {
            assert!(haproxy_word(ok).is_ok(), "{ok:?}");
        }
        assert!(haproxy_word("").is_err());
        assert!(haproxy_word(&"a".repeat(4097)).is_err());
    }
}
