//! Assembling the package mirror (`knit package build`): the Kubernetes
//! package tarball in ACK's `pkg/kubernetes` layout, the agent binary, and
//! sha256 files beside each, plus a `SHA256SUMS` index.

use crate::error::{Result, ServerError};
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Images the local package set lists as system images (`images.txt`).
pub const DEFAULT_SYSTEM_IMAGES: &[&str] = &[
    "registry.k8s.io/pause:3.10",
    "registry.k8s.io/kube-proxy:v1.31.4",
    "docker.io/flannel/flannel:v0.26.1",
];

#[derive(Debug, Clone)]
pub struct PackageBuild {
    pub mirror_dir: PathBuf,
    pub kubernetes_version: String,
    /// Shipped as `bin/kubelet` (on the local cloud: knit-kubelet-sim).
    pub kubelet: PathBuf,
    pub agent: PathBuf,
    /// (name in `bin/`, source path), e.g. ("containerd", /usr/bin/containerd).
    pub runtime_bins: Vec<(String, PathBuf)>,
    pub containerd_version: String,
    pub images: Vec<String>,
    /// (name in `cni/bin/`, source path): CNI plugins the agent installs in /opt/cni/bin.
    pub cni_plugins: Vec<(String, PathBuf)>,
    /// (file name in `cni/net.d/`, content): the default network configuration.
    pub network_config: Option<(String, String)>,
}

/// The local cloud's network configuration: a node-local bridge with
/// host-local addresses. It stands in for a network plugin's DaemonSet,
/// which on a real cluster writes /etc/cni/net.d (no pods run here).
pub const LOCAL_NETWORK_CONFIG: (&str, &str) = (
    "10-knit-bridge.conflist",
    r#"{"cniVersion":"1.0.0","name":"knit-local","plugins":[{"type":"bridge","bridge":"cni0","isGateway":true,"ipMasq":false,"ipam":{"type":"host-local","ranges":[[{"subnet":"10.88.0.0/16"}]]}},{"type":"portmap","capabilities":{"portMappings":true}}]}
"#,
);

/// The CNI plugins that configuration needs, and where Debian puts them.
pub const LOCAL_CNI_PLUGINS: &[&str] = &["bridge", "host-local", "loopback", "portmap"];
pub const DEBIAN_CNI_DIR: &str = "/usr/lib/cni";

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MirrorSummary {
    pub tarball: PathBuf,
    pub tarball_sha256: String,
    pub tarball_bytes: u64,
    pub agent_sha256: String,
    pub files: BTreeMap<String, String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PackageManifest<'a> {
    version: &'a str,
    containerd_version: &'a str,
    files: &'a BTreeMap<String, String>,
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> ServerError {
    move |e| ServerError::io(what, e)
}

pub fn sha256_file(path: &Path) -> Result<String> {
    knit_os::digest::sha256_file(path).map_err(io(format!("read {}", path.display())))
}

fn write_sha_beside(path: &Path, sum: &str) -> Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let side = PathBuf::from(format!("{}.sha256", path.display()));
    Ok(knit_os::durable::write(
        &side,
        format!("{sum}  {name}\n").as_bytes(),
        0o644,
    )?)
}

fn append(
    builder: &mut tar::Builder<impl std::io::Write>,
    name: &str,
    data: &[u8],
    mode: u32,
) -> Result<()> {
    let mut header = tar::Header::new_gnu();
    header.set_size(data.len() as u64);
    header.set_mode(mode);
    // Fixed owner and time: the same inputs give the same tarball.
    header.set_mtime(0);
    header.set_uid(0);
    header.set_gid(0);
    header.set_cksum();
    builder
        .append_data(&mut header, name, data)
        .map_err(io(format!("add {name} to the tarball")))
}

