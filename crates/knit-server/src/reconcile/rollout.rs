//! A pool's rollout as a pure function: which instances to create (with
//! the current template) and which to remove, with a Deployment's
//! arithmetic. No I/O; `planning.rs` reads the store, calls [`plan_rollout`]
//! and writes the intents (every removal through the delete intent and the
//! drain).
//!
//! With `RollingUpdate`, at every moment:
//! - at most `desired + maxSurge` instances count toward the pool
//!   (`counts_toward_pool`), and no new one is made while that many
//!   machines exist counting those still being drained and released;
//! - an out-of-date instance is removed only while at least
//!   `desired - maxUnavailable` others are available (their node Ready and
//!   initialized, not being repaired, not being removed).
//!
//! An instance is out of date when it records a template hash other than
//! the pool's current one; one with none (added by attach) never is: knit
//! never releases the user's machines on its own.

use super::plan::{scale_in_order, NodeFacts};
use crate::pool_state::{counts_toward_pool, up_to_date};
use crate::store::InstanceRecord;
use knit_api::state::InstanceState;
use std::collections::{HashMap, HashSet};

/// What the pool's strategy and state let a rollout do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `RollingUpdate`: replace out-of-date instances within the limits.
    Rolling,
    /// Paused (`spec.paused`) or stopped (its progress deadline): nothing
    /// is replaced; the pool keeps between `desired` and
    /// `desired + maxSurge` instances (a surge instance made before the
    /// stop stays, a Deployment's paused surge does too).
    Hold,
    /// `OnDelete`: nothing is replaced; an instance removed (by hand, by
    /// repair) is made again from the current template.
    OnDelete,
}

/// Everything the rollout planner sees of one pool.
#[derive(Debug, Clone)]
pub struct RolloutInput<'a> {
    pub desired: usize,
    /// `(maxSurge, maxUnavailable)` as counts (`UpdateStrategy::limits`).
    pub limits: (usize, usize),
    pub mode: Mode,
    pub current_hash: &'a str,
    pub instances: &'a [InstanceRecord],
    /// Each instance's template hash.
    pub hashes: &'a HashMap<String, Option<String>>,
    /// Scale-in's facts (Ready, evictable pods).
    pub facts: &'a HashMap<String, NodeFacts>,
    /// Instances that are available: node Ready and initialized, no repair
    /// under way on it.
    pub available: &'a HashSet<String>,
    /// Machines of the pool being removed (drained, then released): they
    /// hold a share of the surge until they are gone, so a drain a
    /// PodDisruptionBudget blocks holds the rollout instead of piling up
    /// machines (surge counts against the quota).
    pub removing: usize,
    /// Out-of-date instances that reach the current template in place
    /// (`knit_api::update::in_place_update`), each with whether its node
    /// is drained around the update.
    pub in_place: &'a HashMap<String, bool>,
    /// Instances of the pool whose in-place update runs now.
    pub updating: &'a HashSet<String>,
}

/// What the pool needs now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RolloutPlan {
    /// Instances to create, from the current template.
    pub create: usize,
    /// Instances removed because the pool has more than it may (scale-in).
    pub scale_in: Vec<String>,
    /// Out-of-date instances removed by the rollout (replaced).
    pub replace: Vec<String>,
    /// Out-of-date instances updated on the same machine now (the agent
    /// re-renders, reinstalls, restarts the kubelet).
    pub update_in_place: Vec<String>,
}

/// The scale-in order during a rollout: instances not serving (pending,
/// failed, not Ready) first whatever their template, then out-of-date
/// ones before up-to-date ones, each by [`scale_in_order`].
fn removal_order(list: &mut [&InstanceRecord], input: &RolloutInput<'_>) {
    scale_in_order(list, input.facts);
    let serving = |i: &InstanceRecord| {
        i.state == InstanceState::Running && input.facts.get(&i.name).is_some_and(|f| f.ready)
    };
    // Stable: scale_in_order's order holds within each group.
    list.sort_by_key(|i| {
        (
            i.added,
            serving(i),
            up_to_date(i, input.hashes, input.current_hash),
        )
    });
}

