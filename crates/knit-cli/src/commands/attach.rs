//! `knit attach` (automatic mode) and `knit attach-script` (manual mode):
//! adding existing instances to a pool (SPEC §2, docs/add-existing.md).

use crate::error::{CliError, Result};
use clap::Args;
use knit_api::views::{preflight_table, AttachOutcome, AttachRequest, AttachScriptRequest};
use knit_client::Client;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Args)]
pub struct AttachArgs {
    #[arg(long)]
    pool: String,
    /// Instance ids, comma separated (i-1,i-2).
    #[arg(long, value_delimiter = ',', required = true)]
    instances: Vec<String>,
    /// Use the last data disk for the runtime and kubelet: formatted ext4
    /// when blank, mounted as is when it holds a filesystem.
    #[arg(long)]
    format_data_disk: bool,
    /// Node name = the instance's name (otherwise the pool's naming rule).
    #[arg(long)]
    keep_instance_name: bool,
    /// New login password (required for pools that log in by password).
    /// Visible to other users in the process list: prefer --password-stdin.
    #[arg(long, conflicts_with = "password_stdin")]
    password: Option<String>,
    /// Read the new login password from the first line of standard input.
    #[arg(long)]
    password_stdin: bool,
    /// Run every preflight check and print the results; change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Follow the nodes until every one is Ready (or failed).
    #[arg(long)]
    wait: bool,
    /// How long --wait waits (`15m`, `90s`, or seconds).
    #[arg(long, default_value = "900", value_parser = super::seconds)]
    timeout: u64,
    /// json for machine-readable output.
    #[arg(short = 'o', long)]
    output: Option<String>,
}

#[derive(Args)]
pub struct ScriptArgs {
    #[arg(long)]
    pool: String,
    #[arg(long)]
    format_data_disk: bool,
    #[arg(long)]
    keep_instance_name: bool,
    /// Life of the command's one-time token: 90s, 30m, 1h, 2d.
    #[arg(long, default_value = "1h")]
    expires: String,
    #[arg(short = 'o', long)]
    output: Option<String>,
}

/// `90s`, `30m`, `1h`, `2d` or plain seconds.
pub fn parse_duration(s: &str) -> Option<i64> {
    let s = s.trim();
    let (num, unit) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => (&s[..i], c),
        _ => (s, 's'),
    };
    let n: i64 = num.parse().ok().filter(|n| *n > 0)?;
    let mult = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86400,
        _ => return None,
    };
    n.checked_mul(mult)
}

/// The first line of `input`, without its line ending; empty is an error.
fn password_from(mut input: impl std::io::BufRead) -> Result<String> {
    let mut line = String::new();
    input.read_line(&mut line).map_err(|source| CliError::Io {
        what: "--password-stdin: cannot read standard input".into(),
        source,
    })?;
    let password = line.trim_end_matches(['\r', '\n']).to_string();
    if password.is_empty() {
        return Err(CliError::Usage(
            "--password-stdin: standard input held no password (the first line is empty)".into(),
        ));
    }
    Ok(password)
}

pub fn attach(c: &Client, mut a: AttachArgs) -> Result<ExitCode> {
    if a.password_stdin {
        a.password = Some(password_from(std::io::stdin().lock())?);
    }
    let request = AttachRequest {
        instances: a.instances.clone(),
        format_data_disk: a.format_data_disk,
        keep_instance_name: a.keep_instance_name,
        password: a.password.clone(),
        dry_run: a.dry_run,
    };
    let answer = c.attach(&a.pool, &request)?;
    let v = &answer.view;
    let passed = v.passed;
    if a.output.as_deref() == Some("json") {
        println!(
            "{}",
            serde_json::to_string_pretty(&answer.raw).unwrap_or_default()
        );
    } else {
        print!("{}", preflight_table(&v.preflight));
        for outcome in &v.attached {
            let i = match outcome {
                AttachOutcome::Failed(f) => {
                    println!("{}: attach failed: {}", f.provider_id, f.error);
                    continue;
                }
                AttachOutcome::Attached(i) => i,
            };
            let disks: Vec<String> = i
                .old_disks
                .iter()
                .zip(&i.new_disks)
                .map(|(o, n)| format!("{o} -> {n}"))
                .collect();
            println!(
                "{} re-imaged and added to pool {} as {} (node {}); data disks: {}",
                i.provider_id,
                a.pool,
                i.instance,
                i.node_name,
                if disks.is_empty() {
                    "none".to_string()
                } else {
                    disks.join(", ")
                }
            );
        }
    }
    if !passed {
        return Err(CliError::Failed(if a.dry_run {
            "preflight found errors (nothing was changed)".into()
        } else {
            "instances not added: see the preflight errors above (nothing was changed for a failed preflight)".into()
        }));
    }
    if a.dry_run {
        if a.output.as_deref() != Some("json") {
            println!("preflight passed (dry run: nothing was changed)");
        }
        return Ok(ExitCode::SUCCESS);
    }
    if a.wait {
        return super::wait::scale(c, &a.pool, Duration::from_secs(a.timeout));
    }
    Ok(ExitCode::SUCCESS)
}

pub fn script(c: &Client, a: ScriptArgs) -> Result<ExitCode> {
    let expires = parse_duration(&a.expires).ok_or_else(|| {
        CliError::Usage(format!(
            "--expires {:?}: use 90s, 30m, 1h, 2d or seconds",
            a.expires
        ))
    })?;
    let request = AttachScriptRequest {
        format_data_disk: a.format_data_disk,
        keep_instance_name: a.keep_instance_name,
        expires_seconds: Some(expires),
    };
    let answer = c.attach_script(&a.pool, &request)?;
    if a.output.as_deref() == Some("json") {
        println!(
            "{}",
            serde_json::to_string_pretty(&answer.raw).unwrap_or_default()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let v = &answer.view;
    eprintln!(
        "# Run as root on the machine to add to pool {} (one machine, once; token {} expires in {}; CA pin {}):",
        a.pool, v.token_id, a.expires, v.ca_pin
    );
    println!("{}", v.command);
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::{parse_duration, password_from};

    #[test]
    fn password_from_stdin_takes_the_first_line_only() {
        let read = |s: &str| password_from(s.as_bytes()).map_err(|e| e.to_string());
        assert_eq!(read("S3cret!pass\nrest\n").as_deref(), Ok("S3cret!pass"));
        assert_eq!(read("S3cret!pass\r\n").as_deref(), Ok("S3cret!pass"));
        assert_eq!(read("no newline").as_deref(), Ok("no newline"));
        let empty = read("\nS3cret!pass\n").unwrap_err();
        assert!(empty.contains("--password-stdin"), "{empty}");
        assert!(read("").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("1h"), Some(3600));
        assert_eq!(parse_duration("90s"), Some(90));
        assert_eq!(parse_duration("30m"), Some(1800));
        assert_eq!(parse_duration("2d"), Some(172800));
        assert_eq!(parse_duration("120"), Some(120));
        assert_eq!(parse_duration("0"), None);
        assert_eq!(parse_duration("1w"), None);
        assert_eq!(parse_duration("h"), None);
    }
}
