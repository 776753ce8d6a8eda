//! A VM's network: the bridge, its address, its TAP and the guard that
//! pins the TAP to the VM's MAC and address.

use super::*;

impl Machines {
    pub(super) fn require_bridge(&self) -> Result<()> {
        if !Path::new("/sys/class/net")
            .join(&self.cfg.bridge)
            .join("bridge")
            .is_dir()
        {
            return Err(QemuError::invalid(
                "bridge",
                &self.cfg.bridge,
                "must be an existing bridge (the local cloud's, made by `knit local network-up`)",
            ));
        }
        Ok(())
    }

    /// The requested address if free, else the highest free one (the local
    /// cloud hands out addresses from the bottom of the subnet).
    pub(super) fn pick_ip(&self, want: Option<Ipv4Addr>) -> Result<Ipv4Addr> {
        let mut used: BTreeSet<Ipv4Addr> = self
            .state
            .vms()?
            .iter()
            .filter_map(|r| r.ip.parse().ok())
            .collect();
        if let Some(reserved) = &self.cfg.reserved {
            used.extend(reserved());
        }
        let size = 1u64 << (32 - self.subnet.prefix);
        let hosts = (2..size.saturating_sub(1) as u32).filter_map(|n| self.subnet.host(n));
        if let Some(want) = want {
            if !hosts.clone().any(|h| h == want) {
                return Err(QemuError::invalid(
                    "ip",
                    want,
                    format!(
                        "must be a host address of {} other than the gateway",
                        self.subnet
                    ),
                ));
            }
            if used.contains(&want) {
                return Err(QemuError::invalid("ip", want, "is already in use"));
            }
            return Ok(want);
        }
        hosts
            .rev()
            .find(|h| !used.contains(h))
            .ok_or_else(|| QemuError::Busy {
                what: format!("subnet {}", self.subnet),
                message: "no free address left".into(),
            })
    }

    /// The anti-spoofing guard of the local cloud's instances
    /// (`knit_local::net::guard_rules`) on the VM's tap: only IPv4 from its
    /// address and ARP for it, from its MAC, leave the VM.
    pub(super) fn guard_add(&self, rec: &VmRecord, dir: &Path) -> Result<()> {
        let rules = knit_local::net::guard_rules(&guard_of(rec, dir)?);
        let file = dir.join("guard.nft");
        write_private(&file, rules.as_bytes())?;
        let applied = run("nft", &["-f", &file.display().to_string()], CMD_TIMEOUT);
        let _ = std::fs::remove_file(&file);
        match applied {
            Err(QemuError::Command { status, .. }) if status == "not started" => {
                Err(QemuError::Command {
                    command: "nft".into(),
                    status: "not installed".into(),
                    stderr: "nft (Debian package nftables) guards every VM's tap against address \
                             spoofing; install it (scripts/setup.sh)"
                        .into(),
                })
            }
            other => other.map(|_| ()),
        }
    }

    /// The tap and its guard (the kernel keeps a port's set elements when
    /// its link goes).
    pub(super) fn release_tap(&self, rec: &VmRecord, dir: &Path) -> Result<()> {
        if link_exists(&rec.tap) {
            run("ip", &["link", "delete", "dev", &rec.tap], CMD_TIMEOUT)?;
        }
        guard_del(&guard_of(rec, dir)?, dir)
    }
}

/// The guard of a VM's tap on its bridge.
fn guard_of<'a>(rec: &'a VmRecord, dir: &Path) -> Result<knit_local::net::Guard<'a>> {
    let ip: Ipv4Addr = rec.ip.parse().map_err(|_| QemuError::State {
        path: dir.join("vm.json").display().to_string(),
        message: format!("ip {:?} is not an IPv4 address", rec.ip),
    })?;
    Ok(knit_local::net::Guard {
        bridge: &rec.bridge,
        port: &rec.tap,
        mac: &rec.mac,
        ip,
    })
}

/// Removes the guard of a tap, if any (`knit_local::net::guard_del_rules`).
pub(super) fn guard_del(guard: &knit_local::net::Guard, dir: &Path) -> Result<()> {
    let file = dir.join("unguard.nft");
    write_private(&file, knit_local::net::guard_del_rules(guard).as_bytes())?;
    let removed = run("nft", &["-f", &file.display().to_string()], CMD_TIMEOUT);
    let _ = std::fs::remove_file(&file);
    match removed {
        Ok(_) => Ok(()),
        Err(QemuError::Command { stderr, .. })
            if stderr.contains(knit_local::net::GUARD_ABSENT) =>
        {
            Ok(())
        }
        // Without nft no guard can have been made.
        Err(QemuError::Command { status, .. }) if status == "not started" => Ok(()),
        Err(e) => Err(e),
    }
}

pub(super) fn colon_hex(hex: &str) -> String {
    hex.as_bytes()
        .chunks(2)
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect::<Vec<_>>()
        .join(":")
}

pub(super) fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

pub(super) fn valid_link_name(field: &str, name: &str) -> Result<()> {
    if name.is_empty()
        || name.len() > 15
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err(QemuError::invalid(
            field,
            format!("{name:?}"),
            "must be a link name: 1-15 letters, digits, '-', '_' or '.'",
        ));
    }
    Ok(())
}