/// What the pool needs now: [`Mode`] says whether out-of-date instances
/// are replaced; scaling applies in every mode (new instances always get
/// the current template; scale-in removes out-of-date ones first).
pub fn plan_rollout(input: &RolloutInput<'_>) -> RolloutPlan {
    let desired = input.desired;
    let (surge, unavailable) = input.limits;
    let mut active: Vec<&InstanceRecord> = input
        .instances
        .iter()
        .filter(|i| counts_toward_pool(&i.state))
        .collect();
    let fresh = |i: &InstanceRecord| up_to_date(i, input.hashes, input.current_hash);
    let outdated = active.iter().filter(|i| !fresh(i)).count();
    let ceiling = match input.mode {
        _ if outdated == 0 => desired,
        Mode::OnDelete => desired,
        Mode::Hold | Mode::Rolling => desired + surge,
    };
    let mut plan = RolloutPlan::default();
    // Scale-in: more than the pool may have now.
    if active.len() > ceiling {
        removal_order(&mut active, input);
        let excess = active.len() - ceiling;
        plan.scale_in = active.drain(..excess).map(|i| i.name.clone()).collect();
    }
    if active.len() < desired && (input.mode != Mode::Rolling || outdated == 0) {
        plan.create = desired - active.len();
        return plan;
    }
    if input.mode != Mode::Rolling || outdated == 0 {
        return plan;
    }
    // In place: a kubelet restart needs no surge; one drained around its
    // update is unavailable meanwhile, so only with maxUnavailable >= 1
    // (else it is replaced: a surge node first keeps every node available).
    let in_place = |i: &InstanceRecord| {
        !fresh(i)
            && input
                .in_place
                .get(&i.name)
                .is_some_and(|&drain| !drain || unavailable >= 1)
    };
    let in_place_count = active.iter().filter(|i| in_place(i)).count();
    // Rolling: new instances up to the surge ceiling, as many as the
    // current template still lacks (nodes updated in place lack none).
    let total = active.len();
    let updated = active.iter().filter(|i| fresh(i)).count();
    plan.create = (ceiling.saturating_sub(total + input.removing))
        .min(desired.saturating_sub(updated + in_place_count));
    // Old ones out while enough stay available (a Deployment's
    // maxScaledDown: every instance, less the available minimum, less the
    // new ones not yet available, the ones just asked for included).
    let min_available = desired.saturating_sub(unavailable);
    let new_unavailable = active
        .iter()
        .filter(|i| fresh(i) && !input.available.contains(&i.name))
        .count()
        + plan.create;
    let mut budget = (total + plan.create).saturating_sub(min_available + new_unavailable);
    let mut available = active
        .iter()
        .filter(|i| input.available.contains(&i.name))
        .count();
    let mut old: Vec<&InstanceRecord> = active
        .iter()
        .copied()
        .filter(|i| !fresh(i) && !in_place(i))
        .collect();
    removal_order(&mut old, input);
    for i in old {
        if budget == 0 {
            break;
        }
        if !input.available.contains(&i.name) {
            // Not serving: its removal lowers no availability.
            plan.replace.push(i.name.clone());
            budget -= 1;
        } else if available > min_available {
            plan.replace.push(i.name.clone());
            available -= 1;
            budget -= 1;
        }
    }
    // In place, one node at a time (maxUnavailable at a time when more),
    // sharing the unavailable budget with the replacements: a drained one
    // only while another's absence leaves at least `desired -
    // maxUnavailable` available, a restart only while the pool is not
    // below that already.
    let updating = active
        .iter()
        .filter(|i| input.updating.contains(&i.name))
        .count();
    let mut slots = unavailable.max(1).saturating_sub(updating);
    let mut candidates: Vec<&InstanceRecord> = active
        .iter()
        .copied()
        .filter(|i| in_place(i) && !input.updating.contains(&i.name))
        .collect();
    removal_order(&mut candidates, input);
    for i in candidates {
        if slots == 0 {
            break;
        }
        let drain = input.in_place.get(&i.name).copied().unwrap_or(true);
        let serving = input.available.contains(&i.name);
        if !serving {
            // Serves nothing now: updating it lowers no availability.
        } else if drain {
            if available <= min_available {
                continue;
            }
            available -= 1;
        } else if available < min_available {
            continue;
        }
        plan.update_in_place.push(i.name.clone());
        slots -= 1;
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = "old-hash";
    const NEW: &str = "new-hash";

    /// A simulated pool: instances with their hash, and which are Ready.
    struct Sim {
        instances: Vec<InstanceRecord>,
        hashes: HashMap<String, Option<String>>,
        ready: HashSet<String>,
        next: i64,
        /// Out of date instances that update in place (drained or not).
        in_place: HashMap<String, bool>,
        /// In-place updates under way.
        updating: HashSet<String>,
    }

    impl Sim {
        fn new(n: usize) -> Sim {
            let mut sim = Sim {
                instances: Vec::new(),
                hashes: HashMap::new(),
                ready: HashSet::new(),
                next: 0,
                in_place: HashMap::new(),
                updating: HashSet::new(),
            };
            for _ in 0..n {
                let name = sim.add(OLD, InstanceState::Running);
                sim.ready.insert(name);
            }
            sim
        }

        fn add(&mut self, hash: &str, state: InstanceState) -> String {
            self.next += 1;
            let name = format!("i{}", self.next);
            self.instances.push(InstanceRecord {
                name: name.clone(),
                pool: "p".into(),
                provider_id: None,
                state,
                ip: None,
                instance_type: "t".into(),
                report_token_hash: None,
                last_error: None,
                last_error_kind: None,
                created_ms: self.next,
                updated_ms: self.next,
                added: false,
            });
            self.hashes.insert(name.clone(), Some(hash.to_string()));
            name
        }

        fn facts(&self) -> HashMap<String, NodeFacts> {
            self.ready
                .iter()
                .map(|n| {
                    (
                        n.clone(),
                        NodeFacts {
                            ready: true,
                            evictable_pods: Some(0),
                        },
                    )
                })
                .collect()
        }

        fn plan(&self, desired: usize, limits: (usize, usize), mode: Mode) -> RolloutPlan {
            let facts = self.facts();
            let removing = self
                .instances
                .iter()
                .filter(|i| i.state == InstanceState::Deleting)
                .count();
            plan_rollout(&RolloutInput {
                desired,
                limits,
                mode,
                current_hash: NEW,
                instances: &self.instances,
                hashes: &self.hashes,
                facts: &facts,
                available: &self.ready,
                removing,
                in_place: &self.in_place,
                updating: &self.updating,
            })
        }

        /// Applies a plan: new instances Pending, removed ones Deleting
        /// (gone from the count at once; released later).
        fn apply(&mut self, p: &RolloutPlan) -> Vec<String> {
            let mut made = Vec::new();
            for _ in 0..p.create {
                made.push(self.add(NEW, InstanceState::Pending));
            }
            for name in p.scale_in.iter().chain(&p.replace) {
                if let Some(i) = self.instances.iter_mut().find(|i| &i.name == name) {
                    i.state = InstanceState::Deleting;
                }
                self.ready.remove(name);
            }
            made
        }

        fn active(&self) -> usize {
            self.instances
                .iter()
                .filter(|i| counts_toward_pool(&i.state))
                .count()
        }

        fn available(&self) -> usize {
            self.instances
                .iter()
                .filter(|i| counts_toward_pool(&i.state) && self.ready.contains(&i.name))
                .count()
        }

        fn outdated(&self) -> usize {
            self.instances
                .iter()
                .filter(|i| {
                    counts_toward_pool(&i.state) && self.hashes[&i.name].as_deref() == Some(OLD)
                })
                .count()
        }

        /// Every old instance updates in place (`drain`: around it).
        fn in_place_all(&mut self, drain: bool) {
            for i in &self.instances {
                if self.hashes[&i.name].as_deref() == Some(OLD) {
                    self.in_place.insert(i.name.clone(), drain);
                }
            }
        }

        /// Applies a plan's in-place updates: under way, not available.
        fn start_updates(&mut self, p: &RolloutPlan) {
            for name in &p.update_in_place {
                assert!(self.updating.insert(name.clone()), "{name} twice");
                self.ready.remove(name);
            }
        }

        /// Every update under way ends: the node Ready, its hash current.
        fn finish_updates(&mut self) {
            for name in std::mem::take(&mut self.updating) {
                self.hashes.insert(name.clone(), Some(NEW.to_string()));
                self.in_place.remove(&name);
                self.ready.insert(name);
            }
        }

        /// Every pending instance comes up (Running and Ready), every one
        /// being removed is gone (drained and released).
        fn come_up(&mut self) {
            self.instances
                .retain(|i| i.state != InstanceState::Deleting);
            for i in &mut self.instances {
                if i.state == InstanceState::Pending {
                    i.state = InstanceState::Running;
                    self.ready.insert(i.name.clone());
                }
            }
        }
    }

    /// A whole rollout, pass by pass, nodes coming up one pass after they
    /// are asked for; the bounds are checked after every step.
    fn roll(desired: usize, limits: (usize, usize)) -> usize {
        let mut sim = Sim::new(desired);
        let (surge, unavailable) = limits;
        let mut passes = 0;
        while sim.outdated() > 0 || sim.active() != desired || sim.available() != desired {
            passes += 1;
            assert!(passes < 100, "the rollout never ends");
            let p = sim.plan(desired, limits, Mode::Rolling);
            sim.apply(&p);
            assert!(
                sim.active() <= desired + surge,
                "surge exceeded: {}",
                sim.active()
            );
            assert!(
                sim.available() + unavailable >= desired,
                "too few available: {}",
                sim.available()
            );
            sim.come_up();
        }
        assert_eq!(sim.outdated(), 0);
        passes
    }

    /// A whole in-place rollout: no machine made or removed, at most
    /// max(1, maxUnavailable) updates at a time, and with a drain never
    /// fewer than `desired - maxUnavailable` available.
    fn roll_in_place(desired: usize, limits: (usize, usize), drain: bool) -> usize {
        let mut sim = Sim::new(desired);
        sim.in_place_all(drain);
        let (_, unavailable) = limits;
        let mut passes = 0;
        while sim.outdated() > 0 || !sim.updating.is_empty() {
            passes += 1;
            assert!(passes < 100, "the rollout never ends");
            let p = sim.plan(desired, limits, Mode::Rolling);
            assert_eq!((p.create, p.replace.len()), (0, 0), "{p:?}");
            sim.start_updates(&p);
            assert!(sim.updating.len() <= unavailable.max(1), "{p:?}");
            if drain {
                assert!(
                    sim.available() + unavailable >= desired,
                    "too few available: {}",
                    sim.available()
                );
            }
            sim.finish_updates();
        }
        assert_eq!(sim.active(), desired);
        passes
    }

    #[test]
    fn in_place_updates_go_one_at_a_time_within_max_unavailable() {
        // A kubelet restart: one node at a time even with maxUnavailable 0.
        assert_eq!(roll_in_place(3, (1, 0), false), 3);
        // maxUnavailable 2: two at a time.
        assert_eq!(roll_in_place(4, (0, 2), false), 2);
        for desired in [1, 2, 3, 5] {
            for limits in [(1, 1), (0, 1), (2, 2), (0, 3)] {
                roll_in_place(desired, limits, true);
                roll_in_place(desired, limits, false);
            }
        }
        // One under way holds the next while maxUnavailable is 1.
        let mut sim = Sim::new(3);
        sim.in_place_all(true);
        let p = sim.plan(3, (0, 1), Mode::Rolling);
        assert_eq!(p.update_in_place.len(), 1);
        sim.start_updates(&p);
        assert_eq!(sim.plan(3, (0, 1), Mode::Rolling), RolloutPlan::default());
        // Paused or stopped: nothing updated.
        let mut sim = Sim::new(3);
        sim.in_place_all(false);
        assert_eq!(sim.plan(3, (1, 0), Mode::Hold), RolloutPlan::default());
        assert_eq!(sim.plan(3, (1, 0), Mode::OnDelete), RolloutPlan::default());
    }

    #[test]
    fn a_drained_update_with_nothing_unavailable_is_a_replacement() {
        let mut sim = Sim::new(3);
        sim.in_place_all(true);
        let p = sim.plan(3, (1, 0), Mode::Rolling);
        assert_eq!(
            (p.create, p.update_in_place.len()),
            (1, 0),
            "maxUnavailable 0: a surge node instead"
        );
        // A node already unavailable is updated in place first (it serves
        // nothing), and the others wait for it.
        let mut sim = Sim::new(3);
        sim.in_place_all(false);
        sim.ready.remove("i2");
        let p = sim.plan(3, (1, 0), Mode::Rolling);
        assert_eq!(p.update_in_place, vec!["i2".to_string()]);
    }

    #[test]
    fn in_place_and_replacement_share_the_unavailable_budget() {
        // i1 needs a new machine, i2 and i3 update in place, drained.
        let mut sim = Sim::new(3);
        sim.in_place.insert("i2".into(), true);
        sim.in_place.insert("i3".into(), true);
        let p = sim.plan(3, (0, 1), Mode::Rolling);
        assert_eq!(p.replace.len() + p.update_in_place.len(), 1, "{p:?}");
        assert_eq!(p.create, 0, "no surge");
        let mut sim = Sim::new(3);
        sim.in_place.insert("i2".into(), true);
        sim.in_place.insert("i3".into(), true);
        let p = sim.plan(3, (1, 1), Mode::Rolling);
        assert_eq!(p.create, 1, "a surge for the one replaced only: {p:?}");
        assert_eq!(p.replace.len() + p.update_in_place.len(), 1, "{p:?}");
    }

    #[test]
    fn surge_one_unavailable_zero_replaces_one_at_a_time_within_the_bounds() {
        let mut sim = Sim::new(3);
        let p = sim.plan(3, (1, 0), Mode::Rolling);
        assert_eq!((p.create, p.replace.len()), (1, 0), "surge first");
        sim.apply(&p);
        // The new one not Ready yet: nothing more, nothing removed.
        assert_eq!(sim.plan(3, (1, 0), Mode::Rolling), RolloutPlan::default());
        sim.come_up();
        let p = sim.plan(3, (1, 0), Mode::Rolling);
        assert_eq!((p.create, p.replace.len()), (0, 1), "then one old out");
        assert_eq!(p.replace, vec!["i3".to_string()], "newest old first");
        sim.apply(&p);
        assert_eq!(
            sim.plan(3, (1, 0), Mode::Rolling),
            RolloutPlan::default(),
            "the old machine, being drained, still holds the surge"
        );
        sim.come_up();
        let p = sim.plan(3, (1, 0), Mode::Rolling);
        assert_eq!((p.create, p.replace.len()), (1, 0), "released: the next");
        assert!(roll(3, (1, 0)) > 0);
    }

    #[test]
    fn every_strategy_keeps_both_bounds_to_the_end() {
        for desired in [1, 2, 3, 5, 10] {
            for limits in [(1, 0), (2, 0), (0, 1), (1, 1), (2, 2), (3, 0), (0, 3)] {
                roll(desired, limits);
            }
        }
    }

    #[test]
    fn a_drain_that_does_not_end_holds_the_rollout() {
        let mut sim = Sim::new(3);
        sim.apply(&sim.plan(3, (1, 0), Mode::Rolling));
        sim.come_up();
        let p = sim.plan(3, (1, 0), Mode::Rolling);
        assert_eq!(p.replace.len(), 1);
        sim.apply(&p);
        // The old node's drain is blocked (a PodDisruptionBudget): no new
        // machine while it is still there.
        for _ in 0..3 {
            assert_eq!(sim.plan(3, (1, 0), Mode::Rolling), RolloutPlan::default());
        }
        sim.instances.retain(|i| i.state != InstanceState::Deleting);
        assert_eq!(
            sim.plan(3, (1, 0), Mode::Rolling).create,
            1,
            "released: go on"
        );
    }

    #[test]
    fn surge_zero_removes_first_then_makes() {
        let mut sim = Sim::new(3);
        let p = sim.plan(3, (0, 1), Mode::Rolling);
        assert_eq!((p.create, p.replace.len()), (0, 1));
        sim.apply(&p);
        assert_eq!(
            sim.plan(3, (0, 1), Mode::Rolling),
            RolloutPlan::default(),
            "no surge: the new machine once the old one is released"
        );
        sim.come_up();
        let p = sim.plan(3, (0, 1), Mode::Rolling);
        assert_eq!((p.create, p.replace.len()), (1, 0));
    }

    #[test]
    fn a_node_under_repair_counts_as_unavailable() {
        let mut sim = Sim::new(3);
        sim.apply(&sim.plan(3, (1, 0), Mode::Rolling));
        sim.come_up();
        // An old node is being repaired: not available, so it may go
        // (it serves nothing) but no Ready one may.
        sim.ready.remove("i1");
        let p = sim.plan(3, (1, 0), Mode::Rolling);
        assert_eq!(p.replace, vec!["i1".to_string()]);
        // A new node under repair: no old one may go.
        let mut sim = Sim::new(3);
        sim.apply(&sim.plan(3, (1, 0), Mode::Rolling));
        sim.come_up();
        sim.ready.remove("i4");
        assert_eq!(sim.plan(3, (1, 0), Mode::Rolling), RolloutPlan::default());
    }

    #[test]
    fn paused_and_stopped_hold_and_on_delete_rolls_nothing() {
        let mut sim = Sim::new(3);
        sim.apply(&sim.plan(3, (1, 0), Mode::Rolling));
        sim.come_up();
        assert_eq!(
            sim.plan(3, (1, 0), Mode::Hold),
            RolloutPlan::default(),
            "the surge stays"
        );
        // Scaling while held: out the out-of-date first, new ones current.
        let p = sim.plan(2, (1, 0), Mode::Hold);
        assert_eq!(p.scale_in, vec!["i3".to_string()]);
        let p = sim.plan(5, (1, 0), Mode::Hold);
        assert_eq!(p.create, 1);
        let sim = Sim::new(3);
        assert_eq!(sim.plan(3, (1, 0), Mode::OnDelete), RolloutPlan::default());
        // OnDelete: one removed is made again, from the new template.
        let mut sim = Sim::new(3);
        sim.instances[0].state = InstanceState::Deleting;
        assert_eq!(sim.plan(3, (1, 0), Mode::OnDelete).create, 1);
    }

    #[test]
    fn scaling_during_a_rollout() {
        // Scale-in mid-rollout: out-of-date nodes leave first.
        let mut sim = Sim::new(5);
        sim.apply(&sim.plan(5, (1, 0), Mode::Rolling));
        sim.come_up();
        let p = sim.plan(2, (1, 0), Mode::Rolling);
        assert_eq!(p.scale_in.len(), 3);
        assert!(
            p.scale_in.iter().all(|n| n != "i6"),
            "the new one stays: {p:?}"
        );
        // Scale-out mid-rollout: the new ones have the new template.
        let mut sim = Sim::new(2);
        let p = sim.plan(4, (1, 0), Mode::Rolling);
        assert_eq!((p.create, p.replace.len()), (3, 0), "up to 4 + 1 instances");
        sim.apply(&p);
        assert!(sim.active() <= 5);
        roll(4, (1, 0));
    }

    #[test]
    fn a_failed_new_instance_leaves_first_and_added_ones_are_never_rolled() {
        let mut sim = Sim::new(2);
        let made = sim.apply(&sim.plan(2, (1, 0), Mode::Rolling));
        sim.instances
            .iter_mut()
            .find(|i| i.name == made[0])
            .unwrap()
            .state = InstanceState::Failed;
        // Stopped: the pool shrinks to desired + surge at most, the failed
        // one kept (for its diagnosis), nothing old removed.
        assert_eq!(sim.plan(2, (1, 0), Mode::Hold), RolloutPlan::default());
        // Scaled in while stopped: the failed one leaves first.
        assert_eq!(
            sim.plan(1, (1, 0), Mode::Hold).scale_in,
            vec![made[0].clone()]
        );
        let mut sim = Sim::new(2);
        for i in &mut sim.instances {
            i.added = true;
        }
        assert_eq!(sim.plan(2, (1, 0), Mode::Rolling), RolloutPlan::default());
    }
}
