//! The ten phases, run in `knit_api::PhaseName::ALL`'s order.

pub mod base_packages;
pub mod components;
pub mod data_disk;
pub mod hardening;
pub mod join;
pub mod kernel_hold;
pub mod node_identity;
pub mod optional;
pub mod os_config;
pub mod time_sync;

use crate::phase::Phase;
use knit_api::PhaseName;

/// Every phase in the order it runs: `PhaseName::ALL`'s order, the one list
/// of phases (knit-api), each name to the code that does it.
pub fn all() -> Vec<Box<dyn Phase>> {
    PhaseName::ALL.iter().map(|&name| of(name)).collect()
}

/// The code of one phase; a phase added to `PhaseName` without code here
/// does not compile.
fn of(name: PhaseName) -> Box<dyn Phase> {
    match name {
        PhaseName::TimeSync => Box::new(time_sync::TimeSync),
        PhaseName::NodeIdentity => Box::new(node_identity::NodeIdentityPhase),
        PhaseName::DataDisk => Box::new(data_disk::DataDisk),
        PhaseName::OsConfigInitial => Box::new(os_config::OsConfigPhase { initial: true }),
        PhaseName::KubernetesComponents => Box::new(components::KubernetesComponents),
        PhaseName::OptionalComponents => Box::new(optional::OptionalComponentsPhase),
        PhaseName::Join => Box::new(join::Join),
        PhaseName::BasePackages => Box::new(base_packages::BasePackagesPhase),
        PhaseName::OsConfig => Box::new(os_config::OsConfigPhase { initial: false }),
        PhaseName::Hardening => Box::new(hardening::HardeningPhase),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each name's code reports that name (the journal and the reports are
    /// keyed by it), so the run order is `PhaseName::ALL`'s.
    #[test]
    fn each_phase_is_the_one_its_name_says() {
        let names: Vec<PhaseName> = all().iter().map(|p| p.name()).collect();
        assert_eq!(names, PhaseName::ALL);
    }
}
