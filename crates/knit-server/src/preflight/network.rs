//! The cluster's network plugin: Terway's pods, zone, NICs and RAM role;
//! IPv6 on a dual-stack cluster; Flannel's route entry.

use super::*;

pub(super) fn run(
    o: &mut Out,
    cluster: &Cluster,
    pool: &NodePool,
    i: &InstanceFacts,
    ctx: &Context,
) {
    let spec = &cluster.spec;

    // Terway.
    if spec.network.plugin == "terway" {
        check_terway(o, cluster, pool, i, ctx);
    } else {
        for c in [
            TERWAY_MAX_PODS,
            TERWAY_ZONE,
            TERWAY_PRIMARY_NIC,
            TERWAY_RAM_ROLE,
        ] {
            o.skip(c, "the cluster's network plugin is not Terway");
        }
    }

    // IPv6 dual stack.
    if spec.network.ipv6 {
        o.require(
            IPV6,
            i.ipv6,
            "the primary NIC has an IPv6 address",
            failure(
                format!(
                    "the cluster is dual-stack but instance {}'s primary NIC has no IPv6 address",
                    i.id
                ),
                "assign an IPv6 address to the primary NIC",
            ),
        );
    } else {
        o.skip(IPV6, "the cluster is not dual-stack");
    }

    // Flannel: one custom route entry per node.
    if spec.network.plugin == "flannel" {
        let after = ctx.route_entries_used + 1;
        o.require(
            FLANNEL_ROUTE_QUOTA,
            after <= ctx.route_entry_quota,
            format!("{after} of {} route entries", ctx.route_entry_quota),
            failure(
                format!("the VPC route table holds {} custom entries, its quota is {}: Flannel needs one more for this node", ctx.route_entries_used, ctx.route_entry_quota),
                "raise the route table's entry quota or remove unused entries",
            ),
        );
    } else {
        o.skip(
            FLANNEL_ROUTE_QUOTA,
            "the cluster's network plugin is not Flannel",
        );
    }
}

