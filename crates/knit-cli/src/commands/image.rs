//! `knit image build` / `knit image show`: the node OS image the local
//! cloud's instances run on (knit-local's `image` module; docs/images.md).

use crate::error::{CliError, Result};
use clap::Subcommand;
use knit_local::image;
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Subcommand)]
pub enum ImageAction {
    /// Build the Debian 12 node image with mmdebstrap from the host's apt
    /// sources; nothing is built when the same packages and versions were
    /// built before.
    Build {
        /// The images directory (the image lands in DIR/<key>, DIR/debian-12
        /// points at it).
        #[arg(long, env = image::DIR_ENV, default_value = image::DEFAULT_DIR)]
        out: PathBuf,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// The current image (DIR/debian-12): key, paths, size, packages.
    Show {
        #[arg(long, env = image::DIR_ENV, default_value = image::DEFAULT_DIR)]
        dir: PathBuf,
    },
}

pub fn run(action: ImageAction) -> Result<ExitCode> {
    match action {
        ImageAction::Build { out, json } => {
            let mut progress = |line: &str| {
                let mut err = std::io::stderr().lock();
                let _ = writeln!(err, "{line}");
            };
            let built = image::build(&out, &mut progress)?;
            if json {
                print_out(&summary(&built));
            } else {
                print_out(&format!(
                    "image {} {}: root {}\n  {} MiB, {} packages, built in {:.0} s{}",
                    image::NAME,
                    built.manifest.key,
                    built.root.display(),
                    built.manifest.size_bytes >> 20,
                    built.manifest.installed.len(),
                    built.manifest.build_seconds,
                    if built.reused { " (already built)" } else { "" }
                ));
            }
            Ok(ExitCode::SUCCESS)
        }
        ImageAction::Show { dir } => match image::current(&dir)? {
            Some(built) => {
                print_out(&summary(&built));
                Ok(ExitCode::SUCCESS)
            }
            None => Err(CliError::Failed(format!(
                "no image in {}: run knit image build",
                dir.display()
            ))),
        },
    }
}

/// One result on stdout; a closed pipe (`| head`) is not an error.
fn print_out(text: &str) {
    let _ = writeln!(std::io::stdout().lock(), "{text}");
}

fn summary(b: &image::Built) -> String {
    let m = &b.manifest;
    let beside = |f: &Option<String>| f.as_ref().map(|f| b.dir.join(f));
    serde_json::to_string_pretty(&json!({
        "name": m.name,
        "key": m.key,
        "dir": b.dir,
        "root": b.root,
        "kernel": beside(&m.kernel),
        "initrd": beside(&m.initrd),
        "kernelVersion": m.kernel_version,
        "packages": m.packages,
        "installed": m.installed.len(),
        "buildSeconds": m.build_seconds,
        "sizeBytes": m.size_bytes,
        "builtAt": m.built_at,
        "reused": b.reused,
    }))
    .unwrap_or_default()
}
