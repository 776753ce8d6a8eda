//! `knit exec node|instance NAME -- CMD…`: runs a command on one machine
//! through its provider, by the server's API (admin token), prints its
//! output and exits with its exit code.

use clap::{Args, ValueEnum};
use knit_client::{
    Client, ClientError, ExecRequest, EXEC_API_OUTPUT_MAX_BYTES, EXEC_DEFAULT_TIMEOUT_SECONDS,
};
use std::io::Write;
use std::process::ExitCode;

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Target {
    #[value(alias = "nodes")]
    Node,
    #[value(alias = "instances")]
    Instance,
}

#[derive(Args)]
pub struct ExecArgs {
    kind: Target,
    name: String,
    /// How long the command may run (`90s`, `5m` or seconds; at most
    /// 300 s); past it the command is killed and knit exec fails.
    #[arg(long, default_value_t = EXEC_DEFAULT_TIMEOUT_SECONDS, value_parser = super::seconds)]
    timeout: u64,
    /// The command and its arguments, after `--`; sent as they are, no
    /// shell (use `sh -c '…'` for one).
    #[arg(last = true, required = true, num_args = 1..)]
    argv: Vec<String>,
}

/// Runs it; the command's exit code becomes knit's (255 when it ended by a
/// signal or the code does not fit).
pub fn run(client: &Client, args: ExecArgs) -> Result<ExitCode, ClientError> {
    let request = ExecRequest {
        kind: match args.kind {
            Target::Node => "node".into(),
            Target::Instance => "instance".into(),
        },
        name: args.name,
        argv: args.argv,
        timeout_seconds: Some(args.timeout),
    };
    let answer = client.exec(&request)?;
    let (stdout, stderr) = knit_client::exec_output(&answer)?;
    let write = |mut to: Box<dyn Write>, bytes: &[u8], cut: bool, stream: &str| {
        let _ = to.write_all(bytes);
        let _ = to.flush();
        if cut {
            eprintln!("\nknit exec: {stream} cut at {EXEC_API_OUTPUT_MAX_BYTES} bytes");
        }
    };
    write(
        Box::new(std::io::stdout()),
        &stdout,
        answer.stdout_cut,
        "stdout",
    );
    write(
        Box::new(std::io::stderr()),
        &stderr,
        answer.stderr_cut,
        "stderr",
    );
    Ok(ExitCode::from(
        u8::try_from(answer.exit_code).unwrap_or(255),
    ))
}