pub fn build(b: &PackageBuild) -> Result<MirrorSummary> {
    if knit_api::validate::parse_kube_version(&b.kubernetes_version).is_none() {
        return Err(ServerError::Package(format!(
            "kubernetes version {:?} is not MAJOR.MINOR.PATCH",
            b.kubernetes_version
        )));
    }
    let pkg_dir = b.mirror_dir.join("pkg/kubernetes");
    let bin_dir = b.mirror_dir.join("bin");
    for d in [&pkg_dir, &bin_dir] {
        std::fs::create_dir_all(d).map_err(io(format!("create {}", d.display())))?;
    }
    let mut inputs: Vec<(String, PathBuf)> = vec![("bin/kubelet".to_string(), b.kubelet.clone())];
    for (name, path) in &b.runtime_bins {
        inputs.push((format!("bin/{name}"), path.clone()));
    }
    for (name, path) in &b.cni_plugins {
        inputs.push((format!("cni/bin/{name}"), path.clone()));
    }
    for (name, path) in &inputs {
        if !path.is_file() {
            return Err(ServerError::Package(format!(
                "{name}: {} is not a file",
                path.display()
            )));
        }
    }
    if !b.agent.is_file() {
        return Err(ServerError::Package(format!(
            "knit-agent: {} is not a file",
            b.agent.display()
        )));
    }

    // Agent: copied, then its digest beside it.
    let agent_dst = bin_dir.join("knit-agent");
    // Written whole, with the source's mode (as a copy keeps it).
    let agent = std::fs::read(&b.agent).map_err(io(format!("copy {}", b.agent.display())))?;
    let agent_mode = std::fs::metadata(&b.agent)
        .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o7777)
        .map_err(io(format!("copy {}", b.agent.display())))?;
    knit_os::durable::write(&agent_dst, &agent, agent_mode)?;
    let agent_sha256 = sha256_file(&agent_dst)?;
    write_sha_beside(&agent_dst, &agent_sha256)?;

    // Tarball: pkg/kubernetes/{bin/*, images.txt, knit-package.json}.
    let tarball = pkg_dir.join(format!(
        "kubernetes-{}-linux-amd64.tar.gz",
        b.kubernetes_version
    ));
    // Built in memory, then written whole: never a half tarball under its name.
    let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(
        Vec::new(),
        flate2::Compression::fast(),
    ));
    let mut files = BTreeMap::new();
    for (name, path) in &inputs {
        let mut data = std::fs::read(path).map_err(io(format!("read {}", path.display())))?;
        if name == "bin/kubelet" {
            // The stand-in reports the version it is packed as; a real
            // kubelet has no slot and is packed as it is.
            stamp_kubelet_version(&mut data, &b.kubernetes_version);
        }
        files.insert(name.clone(), hex::encode(Sha256::digest(&data)));
        append(
            &mut builder,
            &format!("pkg/kubernetes/{name}"),
            &data,
            0o755,
        )?;
    }
    let images = b
        .images
        .iter()
        .map(|i| format!("{i}\n"))
        .collect::<String>();
    files.insert(
        "images.txt".to_string(),
        hex::encode(Sha256::digest(images.as_bytes())),
    );
    append(
        &mut builder,
        "pkg/kubernetes/images.txt",
        images.as_bytes(),
        0o644,
    )?;
    if let Some((name, content)) = &b.network_config {
        let rel = format!("cni/net.d/{name}");
        files.insert(rel.clone(), hex::encode(Sha256::digest(content.as_bytes())));
        append(
            &mut builder,
            &format!("pkg/kubernetes/{rel}"),
            content.as_bytes(),
            0o644,
        )?;
    }
    let manifest = serde_json::to_vec_pretty(&PackageManifest {
        version: &b.kubernetes_version,
        containerd_version: &b.containerd_version,
        files: &files,
    })
    .map_err(|e| ServerError::Internal(e.to_string()))?;
    append(
        &mut builder,
        "pkg/kubernetes/knit-package.json",
        &manifest,
        0o644,
    )?;
    let gz = builder
        .into_inner()
        .map_err(io("finish the tarball".into()))?;
    let gzipped = gz.finish().map_err(io("finish the gzip stream".into()))?;
    knit_os::durable::write(&tarball, &gzipped, 0o644)?;
    let tarball_sha256 = sha256_file(&tarball)?;
    write_sha_beside(&tarball, &tarball_sha256)?;
    let tarball_bytes = std::fs::metadata(&tarball)
        .map_err(io(format!("stat {}", tarball.display())))?
        .len();

    write_index(&b.mirror_dir)?;
    Ok(MirrorSummary {
        tarball,
        tarball_sha256,
        tarball_bytes,
        agent_sha256,
        files,
    })
}

