//! What the control plane asks of a node besides `init`, answered in typed
//! JSON ([`knit_api::agent`]): the package cache's manifest, the snapshot
//! builder's preparation steps, and leaving a pool (the undo). The server
//! knows none of the paths involved; they stay the agent's business.

use crate::error::{AgentError, Context, Result};
use crate::host::Host;
use crate::package::{self, CACHE_MANIFEST};
use knit_api::agent::{
    BuilderCleaned, CacheManifest, CacheManifestReport, ImagePull, ImageReport, KubeletStopped,
    LeaveReport, PackageVerified, SystemImages, BOOTSTRAP_DIR, IMAGES_LOG,
};
use knit_api::ErrorCode;
use knit_os::command::{terminate, wait_while};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The system images the node pulls, one reference a line.
const SYSTEM_IMAGES_FILE: &str = "/etc/kubernetes/images.txt";
/// How many removed paths the answer names (it says how many in all).
const REMOVED_SHOWN: usize = 50;
/// After the pulls' deadline, how long they get to end before SIGKILL.
const PULL_KILL_GRACE: Duration = Duration::from_secs(10);
/// The longest log line kept for messages.
const LOG_LINE_MAX_CHARS: usize = 400;

/// `knit-agent cache-manifest --mount <dir>`.
pub fn cache_manifest(host: &Host, mount_target: &str) -> Result<CacheManifestReport> {
    let cache = package::cache_dir(mount_target);
    let manifest_file = format!("{cache}/{CACHE_MANIFEST}");
    let text = std::fs::read_to_string(host.path(&manifest_file)).map_err(|e| {
        AgentError::new(
            ErrorCode::FailCommand,
            format!("no package cache at {cache}: cannot read {manifest_file}: {e}"),
        )
    })?;
    let manifest: CacheManifest =
        serde_json::from_str(&text).context(ErrorCode::FailCommand, || manifest_file.clone())?;
    Ok(CacheManifestReport {
        cache,
        manifest_file,
        manifest,
    })
}

/// `knit-agent snapshot-prepare verify-package --mount <dir>`: the cache's
/// manifest names a version and the kubelet, and every file matches its
/// sha256.
pub fn verify_package(host: &Host, mount_target: &str) -> Result<PackageVerified> {
    let report = cache_manifest(host, mount_target)?;
    let CacheManifestReport {
        cache,
        manifest_file,
        manifest,
    } = report;
    if manifest.version.is_empty() || !manifest.files.contains_key("bin/kubelet") {
        return Err(AgentError::new(
            ErrorCode::FailChecksumMismatch,
            format!("{manifest_file} names no version or no bin/kubelet"),
        ));
    }
    package::verify_files(&host.path(&cache), &manifest.files).map_err(|why| {
        AgentError::new(
            ErrorCode::FailChecksumMismatch,
            format!("the package cache in {cache} does not match its manifest: {why}"),
        )
    })?;
    Ok(PackageVerified {
        cache,
        kubernetes_version: manifest.version,
        files: manifest.files.len(),
    })
}

/// `knit-agent snapshot-prepare stop-kubelet`: stops the kubelet and waits
/// until it is gone (the unit under systemd, else the agent's supervisor).
/// containerd keeps running.
pub fn stop_kubelet(host: &Host) -> Result<KubeletStopped> {
    crate::services::stop(host, "kubelet")?;
    Ok(KubeletStopped {
        service_manager: if crate::services::uses_systemd(host) {
            "systemd"
        } else {
            "supervisor"
        }
        .to_string(),
    })
}

/// `knit-agent snapshot-prepare system-images`.
pub fn system_images(host: &Host) -> SystemImages {
    let text = host.read(SYSTEM_IMAGES_FILE).unwrap_or_default();
    SystemImages {
        images: text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(str::to_string)
            .collect(),
    }
}

