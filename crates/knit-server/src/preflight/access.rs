//! Reaching the API server and being reached by it: the API server
//! whitelist and the instance's security groups.

use super::*;
use knit_api::parse_cidr;
use std::net::IpAddr;

pub(super) fn run(
    o: &mut Out,
    cluster: &Cluster,
    pool: &NodePool,
    i: &InstanceFacts,
    ctx: &Context,
) {
    let spec = &cluster.spec;
    let ps = &pool.spec;
    let ip: Option<IpAddr> = i.ip.as_deref().and_then(|s| s.parse().ok());

    // API server whitelist.
    match ip {
        Some(a) => o.require(
            API_WHITELIST,
            spec.whitelist_allows(a),
            format!("{a} is in the API server whitelist"),
            failure(
                format!(
                    "instance address {a} is not in the API server whitelist ({})",
                    spec.api_server_whitelist.join(", ")
                ),
                format!("add {a}/32 (or its subnet) to the cluster's apiServerWhitelist"),
            ),
        ),
        None => o.fail(
            API_WHITELIST,
            failure(
                format!("instance {} has no private IP address", i.id),
                "start the instance so it gets an address",
            ),
        ),
    }

    // Security groups: type, access to the API server, conflicts, count.
    check_security_groups(o, ps.security_group_type.as_str(), i, ctx, ip);
}

/// Port range `a/b` contains `port`; none or `-1/-1` is every port.
fn port_in(range: Option<&str>, port: u16) -> bool {
    let Some(r) = range else { return true };
    let Some((a, b)) = r.split_once('/') else {
        return false;
    };
    match (a.trim().parse::<i64>(), b.trim().parse::<i64>()) {
        (Ok(-1), Ok(-1)) => true,
        (Ok(a), Ok(b)) => (a..=b).contains(&i64::from(port)),
        _ => false,
    }
}

fn cidr_has(cidr: Option<&str>, ip: Option<IpAddr>) -> bool {
    match (cidr, ip) {
        (None, _) => true,
        (Some(c), Some(ip)) => parse_cidr(c).is_some_and(|c| c.contains(ip)),
        (Some(c), None) => c == "0.0.0.0/0",
    }
}

/// The first rule (accept or drop) of the instance's groups that matches
/// traffic `direction` / tcp / `port` / `peer`. Drop wins over accept for
/// the same match, as in ECS at equal priority.
fn matching<'a>(
    groups: &'a [SecurityGroupFacts],
    direction: &str,
    port: u16,
    peer: Option<IpAddr>,
) -> (Option<&'a RuleFacts>, Option<&'a RuleFacts>) {
    let rules = groups.iter().flat_map(|g| g.rules.iter()).filter(|r| {
        r.direction == direction
            && (r.protocol == "tcp" || r.protocol == "all")
            && port_in(r.port_range.as_deref(), port)
            && cidr_has(r.cidr.as_deref(), peer)
    });
    let (mut accept, mut drop) = (None, None);
    for r in rules {
        if r.policy == "drop" {
            drop.get_or_insert(r);
        } else {
            accept.get_or_insert(r);
        }
    }
    (accept, drop)
}

fn rule_text(r: &RuleFacts) -> String {
    format!(
        "{} {} {} {} {}",
        r.direction,
        r.protocol,
        r.port_range.as_deref().unwrap_or("all ports"),
        r.cidr.as_deref().unwrap_or("anywhere"),
        r.policy
    )
}

