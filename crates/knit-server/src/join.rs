//! A node joining: an instance redeems its one-time join token for its
//! NodeConfig (`POST /bootstrap/v1/config`), then its agent reports each
//! phase with the report token that came in it (`POST /report/v1/events`).
//! The HTTP handlers (`crate::http::node_api`) hand the bearer token and
//! the caller's address to these calls.

use crate::bootstrap::{expected_node_name, node_config, NodeConfigInput, PackageRef};
use crate::control::ControlPlane;
use crate::error::{Result, ServerError};
use crate::names;
use crate::pki;
use crate::store::{now_ms, InstanceRecord, Redeem};
use knit_api::state::EventType;
use knit_api::{NodePool, PhaseEvent, PhaseName, PhaseOutcome};
use std::net::SocketAddr;

/// Redeems a join token for its instance's NodeConfig (YAML). Every refusal
/// is counted, logged and (with a token) an event naming the caller.
pub async fn bootstrap(
    cp: &ControlPlane,
    token: Option<&str>,
    peer_addr: Option<SocketAddr>,
) -> Result<String> {
    // The address without the port: refusals from one machine read alike
    // (and aggregate into one event).
    let peer = peer_addr
        .map(|p| p.ip().to_string())
        .unwrap_or_else(|| "unknown".into());
    let Some(token) = token else {
        cp.metrics.bootstrap_refused();
        tracing::warn!(%peer, "bootstrap refused: no token");
        return Err(ServerError::TokenRefused("no bearer token".into()));
    };
    let refuse = |instance: Option<&str>, why: String| -> Result<String> {
        cp.metrics.bootstrap_refused();
        tracing::warn!(%peer, reason = %why, "bootstrap refused");
        cp.store.add_event(
            EventType::Warning,
            "Instance",
            instance.unwrap_or("-"),
            "BootstrapRefused",
            &format!("{why} (from {peer})"),
        )?;
        Err(ServerError::TokenRefused(why))
    };
    let now = now_ms();
    let hash = pki::token_hash(token);
    // The token's kind before anything is spent: an attach token presented
    // here is refused and stays usable for its own command.
    if token.starts_with(crate::attach::ATTACH_TOKEN_PREFIX)
        || cp
            .store
            .live_join_token(&hash, now)?
            .is_some_and(|(instance, _)| instance == crate::attach::ATTACH_SENTINEL)
    {
        return refuse(
            None,
            "an attach token cannot bootstrap a node: run the attach command it came with (knit attach-script)".into(),
        );
    }
    // The node the instance will be, before the token is spent: a token
    // that cannot be bound to a node name is never minted.
    if let Some((instance_name, pool_name)) = cp.store.live_join_token(&hash, now)? {
        if let (Some(instance), Some(pool)) = (
            cp.store.instance(&instance_name)?,
            cp.store.pool(&pool_name)?,
        ) {
            let mut instance = instance;
            fill_peer_ip(&mut instance, peer_addr);
            bound_node_name(cp, &instance, &pool.pool)?;
        }
    }
    let (instance_name, pool_name) = match cp.store.redeem_join_token(&hash, now)? {
        Redeem::Ok { instance, pool } => (instance, pool),
        Redeem::Unknown => return refuse(None, "unknown token".into()),
        Redeem::Used { instance, used_ms } => {
            return refuse(
                Some(&instance),
                format!("token already used {} s ago", (now - used_ms) / 1000),
            )
        }
        Redeem::Expired {
            instance,
            expires_ms,
        } => {
            return refuse(
                Some(&instance),
                format!("token expired {} s ago", (now - expires_ms) / 1000),
            )
        }
    };
    let mut instance = cp
        .store
        .instance(&instance_name)?
        .ok_or_else(|| ServerError::Conflict(format!("instance {instance_name} was removed")))?;
    let pool = cp
        .store
        .pool(&pool_name)?
        .ok_or_else(|| ServerError::Conflict(format!("pool {pool_name} was removed")))?;
    let cluster = cp.cluster_doc()?;
    fill_peer_ip(&mut instance, peer_addr);
    let node_name = bound_node_name(cp, &instance, &pool.pool)?;
    // The report token names its node; only its hash is stored, against
    // its instance, so the name in it cannot be changed by the holder.
    let report_token = format!("{}.{node_name}", pki::random_hex(32)?);
    cp.store
        .set_report_token_hash(&instance.name, &pki::token_hash(&report_token))?;
    let join = cp.cluster.join_material(&pool_name, &node_name).await?;
    let version = crate::bootstrap::node_kubernetes_version(&cluster, &pool.pool);
    let tarball = format!("pkg/kubernetes/kubernetes-{version}-linux-amd64.tar.gz");
    let mut config = node_config(NodeConfigInput {
        cluster: &cluster,
        pool: &pool.pool,
        instance: &instance,
        join,
        package: PackageRef {
            url: format!("{}/mirror/{tarball}", cp.advertise_url),
            sha256: cp.mirror_sha256(&tarball)?,
        },
        report_url: format!("{}/report/v1/events", cp.advertise_url),
        report_token,
        control_plane_ca_pem: cp.ca_pem.clone(),
        default_zone: cp.provider.as_ref().and_then(|p| p.default_zone()),
    });
    crate::attach::adjust_config(cp, &instance, &mut config)?;
    // On the local cloud, system images come from this server's registry.
    crate::registry::apply_default_mirrors(cp, &mut config);
    config.validate().map_err(|e| {
        ServerError::Internal(format!(
            "the NodeConfig made for {instance_name} does not validate: {e}"
        ))
    })?;
    cp.store.add_event(
        EventType::Normal,
        "Instance",
        &instance_name,
        "Bootstrapped",
        &format!("NodeConfig sent to {peer}"),
    )?;
    Ok(config.to_yaml())
}