/// Writes `version` into every version slot of a knit-kubelet-sim binary
/// (`knit_api::agent::KUBELET_VERSION_STAMP`: the marker, a version, NUL
/// bytes to the slot's end); how many slots were written (0: not the
/// stand-in, e.g. a real kubelet given with `--kubelet`).
pub fn stamp_kubelet_version(binary: &mut [u8], version: &str) -> usize {
    use knit_api::agent::{
        kubelet_version_of_slot, kubelet_version_slot, KUBELET_VERSION_SLOT, KUBELET_VERSION_STAMP,
    };
    let marker = KUBELET_VERSION_STAMP.as_bytes();
    let slot = kubelet_version_slot(version);
    if kubelet_version_of_slot(&slot) != Some(version) {
        return 0;
    }
    let mut written = 0;
    let mut at = 0;
    while at + KUBELET_VERSION_SLOT <= binary.len() {
        let Some(found) = binary[at..]
            .windows(marker.len())
            .position(|w| w == marker)
            .map(|p| p + at)
        else {
            break;
        };
        let Some(window) = binary.get(found..found + KUBELET_VERSION_SLOT) else {
            break;
        };
        let mut current = [0u8; KUBELET_VERSION_SLOT];
        current.copy_from_slice(window);
        // A slot is the marker, a version, and only NULs after it.
        let valid = kubelet_version_of_slot(&current)
            .is_some_and(|v| current[marker.len() + v.len()..].iter().all(|b| *b == 0));
        if valid {
            binary[found..found + KUBELET_VERSION_SLOT].copy_from_slice(&slot);
            written += 1;
            at = found + KUBELET_VERSION_SLOT;
        } else {
            at = found + 1;
        }
    }
    written
}

/// Where the mirror keeps the package of Kubernetes `version`, relative to
/// the mirror directory (and to `/mirror/` on the wire).
pub fn kubernetes_package(version: &str) -> String {
    format!("pkg/kubernetes/kubernetes-{version}-linux-amd64.tar.gz")
}

/// The Kubernetes versions the mirror holds a package of: each
/// `pkg/kubernetes/kubernetes-<v>-linux-amd64.tar.gz` with its `.sha256`
/// beside it (what `knit package build --kubernetes-version <v>` writes),
/// sorted by version. No `pkg/kubernetes` yet: none.
pub fn kubernetes_versions(mirror_dir: &Path) -> Result<Vec<String>> {
    let dir = mirror_dir.join("pkg/kubernetes");
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(format!("list {}", dir.display()))(e)),
    };
    let mut versions = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io(format!("list {}", dir.display())))?;
        let name = entry.file_name();
        let Some(version) = name
            .to_str()
            .and_then(|n| n.strip_prefix("kubernetes-"))
            .and_then(|n| n.strip_suffix("-linux-amd64.tar.gz"))
        else {
            continue;
        };
        let Some(parsed) = knit_api::validate::parse_kube_version(version) else {
            continue;
        };
        if mirror_dir
            .join(format!("{}.sha256", kubernetes_package(version)))
            .is_file()
        {
            versions.push((parsed, version.to_string()));
        }
    }
    versions.sort();
    Ok(versions.into_iter().map(|(_, v)| v).collect())
}

/// `SHA256SUMS` over every served file (not the `.sha256` files).
fn write_index(mirror: &Path) -> Result<()> {
    let mut lines = Vec::new();
    for sub in ["bin", "pkg/kubernetes"] {
        let dir = mirror.join(sub);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().to_string())
            .filter(|n| !n.ends_with(".sha256") && !n.starts_with('.'))
            .collect();
        names.sort();
        for name in names {
            let sum = sha256_file(&dir.join(&name))?;
            lines.push(format!("{sum}  {sub}/{name}\n"));
        }
    }
    let path = mirror.join("SHA256SUMS");
    Ok(knit_os::durable::write(
        &path,
        lines.concat().as_bytes(),
        0o644,
    )?)
}

/// The public key a signed Debian repository serves beside `Release`
/// (the agent fetches it over the control plane's TLS and names it in
/// `Signed-By`).
pub const DEBIAN_REPOSITORY_KEY: &str = "knit-archive-keyring.gpg";
/// The signing key's user id.
const DEBIAN_KEY_UID: &str = "knit package mirror <knit@localhost>";
/// One gpg call (key generation included) gets this long.
const GPG_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Runs gpg on `home` with `args` in `cwd` (see [`gnupg_tool`]).
fn gpg(home: &Path, cwd: &Path, args: &[&str]) -> Result<()> {
    let mut all = vec!["--batch", "--no-tty", "--quiet"];
    all.extend_from_slice(args);
    gnupg_tool("gpg", home, cwd, &all)
}

/// Runs a GnuPG program (`gpg`, `gpgconf`) on `home` with `args` in `cwd`,
/// bounded by [`GPG_TIMEOUT`]; its error output (capped) in the error.
fn gnupg_tool(program: &str, home: &Path, cwd: &Path, args: &[&str]) -> Result<()> {
    let out = knit_os::command::run(
        std::process::Command::new(program)
            .arg("--homedir")
            .arg(home)
            .args(args)
            .current_dir(cwd),
        GPG_TIMEOUT,
        16 * 1024,
    )
    .map_err(|e| match e {
        knit_os::OsError::NotStarted { .. } => ServerError::Package(format!(
            "{e} (Debian package gpg; scripts/setup.sh installs it)"
        )),
        e => ServerError::Package(e.to_string()),
    })?;
    if !out.success() {
        return Err(ServerError::Package(format!(
            "{program} {} failed ({}): {}",
            args.join(" "),
            out.status,
            out.stderr_text().trim()
        )));
    }
    Ok(())
}

