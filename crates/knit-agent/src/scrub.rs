//! What a snapshot's data disk keeps: the container runtime's image store
//! and knit's package cache, nothing else (issue 30 item 5). [`KEEP`]
//! (`knit_api::agent::SNAPSHOT_KEEP`, where the tests read it too) is the
//! one list; docs/snapshots.md repeats it. It is a keep-list, not a
//! delete-list: whatever a kubelet, a runtime or a workload left on the
//! disk that nobody thought of goes too.
//!
//! Order (`scrub`): mounts below the disk and the runtime directories
//! undone (pods' volumes), containerd asked to delete its tasks,
//! containers, leases and active snapshots (so that its metadata names
//! none), containerd stopped, then every path of the disk that is not kept
//! removed, the freed blocks discarded (`fstrim`) so that a block-level
//! copy of the disk does not carry deleted data either.

use crate::disk::mounts::mounts;
use crate::error::{AgentError, Context, Result};
use crate::host::Host;
use crate::phases::data_disk::RUNTIME_DIRS;
use crate::render::CONTAINERD_SOCK;
use knit_api::ErrorCode;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

pub use knit_api::agent::{Kept, SNAPSHOT_KEEP as KEEP};

/// containerd's metadata on the disk, relative to its mount target: when
/// present, containerd must answer so that its containers can be deleted.
const META_DB: &str = "containerd/io.containerd.metadata.v1.bolt/meta.db";
/// The snapshotter whose active snapshots are deleted (the one the agent
/// renders; remote snapshotters keep their data off the disk).
const SNAPSHOTTER: &str = "overlayfs";
/// Bound on each `ctr` call.
const CTR_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound on `fstrim` (a large disk takes a while).
const FSTRIM_TIMEOUT: Duration = Duration::from_secs(600);

/// What [`scrub`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scrubbed {
    /// Paths (relative to the mount target) removed, top-most only.
    pub removed: Vec<String>,
    /// Kept paths that exist (relative to the mount target).
    pub kept: Vec<String>,
    /// What containerd deleted: `<namespace>/<kind>/<id>`.
    pub runtime_deleted: Vec<String>,
    /// Mounts undone below the disk and the runtime directories.
    pub unmounted: Vec<String>,
    /// The freed blocks were discarded.
    pub trimmed: bool,
}

fn fail(message: String) -> AgentError {
    AgentError::new(ErrorCode::FailCommand, message)
}

/// How `rel` (relative to the mount target) fares under [`KEEP`].
#[derive(Debug, PartialEq, Eq)]
enum Fate {
    Keep,
    KeepEmpty,
    /// A parent of a kept path: look inside.
    Parent,
    Remove,
}

fn fate(rel: &str) -> Fate {
    for k in KEEP {
        if rel == k.path {
            return if k.with_content {
                Fate::Keep
            } else {
                Fate::KeepEmpty
            };
        }
        if k.with_content && rel.starts_with(k.path) && rel[k.path.len()..].starts_with('/') {
            return Fate::Keep;
        }
    }
    if KEEP
        .iter()
        .any(|k| k.path.starts_with(rel) && k.path[rel.len()..].starts_with('/'))
    {
        return Fate::Parent;
    }
    Fate::Remove
}

/// The whole preparation of the data disk mounted at `mount_target` for a
/// snapshot; see the module. The kubelet must be stopped already.
pub fn scrub(host: &Host, mount_target: &str) -> Result<Scrubbed> {
    let mount = host.path(mount_target);
    let mounted = crate::disk::mounts::mounted_at(&host.host_path(mount_target)).is_some();
    if host.is_live() && !mounted {
        return Err(fail(format!(
            "no data disk is mounted at {mount_target}: nothing to prepare for a snapshot"
        )));
    }
    let mut done = Scrubbed {
        unmounted: unmount_below(host, mount_target)?,
        ..Scrubbed::default()
    };
    if mount.join(META_DB).exists() {
        done.runtime_deleted = clear_containerd(host)?;
    }
    crate::services::stop(host, "containerd")?;
    let (removed, kept) = remove_all_but_kept(&mount)?;
    done.removed = removed;
    done.kept = kept;
    nix::unistd::sync();
    // Best effort: a device without discard keeps the freed blocks' old
    // bytes, which the log says. Only ever on the data disk's own mount.
    done.trimmed = mounted
        && match host.run(
            ErrorCode::FailCommand,
            "fstrim",
            &[&host.host_path(mount_target)],
            FSTRIM_TIMEOUT,
        ) {
            Ok(_) => true,
            Err(e) => {
                host.log.line(
                    "snapshot",
                    &format!("fstrim {mount_target} failed, freed blocks not discarded: {e}"),
                );
                false
            }
        };
    Ok(done)
}

