//! The local cloud's network: the bridge and its metadata server, a
//! machine's address and bandwidth.

use super::*;

impl Cloud {
    // ---- network -------------------------------------------------------

    /// The state directory's network (bridge with the gateway address,
    /// metadata server), made now if missing, as the first instance would
    /// make it: so that a host service (e.g. a registry) can listen on the
    /// bridge address alone before any instance exists. `down` removes it.
    pub fn network_up(&self) -> Result<NetworkRecord> {
        let _lock = self.state.lock()?;
        self.ensure_network()
    }

    pub(super) fn ensure_network(&self) -> Result<NetworkRecord> {
        let mut rec = match self.state.network()? {
            Some(n) if n.bridge != self.cfg.bridge || n.subnet != self.subnet.to_string() => {
                return Err(LocalError::invalid(
                    "bridge/subnet",
                    format!("{} {}", self.cfg.bridge, self.subnet),
                    format!("must match the state directory's network ({} {}); run `down` first to change it", n.bridge, n.subnet),
                ));
            }
            Some(n) => n,
            None => {
                net::check_network(&self.cfg.bridge, &self.cfg.subnet)?;
                if net::link_exists(&self.cfg.bridge) {
                    return Err(LocalError::Busy {
                        what: format!("bridge {}", self.cfg.bridge),
                        message: format!(
                            "it exists but is not managed by {}; pick another bridge name",
                            self.state.root().display()
                        ),
                    });
                }
                let gateway = self.gateway()?;
                let n = NetworkRecord {
                    bridge: self.cfg.bridge.clone(),
                    subnet: self.subnet.to_string(),
                    gateway: gateway.to_string(),
                    metadata_port: self.cfg.metadata_port,
                    metadata: None,
                };
                self.state.put_network(&n)?;
                n
            }
        };
        if !net::link_exists(&rec.bridge) {
            net::create_bridge(&rec.bridge, self.gateway()?, self.subnet.prefix)?;
        }
        if !rec.metadata.is_some_and(|m| m.alive()) {
            rec.metadata = Some(self.spawn_metadata(&rec)?);
            self.state.put_network(&rec)?;
        }
        Ok(rec)
    }

    pub(super) fn gateway(&self) -> Result<std::net::Ipv4Addr> {
        self.subnet.host(1).ok_or_else(|| {
            LocalError::invalid(
                "subnet",
                format!("{:?}", self.cfg.subnet),
                "must hold at least a gateway and one instance",
            )
        })
    }

    pub(super) fn spawn_metadata(&self, n: &NetworkRecord) -> Result<ProcRef> {
        let listen = format!("{}:{}", n.gateway, n.metadata_port);
        let log = self.state.root().join("metadata.log");
        let log_file = std::fs::File::options()
            .create(true)
            .append(true)
            .open(&log)
            .ctx("cannot open", &log)?;
        let mut cmd = Command::new(self.helper()?);
        cmd.arg("__metadata")
            .arg("--state-dir")
            .arg(self.state.root())
            .arg("--listen")
            .arg(&listen)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file);
        // SAFETY: setsid is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        let mut child = cmd
            .spawn()
            .ctx("cannot start metadata server", self.helper()?)?;
        let pid = child.id() as i32;
        let addr: std::net::SocketAddr = listen.parse().map_err(|_| {
            LocalError::invalid("metadataPort", n.metadata_port, "must form a valid address")
        })?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                break;
            }
            if let Ok(Some(status)) = child.try_wait() {
                return Err(LocalError::Boot {
                    id: "metadata".into(),
                    message: format!("metadata server exited ({status}); see {}", log.display()),
                });
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(LocalError::Boot {
                    id: "metadata".into(),
                    message: format!("metadata server not listening on {listen} after 10s"),
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let r = ProcRef::of(pid).ok_or_else(|| LocalError::Boot {
            id: "metadata".into(),
            message: "metadata server vanished".into(),
        })?;
        std::thread::spawn(move || child.wait());
        Ok(r)
    }

    /// The requested address if it is usable, else the next free one.
    pub(super) fn pick_ip(&self, want: Option<&str>) -> Result<std::net::Ipv4Addr> {
        let used: BTreeSet<String> = self
            .state
            .instances()?
            .into_iter()
            .map(|r| r.private_ip)
            .collect();
        if let Some(want) = want {
            let ok = (2..)
                .map_while(|n| self.subnet.host(n))
                .any(|ip| ip.to_string() == want);
            if !ok {
                return Err(LocalError::invalid(
                    "privateIp",
                    format!("{want:?}"),
                    format!(
                        "must be a host address of {} other than the gateway",
                        self.subnet
                    ),
                ));
            }
            if used.contains(want) {
                return Err(LocalError::invalid(
                    "privateIp",
                    format!("{want:?}"),
                    "is already used by another instance",
                ));
            }
            return want.parse().map_err(|_| {
                LocalError::invalid("privateIp", format!("{want:?}"), "must be an IPv4 address")
            });
        }
        (2..)
            .map_while(|n| self.subnet.host(n))
            .find(|ip| !used.contains(&ip.to_string()))
            .ok_or_else(|| LocalError::Busy {
                what: format!("subnet {}", self.subnet),
                message: "no free address left".into(),
            })
    }

    /// Changes (or with `None` removes) the shaping of a running instance's link.
    pub fn set_bandwidth(&self, id: &str, mbit: Option<u32>) -> Result<()> {
        if mbit == Some(0) {
            return Err(LocalError::invalid(
                "bandwidthMbit",
                0,
                "must be > 0 (omit it for an unshaped link)",
            ));
        }
        let mut rec = self.running(id, "shape")?;
        net::shape(&rec.veth, &rec.netns, mbit)?;
        rec.template.bandwidth_mbit = mbit;
        self.state.put_instance(&rec)
    }
}
