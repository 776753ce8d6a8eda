//! `knit attach` (automatic mode) and `knit attach-script` (manual mode):
//! adding existing instances to a pool (docs/spec.md §2, docs/add-existing.md).

use crate::error::{CliError, Result};
use clap::Args;
use knit_api::views::{preflight_table, AttachOutcome, AttachRequest, AttachScriptRequest};
use knit_client::Client;
use std::path::{Path, PathBuf};
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
    /// Refused: a password on the command line is visible to other users
    /// (the process list, /proc/PID/cmdline) and kept in shell history.
    /// Kept only to say what to use instead (never echoed).
    #[arg(long, hide = true, num_args = 0..=1, default_missing_value = "", value_parser = RefusePassword)]
    password: Option<String>,
    /// New login password (required for pools that log in by password):
    /// the first line of the file PATH, or of standard input with `-`.
    #[arg(long, value_name = "PATH", conflicts_with = "password_stdin")]
    password_file: Option<PathBuf>,
    /// The same as `--password-file -`.
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
/// `what` names where it came from, for the errors.
fn password_from(mut input: impl std::io::BufRead, what: &str) -> Result<String> {
    let mut line = String::new();
    input.read_line(&mut line).map_err(|source| CliError::Io {
        what: format!("{what}: cannot read it"),
        source,
    })?;
    let password = line.trim_end_matches(['\r', '\n']).to_string();
    if password.is_empty() {
        return Err(CliError::Usage(format!(
            "{what} held no password (its first line is empty)"
        )));
    }
    Ok(password)
}

/// What `--password` is refused with: the secret is never echoed.
pub const PASSWORD_FLAG_REFUSED: &str = "--password is not accepted: a password on the command line is visible to other users (the process list, /proc/PID/cmdline) and kept in shell history. Put it in a file only you can read and pass --password-file PATH, or pipe it in with --password-file - (standard input)";

/// `--password`'s parser: refuses every value at parse time (before the
/// client config is read or the server asked), with a message of its own
/// that does not repeat the value as clap's would.
#[derive(Clone)]
struct RefusePassword;

impl clap::builder::TypedValueParser for RefusePassword {
    type Value = String;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        _arg: Option<&clap::Arg>,
        _value: &std::ffi::OsStr,
    ) -> std::result::Result<String, clap::Error> {
        Err(clap::Error::raw(
            clap::error::ErrorKind::ValueValidation,
            format!("{PASSWORD_FLAG_REFUSED}\n"),
        )
        .with_cmd(cmd))
    }
}

/// The new login password the attach sets, from `--password-file PATH`
/// (`-`: `stdin`) or `--password-stdin`; never from the command line.
fn attach_password(a: &AttachArgs, stdin: impl std::io::BufRead) -> Result<Option<String>> {
    if a.password.is_some() {
        return Err(CliError::Usage(PASSWORD_FLAG_REFUSED.into()));
    }
    match a.password_file.as_deref() {
        Some(p) if p == Path::new("-") => {
            password_from(stdin, "--password-file -: standard input").map(Some)
        }
        Some(p) => {
            let what = format!("--password-file {}", p.display());
            let file = std::fs::File::open(p).map_err(|source| CliError::Io {
                what: format!("{what}: cannot open it"),
                source,
            })?;
            password_from(std::io::BufReader::new(file), &what).map(Some)
        }
        None if a.password_stdin => {
            password_from(stdin, "--password-stdin: standard input").map(Some)
        }
        None => Ok(None),
    }
}