/// Undoes every mount below the disk's mount target and below the runtime
/// directories bound from it (pods' volumes), deepest first; the runtime
/// directories' own bind mounts stay.
fn unmount_below(host: &Host, mount_target: &str) -> Result<Vec<String>> {
    let mut tops = vec![host.host_path(mount_target)];
    tops.extend(RUNTIME_DIRS.iter().map(|(dir, _)| host.host_path(dir)));
    let mut below: Vec<String> = mounts()
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|p| {
            tops.iter().any(|t| {
                p.len() > t.len() && p.starts_with(t.as_str()) && p[t.len()..].starts_with('/')
            })
        })
        .collect();
    below.sort_by_key(|p| std::cmp::Reverse(p.matches('/').count()));
    below.dedup();
    let mut undone = Vec::new();
    for p in below {
        // Stacked mounts on one point: each umount takes the top one.
        while mounts().iter().any(|m| m.mount_point == p) {
            nix::mount::umount2(p.as_str(), nix::mount::MntFlags::MNT_DETACH)
                .map_err(|e| fail(format!("unmount {p} (below the data disk): {e}")))?;
        }
        undone.push(p);
    }
    Ok(undone)
}

/// `ctr` against the node's containerd, bounded.
fn ctr(host: &Host, args: &[&str]) -> Result<String> {
    let sock = host.host_path(CONTAINERD_SOCK);
    let timeout = format!("{}s", CTR_TIMEOUT.as_secs());
    let mut all = vec!["--address", &sock, "--timeout", &timeout];
    all.extend_from_slice(args);
    Ok(host
        .run(ErrorCode::FailCommand, "ctr", &all, CTR_TIMEOUT)?
        .stdout)
}

