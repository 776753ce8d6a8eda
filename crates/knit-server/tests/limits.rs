//! No client can starve the control plane (issue 30, item 4), as probes: a
//! real server on loopback (TLS, SQLite, an ephemeral port) held by
//! hundreds of idle, half-sent and trickling connections from several
//! addresses still answers a fresh client; the connection over a
//! per-address limit is closed at once and counted; an HTTP/2 client is
//! told the stream limit, and one that opens more streams anyway has them
//! refused; a flood of reports from one node is rate limited, and the
//! `knit exec` audit trail outlives the node's noise.
//!
//! Other loopback addresses (127.0.0.2 …) stand for other clients: Linux
//! routes all of 127.0.0.0/8 to `lo`.

mod support;

use knit_api::{NodeConfig, PhaseEvent, PhaseName, PhaseOutcome};
use knit_server::ConnectionLimits;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{instance, FakeCloud, TestServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const POOL: &str = "apiVersion: knit.dev/v1alpha1\nkind: NodePool\nmetadata:\n  name: workers\nspec:\n  replicas: 1\n";

/// A generous deadline for what must happen (never a measure of speed).
const DEADLINE: Duration = Duration::from_secs(90);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// The soft open-file limit of this process (the server raised it to the
/// hard one at its start).
fn open_file_limit() -> u64 {
    let text = std::fs::read_to_string("/proc/self/limits").unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    line.split_whitespace().nth(3).unwrap().parse().unwrap()
}

/// A TLS client of the server's CA, speaking `alpn`.
fn tls_connector(ca_pem: &str, alpn: &[u8]) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    cfg.alpn_protocols = vec![alpn.to_vec()];
    tokio_rustls::TlsConnector::from(Arc::new(cfg))
}

/// A TCP connection to `to` from the loopback address `from`.
async fn connect_from(from: &str, to: SocketAddr) -> std::io::Result<tokio::net::TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(format!("{from}:0").parse().unwrap())?;
    socket.connect(to).await
}

fn server_name() -> rustls::pki_types::ServerName<'static> {
    rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap()
}

/// The value of the first metrics line starting with `prefix`.
fn metric(text: &str, prefix: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
}

