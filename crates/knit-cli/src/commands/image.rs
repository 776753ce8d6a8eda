//! `knit image build` / `knit image show`: the node OS image the local
//! cloud's instances run on (knit-local's `image` module; docs/images.md).

use crate::error::{CliError, Result};
use clap::Subcommand;
use knit_local::image;
use serde_json::json;
use std::io::Write;
use std::path::{Path, PathBuf};
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
    /// The current image with the server's Kubernetes package and
    /// knit-agent preloaded (DIR/debian-12-preloaded): pools with `image:
    /// debian-12-preloaded` neither download nor write them on each node.
    /// Run again after `knit package build` or `knit image build`.
    Preload {
        #[arg(long, env = image::DIR_ENV, default_value = image::DEFAULT_DIR)]
        out: PathBuf,
        /// The server's state directory: its package mirror is preloaded.
        #[arg(long, env = "KNIT_STATE_DIR", default_value = "/var/lib/knit/server")]
        state_dir: PathBuf,
        #[arg(long, default_value = knit_api::DEFAULT_KUBERNETES_VERSION)]
        kubernetes_version: String,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(action: ImageAction) -> Result<ExitCode> {
    match action {
        ImageAction::Build { out, json } => {
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
        ImageAction::Preload {
            out,
            state_dir,
            kubernetes_version,
            json,
        } => {
            let input = preload_input(&state_dir, kubernetes_version)?;
            let built = image::preload(&out, &input, &mut progress)?;
            if json {
                print_out(&summary(&built));
            } else {
                print_out(&format!(
                    "image {} {}: root {}\n  Kubernetes {} and knit-agent preloaded{}; pools use it with `image: {}`",
                    image::PRELOADED_NAME,
                    built.manifest.key,
                    built.root.display(),
                    input.kubernetes_version,
                    if built.reused { " (already made)" } else { "" },
                    image::PRELOADED_NAME,
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

/// The mirror's tarball of `version`, its sha256 (the `.sha256` beside it,
/// as the server serves it) and the mirror's agent.
fn preload_input(state_dir: &Path, version: String) -> Result<image::PreloadInput> {
    let mirror = knit_server::Settings::new(state_dir.to_path_buf()).mirror_dir();
    let tarball = mirror.join(knit_server::mirror::kubernetes_package(&version));
    let agent = mirror.join("bin/knit-agent");
    let sidecar = PathBuf::from(format!("{}.sha256", tarball.display()));
    let sha = std::fs::read_to_string(&sidecar)
        .ok()
        .and_then(|t| t.split_whitespace().next().map(str::to_string))
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()));
    match (sha, agent.is_file()) {
        (Some(tarball_sha256), true) => Ok(image::PreloadInput {
            tarball,
            kubernetes_version: version,
            tarball_sha256,
            agent,
        }),
        _ => Err(CliError::Failed(format!(
            "no Kubernetes {version} package in the mirror {} ({} with its .sha256, and bin/knit-agent): run knit package build first",
            mirror.display(),
            knit_server::mirror::kubernetes_package(&version)
        ))),
    }
}

/// A long step's progress, a line at a time on stderr.
fn progress(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
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
        "preload": m.preload,
        "reused": b.reused,
    }))
    .unwrap_or_default()
}
