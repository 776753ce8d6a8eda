//! The instance belongs where the cluster is, and nowhere else: node
//! quota, account, region and VPC, no other cluster, no scaling group.

use super::*;

pub(super) fn run(o: &mut Out, cluster: &Cluster, i: &InstanceFacts, ctx: &Context) {
    let spec = &cluster.spec;

    // Cluster node quota.
    let quota = spec.effective_node_quota();
    let total = ctx.cluster_nodes + ctx.adding;
    o.require(
        NODE_QUOTA,
        total <= quota,
        format!("{total} of {quota} nodes after adding"),
        failure(
            format!("adding {} instance(s) makes {total} nodes; the cluster's node quota is {quota}", ctx.adding),
            "remove nodes from other pools, add fewer instances, or raise the cluster's nodeQuota (edition pro allows 5000)",
        ),
    );

    // Same account, region and VPC.
    o.require(
        SAME_ACCOUNT,
        i.account_id == ctx.account_id,
        format!("account {}", i.account_id),
        failure(
            format!(
                "instance {} belongs to account {:?}, the cluster to {:?}",
                i.id, i.account_id, ctx.account_id
            ),
            "only instances of the cluster's own account can be added",
        ),
    );
    o.require(
        SAME_REGION,
        i.region_id == spec.region,
        format!("region {}", i.region_id),
        failure(
            format!(
                "instance {} is in region {:?}, the cluster in {:?}",
                i.id, i.region_id, spec.region
            ),
            "add an instance of the cluster's region",
        ),
    );
    // A peered VPC is reachable but refused.
    if ctx.peered_vpcs.contains(&i.vpc_id) && i.vpc_id != spec.vpc {
        o.fail(SAME_VPC_PEERED, failure(
            format!("instance {} is in VPC {:?}, peered with the cluster's VPC {:?}: instances across a VPC peering cannot be added", i.id, i.vpc_id, spec.vpc),
            "use an instance in the cluster's own VPC",
        ));
    } else {
        o.require(
            SAME_VPC,
            i.vpc_id == spec.vpc,
            format!("VPC {}", i.vpc_id),
            failure(
                format!(
                    "instance {} is in VPC {:?}, the cluster in {:?}",
                    i.id, i.vpc_id, spec.vpc
                ),
                "use an instance in the cluster's VPC",
            ),
        );
    }

    // Not in another cluster (or already a node of this one).
    let other = [TAG_ACK_CLUSTER, TAG_CLUSTER].iter().find_map(|t| {
        i.tags
            .get(*t)
            .filter(|v| **v != cluster.metadata.name)
            .map(|v| (*t, v))
    });
    match (other, &ctx.member_of_pool) {
        (Some((tag, v)), _) => o.fail(NOT_IN_OTHER_CLUSTER, failure(
            format!("instance {} belongs to cluster {v:?} (tag {tag})", i.id),
            "remove it from that cluster first (drain it and remove the node, keeping the instance)",
        )),
        (None, Some(p)) => o.fail(ALREADY_IN_CLUSTER, failure(
            format!("instance {} is already a node of pool {p:?} of this cluster", i.id),
            format!("remove it from pool {p:?} first: knit delete node NAME --release=false"),
        )),
        (None, None) => o.pass(NOT_IN_OTHER_CLUSTER, "in no other cluster"),
    }

    // Not in an auto-scaling group.
    match i.tags.get(TAG_SCALING_GROUP) {
        Some(g) => o.fail(
            NOT_IN_SCALING_GROUP,
            failure(
                format!("instance {} belongs to auto-scaling group {g:?}", i.id),
                "remove it from the scaling group first",
            ),
        ),
        None => o.pass(NOT_IN_SCALING_GROUP, "in no auto-scaling group"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preflight::tests::*;

    #[test]
    fn node_quota() {
        pair(
            "node-quota",
            PreflightStatus::Error,
            "PreflightNodeQuota",
            |_, _, _, ctx| ctx.cluster_nodes = 10,
        );
    }
    #[test]
    fn same_account() {
        pair(
            "same-account",
            PreflightStatus::Error,
            "PreflightAccountMismatch",
            |_, _, i, _| i.account_id = "other".into(),
        );
    }
    #[test]
    fn same_region() {
        pair(
            "same-region",
            PreflightStatus::Error,
            "PreflightRegionMismatch",
            |_, _, i, _| i.region_id = "cn-x".into(),
        );
    }
    #[test]
    fn same_vpc_and_peered_vpc() {
        pair(
            "same-vpc",
            PreflightStatus::Error,
            "PreflightVpcMismatch",
            |_, _, i, _| i.vpc_id = "vpc-2".into(),
        );
        pair(
            "same-vpc",
            PreflightStatus::Error,
            "PreflightVpcPeered",
            |_, _, i, ctx| {
                i.vpc_id = "vpc-peer".into();
                ctx.peered_vpcs = vec!["vpc-peer".into()];
            },
        );
    }
    #[test]
    fn not_in_other_cluster() {
        pair(
            "not-in-other-cluster",
            PreflightStatus::Error,
            "PreflightInOtherCluster",
            |_, _, i, _| {
                i.tags.insert(TAG_ACK_CLUSTER.into(), "c-123".into());
            },
        );
        pair(
            "not-in-other-cluster",
            PreflightStatus::Error,
            "PreflightAlreadyInCluster",
            |_, _, _, ctx| ctx.member_of_pool = Some("workers".into()),
        );
    }
    #[test]
    fn not_in_scaling_group() {
        pair(
            "not-in-scaling-group",
            PreflightStatus::Error,
            "PreflightInScalingGroup",
            |_, _, i, _| {
                i.tags.insert(TAG_SCALING_GROUP.into(), "asg-1".into());
            },
        );
    }
}
