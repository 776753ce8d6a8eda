//! knit-local: the local cloud. Sandbox machines on one Linux host, each with
//! its own mount/UTS/IPC/PID/network namespaces, an overlayfs root over a
//! read-only base root whose upper layer lives on the instance's system disk,
//! a private `/dev` with its own loop-backed disks under cloud names, a veth
//! into a host bridge, a metadata endpoint and a cloud-init compatible
//! user-data runner; data disks and snapshots live in a copy-on-write block
//! store (reflink clones). See docs/local-cloud.md.

pub mod blockstore;
pub mod boot;
pub mod bounds;
pub mod cloud;
pub mod devprog;
pub mod error;
pub mod host_limits;
pub mod image;
pub mod loopdev;
pub mod metadata;
pub mod model;
pub mod mounts;
pub mod net;
pub mod pause;
pub mod run;
pub mod state;
pub mod userdata;

pub use cloud::{Cloud, Config, DownReport};
pub use error::{LocalError, Result};
/// knit-api's shell-script helpers, for knit-qemu (whose manifest does not
/// name knit-api yet).
pub use knit_api::shell;
pub use model::*;
pub use run::require_root;