/// Signs a flat Debian repository's `Release` the way a Debian archive is
/// signed: `InRelease` (clear-signed) and `Release.gpg` (detached, armored),
/// with an ed25519 key made once in `gnupg_home` (mode 0700, never
/// served); its public half is written as [`DEBIAN_REPOSITORY_KEY`]. apt
/// then reads one `InRelease` instead of asking for `InRelease`,
/// `Release` and `Release.gpg`, two of them missing. Every file is written
/// under a temporary name and renamed, `InRelease` last.
pub fn sign_debian_repository(repo: &Path, gnupg_home: &Path) -> Result<()> {
    let signed = sign_release(repo, gnupg_home);
    // gpg started a gpg-agent for the secret key: it would outlive us.
    if gnupg_home.is_dir() {
        if let Err(e) = gnupg_tool("gpgconf", gnupg_home, repo, &["--kill", "gpg-agent"]) {
            tracing::warn!(error = %e, "the gpg-agent of the repository's key was not stopped");
        }
    }
    signed
}

fn sign_release(repo: &Path, gnupg_home: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if !repo.join("Release").is_file() {
        return Err(ServerError::Package(format!(
            "{} has no Release to sign",
            repo.display()
        )));
    }
    std::fs::create_dir_all(gnupg_home).map_err(io(format!("create {}", gnupg_home.display())))?;
    std::fs::set_permissions(gnupg_home, std::fs::Permissions::from_mode(0o700))
        .map_err(io(format!("chmod {}", gnupg_home.display())))?;
    if gpg(gnupg_home, repo, &["--list-secret-keys", DEBIAN_KEY_UID]).is_err() {
        gpg(
            gnupg_home,
            repo,
            &[
                "--pinentry-mode",
                "loopback",
                "--passphrase",
                "",
                "--quick-gen-key",
                DEBIAN_KEY_UID,
                "ed25519",
                "sign",
                "never",
            ],
        )?;
    }
    let tmp = |name: &str| repo.join(format!(".{name}.tmp"));
    let outputs = [
        (DEBIAN_REPOSITORY_KEY, vec!["--export", DEBIAN_KEY_UID]),
        ("Release.gpg", vec!["--armor", "--detach-sign", "Release"]),
        ("InRelease", vec!["--clearsign", "Release"]),
    ];
    for (name, args) in &outputs {
        let out = tmp(name);
        let _ = std::fs::remove_file(&out);
        let out_arg = out.display().to_string();
        let mut all = vec![
            "--digest-algo",
            "SHA512",
            "--local-user",
            DEBIAN_KEY_UID,
            "--output",
            out_arg.as_str(),
        ];
        all.extend(args.iter().copied());
        gpg(gnupg_home, repo, &all)?;
    }
    for (name, _) in &outputs {
        let out = tmp(name);
        std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o644))
            .map_err(io(format!("chmod {}", out.display())))?;
        std::fs::rename(&out, repo.join(name))
            .map_err(io(format!("rename to {}", repo.join(name).display())))?;
    }
    Ok(())
}

