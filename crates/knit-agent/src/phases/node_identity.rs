//! `node-identity`: the node name (`<region>.<instance-id>` or the pool's
//! custom name), recorded in the node; with a custom name, also the hostname.

use crate::error::{Context, Result};
use crate::phase::{Ctx, Decision, Phase};
use knit_api::{ErrorCode, PhaseName};

pub struct NodeIdentityPhase;

const NODE_NAME_FILE: &str = "/etc/knit/node-name";

impl Phase for NodeIdentityPhase {
    fn name(&self) -> PhaseName {
        PhaseName::NodeIdentity
    }

    fn inspect(&self, ctx: &Ctx) -> Result<Decision> {
        let recorded = ctx.host.read(NODE_NAME_FILE).map(|s| s.trim().to_string());
        let hostname_ok = match &ctx.node.hostname {
            Some(want) => ctx
                .host
                .read("/etc/hostname")
                .is_some_and(|h| h.trim() == want),
            None => true,
        };
        if recorded.as_deref() == Some(ctx.node.name.as_str()) && hostname_ok {
            return Ok(Decision::Done(format!("node name {}", ctx.node.name)));
        }
        Ok(Decision::Run(format!("set node name {}", ctx.node.name)))
    }

    fn run(&self, ctx: &mut Ctx) -> Result<String> {
        let name = ctx.node.name.clone();
        ctx.host
            .write_file(NODE_NAME_FILE, format!("{name}\n").as_bytes(), 0o644)?;
        let mut summary = format!(
            "node name {name}, node ID {}, IP {}",
            ctx.node.node_id, ctx.node.ip
        );
        if let Some(hostname) = ctx.node.hostname.clone() {
            ctx.host
                .write_file("/etc/hostname", format!("{hostname}\n").as_bytes(), 0o644)?;
            let hosts = ctx.host.read("/etc/hosts").unwrap_or_default();
            let entry = format!("{} {hostname}", ctx.node.ip);
            if !hosts
                .lines()
                .any(|l| l.split_whitespace().collect::<Vec<_>>().join(" ") == entry)
            {
                ctx.host
                    .write_file("/etc/hosts", format!("{hosts}{entry}\n").as_bytes(), 0o644)?;
            }
            // Only the machine's own UTS name; under --root the host is not ours.
            if ctx.host.is_live() {
                nix::unistd::sethostname(&hostname)
                    .context(ErrorCode::FailSetNodeIdentity, || {
                        format!("sethostname {hostname}")
                    })?;
            }
            summary.push_str(&format!(", hostname {hostname}"));
        }
        Ok(summary)
    }
}
