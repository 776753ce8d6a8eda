//! A pool's instances counted the one way the pool rules (status), the
//! reconciler (plan, rollout, repair) and the drain (a rollout stopped at
//! a drain's timeout) all count them: which count toward the pool, which
//! are up to date with its template, where a rollout stands. Pure, and
//! below all three, so none of them imports another for it.

use crate::store::InstanceRecord;
use knit_api::state::InstanceState;
use std::collections::{HashMap, HashSet};

/// The reason (event and pool condition) of a rollout stopped, as a
/// Deployment past its progress deadline: a replacement did not come up,
/// or an out-of-date node's drain passed its timeout.
pub const ROLLOUT_STOPPED_REASON: &str = "ProgressDeadlineExceeded";

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

/// Whether `i` was made from `current` (an instance without a hash, added
/// by attach, counts as up to date: it is never rolled).
pub fn up_to_date(
    i: &InstanceRecord,
    hashes: &HashMap<String, Option<String>>,
    current: &str,
) -> bool {
    if i.added {
        return true;
    }
    match hashes.get(&i.name) {
        Some(Some(h)) => h == current,
        _ => true,
    }
}

/// Where a pool's rollout stands, counted from its instances.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RolloutCounts {
    /// Instances counting toward the pool.
    pub total: usize,
    /// Of those, made from the current template.
    pub updated: usize,
    /// Of the updated ones, available.
    pub updated_available: usize,
    /// Instances counting toward the pool and available.
    pub available: usize,
    /// Out of date (to be replaced).
    pub outdated: usize,
}

/// The rollout's counts of `instances`, each with its template hash in
/// `hashes`, against the pool's `current` hash; `available` names the
/// instances whose node is available.
pub fn rollout_counts(
    instances: &[InstanceRecord],
    hashes: &HashMap<String, Option<String>>,
    current: &str,
    available: &HashSet<String>,
) -> RolloutCounts {
    let mut c = RolloutCounts::default();
    for i in instances.iter().filter(|i| counts_toward_pool(&i.state)) {
        let is_available = available.contains(&i.name);
        c.total += 1;
        c.available += usize::from(is_available);
        if up_to_date(i, hashes, current) {
            c.updated += 1;
            c.updated_available += usize::from(is_available);
        } else {
            c.outdated += 1;
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(name: &str, state: InstanceState, added: bool) -> InstanceRecord {
        InstanceRecord {
            added,
            ..InstanceRecord::example(name, state)
        }
    }

    #[test]
    fn counts_only_what_counts_toward_the_pool_and_attached_ones_are_never_out_of_date() {
        let instances = [
            instance("new", InstanceState::Running, false),
            instance("old", InstanceState::Running, false),
            instance("old-pending", InstanceState::Pending, false),
            instance("attached", InstanceState::Running, true),
            instance("leaving", InstanceState::Deleting, false),
        ];
        let hashes: HashMap<String, Option<String>> = [
            ("new", Some("h2")),
            ("old", Some("h1")),
            ("old-pending", Some("h1")),
            ("attached", Some("h1")),
            ("leaving", Some("h1")),
        ]
        .into_iter()
        .map(|(n, h)| (n.to_string(), h.map(str::to_string)))
        .collect();
        let available: HashSet<String> = ["new", "old", "attached", "leaving"]
            .into_iter()
            .map(str::to_string)
            .collect();
        assert_eq!(
            rollout_counts(&instances, &hashes, "h2", &available),
            RolloutCounts {
                total: 4,
                updated: 2,
                updated_available: 2,
                available: 3,
                outdated: 2,
            }
        );
        assert!(!counts_toward_pool(&InstanceState::Deleting));
        assert!(up_to_date(&instances[3], &hashes, "h2"));
        // No hash recorded (made before rollouts): up to date too.
        assert!(up_to_date(&instances[1], &HashMap::new(), "h2"));
    }
}
