//! Readiness from real checks: the container runtime answers CRI
//! `RuntimeService/Version` and `Status` on its socket, and a CNI config
//! exists. Messages follow kubelet's wording so operators recognise them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{StatusRequest, VersionRequest};
use tonic::transport::{Endpoint, Uri};

use crate::error::SimError;

const CRI_TIMEOUT: Duration = Duration::from_secs(3);

pub struct Runtime {
    rt: tokio::runtime::Runtime,
    socket: PathBuf,
}

/// What one check found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Health {
    /// `containerd://1.6.20`, when the runtime answered.
    pub runtime_version: Option<String>,
    /// Why the node is not ready; empty means ready.
    pub problems: Vec<String>,
}

impl Runtime {
    pub fn new(endpoint: &str) -> Result<Runtime, SimError> {
        let socket = endpoint.strip_prefix("unix://").ok_or_else(|| {
            SimError::Flags(format!(
                "--container-runtime-endpoint={endpoint}: only unix:// sockets are supported"
            ))
        })?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| SimError::io("tokio runtime", e))?;
        Ok(Runtime {
            rt,
            socket: socket.into(),
        })
    }

    pub fn check(&self, cni_dir: &Path) -> Health {
        let mut h = self.rt.block_on(self.query());
        if let Some(p) = cni_problem(cni_dir) {
            h.problems.push(p);
        }
        h
    }

    async fn query(&self) -> Health {
        let channel = channel(&self.socket, CRI_TIMEOUT).await;
        let down = |e: &dyn std::fmt::Display| Health {
            runtime_version: None,
            problems: vec![format!("container runtime is down: {e}")],
        };
        let mut client = match channel {
            Ok(c) => RuntimeServiceClient::new(c),
            Err(e) => {
                return down(&format!(
                    "rpc error: code = Unavailable desc = connection error: dial unix {}: {}",
                    self.socket.display(),
                    chain(&e)
                ))
            }
        };
        let version = match client
            .version(VersionRequest {
                version: "v1".into(),
            })
            .await
        {
            Ok(v) => {
                let v = v.into_inner();
                Some(format!("{}://{}", v.runtime_name, v.runtime_version))
            }
            Err(e) => {
                return down(&format!(
                    "rpc error: code = {:?} desc = {}",
                    e.code(),
                    e.message()
                ))
            }
        };
        let status = match client.status(StatusRequest { verbose: false }).await {
            Ok(s) => s.into_inner(),
            Err(e) => {
                return down(&format!(
                    "rpc error: code = {:?} desc = {}",
                    e.code(),
                    e.message()
                ))
            }
        };
        let conditions = status.status.map(|s| s.conditions).unwrap_or_default();
        let mut problems = Vec::new();
        for wanted in ["RuntimeReady", "NetworkReady"] {
            match conditions.iter().find(|c| c.r#type == wanted) {
                Some(c) if c.status => {}
                Some(c) => problems.push(format!(
                    "{}: {wanted}=false reason:{} message:{}",
                    if wanted == "NetworkReady" {
                        "container runtime network not ready"
                    } else {
                        "container runtime not ready"
                    },
                    c.reason,
                    c.message
                )),
                None => problems.push(format!("container runtime did not report {wanted}")),
            }
        }
        Health {
            runtime_version: version,
            problems,
        }
    }
}

/// A gRPC channel over the runtime's unix socket; `timeout` bounds each call.
pub(crate) async fn channel(
    socket: &Path,
    timeout: Duration,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let socket = socket.to_path_buf();
    // The URI is required by tonic but unused: the connector dials the socket.
    Endpoint::from_static("http://[::1]:50051")
        .connect_timeout(CRI_TIMEOUT)
        .timeout(timeout)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move {
                tokio::net::UnixStream::connect(socket)
                    .await
                    .map(TokioIo::new)
            }
        }))
        .await
}

/// An error with its causes, `outer: inner: root`.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// kubelet needs a network config before pods can run.
pub fn cni_problem(dir: &Path) -> Option<String> {
    let has_config = std::fs::read_dir(dir).ok().is_some_and(|entries| {
        entries.flatten().any(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            [".conf", ".conflist", ".json"]
                .iter()
                .any(|ext| name.ends_with(ext))
        })
    });
    (!has_config).then(|| format!("network plugin is not ready: cni config uninitialized (no CNI configuration file in {})", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_socket_and_cni_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let rt = Runtime::new(&format!(
            "unix://{}",
            dir.path().join("nope.sock").display()
        ))
        .unwrap();
        let h = rt.check(dir.path());
        assert_eq!(h.runtime_version, None);
        assert!(
            h.problems[0].starts_with("container runtime is down"),
            "{h:?}"
        );
        assert!(h.problems[1].contains("cni config uninitialized"), "{h:?}");
        std::fs::write(dir.path().join("10-net.conflist"), "{}").unwrap();
        assert_eq!(cni_problem(dir.path()), None);
        assert!(Runtime::new("tcp://127.0.0.1:5").is_err());
    }
}