/// Instances reach the server directly over the bridge: the peer is the
/// instance's own address when the provider has not said it.
fn fill_peer_ip(instance: &mut InstanceRecord, peer: Option<SocketAddr>) {
    if instance.ip.is_none() {
        instance.ip = peer.map(|p| p.ip().to_string());
    }
}

/// The node name an instance's credentials are bound to: the kept name of
/// an added instance, else the pool's rule. Refused when it cannot be
/// computed yet (no instance id or IP known) or is no valid node name:
/// a credential is never minted unbound.
fn bound_node_name(
    cp: &ControlPlane,
    instance: &InstanceRecord,
    pool: &NodePool,
) -> Result<String> {
    let name = match crate::attach::node_name(cp, instance)? {
        Some(kept) => Some(kept),
        None => expected_node_name(&cp.cluster_doc()?.spec.region, instance, pool),
    };
    let Some(name) = name else {
        return Err(ServerError::Conflict(format!(
            "instance {}'s node name cannot be computed yet (its provider id or address is not recorded): retry in a few seconds",
            instance.name
        )));
    };
    names::check_node("node name", &name)?;
    Ok(name)
}

/// The node a report token is bound to (the part after its first `.`).
fn report_token_node(token: &str) -> Option<&str> {
    token
        .split_once('.')
        .map(|(_, node)| node)
        .filter(|n| !n.is_empty())
}

/// The instance a report token was issued to; refused without one.
pub fn reporter(cp: &ControlPlane, token: Option<&str>) -> Result<InstanceRecord> {
    let token = token.ok_or_else(|| ServerError::Unauthorized("no bearer token".into()))?;
    cp.store
        .instance_by_report_token(&pki::token_hash(token))?
        .ok_or_else(|| ServerError::Unauthorized("unknown report token".into()))
}

/// Records one phase event of `instance` (the holder of `token`, see
/// [`reporter`]): only about the node and instance the token is bound to.
pub fn record_report(
    cp: &ControlPlane,
    instance: &InstanceRecord,
    token: &str,
    event: &PhaseEvent,
) -> Result<()> {
    let Some(bound) = report_token_node(token) else {
        return Err(ServerError::Forbidden(format!(
            "this report token of instance {} names no node (issued before reports were bound to nodes): re-bootstrap the instance",
            instance.name
        )));
    };
    if event.node != bound {
        return Err(ServerError::Forbidden(format!(
            "this report token belongs to node {bound} (instance {}): a report about node {:?} is refused",
            instance.name, event.node
        )));
    }
    if let Some(id) = &instance.provider_id {
        if &event.instance_id != id {
            return Err(ServerError::Forbidden(format!(
                "this report token belongs to instance {id} (node {bound}), not {:?}",
                event.instance_id
            )));
        }
    }
    let initialized_before = cp.store.node(&event.node)?.is_some_and(|n| n.initialized());
    cp.store.record_phase_event(instance, event)?;
    if let Some(ms) = event.duration_ms {
        if event.outcome != PhaseOutcome::Started {
            cp.metrics.phase_duration(event.phase.as_str(), ms);
        }
    }
    match event.outcome {
        PhaseOutcome::Failed => cp.store.add_event(
            EventType::Warning,
            "Node",
            &event.node,
            "PhaseFailed",
            &format!(
                "{} failed{}: {}",
                event.phase,
                event
                    .error_code
                    .map(|c| format!(" ({c})"))
                    .unwrap_or_default(),
                event.reason.as_deref().unwrap_or("no reason given")
            ),
        )?,
        PhaseOutcome::Done | PhaseOutcome::Skipped if event.phase == PhaseName::Hardening => {
            // The first time only: a re-run after a reboot is no start-up.
            if !initialized_before && !instance.added {
                cp.metrics.node_startup(
                    crate::metrics::StartupStage::Initialized,
                    &instance.pool,
                    cp.provider.as_ref().map_or("none", |p| p.name()),
                    instance.created_ms,
                    crate::store::now_ms(),
                );
            }
            cp.store.add_event(
                EventType::Normal,
                "Node",
                &event.node,
                "Initialized",
                "every phase finished",
            )?
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::report_token_node;

    #[test]
    fn a_report_token_names_its_node_after_the_first_dot() {
        assert_eq!(
            report_token_node("ab12.cn-local.10.88.0.2"),
            Some("cn-local.10.88.0.2")
        );
        assert_eq!(report_token_node("ab12."), None);
        assert_eq!(report_token_node("ab12"), None);
    }
}
