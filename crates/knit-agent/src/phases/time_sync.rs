//! `time-sync`: keep the node clock on NTP with chronyd (SPEC §1 3.1).

use crate::engine::{Ctx, Decision, Phase};
use crate::error::Result;
use crate::services::{self, ServiceSpec};
use knit_api::PhaseName;

pub struct TimeSync;

const SERVICE: &str = "chronyd";

/// Whether this process may set the system clock (CAP_SYS_TIME, bit 25).
fn can_set_clock() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << 25) != 0)
}

impl Phase for TimeSync {
    fn name(&self) -> PhaseName {
        PhaseName::TimeSync
    }

    fn inspect(&self, ctx: &Ctx) -> Result<Decision> {
        if !ctx.config.time_sync.enabled {
            return Ok(Decision::Skip("timeSync.enabled is false".to_string()));
        }
        if !ctx.host.is_live() {
            return Ok(Decision::Skip(
                "the clock belongs to the host: time sync runs only without --root".to_string(),
            ));
        }
        if ctx.host.find_program("chronyd").is_none() {
            return Ok(Decision::Skip(
                "chronyd is not installed in this image (package chrony)".to_string(),
            ));
        }
        if services::is_running(ctx.host, SERVICE) {
            return Ok(Decision::Done("chronyd is running".to_string()));
        }
        Ok(Decision::Run("chronyd is not running".to_string()))
    }

    fn run(&self, ctx: &mut Ctx) -> Result<String> {
        let program = ctx
            .host
            .find_program("chronyd")
            .unwrap_or_else(|| "chronyd".to_string());
        let mut exec = vec![program, "-d".to_string()];
        let mut note = String::new();
        if !can_set_clock() {
            // In a sandbox the clock is the host's: track NTP without setting it.
            exec.push("-x".to_string());
            note = " (without CAP_SYS_TIME: tracking only, clock left to the host)".to_string();
        }
        if !ctx.config.time_sync.servers.is_empty() {
            let conf: String = ctx
                .config
                .time_sync
                .servers
                .iter()
                .map(|s| format!("server {s} iburst\n"))
                .collect();
            ctx.host
                .write_file("/etc/chrony/conf.d/knit.conf", conf.as_bytes(), 0o644)?;
        }
        services::ensure_running(
            ctx.host,
            &ServiceSpec {
                name: SERVICE.to_string(),
                exec,
                env: vec![],
                limit_nofile: None,
                limit_core: None,
                limit_memlock: None,
                log_file: "/var/log/chronyd.log".to_string(),
            },
        )?;
        Ok(format!("chronyd started{note}"))
    }
}
