//! `knit image preload`: the current node image with a Kubernetes package
//! and the agent preloaded. Its root is the current image's, hard-linked
//! (images are never changed in place, and the preload only adds new
//! names), plus what `knit-agent preload` writes under it: the package as
//! a read-only cache at `/opt/knit/kubernetes`, its binaries where the
//! agent installs them, the agent at `/usr/local/bin/knit-agent`. A node on
//! it checks those against what the control plane serves and uses them:
//! nothing downloaded, nothing written through its disk, and every machine
//! on the host shares one copy in the page cache.
//!
//! Layout beside the other images: `<dir>/<key>/` (root, kernel and
//! initramfs links, image.json with `preload`), `<dir>/debian-12-preloaded`
//! pointing at it. The key covers the base image's key, the tarball's and
//! the agent's sha256: the same inputs make nothing new.

use super::{du, linked, lock, point, remove_unfinished, sync_dir, Built, Manifest, NAME};
use crate::error::{IoContext, LocalError, Result};
use crate::model::PRELOADED_NAME;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// What a preloaded image holds on top of the image it was made from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Preload {
    /// The key of the image it was made from.
    pub base_key: String,
    pub kubernetes_version: String,
    pub tarball_sha256: String,
    pub agent_sha256: String,
}

/// What to preload.
#[derive(Debug, Clone)]
pub struct PreloadInput {
    /// `kubernetes-<version>-linux-amd64.tar.gz`.
    pub tarball: PathBuf,
    pub kubernetes_version: String,
    /// The tarball's sha256, as the control plane serves it.
    pub tarball_sha256: String,
    /// The agent the control plane serves: preloaded, and run to preload.
    pub agent: PathBuf,
}

/// `knit-agent preload` unpacks and copies a package of tens of MiB.
const PRELOAD_TIMEOUT: Duration = Duration::from_secs(600);
/// Its answer is one JSON document listing a few binaries.
const ANSWER_CAP: usize = 1 << 20;

/// `knit-agent preload`'s answer: what it installed.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct AgentAnswer {
    tarball_sha256: String,
    agent_sha256: Option<String>,
}

/// Makes (or finds) the preloaded image of the current one in `images`
/// and points `debian-12-preloaded` at it.
pub fn preload(
    images: &Path,
    input: &PreloadInput,
    progress: &mut dyn FnMut(&str),
) -> Result<Built> {
    crate::run::require_root()?;
    let _lock = lock(&images.join("lock"), progress)?;
    let base = linked(images, NAME)?.ok_or_else(|| {
        LocalError::invalid(
            "image",
            images.join(NAME).display().to_string(),
            "holds no node image: run knit image build first",
        )
    })?;
    let agent_sha256 = sha256_file(&input.agent)?;
    let key = key_of(&base.manifest.key, &input.tarball_sha256, &agent_sha256);
    let dir = images.join(&key);
    if let Some(manifest) = crate::state::read_opt::<Manifest>(&dir.join("image.json"))? {
        point(images, PRELOADED_NAME, &key)?;
        progress(&format!("image {key} is already preloaded: nothing to do"));
        return Ok(Built {
            root: dir.join("root"),
            dir,
            manifest,
            reused: true,
        });
    }
    remove_unfinished(images)?;
    if dir.exists() {
        return Err(LocalError::Busy {
            what: dir.display().to_string(),
            message: "exists but holds no image.json: not made by knit image; move it away".into(),
        });
    }
    let started = Instant::now();
    let tmp = images.join(format!(".build-{key}"));
    std::fs::create_dir(&tmp).ctx("cannot create", &tmp)?;
    let root = tmp.join("root");
    progress(&format!(
        "[1/3] linking the root of image {} into {}",
        base.manifest.key,
        tmp.display()
    ));
    link_tree(&base.root, &root)?;
    for file in [&base.manifest.kernel, &base.manifest.initrd]
        .into_iter()
        .flatten()
    {
        link_tree(&base.dir.join(file), &tmp.join(file))?;
    }
    progress(&format!(
        "[2/3] preloading Kubernetes {} ({}) and knit-agent ({})",
        input.kubernetes_version,
        short(&input.tarball_sha256),
        short(&agent_sha256)
    ));
    agent_preload(&root, input, &agent_sha256)?;
    progress("[3/3] manifest, publishing");
    let manifest = Manifest {
        name: PRELOADED_NAME.into(),
        key: key.clone(),
        build_seconds: (started.elapsed().as_millis() as f64) / 1000.0,
        size_bytes: du(&tmp)?,
        built_at: crate::state::now(),
        preload: Some(Preload {
            base_key: base.manifest.key.clone(),
            kubernetes_version: input.kubernetes_version.clone(),
            tarball_sha256: input.tarball_sha256.to_lowercase(),
            agent_sha256,
        }),
        ..base.manifest
    };
    crate::state::write_json(&tmp.join("image.json"), &manifest)?;
    std::fs::rename(&tmp, &dir).ctx("cannot rename the build into place", &dir)?;
    sync_dir(images)?;
    point(images, PRELOADED_NAME, &key)?;
    Ok(Built {
        root: dir.join("root"),
        dir,
        manifest,
        reused: false,
    })
}