/// Removes a repository's signatures and key (it is served unsigned).
pub fn remove_debian_signatures(repo: &Path) {
    for name in ["InRelease", "Release.gpg", DEBIAN_REPOSITORY_KEY] {
        let _ = std::fs::remove_file(repo.join(name));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn the_kubelet_stand_in_is_stamped_with_the_version_it_is_packed_as() {
        let slot = knit_api::agent::kubelet_version_slot("1.31.4");
        let mut binary = b"ELF...".to_vec();
        binary.extend_from_slice(&slot);
        // The marker alone (no slot behind it) is left alone.
        binary.extend_from_slice(knit_api::agent::KUBELET_VERSION_STAMP.as_bytes());
        binary.extend_from_slice(b"text that is no version");
        let before = binary.clone();
        assert_eq!(stamp_kubelet_version(&mut binary, "1.32.0"), 1);
        let mut stamped = [0u8; knit_api::agent::KUBELET_VERSION_SLOT];
        stamped.copy_from_slice(&binary[6..6 + knit_api::agent::KUBELET_VERSION_SLOT]);
        assert_eq!(
            knit_api::agent::kubelet_version_of_slot(&stamped),
            Some("1.32.0")
        );
        assert_eq!(binary.len(), before.len());
        assert_eq!(binary[6 + 64..], before[6 + 64..]);
        // A real kubelet has no slot: unchanged.
        let mut real = b"a real kubelet".to_vec();
        assert_eq!(stamp_kubelet_version(&mut real, "1.32.0"), 0);
        assert_eq!(real, b"a real kubelet");

        let dir = tempfile::tempdir().unwrap();
        assert!(kubernetes_versions(dir.path()).unwrap().is_empty());
        let pkg = dir.path().join("pkg/kubernetes");
        std::fs::create_dir_all(&pkg).unwrap();
        for v in ["1.31.4", "1.9.0", "1.32.0"] {
            let tarball = dir.path().join(kubernetes_package(v));
            std::fs::write(&tarball, b"t").unwrap();
            std::fs::write(format!("{}.sha256", tarball.display()), b"x").unwrap();
        }
        // Without its sha256 a tarball is not (yet) a package.
        std::fs::write(dir.path().join(kubernetes_package("1.33.0")), b"t").unwrap();
        assert_eq!(
            kubernetes_versions(dir.path()).unwrap(),
            ["1.9.0", "1.31.4", "1.32.0"]
        );
    }

    #[test]
    fn builds_the_contract_layout() {
        let dir = tempfile::tempdir().unwrap();
        let kubelet = dir.path().join("kubelet-src");
        let agent = dir.path().join("agent-src");
        std::fs::write(&kubelet, b"#!/bin/sh\necho kubelet\n").unwrap();
        std::fs::write(&agent, b"agent bytes").unwrap();
        let mirror = dir.path().join("mirror");
        let summary = build(&PackageBuild {
            mirror_dir: mirror.clone(),
            kubernetes_version: "1.31.4".into(),
            kubelet,
            agent,
            runtime_bins: vec![],
            containerd_version: "1.7.24".into(),
            images: vec!["registry.k8s.io/pause:3.10".into()],
            cni_plugins: vec![],
            network_config: Some((LOCAL_NETWORK_CONFIG.0.into(), LOCAL_NETWORK_CONFIG.1.into())),
        })
        .unwrap();
        let tarball = mirror.join("pkg/kubernetes/kubernetes-1.31.4-linux-amd64.tar.gz");
        assert_eq!(summary.tarball, tarball);
        let side = std::fs::read_to_string(format!("{}.sha256", tarball.display())).unwrap();
        assert!(side.starts_with(&summary.tarball_sha256));
        assert_eq!(sha256_file(&tarball).unwrap(), summary.tarball_sha256);

        // Read it back with the tar crate and check the manifest's digests.
        let file = std::fs::File::open(&tarball).unwrap();
        let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(file));
        let mut seen = BTreeMap::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let path = entry.path().unwrap().to_string_lossy().to_string();
            let mut data = Vec::new();
            entry.read_to_end(&mut data).unwrap();
            seen.insert(path, data);
        }
        let manifest: serde_json::Value =
            serde_json::from_slice(&seen["pkg/kubernetes/knit-package.json"]).unwrap();
        assert_eq!(manifest["version"], "1.31.4");
        assert_eq!(manifest["containerdVersion"], "1.7.24");
        let kubelet_sum = hex::encode(Sha256::digest(&seen["pkg/kubernetes/bin/kubelet"]));
        assert_eq!(manifest["files"]["bin/kubelet"], kubelet_sum);
        assert_eq!(
            seen["pkg/kubernetes/images.txt"],
            b"registry.k8s.io/pause:3.10\n"
        );
        assert_eq!(
            seen["pkg/kubernetes/cni/net.d/10-knit-bridge.conflist"],
            LOCAL_NETWORK_CONFIG.1.as_bytes()
        );

        let sums = std::fs::read_to_string(mirror.join("SHA256SUMS")).unwrap();
        assert!(sums.contains(&format!("{}  bin/knit-agent", summary.agent_sha256)));
        assert!(sums.contains("pkg/kubernetes/kubernetes-1.31.4-linux-amd64.tar.gz"));
    }

    #[test]
    fn missing_input_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let err = build(&PackageBuild {
            mirror_dir: dir.path().join("m"),
            kubernetes_version: "1.31.4".into(),
            kubelet: dir.path().join("nope"),
            agent: dir.path().join("nope2"),
            runtime_bins: vec![],
            containerd_version: String::new(),
            images: vec![],
            cni_plugins: vec![],
            network_config: None,
        })
        .unwrap_err();
        assert!(err.to_string().contains("bin/kubelet"), "{err}");
    }
}