/// `knit-agent snapshot-prepare pull-images`: `kubelet --ensure-images`
/// with a deadline, its stderr in [`IMAGES_LOG`] (the server shows its last
/// line while the pulls run), its report from stdout.
pub fn pull_images(host: &Host, images: &[String], limit: Duration) -> Result<ImagePull> {
    let kubelet = format!("{}/kubelet", package::BIN_DIR);
    let log_path = host.path(IMAGES_LOG);
    if let Some(dir) = log_path.parent() {
        std::fs::create_dir_all(dir).context(ErrorCode::FailCommand, || {
            format!("create {}", dir.display())
        })?;
    }
    let log = std::fs::File::create(&log_path)
        .context(ErrorCode::FailCommand, || format!("create {IMAGES_LOG}"))?;
    let out_path = log_path.with_extension("report");
    let out = std::fs::File::create(&out_path).context(ErrorCode::FailCommand, || {
        format!("create {}", out_path.display())
    })?;
    let mut child = Command::new(host.path(&kubelet))
        .arg(format!("--ensure-images={}", images.join(",")))
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(log)
        .spawn()
        .context(ErrorCode::FailCommand, || format!("start {kubelet}"))?;
    let deadline = Instant::now() + limit;
    let waited = wait_while(&mut child, &kubelet, || Instant::now() < deadline);
    let ended = match waited {
        Ok(Some(status)) => Some(status),
        // Past the deadline, or not waitable: stopped (and reaped) either way.
        other => {
            let stopped = terminate(&mut child, &kubelet, PULL_KILL_GRACE);
            other
                .and(stopped)
                .context(ErrorCode::FailCommand, || format!("wait for {kubelet}"))?;
            None
        }
    };
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    let _ = std::fs::remove_file(&out_path);
    let last_log_line = last_line(&std::fs::read_to_string(&log_path).unwrap_or_default());
    let Some(status) = ended else {
        return Ok(ImagePull::TimedOut { last_log_line });
    };
    let report = serde_json::from_str::<ImageReport>(stdout.trim()).ok();
    match (status.code(), report) {
        (Some(0), Some(report)) => Ok(ImagePull::Pulled { report }),
        (Some(0), None) => Err(AgentError::new(
            ErrorCode::FailCommand,
            format!("{kubelet} --ensure-images printed no image report: {stdout:?}"),
        )),
        (code, report) => Ok(ImagePull::Failed {
            // Killed by a signal: as a shell reports it.
            exit_code: code.unwrap_or(128),
            report,
            last_log_line,
        }),
    }
}

/// The last non-empty line, shortened for messages.
fn last_line(text: &str) -> String {
    text.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .chars()
        .take(LOG_LINE_MAX_CHARS)
        .collect()
}

/// `knit-agent snapshot-prepare clean --mount <dir>`: the data disk
/// scrubbed down to [`crate::scrub::KEEP`] (containerd's containers deleted
/// and containerd stopped first), synced and trimmed, its used bytes
/// counted; containerd's version read for the record.
pub fn clean(host: &Host, mount_target: &str) -> Result<BuilderCleaned> {
    let containerd_version = host
        .run(
            ErrorCode::FailCommand,
            "containerd",
            &["--version"],
            Duration::from_secs(30),
        )
        .map(|out| {
            out.stdout
                .split_whitespace()
                .nth(2)
                .unwrap_or_default()
                .to_string()
        })
        .unwrap_or_default();
    let scrubbed = crate::scrub::scrub(host, mount_target)?;
    nix::unistd::sync();
    let stat = nix::sys::statvfs::statvfs(&host.path(mount_target))
        .context(ErrorCode::FailCommand, || format!("statvfs {mount_target}"))?;
    // As `df` counts used: blocks not free, in fragment-size units.
    let used_bytes = (stat.blocks() as u64).saturating_sub(stat.blocks_free() as u64)
        * stat.fragment_size() as u64;
    Ok(BuilderCleaned {
        used_bytes,
        containerd_version,
        kept: scrubbed.kept,
        removed_count: scrubbed.removed.len() as u64,
        removed: scrubbed.removed.into_iter().take(REMOVED_SHOWN).collect(),
        runtime_deleted: scrubbed.runtime_deleted.len() as u64,
        trimmed: scrubbed.trimmed,
    })
}

