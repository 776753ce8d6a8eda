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
use knit_api::routes::Route;
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
            url: format!("{}{}", cp.advertise_url, Route::Mirror.fill(&[&tarball])),
            sha256: cp.mirror_sha256(&tarball)?,
        },
        report_url: format!("{}{}", cp.advertise_url, Route::Report.path()),
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
    Ok(config.to_yaml()?)
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

/// The longest reason of a report kept: a longer one is cut there, with
/// [`cut_reason`]'s marker saying how long it was.
pub const MAX_REPORT_REASON_BYTES: usize = 4096;

/// `reason` cut to [`MAX_REPORT_REASON_BYTES`] (on a character boundary),
/// with a marker naming its full length; a shorter one as it is.
pub fn cut_reason(reason: &str) -> std::borrow::Cow<'_, str> {
    if reason.len() <= MAX_REPORT_REASON_BYTES {
        return std::borrow::Cow::Borrowed(reason);
    }
    let mut end = MAX_REPORT_REASON_BYTES;
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    std::borrow::Cow::Owned(format!(
        "{}… [cut: {} bytes in all]",
        &reason[..end],
        reason.len()
    ))
}

/// Takes one report from the allowance of the node holding `token`;
/// refused (429, with when to retry) when it is spent. The agent keeps a
/// refused event and sends it again with its next one.
pub fn allow_report(cp: &ControlPlane, token: &str) -> Result<()> {
    let limits = &cp.settings.limits;
    let key = pki::token_hash(token);
    cp.report_limiter
        .take(&key, limits.report_burst, limits.report_refill)
        .map_err(|wait| {
            cp.metrics.report_refused("rate");
            ServerError::RateLimited {
                what: format!(
                    "node reports of this node: {} at once, then one every {:.1} s",
                    limits.report_burst,
                    limits.report_refill.as_secs_f64()
                ),
                retry_after_secs: wait.as_secs().max(1),
            }
        })
}

/// Records one phase event of `instance` (the holder of `token`, see
/// [`reporter`]): only about the node and instance the token is bound to.
/// A reason over [`MAX_REPORT_REASON_BYTES`] is cut ([`cut_reason`]).
pub fn record_report(
    cp: &ControlPlane,
    instance: &InstanceRecord,
    token: &str,
    event: &PhaseEvent,
) -> Result<()> {
    let cut;
    let event = match event.reason.as_deref().map(cut_reason) {
        Some(std::borrow::Cow::Owned(reason)) => {
            cut = PhaseEvent {
                reason: Some(reason),
                ..event.clone()
            };
            &cut
        }
        _ => event,
    };
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
        PhaseOutcome::Done | PhaseOutcome::Skipped if event.phase == PhaseName::LAST => {
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
    fn long_reasons_are_cut_with_a_marker_on_a_character_boundary() {
        use super::{cut_reason, MAX_REPORT_REASON_BYTES};
        assert_eq!(cut_reason("short"), "short");
        let exact = "x".repeat(MAX_REPORT_REASON_BYTES);
        assert_eq!(cut_reason(&exact), exact);
        // Multi-byte characters across the limit: cut before the one that
        // does not fit.
        let long = "é".repeat(MAX_REPORT_REASON_BYTES);
        let cut = cut_reason(&long);
        assert!(
            cut.ends_with(&format!("… [cut: {} bytes in all]", long.len())),
            "{cut}"
        );
        let kept = cut.split('…').next().unwrap();
        assert_eq!(kept.len(), MAX_REPORT_REASON_BYTES);
        assert!(kept.chars().all(|c| c == 'é'));
    }

    #[test]
    fn a_report_bucket_allows_its_burst_then_its_rate() {
        use crate::control::ReportLimiter;
        use std::time::Duration;
        let l = ReportLimiter::default();
        for _ in 0..3 {
            l.take("a", 3, Duration::from_secs(3600)).unwrap();
        }
        let wait = l.take("a", 3, Duration::from_secs(3600)).unwrap_err();
        assert!(wait > Duration::from_secs(3000), "{wait:?}");
        // Another node has its own bucket.
        l.take("b", 3, Duration::from_secs(3600)).unwrap();
        // A fast refill gives the bucket back.
        let l = ReportLimiter::default();
        l.take("c", 1, Duration::from_millis(1)).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        l.take("c", 1, Duration::from_millis(1)).unwrap();
    }

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
