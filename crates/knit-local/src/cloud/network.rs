//! The local cloud's network: the bridge and its metadata server, the
//! overflow bridges and which one a machine's port joins, a machine's
//! address and bandwidth.

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
                    overflow: Vec::new(),
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

    // ---- bridges ---------------------------------------------------------

    /// How this cloud's machines spread over bridges.
    pub(super) fn bridge_layout(&self) -> BridgeLayout {
        BridgeLayout::new(self.port_limit, self.subnet.machine_addresses())
    }

    /// Bridge `index` of the layout (0: the main one).
    fn bridge_name(&self, index: usize) -> String {
        if index == 0 {
            self.cfg.bridge.clone()
        } else {
            net::Overflow::of(&self.cfg.bridge, index + 1).bridge
        }
    }

    /// Machine ports in use on each bridge of the layout: its ports other
    /// than the links between the cloud's bridges, or the machines of
    /// `records` placed on it (some not yet joined), whichever is more.
    pub(super) fn bridge_use(&self, records: &[InstanceRecord], layout: &BridgeLayout) -> Vec<u64> {
        let links: BTreeSet<String> = (1..layout.bridges())
            .map(|i| net::Overflow::named(self.bridge_name(i)))
            .flat_map(|o| [o.main_end, o.own_end])
            .collect();
        (0..layout.bridges())
            .map(|i| {
                let name = self.bridge_name(i);
                let ports = bridge_ports(&name)
                    .iter()
                    .filter(|p| !links.contains(*p))
                    .count() as u64;
                let placed = records
                    .iter()
                    .filter(|r| r.bridge.as_deref() == Some(name.as_str()))
                    .count() as u64;
                ports.max(placed)
            })
            .collect()
    }

    /// Chooses the bridge `rec`'s port joins (the first with room), makes
    /// it if it is an overflow bridge not there yet, and records the choice
    /// (called under the state lock, with the cloud's network `n`).
    pub(super) fn place_port(
        &self,
        rec: &mut InstanceRecord,
        n: &mut NetworkRecord,
    ) -> Result<String> {
        // Deleted meanwhile: nothing is placed (see the end of `boot`).
        self.state.instance(&rec.id)?;
        let others: Vec<InstanceRecord> = self
            .state
            .instances()?
            .into_iter()
            .filter(|r| r.id != rec.id)
            .collect();
        let layout = self.bridge_layout();
        let used = self.bridge_use(&others, &layout);
        let index = layout
            .place(&used)
            .ok_or_else(|| bridge_ports_full(&self.cfg.bridge, &layout, &used, 0))?;
        let bridge = self.bridge_name(index);
        if index > 0 {
            self.ensure_overflow(net::Overflow::named(bridge.clone()), n)?;
        }
        rec.bridge = Some(bridge.clone());
        self.state.put_instance(rec)?;
        Ok(bridge)
    }

    /// Overflow bridge `o`, recorded in `n` before it is made; a link of
    /// that name this cloud did not record is someone else's.
    fn ensure_overflow(&self, o: net::Overflow, n: &mut NetworkRecord) -> Result<()> {
        if !n.overflow.contains(&o.bridge) {
            if let Some(taken) = [&o.bridge, &o.main_end, &o.own_end]
                .into_iter()
                .find(|l| net::link_exists(l))
            {
                return Err(LocalError::Busy {
                    what: format!("link {taken}"),
                    message: format!(
                        "it exists but is not managed by {}, and this local cloud needs that \
                         name for an overflow bridge of {}; remove it or pick another bridge name",
                        self.state.root().display(),
                        self.cfg.bridge
                    ),
                });
            }
            n.overflow.push(o.bridge.clone());
            self.state.put_network(n)?;
        }
        o.create(&self.cfg.bridge)
    }

    /// Removes the overflow bridges no machine is placed on and nothing but
    /// their link is a port of. After a machine's port went (delete, stop);
    /// a failure is logged, not returned: the machine's own operation
    /// succeeded, and `down` removes what is left.
    pub(super) fn release_bridges(&self) {
        if let Err(e) = self.try_release_bridges() {
            tracing::warn!(error = %e, "cannot remove an empty overflow bridge; `down` will");
        }
    }

    fn try_release_bridges(&self) -> Result<()> {
        let _lock = self.state.lock()?;
        let Some(mut n) = self.state.network()? else {
            return Ok(());
        };
        if n.overflow.is_empty() {
            return Ok(());
        }
        let records = self.state.instances()?;
        let mut kept = Vec::new();
        for name in std::mem::take(&mut n.overflow) {
            let o = net::Overflow::named(name);
            let placed = records
                .iter()
                .any(|r| r.bridge.as_deref() == Some(o.bridge.as_str()));
            let foreign = bridge_ports(&o.bridge).iter().any(|p| *p != o.own_end);
            if placed || foreign {
                kept.push(o.bridge);
                continue;
            }
            if let Err(e) = o.delete() {
                kept.push(o.bridge);
                n.overflow = kept;
                self.state.put_network(&n)?;
                return Err(e);
            }
            tracing::info!(bridge = %o.bridge, "empty overflow bridge removed");
        }
        n.overflow = kept;
        self.state.put_network(&n)
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
        knit_os::reap::when_done(child);
        Ok(r)
    }

    /// The requested address if it is usable, else the next free one.
    /// (`records`: every instance, read under the state lock).
    pub(super) fn pick_ip(
        &self,
        records: &[InstanceRecord],
        want: Option<&str>,
    ) -> Result<std::net::Ipv4Addr> {
        let used: BTreeSet<&str> = records.iter().map(|r| r.private_ip.as_str()).collect();
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
            .find(|ip| !used.contains(ip.to_string().as_str()))
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