/// The image's key: its base, the package and the agent.
fn key_of(base_key: &str, tarball_sha256: &str, agent_sha256: &str) -> String {
    let digest = Sha256::digest(format!(
        "preload 1\nbase {base_key}\ntarball {}\nagent {agent_sha256}\n",
        tarball_sha256.to_lowercase()
    ));
    hex::encode(digest)[..16].to_string()
}

fn short(sha: &str) -> &str {
    sha.get(..12).unwrap_or(sha)
}

/// `cp -al`: a tree of hard links (no byte copied, one page cache); a
/// copy when `to` is on another filesystem than `from`.
fn link_tree(from: &Path, to: &Path) -> Result<()> {
    let (from, to_text) = (from.display().to_string(), to.display().to_string());
    if crate::run::run("cp", &["-al", &from, &to_text]).is_ok() {
        return Ok(());
    }
    if to.exists() {
        crate::state::remove_dir_all(to)?;
    }
    crate::run::run("cp", &["-a", &from, &to_text]).map(|_| ())
}

fn sha256_file(path: &Path) -> Result<String> {
    knit_os::digest::sha256_file(path).ctx("cannot read", path)
}

/// Runs the agent's own preload under `root`: the package is verified and
/// installed by the code that installs it on nodes.
fn agent_preload(root: &Path, input: &PreloadInput, agent_sha256: &str) -> Result<()> {
    let mut cmd = Command::new(&input.agent);
    cmd.arg("--root")
        .arg(root)
        .arg("preload")
        .arg("--package")
        .arg(&input.tarball)
        .args(["--kubernetes-version", &input.kubernetes_version])
        .args(["--sha256", &input.tarball_sha256])
        .arg("--agent")
        .arg(&input.agent);
    let out = knit_os::command::run_with_input(&mut cmd, b"", PRELOAD_TIMEOUT, ANSWER_CAP)?;
    let failed = |status: String, detail: String| LocalError::Command {
        command: knit_os::command::display(&cmd),
        status,
        stderr: detail,
    };
    let text = out.stdout_text();
    if !out.success() {
        // The agent's failure is a JSON document on stdout.
        let said = if text.trim().is_empty() {
            knit_os::command::printed_tail(&out.stderr)
        } else {
            text
        };
        return Err(failed(out.status.to_string(), said.trim().to_string()));
    }
    let answer: AgentAnswer = serde_json::from_str(&text).map_err(|e| {
        failed(
            "answered".into(),
            format!("unreadable answer ({e}): {text}"),
        )
    })?;
    if !answer
        .tarball_sha256
        .eq_ignore_ascii_case(&input.tarball_sha256)
        || answer.agent_sha256.as_deref() != Some(agent_sha256)
    {
        return Err(failed(
            "answered".into(),
            format!("preloaded other files than asked: {text}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_follows_every_input() {
        let k = key_of("base", "aa", "bb");
        assert_eq!(k.len(), 16);
        assert_eq!(k, key_of("base", "AA", "bb"), "hex case is not an input");
        assert_ne!(k, key_of("base2", "aa", "bb"));
        assert_ne!(k, key_of("base", "ab", "bb"));
        assert_ne!(k, key_of("base", "aa", "bc"));
    }
}
