//! `knit local …`: the local cloud's verbs, run by the knit-local program
//! installed beside knit.

use super::package::sibling;
use crate::error::{io, CliError, Result};
use std::process::ExitCode;

pub fn run(args: &[String]) -> Result<ExitCode> {
    let program = sibling("knit-local")?;
    if !program.is_file() {
        return Err(CliError::Failed(format!(
            "{} is missing: build the knit-local crate",
            program.display()
        )));
    }
    let status = std::process::Command::new(&program)
        .args(args)
        .status()
        .map_err(io(format!("run {}", program.display())))?;
    Ok(match status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(c) => ExitCode::from(c.clamp(1, 255) as u8),
        None => ExitCode::FAILURE,
    })
}
