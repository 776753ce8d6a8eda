//! knit-agent: takes a machine from a bare OS to a joined, configured node
//! as a journal of idempotent phases (docs/spec.md §1.3, §5.1).

pub mod disk;
pub mod engine;
pub mod error;
pub mod files;
pub mod host;
pub mod identity;
pub mod journal;
pub mod ledger;
pub mod log;
pub mod markers;
pub mod package;
pub mod phase;
pub mod phases;
pub mod prepare;
pub mod render;
pub mod report;
pub mod scrub;
pub mod services;
pub mod supervise;
pub mod tls;
pub mod undo;
pub mod update;

pub use error::{AgentError, Result};