pub fn attach(c: &Client, a: AttachArgs) -> Result<ExitCode> {
    let password = attach_password(&a, std::io::stdin().lock())?;
    let request = AttachRequest {
        instances: a.instances.clone(),
        format_data_disk: a.format_data_disk,
        keep_instance_name: a.keep_instance_name,
        password,
        dry_run: a.dry_run,
    };
    let answer = c.attach(&a.pool, &request)?;
    let v = &answer.view;
    let passed = v.passed;
    if a.output.as_deref() == Some("json") {
        println!("{}", knit_api::ser::value_pretty(&answer.raw));
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
        println!("{}", knit_api::ser::value_pretty(&answer.raw));
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
    use super::{attach_password, parse_duration, password_from, AttachArgs};
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        attach: AttachArgs,
    }

    fn parse(args: &[&str]) -> Result<AttachArgs, clap::Error> {
        let argv = ["attach", "--pool", "p", "--instances", "i-1"];
        Cli::try_parse_from(argv.iter().chain(args)).map(|c| c.attach)
    }

    #[test]
    fn password_from_stdin_takes_the_first_line_only() {
        let read = |s: &str| password_from(s.as_bytes(), "stdin").map_err(|e| e.to_string());
        assert_eq!(read("S3cret!pass\nrest\n").as_deref(), Ok("S3cret!pass"));
        assert_eq!(read("S3cret!pass\r\n").as_deref(), Ok("S3cret!pass"));
        assert_eq!(read("no newline").as_deref(), Ok("no newline"));
        let empty = read("\nS3cret!pass\n").unwrap_err();
        assert!(empty.contains("stdin held no password"), "{empty}");
        assert!(read("").is_err());
    }

    /// The password never comes from argv: `--password VALUE` (and a bare
    /// `--password`) is refused when the command line is parsed, naming
    /// what to use and never echoing the value.
    #[test]
    fn the_password_flag_is_refused_without_echoing_it() {
        for args in [
            &["--password", "N3w-pass!x"][..],
            &["--password"],
            &["--password=N3w-pass!x"],
        ] {
            let Err(e) = parse(args) else {
                panic!("{args:?} parsed")
            };
            let err = e.to_string();
            assert!(err.contains("--password-file PATH"), "{err}");
            assert!(err.contains("--password-file -"), "{err}");
            assert!(!err.contains("N3w-pass!x"), "echoed: {err}");
        }
        // Had a value got through, the attach would refuse it still.
        let mut a = parse(&[]).unwrap();
        a.password = Some("N3w-pass!x".into());
        let err = attach_password(&a, "x\n".as_bytes())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--password-file PATH") && !err.contains("N3w-pass!x"),
            "{err}"
        );
        // Nothing given: no password, nothing read.
        let a = parse(&[]).unwrap();
        assert_eq!(attach_password(&a, "x\n".as_bytes()).unwrap(), None);
    }

    #[test]
    fn the_password_comes_from_a_file_or_stdin() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pw");
        std::fs::write(&path, "N3w-pass!file\nignored\n").unwrap();
        let a = parse(&["--password-file", path.to_str().unwrap()]).unwrap();
        let got = attach_password(&a, "from-stdin\n".as_bytes()).unwrap();
        assert_eq!(got.as_deref(), Some("N3w-pass!file"));

        let a = parse(&["--password-file", "-"]).unwrap();
        let got = attach_password(&a, "N3w-pass!stdin\n".as_bytes()).unwrap();
        assert_eq!(got.as_deref(), Some("N3w-pass!stdin"));
        let a = parse(&["--password-stdin"]).unwrap();
        let got = attach_password(&a, "N3w-pass!stdin\n".as_bytes()).unwrap();
        assert_eq!(got.as_deref(), Some("N3w-pass!stdin"));

        let missing = dir.path().join("absent");
        let a = parse(&["--password-file", missing.to_str().unwrap()]).unwrap();
        let err = attach_password(&a, "x\n".as_bytes())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--password-file") && err.contains("absent"),
            "{err}"
        );
        std::fs::write(&path, "\n").unwrap();
        let a = parse(&["--password-file", path.to_str().unwrap()]).unwrap();
        assert!(attach_password(&a, "x\n".as_bytes()).is_err());
        assert!(parse(&["--password-file", "-", "--password-stdin"]).is_err());
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
