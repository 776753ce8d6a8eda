//! knit-os: what every knit binary needs from the operating system, once.
//!
//! Each module does one job the crates used to write for themselves:
//! [`durable`] files (temp + fsync + rename + directory fsync), [`proc`]ess
//! identity that survives PID reuse (the start time in /proc/PID/stat),
//! [`command`]s with a deadline and an output cap, TLS trust roots from
//! [`pem`], [`time`] (RFC 3339 and HTTP dates, the clock), file [`digest`]s, shell
//! [`quote`]-ing, and long-lived children [`reap`]ed by one thread. It depends on no knit crate; every knit crate may use it.
//! Errors are one [`OsError`] with a stable [`OsError::code`].

pub mod command;
pub mod digest;
pub mod durable;
mod error;
pub mod pem;
pub mod proc;
pub mod quote;
pub mod reap;
pub mod time;

pub use error::{OsError, Result};