/// Retries `GET path` with the admin client until it answers 200, within
/// [`DEADLINE`]; the body (the client may reuse a connection).
fn answered(h: &TestServer, path: &str) -> String {
    let until = Instant::now() + DEADLINE;
    loop {
        match h.client().raw("GET", path, None) {
            Ok((200, body)) => return body,
            other if Instant::now() > until => {
                panic!("GET {path} not answered within {DEADLINE:?}: {other:?}")
            }
            _ => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

/// `GET path` on a new connection from 127.0.0.1 (`Connection: close`),
/// retried on new connections until it answers 200 within [`DEADLINE`]:
/// the body. A refused connection (closed by the server) is retried.
async fn fresh_get(
    addr: SocketAddr,
    connector: &tokio_rustls::TlsConnector,
    token: &str,
    path: &str,
) -> String {
    let until = Instant::now() + DEADLINE;
    let mut last = String::new();
    while Instant::now() < until {
        let attempt = async {
            let tcp = connect_from("127.0.0.1", addr).await?;
            let mut s = connector.connect(server_name(), tcp).await?;
            s.write_all(
                format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            )
            .await?;
            let mut answer = Vec::new();
            s.read_to_end(&mut answer).await?;
            std::io::Result::Ok(String::from_utf8_lossy(&answer).into_owned())
        };
        match tokio::time::timeout(Duration::from_secs(10), attempt).await {
            Ok(Ok(answer)) if answer.starts_with("HTTP/1.1 200") => {
                return answer
                    .split_once("\r\n\r\n")
                    .map(|(_, body)| body.to_string())
                    .unwrap_or_default();
            }
            Ok(Ok(answer)) => last = answer,
            Ok(Err(e)) => last = e.to_string(),
            Err(_) => last = "no answer in 10 s".into(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("GET {path} on a fresh connection not answered within {DEADLINE:?}; last: {last}")
}

#[test]
fn eight_hundred_held_connections_do_not_starve_the_api() {
    let mut h = TestServer::new();
    h.settings.limits = ConnectionLimits {
        max_connections: 300,
        max_per_address: 50,
        handshake_timeout: Duration::from_secs(2),
        header_timeout: Duration::from_secs(2),
        idle_timeout: Duration::from_secs(3),
        ..ConnectionLimits::default()
    };
    h.start(None);
    let limit = open_file_limit();
    assert!(
        limit >= 4096,
        "the open-file limit is {limit}: this test holds 800 connections at both ends in one process; raise the hard limit (ulimit -Hn)"
    );
    let addr = h.server().addr;
    let connector = tls_connector(h.server().ca_pem(), b"http/1.1");
    let h2_connector = tls_connector(h.server().ca_pem(), b"h2");
    let rt = runtime();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    // 800 attackers from eight addresses (100 each, one address after
    // the other: the first ones meet the per-address limit, the last ones
    // the total), each holding its connection in one of four ways until
    // the test ends (or the server closes it).
    let attackers: Vec<_> = (0..800)
        .map(|i| {
            let from = format!("127.0.0.{}", 2 + i / 100);
            let connector = connector.clone();
            let h2_connector = h2_connector.clone();
            let mut stopped = stopped.clone();
            rt.spawn(async move {
                let Ok(tcp) = connect_from(&from, addr).await else {
                    return;
                };
                let hold = async move {
                    match i % 4 {
                        // Idle: connected, never a byte.
                        0 => {
                            let mut tcp = tcp;
                            let mut b = [0u8; 1];
                            let _ = tcp.read(&mut b).await;
                        }
                        // Half a request head, then silence.
                        1 => {
                            let Ok(mut s) = connector.connect(server_name(), tcp).await else {
                                return;
                            };
                            let _ = s
                                .write_all(b"GET /api/v1/pools HTTP/1.1\r\nHost: x\r\n")
                                .await;
                            let mut b = [0u8; 64];
                            while matches!(s.read(&mut b).await, Ok(n) if n > 0) {}
                        }
                        // A request head trickled one byte at a time.
                        2 => {
                            let Ok(mut s) = connector.connect(server_name(), tcp).await else {
                                return;
                            };
                            let head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n";
                            for b in head.iter().cycle().take(10_000) {
                                if s.write_all(&[*b]).await.is_err() {
                                    return;
                                }
                                tokio::time::sleep(Duration::from_millis(500)).await;
                            }
                        }
                        // HTTP/2, connected and never asking.
                        _ => {
                            let Ok(s) = h2_connector.connect(server_name(), tcp).await else {
                                return;
                            };
                            let Ok((_send, conn)) = h2::client::handshake(s).await else {
                                return;
                            };
                            let _ = conn.await;
                        }
                    }
                };
                tokio::select! {
                    _ = hold => {}
                    _ = stopped.changed() => {}
                }
            })
        })
        .collect();
    let token = h.server().admin_token().to_string();
    let refused = |text: &str, limit: &str| {
        text.lines()
            .find(|l| {
                l.starts_with(&format!(
                    "knit_connections_refused_total{{listener=\"api\",limit=\"{limit}\"}}"
                ))
            })
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // Every attacker has connected (admitted or refused) before the fresh
    // client's request that counts.
    let until = Instant::now() + DEADLINE;
    let text = loop {
        let text = rt.block_on(fresh_get(addr, &connector, &token, "/metrics"));
        let admitted = metric(&text, "knit_connections_accepted_total{listener=\"api\"}");
        if admitted + refused(&text, "total") + refused(&text, "per_address") >= 800.0 {
            break text;
        }
        assert!(
            Instant::now() < until,
            "the attackers did not all connect:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    // Both limits refused some at once, each counted.
    assert!(refused(&text, "per_address") >= 1.0, "{text}");
    assert!(refused(&text, "total") >= 1.0, "{text}");
    // The API answers a fresh client (a new connection, authenticated)
    // while the attackers hold on.
    let pools = rt.block_on(fresh_get(addr, &connector, &token, "/api/v1/pools"));
    assert!(pools.contains("items"), "{pools}");
    let _ = stop.send(true);
    for a in attackers {
        let _ = rt.block_on(a);
    }
}

#[test]
fn the_connection_over_the_per_address_limit_is_closed_at_once() {
    let mut h = TestServer::new();
    h.settings.limits = ConnectionLimits {
        max_per_address: 3,
        ..ConnectionLimits::default()
    };
    h.start(None);
    let addr = h.server().addr;
    let connector = tls_connector(h.server().ca_pem(), b"http/1.1");
    let rt = runtime();
    rt.block_on(async {
        let mut held = Vec::new();
        for _ in 0..3 {
            let tcp = connect_from("127.0.0.3", addr).await.unwrap();
            // A finished handshake: the server admitted it.
            held.push(connector.connect(server_name(), tcp).await.unwrap());
        }
        // The fourth from that address: closed by the server, no handshake.
        let mut tcp = connect_from("127.0.0.3", addr).await.unwrap();
        let mut b = [0u8; 16];
        let read = tokio::time::timeout(DEADLINE, tcp.read(&mut b))
            .await
            .expect("the refused connection is closed by the server");
        assert!(
            matches!(read, Ok(0)) || read.is_err(),
            "refused, not served: {read:?}"
        );
        // Another address is not concerned.
        let tcp = connect_from("127.0.0.4", addr).await.unwrap();
        connector.connect(server_name(), tcp).await.unwrap();
        // One of the three gone: its place is given back.
        drop(held.pop());
        let until = Instant::now() + DEADLINE;
        loop {
            let tcp = connect_from("127.0.0.3", addr).await.unwrap();
            if connector.connect(server_name(), tcp).await.is_ok() {
                break;
            }
            assert!(Instant::now() < until, "the place was not given back");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let text = answered(&h, "/metrics");
    assert!(
        metric(
            &text,
            "knit_connections_refused_total{listener=\"api\",limit=\"per_address\"}"
        ) >= 1.0,
        "{text}"
    );
}

/// One HTTP/2 frame: its header and payload.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// An HPACK header block for `POST path` (static table indexes and
/// literals without indexing, no Huffman: RFC 7541).
fn post_headers(path: &str) -> Vec<u8> {
    let mut b = vec![0x83, 0x87]; // :method POST, :scheme https
    for (index, value) in [(4u8, path), (1u8, "127.0.0.1")] {
        b.push(index); // literal without indexing, indexed name
        b.push(value.len() as u8);
        b.extend_from_slice(value.as_bytes());
    }
    b
}

#[test]
fn http2_streams_over_the_limit_are_refused() {
    let mut h = TestServer::new();
    h.settings.limits = ConnectionLimits {
        http2_max_streams: 4,
        ..ConnectionLimits::default()
    };
    h.start(None);
    let addr = h.server().addr;
    let connector = tls_connector(h.server().ca_pem(), b"h2");
    let rt = runtime();
    rt.block_on(async {
        // A well-behaved client (the h2 crate) is told the limit.
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let tls = connector.connect(server_name(), tcp).await.unwrap();
        let (send, mut conn) = h2::client::handshake(tls).await.unwrap();
        let mut send = send.ready().await.unwrap();
        let request = http::Request::get("https://127.0.0.1/healthz")
            .body(())
            .unwrap();
        let (response, _) = send.send_request(request, true).unwrap();
        // The connection is driven while the answer comes (its SETTINGS
        // come first).
        let response = tokio::time::timeout(DEADLINE, async {
            tokio::select! {
                r = response => r.unwrap(),
                ended = &mut conn => panic!("the connection ended: {ended:?}"),
            }
        })
        .await
        .unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(conn.max_concurrent_send_streams(), 4);

        // A client that ignores it: six requests whose bodies never come.
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut s = connector.connect(server_name(), tcp).await.unwrap();
        s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .unwrap();
        s.write_all(&frame(4, 0, 0, &[])).await.unwrap();
        let mut opened = false;
        let mut refused = Vec::new();
        let read_frames = async {
            loop {
                let mut head = [0u8; 9];
                s.read_exact(&mut head).await.unwrap();
                let len = (usize::from(head[0]) << 16)
                    | (usize::from(head[1]) << 8)
                    | usize::from(head[2]);
                let (kind, flags) = (head[3], head[4]);
                let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
                let mut payload = vec![0u8; len];
                s.read_exact(&mut payload).await.unwrap();
                match kind {
                    // The server's SETTINGS: acknowledged, then the streams.
                    4 if flags & 1 == 0 => {
                        s.write_all(&frame(4, 1, 0, &[])).await.unwrap();
                        if !opened {
                            opened = true;
                            for n in 0..6u32 {
                                let block = post_headers("/report/v1/events");
                                // END_HEADERS only: the body is to follow.
                                s.write_all(&frame(1, 0x4, 1 + 2 * n, &block))
                                    .await
                                    .unwrap();
                            }
                        }
                    }
                    // RST_STREAM: which stream, why.
                    3 => {
                        let code =
                            u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]);
                        refused.push((stream, code));
                        if refused.len() == 2 {
                            return;
                        }
                    }
                    // GOAWAY: the connection is over.
                    7 => panic!(
                        "the server closed the connection (GOAWAY) instead of refusing streams"
                    ),
                    _ => {}
                }
            }
        };
        tokio::time::timeout(DEADLINE, read_frames)
            .await
            .expect("the streams over the limit are reset");
        // The fifth and sixth (ids 9 and 11), REFUSED_STREAM (0x7); the
        // first four are being served.
        refused.sort();
        assert_eq!(refused, vec![(9, 7), (11, 7)]);
    });
}

/// A node's report: a failed phase with `reason`.
fn failed(node: &str, id: &str, reason: String) -> String {
    serde_json::to_string(&PhaseEvent {
        node: node.into(),
        instance_id: id.into(),
        phase: PhaseName::TimeSync,
        outcome: PhaseOutcome::Failed,
        reason: Some(reason),
        error_code: None,
        at_ms: 1,
        duration_ms: None,
    })
    .unwrap()
}

#[test]
fn a_report_flood_is_rate_limited_and_the_exec_audit_is_kept() {
    use knit_server::store::EventRetention;
    let mut h = TestServer::new();
    h.settings.limits = ConnectionLimits {
        report_burst: 150,
        report_refill: Duration::from_secs(3600),
        ..ConnectionLimits::default()
    };
    let cloud = Arc::new(FakeCloud::default());
    h.start(Some(cloud.clone()));
    cloud.add(instance("i-000a", "workers-aaaaa", "10.213.0.10"));
    h.client()
        .call("POST", "/api/v1/pools", Some(POOL))
        .unwrap();
    let cp = &h.server().control;
    // Small numbers, so that the flood is many times what is kept.
    cp.store().set_event_retention(EventRetention {
        max_count: 20,
        audit_max_count: 100,
        ..EventRetention::default()
    });
    cp.store()
        .add_create_intents(
            "workers",
            &[("workers-aaaaa".into(), "ecs.g7.large".into())],
        )
        .unwrap();
    cp.store()
        .set_instance_created("workers-aaaaa", "i-000a", Some("10.213.0.10"))
        .unwrap();
    let join = cp.issue_join_token("workers-aaaaa", "workers").unwrap();
    let (status, yaml) = h
        .client()
        .with_token(&join)
        .raw("POST", "/bootstrap/v1/config", None)
        .unwrap();
    assert_eq!(status, 200, "{yaml}");
    let config = NodeConfig::from_yaml(&yaml).unwrap();
    let node = h.client().with_token(&config.cluster.report_token.unwrap());
    // The admin runs five commands: the audit trail.
    for i in 0..5 {
        let answer = h
            .client()
            .exec(&knit_client::ExecRequest {
                kind: "instance".into(),
                name: "workers-aaaaa".into(),
                argv: vec!["echo".into(), format!("audit-{i}")],
                timeout_seconds: None,
            })
            .unwrap();
        assert_eq!(answer.exit_code, 0);
    }
    // The node floods: each report a new failure (a new event), with a
    // reason far over the cap.
    let mut accepted = 0;
    let mut limited = Vec::new();
    for i in 0..200 {
        let reason = format!("flood {i} {}", "x".repeat(20_000));
        let (status, body) = node
            .raw(
                "POST",
                "/report/v1/events",
                Some(&failed("local.i-000a", "i-000a", reason)),
            )
            .unwrap();
        match status {
            204 => accepted += 1,
            429 => limited.push(body),
            other => panic!("report {i}: {other} {body}"),
        }
    }
    assert_eq!(accepted, 150, "the burst is let through");
    assert_eq!(limited.len(), 50, "the rest is refused");
    let refusal: serde_json::Value = serde_json::from_str(&limited[0]).unwrap();
    assert_eq!(refusal["code"], "RateLimited", "{refusal}");
    assert!(
        refusal["message"].as_str().unwrap().contains("retry in"),
        "{refusal}"
    );
    let text = answered(&h, "/metrics");
    assert_eq!(
        metric(&text, "knit_reports_refused_total{reason=\"rate\"}"),
        50.0
    );
    cp.store()
        .prune_events(knit_server::store::now_ms())
        .unwrap();
    let events = cp.store().events(100_000).unwrap();
    let audit: Vec<&str> = events
        .iter()
        .filter(|e| e.reason == "Exec")
        .map(|e| e.message.as_str())
        .collect();
    assert_eq!(audit.len(), 5, "every exec event is kept: {audit:?}");
    for i in 0..5 {
        assert!(
            audit.iter().any(|m| m.contains(&format!("audit-{i}"))),
            "{audit:?}"
        );
    }
    let noise = events.iter().filter(|e| e.reason == "PhaseFailed").count();
    assert!(
        noise <= 20,
        "the node's events are kept to their count: {noise}"
    );
    // Each reason was cut to the cap, with a marker.
    let failures: Vec<&str> = events
        .iter()
        .filter(|e| e.reason == "PhaseFailed")
        .map(|e| e.message.as_str())
        .collect();
    assert!(!failures.is_empty());
    for m in failures {
        assert!(m.len() < 4096 + 200, "{} bytes", m.len());
        assert!(m.contains("bytes in all]"), "{}", &m[m.len() - 60..]);
    }
}

#[test]
fn a_nodes_timeline_is_bounded() {
    use knit_server::store::MAX_TIMELINE_PER_NODE;
    let mut h = TestServer::new();
    h.start(None);
    h.client()
        .call("POST", "/api/v1/pools", Some(POOL))
        .unwrap();
    let cp = &h.server().control;
    cp.store()
        .add_create_intents(
            "workers",
            &[("workers-aaaaa".into(), "ecs.g7.large".into())],
        )
        .unwrap();
    cp.store()
        .set_instance_created("workers-aaaaa", "i-000a", Some("10.213.0.10"))
        .unwrap();
    let record = cp.store().instance("workers-aaaaa").unwrap().unwrap();
    let n = MAX_TIMELINE_PER_NODE as usize + 25;
    for i in 0..n {
        let event: PhaseEvent =
            serde_json::from_str(&failed("local.i-000a", "i-000a", format!("run {i}"))).unwrap();
        cp.store().record_phase_event(&record, &event).unwrap();
    }
    let timeline = cp.store().timeline("local.i-000a").unwrap();
    assert_eq!(timeline.len(), MAX_TIMELINE_PER_NODE as usize);
    // The newest are kept.
    assert_eq!(
        timeline.last().unwrap().reason.as_deref(),
        Some(format!("run {}", n - 1).as_str())
    );
}