fn check_terway(o: &mut Out, cluster: &Cluster, pool: &NodePool, i: &InstanceFacts, ctx: &Context) {
    let spec = &cluster.spec;
    let pool_name = &pool.metadata.name;
    let exclusive = spec.network.terway_eni_mode == "exclusive";
    let extra = i.max_enis.saturating_sub(1);
    let (pods, min, formula) = if exclusive {
        (
            extra,
            TERWAY_MIN_PODS_EXCLUSIVE,
            format!("EniQuantity − 1 = {} − 1", i.max_enis),
        )
    } else {
        (
            extra * i.max_ips_per_eni,
            TERWAY_MIN_PODS_SHARED,
            format!(
                "(EniQuantity − 1) × EniPrivateIpAddressQuantity = ({} − 1) × {}",
                i.max_enis, i.max_ips_per_eni
            ),
        )
    };
    o.require(
        TERWAY_MAX_PODS,
        pods > min,
        format!("max pods {pods} ({formula})"),
        failure(
            format!("instance type {} gives Terway ({} ENI) at most {pods} pods ({formula}); more than {min} are needed", i.instance_type, spec.network.terway_eni_mode),
            "use an instance type with more ENIs / IPs per ENI",
        ),
    );
    match &pool.spec.zone {
        Some(z) if *z != i.zone_id => o.warn(TERWAY_ZONE, failure(
            format!("instance is in zone {:?}, pool {pool_name:?} in {z:?}: without a vSwitch of that zone in Terway's config, pods get addresses from the wrong vSwitch", i.zone_id),
            format!("add a vSwitch of zone {:?} to Terway's configuration (eni-config)", i.zone_id),
        )),
        _ => o.pass(TERWAY_ZONE, format!("zone {}", i.zone_id)),
    }
    o.require(
        TERWAY_PRIMARY_NIC,
        i.eni_count <= 1,
        "only the primary NIC",
        failure(
            format!(
                "instance {} has {} network interfaces; Terway needs only the primary NIC attached",
                i.id, i.eni_count
            ),
            "detach the secondary ENIs (existing ones are kept otherwise and confuse Terway)",
        ),
    );
    let role = ctx.worker_ram_role.as_str();
    o.require(
        TERWAY_RAM_ROLE,
        i.ram_role.as_deref() == Some(role),
        format!("RAM role {role}"),
        failure(
            format!(
                "instance {} carries RAM role {:?}, Terway needs the worker role {:?}",
                i.id,
                i.ram_role.as_deref().unwrap_or("(none)"),
                role
            ),
            format!("attach the RAM role {role} to the instance"),
        ),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preflight::tests::*;

    #[test]
    fn terway_max_pods_shared_and_exclusive() {
        // Shared: (3 − 1) × 5 = 10, not > 10.
        pair(
            "terway-max-pods",
            PreflightStatus::Error,
            "PreflightTerwayMaxPods",
            |_, _, i, _| i.max_ips_per_eni = 5,
        );
        // Exclusive: 6 − 1 = 5, not > 5; 7 − 1 = 6 passes.
        pair(
            "terway-max-pods",
            PreflightStatus::Error,
            "PreflightTerwayMaxPods",
            |c, _, i, _| {
                c.spec.network.terway_eni_mode = "exclusive".into();
                i.max_enis = 6;
            },
        );
        let mut c = terway();
        c.spec.network.terway_eni_mode = "exclusive".into();
        let i = InstanceFacts {
            max_enis: 7,
            ..good()
        };
        assert_eq!(
            result(&c, &pool(), &i, &Context::default(), "terway-max-pods").status,
            PreflightStatus::Pass
        );
    }
    #[test]
    fn terway_other_zone_warns() {
        pair(
            "terway-zone",
            PreflightStatus::Warning,
            "PreflightTerwayOtherZone",
            |_, p, _, _| p.spec.zone = Some("local-b".into()),
        );
    }
    #[test]
    fn terway_primary_nic_only() {
        pair(
            "terway-primary-nic-only",
            PreflightStatus::Error,
            "PreflightTerwaySecondaryEni",
            |_, _, i, _| i.eni_count = 2,
        );
    }
    #[test]
    fn terway_ram_role() {
        pair(
            "terway-ram-role",
            PreflightStatus::Error,
            "PreflightRamRole",
            |_, _, i, _| i.ram_role = None,
        );
    }
    #[test]
    fn ipv6_when_dual_stack() {
        let mut c = terway();
        c.spec.network.ipv6 = true;
        assert_eq!(
            result(&c, &pool(), &good(), &Context::default(), "ipv6").status,
            PreflightStatus::Pass
        );
        let i = InstanceFacts {
            ipv6: false,
            ..good()
        };
        let bad = result(&c, &pool(), &i, &Context::default(), "ipv6");
        assert_eq!(
            (bad.status, bad.code.as_str()),
            (PreflightStatus::Error, "PreflightNoIpv6")
        );
        assert!(!check(&c, &pool(), &i, &Context::default()).passed());
    }
    #[test]
    fn flannel_route_quota() {
        let flannel = Cluster::default();
        let ctx = Context {
            route_entries_used: 10,
            ..Context::default()
        };
        let ok = result(&flannel, &pool(), &good(), &ctx, "flannel-route-quota");
        assert_eq!(ok.status, PreflightStatus::Pass);
        // Terway checks do not apply on Flannel.
        assert_eq!(
            result(&flannel, &pool(), &good(), &ctx, "terway-ram-role").status,
            PreflightStatus::Skipped
        );
        let ctx = Context {
            route_entries_used: ROUTE_ENTRY_QUOTA,
            ..Context::default()
        };
        let bad = result(&flannel, &pool(), &good(), &ctx, "flannel-route-quota");
        assert_eq!(
            (bad.status, bad.code.as_str()),
            (PreflightStatus::Error, "PreflightRouteQuota")
        );
    }
}