/// `knit-agent leave`: the undo (`reset --undo`: knit's services stopped,
/// its mounts, kernel settings and files undone from the ledger), then what
/// the stub or the attach command left (this agent, the CA, the NodeConfig)
/// and the agent's state directory when nothing else is in it. Safe to run
/// twice: with the ledger gone there is nothing left to undo.
pub fn leave(host: &Host) -> Result<LeaveReport> {
    let undone = crate::undo::undo(host)?;
    let mut report = LeaveReport {
        undone: undone.done,
        failed: undone.failed,
    };
    if !report.failed.is_empty() {
        // The agent stays, so that the undo can be run again once fixed.
        return Ok(report);
    }
    match std::fs::remove_dir_all(host.path(BOOTSTRAP_DIR)) {
        Ok(()) => report.undone.push(format!("{BOOTSTRAP_DIR} removed")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => report.failed.push(format!("remove {BOOTSTRAP_DIR}: {e}")),
    }
    // Only when empty: other software may keep files there.
    let _ = std::fs::remove_dir(host.path(crate::ledger::STATE_DIR));
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn tree() -> (tempfile::TempDir, Host) {
        let dir = tempfile::tempdir().unwrap();
        let host = Host::without_log(dir.path());
        (dir, host)
    }

    fn write(host: &Host, abs: &str, text: &str) {
        let path = host.path(abs);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    /// A cache as the agent writes it verifies; a changed file is named.
    #[test]
    fn verify_package_checks_every_file() {
        let (_dir, host) = tree();
        let cache = package::cache_dir("/mnt/data");
        write(&host, &format!("{cache}/bin/kubelet"), "kubelet");
        let sum = package::sha256_file(&host.path(&format!("{cache}/bin/kubelet"))).unwrap();
        write(
            &host,
            &format!("{cache}/{CACHE_MANIFEST}"),
            &serde_json::json!({"version": "1.31.4", "tarballSha256": "", "files": {"bin/kubelet": sum}})
                .to_string(),
        );
        let report = cache_manifest(&host, "/mnt/data/").unwrap();
        assert_eq!(report.cache, "/mnt/data/ack/kubernetes");
        assert_eq!(report.manifest.version, "1.31.4");
        let ok = verify_package(&host, "/mnt/data").unwrap();
        assert_eq!((ok.kubernetes_version.as_str(), ok.files), ("1.31.4", 1));
        write(&host, &format!("{cache}/bin/kubelet"), "changed");
        let e = verify_package(&host, "/mnt/data").unwrap_err();
        assert!(
            e.message.contains("does not match its manifest") && e.message.contains("bin/kubelet"),
            "{e}"
        );
        let e = cache_manifest(&host, "/elsewhere").unwrap_err();
        assert!(
            e.message
                .contains("no package cache at /elsewhere/ack/kubernetes"),
            "{e}"
        );
    }

    #[test]
    fn system_images_skip_comments_and_blanks() {
        let (_dir, host) = tree();
        assert!(system_images(&host).images.is_empty());
        write(
            &host,
            SYSTEM_IMAGES_FILE,
            "# system\nregistry.k8s.io/pause:3.9\n\n  coredns:1 \n",
        );
        assert_eq!(
            system_images(&host).images,
            ["registry.k8s.io/pause:3.9", "coredns:1"]
        );
    }

    /// A kubelet stand-in: prints a report and exits with the code asked,
    /// or hangs past the deadline (then the pulls are ended).
    #[test]
    fn pull_images_reports_success_failure_and_deadline() {
        let (_dir, host) = tree();
        let kubelet = host.path("/usr/local/bin/kubelet");
        std::fs::create_dir_all(kubelet.parent().unwrap()).unwrap();
        let script = r#"#!/bin/sh
case "$1" in
  *hang*) echo "pulling hang" >&2; exec sleep 30;;
  *bad*) echo "pull bad: refused" >&2
         echo '{"images":[{"image":"bad","repoDigests":[],"error":"refused"}],"failed":1}'; exit 1;;
  *) echo '{"images":[{"image":"a","repoDigests":["a@sha256:01"]}],"hit":0,"miss":1,"bytesPulled":7}';;
esac
"#;
        std::fs::write(&kubelet, script).unwrap();
        std::fs::set_permissions(&kubelet, std::fs::Permissions::from_mode(0o755)).unwrap();
        let ok = pull_images(&host, &["a".into()], Duration::from_secs(20)).unwrap();
        let ImagePull::Pulled { report } = ok else {
            panic!("{ok:?}")
        };
        assert_eq!((report.miss, report.bytes_pulled), (1, 7));
        let bad = pull_images(&host, &["bad".into()], Duration::from_secs(20)).unwrap();
        let ImagePull::Failed {
            exit_code,
            report,
            last_log_line,
        } = bad
        else {
            panic!("{bad:?}")
        };
        assert_eq!(exit_code, 1);
        assert_eq!(report.unwrap().images[0].error.as_deref(), Some("refused"));
        assert_eq!(last_log_line, "pull bad: refused");
        let started = Instant::now();
        let hung = pull_images(&host, &["hang".into()], Duration::from_secs(1)).unwrap();
        assert_eq!(
            hung,
            ImagePull::TimedOut {
                last_log_line: "pulling hang".into()
            }
        );
        assert!(started.elapsed() < Duration::from_secs(15));
    }

    /// On a plain tree (no containerd metadata, no discard): only the
    /// kept paths stay on the disk; the rest of the machine is untouched.
    #[test]
    fn clean_keeps_only_the_keep_list() {
        let (_dir, host) = tree();
        write(&host, "/mnt/data/kubelet/pki/kubelet.crt", "x");
        write(&host, "/mnt/data/kubelet/knit-images.json", "{}");
        write(&host, "/mnt/data/ack/kubernetes/bin/kubelet", "kept");
        write(&host, "/mnt/data/ack/kubernetes.staging/x", "gone");
        write(&host, "/var/lib/kubelet/config.yaml", "not on the disk");
        let cleaned = clean(&host, "/mnt/data").unwrap();
        assert!(cleaned.used_bytes > 0);
        assert_eq!(cleaned.kept, ["ack/kubernetes"]);
        assert_eq!(cleaned.removed, ["ack/kubernetes.staging", "kubelet"]);
        assert_eq!(cleaned.removed_count, 2);
        assert!(host.path("/mnt/data/ack/kubernetes/bin/kubelet").exists());
        assert!(!host.path("/mnt/data/kubelet").exists());
        assert!(host.path("/var/lib/kubelet/config.yaml").exists());
        // Again: nothing left to remove is no error.
        let again = clean(&host, "/mnt/data").unwrap();
        assert_eq!(again.removed_count, 0);
    }

    /// Leave on a machine the agent never changed: the bootstrap files go,
    /// the state directory goes when empty; twice is harmless.
    #[test]
    fn leave_removes_the_bootstrap_files() {
        let (_dir, host) = tree();
        write(&host, &format!("{BOOTSTRAP_DIR}/knit-agent"), "agent");
        let report = leave(&host).unwrap();
        assert!(report.failed.is_empty(), "{report:?}");
        assert!(!host.path(BOOTSTRAP_DIR).exists());
        assert!(!host.path(crate::ledger::STATE_DIR).exists());
        let again = leave(&host).unwrap();
        assert!(again.failed.is_empty(), "{again:?}");
    }
}
