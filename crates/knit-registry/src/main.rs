//! `knit-registry serve --dir D --addr IP:PORT`: runs docker-registry in the
//! foreground (this process becomes it), log on stdout/stderr. It takes
//! pushes on a loopback address only, with the writer credential (basic
//! auth as `knit-writer`, the token in `D/writer-token`); on any other it
//! serves pulls only (run a second `serve` of the same `--dir` on 127.0.0.1
//! to push, with `seed --credential-file D/writer-token`).
//! `knit-registry seed --registry http://IP:PORT [--credential-file F] [--work D] REF=SIZE[xLAYERS]…`:
//! builds each image from random bytes and pushes it; prints one JSON line
//! per image (reference, digest, bytes).

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::ExitCode;

use knit_registry::{RegistryError, Result};

const USAGE: &str = "usage: knit-registry serve --dir D --addr IP:PORT\n       knit-registry seed --registry http://IP:PORT [--credential-file D/writer-token] [--work D] REF=SIZE[xLAYERS]...";

fn flag(args: &mut Vec<String>, name: &str) -> Option<String> {
    let i = args.iter().position(|a| a == name)?;
    if i + 1 >= args.len() {
        return None;
    }
    let v = args.remove(i + 1);
    args.remove(i);
    Some(v)
}

fn run(mut args: Vec<String>) -> Result<()> {
    let usage = || RegistryError::Invalid(USAGE.into());
    if args.is_empty() {
        return Err(usage());
    }
    match args.remove(0).as_str() {
        "serve" => {
            let dir = flag(&mut args, "--dir").ok_or_else(usage)?;
            let addr = flag(&mut args, "--addr").ok_or_else(usage)?;
            let access = knit_registry::access_for(&addr);
            if access == knit_registry::Access::PullOnly {
                eprintln!(
                    "knit-registry: {addr} is not loopback: pulls only (push and delete answer 405); \
                     to push, serve the same --dir on 127.0.0.1 too"
                );
            }
            let (bin, config) = knit_registry::prepare(&PathBuf::from(&dir), &addr, access)?;
            if access == knit_registry::Access::ReadWrite {
                eprintln!(
                    "knit-registry: pushes on {addr} need the writer credential: user {}, token in {dir}/{}",
                    knit_registry::WRITER_USER,
                    knit_registry::WRITER_TOKEN_FILE
                );
            }
            // exec: the caller's PID is the registry's, so it can be killed by PID.
            let e = std::process::Command::new(bin)
                .arg("serve")
                .arg(config)
                .exec();
            Err(RegistryError::Start(format!("exec docker-registry: {e}")))
        }
        "seed" => {
            let mut base = flag(&mut args, "--registry").ok_or_else(usage)?;
            // The writer's credential from its file, never from argv.
            if let Some(file) = flag(&mut args, "--credential-file") {
                let token = std::fs::read_to_string(&file).map_err(|e| {
                    RegistryError::Invalid(format!("--credential-file {file}: {e}"))
                })?;
                base = knit_registry::credential_url(&base, token.trim());
            }
            let work = flag(&mut args, "--work")
                .map(PathBuf::from)
                .unwrap_or_else(std::env::temp_dir);
            for arg in &args {
                let (reference, layers, bytes) = knit_registry::parse_image_arg(arg)?;
                let img = knit_registry::seed(&base, &work, &reference, layers, bytes)?;
                println!(
                    "{}",
                    serde_json::json!({
                        "reference": reference,
                        "digest": img.manifest_digest,
                        "transferBytes": img.transfer_bytes(),
                        "layers": layers,
                    })
                );
            }
            Ok(())
        }
        _ => Err(usage()),
    }
}

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error[{}]: {e}", e.code());
            ExitCode::FAILURE
        }
    }
}
