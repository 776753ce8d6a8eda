//! The whole path on a non-default local subnet with no advertise address
//! given: the server takes the instances' gateway from the provider (the
//! first host of --local-subnet), listens on loopback and that gateway
//! only, and a node made from a pool initializes through it. Root only (a
//! bridge, namespaces, loop devices); the harness gives this test a bridge
//! and a subnet (10.216.x.0/24) of its own and removes them afterwards.

mod common;

use common::{tail, Env};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// Kills the server this test started (by PID) on every way out.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn nodes_on_a_non_default_subnet_bootstrap_from_the_providers_gateway() {
    let env = Env::builder().build();
    env.build_package(false);
    let log_path = env.path("server.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let listen = format!(
        "127.0.0.1:{port},{gw}:{port}",
        port = env.port,
        gw = env.gateway
    );
    // No --advertise-address: the advertised host must be the gateway.
    let child = env
        .cmd()
        .args(["server", "--write-config", "--state-dir"])
        .arg(env.state_dir())
        .args(["--cluster", "none", "--listen", &listen])
        .args(["--local-bridge", &env.bridge, "--local-subnet", &env.subnet])
        .arg("--local-state-dir")
        .arg(env.path("local"))
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let _server = Server(child);
    let server_log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !(env.path("config").exists() && env.knit(&["get", "clusters"]).0) {
        assert!(
            Instant::now() < deadline,
            "server did not start:\n{}",
            tail(&server_log(), 40)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let expected = format!("https://{}:{}", env.gateway, env.port);
    assert!(
        server_log().contains(&format!("instances use {expected}")),
        "{}",
        tail(&server_log(), 40)
    );
    // Listening on loopback and the gateway, not everywhere.
    let mut addrs = common::listeners(&env.port.to_string());
    addrs.sort();
    let mut want = vec![
        format!("127.0.0.1:{}", env.port),
        format!("{}:{}", env.gateway, env.port),
    ];
    want.sort();
    assert_eq!(addrs, want);

    env.create(
        "workers",
        "apiVersion: knit.dev/v1alpha1\nkind: NodePool\nmetadata:\n  name: workers\nspec:\n  replicas: 0\n",
    );
    env.scale_wait("workers", 1);
    let nodes = env.nodes_of("workers");
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    assert_eq!(nodes[0]["initialized"], true, "{nodes:?}");
    // The instance's user data fetched from the gateway, never 10.213.0.1.
    let cloud = env.cloud();
    let instances = cloud.list().unwrap();
    assert_eq!(instances.len(), 1);
    let user_data = instances[0]
        .record
        .template
        .user_data
        .clone()
        .unwrap_or_default();
    assert!(
        // The stub's values are shell assignments at its top.
        user_data.contains(&format!("\nbootstrap_url={expected}/bootstrap/v1/config\n")),
        "{user_data}"
    );
    assert!(!user_data.contains("10.213.0.1"), "{user_data}");
    env.knit_ok(&["delete", "pool", "workers"]);
}