fn check_security_groups(
    o: &mut Out,
    pool_type: &str,
    i: &InstanceFacts,
    ctx: &Context,
    node_ip: Option<IpAddr>,
) {
    let groups = &i.security_groups;
    let wrong: Vec<String> = groups
        .iter()
        .filter(|g| g.kind != pool_type)
        .map(|g| format!("{} ({})", g.id, g.kind))
        .collect();
    if groups.is_empty() {
        o.fail(
            SG_TYPE,
            failure(
                format!("instance {} is in no security group", i.id),
                format!("put it in a {pool_type} security group"),
            ),
        );
    } else {
        o.require(
            SG_TYPE,
            wrong.is_empty(),
            format!("{pool_type} security group(s)"),
            failure(
                format!(
                    "security group(s) {} are not of the pool's type {pool_type}",
                    wrong.join(", ")
                ),
                format!("move the instance into {pool_type} security groups only"),
            ),
        );
    }

    let api_ip = &ctx.api_server_ip;
    let api: Option<IpAddr> = api_ip.parse().ok();
    let (accept, drop) = matching(groups, "egress", API_SERVER_PORT, api);
    // Normal groups allow all egress unless a rule drops it; enterprise
    // groups deny egress unless a rule accepts it.
    let enterprise = groups.iter().any(|g| g.kind == "enterprise");
    match (drop, accept) {
        (Some(d), _) => o.fail(SG_API_ACCESS, failure(
            format!("rule \"{}\" blocks the API server {api_ip}:{API_SERVER_PORT}", rule_text(d)),
            format!("remove the rule, or accept egress tcp {API_SERVER_PORT}/{API_SERVER_PORT} to {api_ip}/32"),
        )),
        (None, None) if enterprise => o.fail(SG_API_ACCESS, failure(
            format!("enterprise security groups deny egress by default and no rule accepts the API server {api_ip}:{API_SERVER_PORT}"),
            format!("add an egress rule: tcp {API_SERVER_PORT}/{API_SERVER_PORT} to {api_ip}/32 accept"),
        )),
        _ => o.pass(SG_API_ACCESS, format!("egress to {api_ip}:{API_SERVER_PORT} allowed")),
    }
    // A conflict: the cluster's rule that lets the API server reach the
    // kubelet is overridden by a drop rule of the instance's groups.
    let (_, drop) = matching(groups, "ingress", KUBELET_PORT, api);
    match drop {
        Some(d) => o.fail(SG_CONFLICT, failure(
            format!("rule \"{}\" conflicts with the cluster's rules: it drops the API server's traffic to the kubelet ({}:{KUBELET_PORT} from {api_ip})", rule_text(d), node_ip.map(|a| a.to_string()).unwrap_or_default()),
            "remove the drop rule or narrow it so it does not cover the API server's address",
        )),
        None => o.pass(SG_CONFLICT, "no rule conflicts with the cluster's"),
    }
    o.require(
        SG_QUOTA,
        groups.len() <= SECURITY_GROUP_QUOTA,
        format!("{} of {SECURITY_GROUP_QUOTA} security groups", groups.len()),
        failure(
            format!("instance {} is in {} security groups; at most {SECURITY_GROUP_QUOTA} are allowed, and joining adds the cluster's", i.id, groups.len()),
            "remove the instance from security groups it does not need",
        ),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preflight::tests::*;

    #[test]
    fn api_whitelist() {
        pair(
            "api-whitelist",
            PreflightStatus::Error,
            "PreflightNotWhitelisted",
            |c, _, _, _| c.spec.api_server_whitelist = vec!["192.168.0.0/16".into()],
        );
    }
    #[test]
    fn security_group_type() {
        pair(
            "security-group-type",
            PreflightStatus::Error,
            "PreflightSecurityGroupType",
            |_, p, _, _| p.spec.security_group_type = "enterprise".into(),
        );
    }
    #[test]
    fn security_group_api_access() {
        pair(
            "security-group-api-access",
            PreflightStatus::Error,
            "PreflightSecurityGroupBlocksApiServer",
            |_, _, i, _| {
                i.security_groups[0].rules.push(RuleFacts {
                    direction: "egress".into(),
                    protocol: "tcp".into(),
                    port_range: Some("6000/7000".into()),
                    cidr: Some("10.213.0.0/24".into()),
                    policy: "drop".into(),
                });
            },
        );
        // Enterprise groups need an explicit accept.
        pair(
            "security-group-api-access",
            PreflightStatus::Error,
            "PreflightSecurityGroupBlocksApiServer",
            |_, p, i, _| {
                p.spec.security_group_type = "enterprise".into();
                i.security_groups[0].kind = "enterprise".into();
            },
        );
        let mut p = pool();
        p.spec.security_group_type = "enterprise".into();
        let mut i = good();
        i.security_groups[0].kind = "enterprise".into();
        i.security_groups[0].rules.push(RuleFacts {
            direction: "egress".into(),
            protocol: "tcp".into(),
            port_range: Some("6443/6443".into()),
            cidr: Some("10.213.0.1/32".into()),
            policy: "accept".into(),
        });
        assert_eq!(
            result(
                &terway(),
                &p,
                &i,
                &Context::default(),
                "security-group-api-access"
            )
            .status,
            PreflightStatus::Pass
        );
    }
    #[test]
    fn security_group_conflict() {
        pair(
            "security-group-conflict",
            PreflightStatus::Error,
            "PreflightSecurityGroupConflict",
            |_, _, i, _| {
                i.security_groups[0].rules.push(RuleFacts {
                    direction: "ingress".into(),
                    protocol: "all".into(),
                    port_range: None,
                    cidr: Some("10.213.0.0/16".into()),
                    policy: "drop".into(),
                });
            },
        );
    }
    #[test]
    fn security_group_quota() {
        pair(
            "security-group-quota",
            PreflightStatus::Error,
            "PreflightSecurityGroupQuota",
            |_, _, i, _| {
                let g = i.security_groups[0].clone();
                i.security_groups = vec![g; 6];
            },
        );
    }
}
