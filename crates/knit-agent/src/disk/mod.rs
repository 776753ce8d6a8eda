//! Block devices: discovery under `<root>/dev`, facts from sysfs, on-disk
//! signatures, and the data-disk selection rule.

pub mod discover;
pub mod mounts;
pub mod signature;

pub use discover::{discover, BlockDisk, DiskIdentity};
pub use signature::{read_signature, Signature};
