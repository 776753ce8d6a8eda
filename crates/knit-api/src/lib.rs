//! knit's shared language: the documents users and components exchange, the
//! names every part agrees on (phases, error codes), and their validation.
//!
//! Pure data and validation, no I/O: everything else in knit depends on this
//! crate and it depends on nothing of knit.

pub mod agent;
pub mod config;
pub mod disk;
pub mod error;
pub mod events;
pub mod instance_types;
pub mod phase;
pub mod pool;
pub mod reference;
pub mod routes;
pub mod schema;
pub mod ser;
pub mod shell;
pub mod state;
pub mod update;
pub mod validate;
pub mod views;
mod word;

pub use config::*;
pub use error::{ApiError, FieldError};
pub use events::*;
pub use phase::{ErrorCode, PhaseName};
pub use pool::*;
