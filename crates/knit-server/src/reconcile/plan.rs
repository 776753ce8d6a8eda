//! Desired vs actual, as a pure function: which instances to create and
//! which to remove. No I/O.

use crate::store::InstanceRecord;
use knit_api::state::InstanceState;

/// What a pool needs now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub create: usize,
    /// Instances to remove, in the order chosen.
    pub delete: Vec<String>,
}

/// States that count toward a pool's actual size.
pub fn counts_toward_pool(s: &InstanceState) -> bool {
    matches!(
        *s,
        InstanceState::Pending
            | InstanceState::Creating
            | InstanceState::Running
            | InstanceState::Failed
    )
}

/// Desired vs actual for one pool. Scale-in removes instances knit created
/// before instances added by attach (the user's machines), and within each,
/// in this order: not yet created, failed, being created, then running ones
/// newest first (SPEC: newest first unless the user names the node).
pub fn plan(desired: usize, instances: &[InstanceRecord]) -> Plan {
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
    let rank = |s: &InstanceState| match *s {
        InstanceState::Pending => 0,
        InstanceState::Failed => 1,
        InstanceState::Creating => 2,
        _ => 3,
    };
    let mut victims = active;
    victims.sort_by(|a, b| {
        a.added
            .cmp(&b.added)
            .then(rank(&a.state).cmp(&rank(&b.state)))
            .then(b.created_ms.cmp(&a.created_ms))
            .then(b.name.cmp(&a.name))
    });
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
            name: name.into(),
            pool: "p".into(),
            provider_id: None,
            state: st,
            ip: None,
            instance_type: "t".into(),
            report_token_hash: None,
            last_error: None,
            created_ms,
            updated_ms: created_ms,
            added: false,
        }
    }

    #[test]
    fn scale_out_counts_pending_and_failed() {
        let list = vec![
            inst("a", InstanceState::Running, 1),
            inst("b", InstanceState::Pending, 2),
            inst("c", InstanceState::Failed, 3),
        ];
        assert_eq!(
            plan(5, &list),
            Plan {
                create: 2,
                delete: vec![]
            }
        );
        assert_eq!(plan(3, &list), Plan::default());
    }

    #[test]
    fn deleting_and_detached_do_not_count() {
        let list = vec![
            inst("a", InstanceState::Deleting, 1),
            inst("b", InstanceState::Detached, 2),
        ];
        assert_eq!(plan(1, &list).create, 1);
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
        assert_eq!(plan(1, &list).delete, vec!["wait", "bad", "new", "mid"]);
        assert_eq!(plan(3, &list).delete, vec!["wait", "bad"]);
        assert_eq!(plan(0, &list).delete.len(), 5);
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
        assert_eq!(plan(3, &list).delete, vec!["ours-new"]);
        assert_eq!(plan(2, &list).delete, vec!["ours-new", "ours-old"]);
        assert_eq!(
            plan(1, &list).delete,
            vec!["ours-new", "ours-old", "mine-bad"]
        );
    }
}
