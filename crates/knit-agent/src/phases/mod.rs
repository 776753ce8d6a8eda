//! The ten phases, in the order they run.

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

use crate::engine::Phase;

pub fn all() -> Vec<Box<dyn Phase>> {
    vec![
        Box::new(time_sync::TimeSync),
        Box::new(node_identity::NodeIdentityPhase),
        Box::new(data_disk::DataDisk),
        Box::new(os_config::OsConfigPhase { initial: true }),
        Box::new(components::KubernetesComponents),
        Box::new(optional::OptionalComponentsPhase),
        Box::new(join::Join),
        Box::new(base_packages::BasePackagesPhase),
        Box::new(os_config::OsConfigPhase { initial: false }),
        Box::new(hardening::HardeningPhase),
    ]
}
