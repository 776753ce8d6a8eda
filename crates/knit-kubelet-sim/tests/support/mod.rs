//! What the stand-in's end-to-end suites share: the processes they start
//! (killed by PID when dropped, also on panic), their own containerd, the
//! bootstrap kubeconfig, and waiting on a Node with the logs shown on
//! timeout. Each suite also includes knit-cluster's test `common` module
//! (the admin client, `wait_for`, `blocking`).

#![allow(dead_code)] // each suite uses its own part

use crate::common::{wait_for, Client};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub const SIM: &str = env!("CARGO_BIN_EXE_knit-kubelet-sim");

/// A CNI configuration with which containerd reports NetworkReady.
pub const CNI_CONFLIST: &str = r#"{"cniVersion": "0.4.0", "name": "knit", "plugins": [{"type": "bridge", "bridge": "knit0"}]}"#;

/// A child process killed (by its PID) when dropped, also on panic.
pub struct Proc {
    child: Child,
    log: PathBuf,
}

impl Proc {
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on the PID of our own child; no memory is shared.
        let rc = unsafe { libc::kill(self.child.id() as i32, sig) };
        assert_eq!(rc, 0, "kill({sig}) failed");
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Wait for exit (bounded); the exit status and the log.
    pub fn wait_exit(&mut self, limit: Duration) -> (std::process::ExitStatus, String) {
        let st = wait_for("process exit", limit, || self.child.try_wait().unwrap());
        (st, self.log())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // A stopped process must be continued to die promptly.
        // SAFETY: as in `signal`.
        let _ = unsafe { libc::kill(self.child.id() as i32, libc::SIGCONT) };
        self.kill();
    }
}

/// Starts `bin` with its output in `log`.
pub fn spawn(bin: &str, args: &[String], log: PathBuf) -> Proc {
    let out = std::fs::File::create(&log).unwrap();
    let child = Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {bin}: {e}"));
    Proc { child, log }
}

pub fn which(bin: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(bin))
        .find(|p| p.is_file())
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Our own containerd: root, state, sockets and CNI dir under `dir`. With
/// `registry` (`host:port`), `registry.k8s.io` and `docker.io` are mirrored
/// to it over plain HTTP, as the agent renders `certs.d/<host>/hosts.toml`.
pub fn start_containerd(dir: &Path, cni: &Path, registry: Option<&str>) -> Proc {
    let bin = which("containerd").expect("containerd checked by the caller");
    let d = dir.display();
    let mut registry_config = String::new();
    if let Some(reg) = registry {
        for host in ["registry.k8s.io", "docker.io"] {
            let hd = dir.join("certs.d").join(host);
            std::fs::create_dir_all(&hd).unwrap();
            std::fs::write(
                hd.join("hosts.toml"),
                // The local registry is the server itself: a miss never
                // falls back to the internet.
                format!("server = \"http://{reg}\"\n\n[host.\"http://{reg}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"),
            )
            .unwrap();
        }
        registry_config = format!(
            "[plugins.\"io.containerd.grpc.v1.cri\".registry]\n    config_path = \"{d}/certs.d\"\n"
        );
    }
    let cfg = dir.join("containerd.toml");
    std::fs::write(
        &cfg,
        format!(
            "version = 2\nroot = \"{d}/root\"\nstate = \"{d}/state\"\n\
             [grpc]\n  address = \"{d}/containerd.sock\"\n[ttrpc]\n  address = \"{d}/containerd-ttrpc.sock\"\n\
             [debug]\n  address = \"\"\n[metrics]\n  address = \"\"\n\
             [plugins.\"io.containerd.grpc.v1.cri\"]\n  disable_tcp_service = true\n\
             [plugins.\"io.containerd.grpc.v1.cri\".cni]\n    conf_dir = \"{}\"\n    bin_dir = \"{d}/cni-bin\"\n\
             {registry_config}",
            cni.display()
        ),
    )
    .unwrap();
    let _ = std::fs::remove_file(dir.join("containerd.sock"));
    let p = spawn(
        bin.to_str().unwrap(),
        &["--config".into(), cfg.display().to_string()],
        dir.join("containerd.log"),
    );
    wait_for("containerd socket", Duration::from_secs(60), || {
        dir.join("containerd.sock").exists().then_some(())
    });
    p
}

/// The bootstrap kubeconfig the agent writes: the cluster's CA and a
/// bootstrap token.
pub fn bootstrap_kubeconfig(path: &Path, server: &str, ca_pem: &str, token: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(
        path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: default-cluster\n  cluster:\n    server: {server}\n    certificate-authority-data: {}\ncontexts:\n- name: tls-bootstrap-token-user@kubernetes\n  context:\n    cluster: default-cluster\n    user: tls-bootstrap-token-user\ncurrent-context: tls-bootstrap-token-user@kubernetes\nusers:\n- name: tls-bootstrap-token-user\n  user:\n    token: {token}\n",
            STANDARD.encode(ca_pem)
        ),
    )
    .unwrap();
}

/// Waits (up to `limit`) until node `name` satisfies `f`; on timeout, the
/// last state of the node and the stand-in's log.
pub fn wait_node(
    admin: &Client,
    name: &str,
    what: &str,
    sim: &Proc,
    limit: Duration,
    f: impl Fn(&Value) -> bool,
) -> Value {
    let found = std::cell::RefCell::new(Value::Null);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for(what, limit, || {
            let (code, n) = admin.get(&format!("/api/v1/nodes/{name}"));
            *found.borrow_mut() = n.clone();
            (code == 200 && f(&n)).then_some(n)
        })
    }));
    result.unwrap_or_else(|_| {
        panic!(
            "{what}: last node state {}\nsim log:\n{}",
            found.borrow(),
            sim.log()
        )
    })
}

/// The renew time of node `name`'s Lease ("" when there is none).
pub fn lease_renew_time(admin: &Client, name: &str) -> String {
    admin
        .get(&format!(
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}"
        ))
        .1["spec"]["renewTime"]
        .as_str()
        .unwrap_or("")
        .to_string()
}