fn ids(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

/// Deletes, in every containerd namespace, the tasks, containers and
/// leases, then the active snapshots (containers' root filesystems and
/// unfinished unpacks); images and their committed layers stay.
fn clear_containerd(host: &Host) -> Result<Vec<String>> {
    let namespaces = ctr(host, &["namespaces", "ls", "-q"]).map_err(|e| {
        fail(format!(
            "containerd's metadata is on the data disk but containerd does not answer, so its containers cannot be deleted: {}",
            e.message
        ))
    })?;
    let mut deleted = Vec::new();
    let namespaces = ids(&namespaces);
    for ns in &namespaces {
        let n = ns.as_str();
        for task in ids(&ctr(host, &["-n", n, "tasks", "ls", "-q"])?) {
            // A task that already exited cannot be killed; delete -f ends it.
            let _ = ctr(host, &["-n", n, "tasks", "kill", "-s", "SIGKILL", &task]);
            ctr(host, &["-n", n, "tasks", "delete", "-f", &task])?;
            deleted.push(format!("{n}/task/{task}"));
        }
        for c in ids(&ctr(host, &["-n", n, "containers", "ls", "-q"])?) {
            ctr(host, &["-n", n, "containers", "delete", &c])?;
            deleted.push(format!("{n}/container/{c}"));
        }
        for lease in ids(&ctr(host, &["-n", n, "leases", "ls", "-q"])?) {
            ctr(host, &["-n", n, "leases", "delete", &lease])?;
            deleted.push(format!("{n}/lease/{lease}"));
        }
        let listed = ctr(
            host,
            &["-n", n, "snapshots", "--snapshotter", SNAPSHOTTER, "ls"],
        )?;
        // KEY PARENT KIND; a parent may be empty, the kind is last.
        for line in listed.lines().skip(1) {
            let words: Vec<&str> = line.split_whitespace().collect();
            if words.len() >= 2 && words[words.len() - 1] == "Active" {
                let key = words[0];
                ctr(
                    host,
                    &[
                        "-n",
                        n,
                        "snapshots",
                        "--snapshotter",
                        SNAPSHOTTER,
                        "rm",
                        key,
                    ],
                )?;
                deleted.push(format!("{n}/snapshot/{key}"));
            }
        }
    }
    // Deletes above only drop records: the snapshotter's directories and
    // unreferenced content go at containerd's next garbage collection,
    // which the synchronous delete of a fresh lease runs now.
    if let Some(n) = namespaces.first() {
        let lease = ctr(host, &["-n", n, "leases", "create"])?;
        let lease = lease.trim();
        ctr(host, &["-n", n, "leases", "delete", "--sync", lease])?;
    }
    Ok(deleted)
}

/// Removes every path under `mount` that [`KEEP`] does not keep; never
/// crosses into another filesystem (a mount left below is an error).
/// Returns (removed, kept), relative paths.
pub fn remove_all_but_kept(mount: &Path) -> Result<(Vec<String>, Vec<String>)> {
    let dev = std::fs::symlink_metadata(mount)
        .context(ErrorCode::FailCommand, || {
            format!("read {}", mount.display())
        })?
        .dev();
    let mut removed = Vec::new();
    let mut kept = Vec::new();
    walk(mount, "", dev, &mut removed, &mut kept)?;
    removed.sort();
    kept.sort();
    Ok((removed, kept))
}

fn walk(
    dir: &Path,
    rel: &str,
    dev: u64,
    removed: &mut Vec<String>,
    kept: &mut Vec<String>,
) -> Result<()> {
    let entries = std::fs::read_dir(dir)
        .context(ErrorCode::FailCommand, || format!("list {}", dir.display()))?;
    for entry in entries {
        let entry = entry.context(ErrorCode::FailCommand, || format!("list {}", dir.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let child_rel = if rel.is_empty() {
            name
        } else {
            format!("{rel}/{name}")
        };
        let path = entry.path();
        let meta = std::fs::symlink_metadata(&path).context(ErrorCode::FailCommand, || {
            format!("read {}", path.display())
        })?;
        let real_dir = meta.is_dir() && meta.dev() == dev;
        // A kept path must be this filesystem's own file or directory: a
        // symlink would point elsewhere on the next node.
        let real = !meta.file_type().is_symlink() && meta.dev() == dev;
        match fate(&child_rel) {
            Fate::Keep if real => kept.push(child_rel),
            Fate::KeepEmpty if real_dir => {
                for inner in std::fs::read_dir(&path).context(ErrorCode::FailCommand, || {
                    format!("list {}", path.display())
                })? {
                    let inner = inner.context(ErrorCode::FailCommand, || {
                        format!("list {}", path.display())
                    })?;
                    remove_tree(&inner.path(), dev)?;
                    removed.push(format!(
                        "{child_rel}/{}",
                        inner.file_name().to_string_lossy()
                    ));
                }
                kept.push(child_rel);
            }
            Fate::Parent if real_dir => walk(&path, &child_rel, dev, removed, kept)?,
            _ => {
                remove_tree(&path, dev)?;
                removed.push(child_rel);
            }
        }
    }
    Ok(())
}

/// `rm -r` that never follows a symlink nor enters another filesystem.
fn remove_tree(path: &Path, dev: u64) -> Result<()> {
    let meta = std::fs::symlink_metadata(path).context(ErrorCode::FailCommand, || {
        format!("read {}", path.display())
    })?;
    if !meta.is_dir() {
        return std::fs::remove_file(path).context(ErrorCode::FailCommand, || {
            format!("remove {}", path.display())
        });
    }
    if meta.dev() != dev {
        return Err(fail(format!(
            "{} is another filesystem mounted on the data disk: not removed (unmount it first)",
            path.display()
        )));
    }
    for entry in std::fs::read_dir(path).context(ErrorCode::FailCommand, || {
        format!("list {}", path.display())
    })? {
        let entry = entry.context(ErrorCode::FailCommand, || {
            format!("list {}", path.display())
        })?;
        remove_tree(&entry.path(), dev)?;
    }
    std::fs::remove_dir(path).context(ErrorCode::FailCommand, || {
        format!("remove {}", path.display())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fates_follow_the_keep_list() {
        assert_eq!(fate("ack"), Fate::Parent);
        assert_eq!(fate("ack/kubernetes"), Fate::Keep);
        assert_eq!(fate("ack/kubernetes/bin/kubelet"), Fate::Keep);
        assert_eq!(fate("ack/kubernetes.staging"), Fate::Remove);
        assert_eq!(fate("ack/other"), Fate::Remove);
        assert_eq!(fate("containerd"), Fate::Parent);
        assert_eq!(
            fate("containerd/io.containerd.metadata.v1.bolt"),
            Fate::Parent
        );
        assert_eq!(
            fate("containerd/io.containerd.metadata.v1.bolt/meta.db"),
            Fate::Keep
        );
        assert_eq!(
            fate("containerd/io.containerd.content.v1.content/ingest"),
            Fate::Remove
        );
        assert_eq!(fate("containerd/io.containerd.grpc.v1.cri"), Fate::Remove);
        assert_eq!(fate("kubelet"), Fate::Remove);
        assert_eq!(fate("lost+found"), Fate::KeepEmpty);
        assert_eq!(fate("lost+found/#12"), Fate::Remove);
        assert_eq!(fate("a"), Fate::Remove);
    }
}
