//! Desired vs actual, as a pure function: which instances to create and
//! which to remove. No I/O.

use crate::pool_state::counts_toward_pool;
use crate::store::InstanceRecord;
use knit_api::state::InstanceState;
use std::collections::HashMap;

/// What a pool needs now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub create: usize,
    /// Instances to remove, in the order chosen.
    pub delete: Vec<String>,
}

/// What scale-in knows of an instance's node: whether it is Ready, and
/// how many pods a drain would evict from it (`None`: not known, e.g. the
/// cluster's API did not answer).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeFacts {
    pub ready: bool,
    pub evictable_pods: Option<usize>,
}

/// The scale-in rule, as one sort key (lower leaves first):
/// 1. instances knit created before instances added by attach (the
///    user's machines);
/// 2. instances not yet Ready or failed: not yet created, failed, being
///    created, then running without a Ready node;
/// 3. Ready nodes with no evictable pod, then the fewest evictable pods
///    (an unknown count after every known one);
/// 4. the newest (then the name, so that the order is total).
pub fn scale_in_order(instances: &mut [&InstanceRecord], facts: &HashMap<String, NodeFacts>) {
    let key = |i: &InstanceRecord| {
        let f = facts.get(&i.name).copied().unwrap_or_default();
        let (group, pods) = match i.state {
            InstanceState::Pending => (0, 0),
            InstanceState::Failed => (1, 0),
            InstanceState::Creating => (2, 0),
            _ if !f.ready => (3, 0),
            _ => (4, f.evictable_pods.unwrap_or(usize::MAX)),
        };
        (i.added, group, pods, std::cmp::Reverse(i.created_ms))
    };
    instances.sort_by(|a, b| key(a).cmp(&key(b)).then(b.name.cmp(&a.name)));
}

/// Desired vs actual for one pool; on scale-in, which instances leave by
/// [`scale_in_order`].
pub fn plan(
    desired: usize,
    instances: &[InstanceRecord],
    facts: &HashMap<String, NodeFacts>,
) -> Plan {
    let active: Vec<&InstanceRecord> = instances
        .iter()
        .filter(|i| counts_toward_pool(&i.state))
        .collect();
    if active.len() < desired {
        return Plan {
            create: desired - active.len(),
            delete: Vec::new(),
        };
    }
    let excess = active.len() - desired;
    if excess == 0 {
        return Plan::default();
    }
    let mut victims = active;
    scale_in_order(&mut victims, facts);
    Plan {
        create: 0,
        delete: victims
            .into_iter()
            .take(excess)
            .map(|i| i.name.clone())
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inst(name: &str, st: InstanceState, created_ms: i64) -> InstanceRecord {
        InstanceRecord {
            created_ms,
            updated_ms: created_ms,
            ..InstanceRecord::example(name, st)
        }
    }

    fn none() -> HashMap<String, NodeFacts> {
        HashMap::new()
    }

    fn ready(pods: Option<usize>) -> NodeFacts {
        NodeFacts {
            ready: true,
            evictable_pods: pods,
        }
    }

    #[test]
    fn scale_in_takes_unready_then_empty_then_fewest_pods_then_newest() {
        let list = vec![
            inst("busy-old", InstanceState::Running, 1),
            inst("busy-new", InstanceState::Running, 2),
            inst("light", InstanceState::Running, 3),
            inst("empty-old", InstanceState::Running, 4),
            inst("empty-new", InstanceState::Running, 5),
            inst("unready", InstanceState::Running, 0),
            inst("unknown", InstanceState::Running, 9),
            inst("failed", InstanceState::Failed, 0),
            inst("creating", InstanceState::Creating, 0),
            inst("pending", InstanceState::Pending, 0),
        ];
        let facts: HashMap<String, NodeFacts> = [
            ("busy-old", ready(Some(5))),
            ("busy-new", ready(Some(5))),
            ("light", ready(Some(1))),
            ("empty-old", ready(Some(0))),
            ("empty-new", ready(Some(0))),
            (
                "unready",
                NodeFacts {
                    ready: false,
                    evictable_pods: Some(7),
                },
            ),
            ("unknown", ready(None)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(
            plan(0, &list, &facts).delete,
            vec![
                "pending",
                "failed",
                "creating",
                "unready",
                "empty-new",
                "empty-old",
                "light",
                "busy-new",
                "busy-old",
                "unknown"
            ]
        );
        assert_eq!(
            plan(7, &list, &facts).delete,
            vec!["pending", "failed", "creating"]
        );
        // Without facts (no cluster): newest first, as before.
        let running: Vec<InstanceRecord> = list[..5].to_vec();
        assert_eq!(
            plan(3, &running, &none()).delete,
            vec!["empty-new", "empty-old"]
        );
    }

    #[test]
    fn scale_out_counts_pending_and_failed() {
        let list = vec![
            inst("a", InstanceState::Running, 1),
            inst("b", InstanceState::Pending, 2),
            inst("c", InstanceState::Failed, 3),
        ];
        assert_eq!(
            plan(5, &list, &none()),
            Plan {
                create: 2,
                delete: vec![]
            }
        );
        assert_eq!(plan(3, &list, &none()), Plan::default());
    }

    #[test]
    fn deleting_and_detached_do_not_count() {
        let list = vec![
            inst("a", InstanceState::Deleting, 1),
            inst("b", InstanceState::Detached, 2),
        ];
        assert_eq!(plan(1, &list, &none()).create, 1);
    }

    #[test]
    fn scale_in_prefers_uncreated_then_failed_then_newest() {
        let list = vec![
            inst("old", InstanceState::Running, 1),
            inst("new", InstanceState::Running, 9),
            inst("mid", InstanceState::Running, 5),
            inst("bad", InstanceState::Failed, 2),
            inst("wait", InstanceState::Pending, 3),
        ];
        assert_eq!(
            plan(1, &list, &none()).delete,
            vec!["wait", "bad", "new", "mid"]
        );
        assert_eq!(plan(3, &list, &none()).delete, vec!["wait", "bad"]);
        assert_eq!(plan(0, &list, &none()).delete.len(), 5);
    }

    #[test]
    fn scale_in_takes_instances_knit_created_before_added_ones() {
        let added = |name: &str, st: InstanceState, created_ms: i64| InstanceRecord {
            added: true,
            ..inst(name, st, created_ms)
        };
        let list = vec![
            added("mine-new", InstanceState::Running, 9),
            added("mine-bad", InstanceState::Failed, 8),
            inst("ours-old", InstanceState::Running, 1),
            inst("ours-new", InstanceState::Running, 5),
        ];
        assert_eq!(plan(3, &list, &none()).delete, vec!["ours-new"]);
        assert_eq!(plan(2, &list, &none()).delete, vec!["ours-new", "ours-old"]);
        assert_eq!(
            plan(1, &list, &none()).delete,
            vec!["ours-new", "ours-old", "mine-bad"]
        );
    }
}
