//! `data-disk`: choose the data disk, format it only when it is blank (or the
//! config forces it), mount it as the container runtime's home, bind
//! `/var/lib/containerd` and `/var/lib/kubelet` from it, persist in fstab.
//!
//! Safety rules: a disk holding a supported filesystem is mounted as is and
//! never wiped; a partition table or unknown data is never formatted unless
//! `format: force` (left alone when the selection rule found the disk,
//! refused when the config names it); a format is only ever resumed on the disk the journal
//! says this agent started formatting.

use crate::disk::discover::{choose, discover, BlockDisk};
use crate::disk::mounts::{mounted_at, MountEntry};
use crate::disk::{read_signature, Signature};
use crate::error::{AgentError, Context, Result};
use crate::markers;
use crate::phase::{Ctx, Decision, Phase};
use knit_api::{ErrorCode, FormatPolicy, PhaseName};
use nix::mount::{mount, MsFlags};
use serde::Serialize;
use std::time::Duration;

/// The runtime directories that live on the data disk: (node path, subdirectory on the disk).
pub const RUNTIME_DIRS: &[(&str, &str)] = &[
    ("/var/lib/containerd", "containerd"),
    ("/var/lib/kubelet", "kubelet"),
];
const FSTAB_BEGIN: &str = "# BEGIN knit data disk (managed by knit-agent)";
const FSTAB_END: &str = "# END knit data disk";

#[derive(Debug, Clone, Serialize)]
pub struct CandidateView {
    pub device: String,
    pub size_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub excluded: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DiskPlan {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// format | mount | skip | refuse | done
    pub action: &'static str,
    pub reason: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
    pub mount_target: String,
    pub candidates: Vec<CandidateView>,
}

/// What to do with the disk, decided from the machine and the journal.
enum Choice {
    Skip(String),
    Done(String),
    /// Mounted; the bind mounts / fstab are missing, or the copy for
    /// `/var/.keep-container-data` did not finish (`true`).
    Complete(MountEntry, bool),
    Format(BlockDisk, String),
    Mount(BlockDisk, String, String),
    Refuse(Option<BlockDisk>, ErrorCode, String),
}

fn decide(ctx: &Ctx) -> Result<(Choice, Vec<BlockDisk>, Option<Signature>)> {
    let config = &ctx.config.data_disk;
    if markers::present(ctx.host, markers::SKIP_AUTO_FDISK) {
        return Ok((
            Choice::Skip(format!(
                "marker {} present: no format, no mount",
                markers::SKIP_AUTO_FDISK
            )),
            vec![],
            None,
        ));
    }
    if !config.enabled {
        return Ok((
            Choice::Skip("dataDisk.enabled is false".to_string()),
            vec![],
            None,
        ));
    }
    let target = ctx.host.host_path(&config.mount_target);
    if let Some(entry) = mounted_at(&target) {
        let ours = ctx.journal.data_disk.dev_id.as_deref() == Some(entry.dev_id.as_str());
        if !ours {
            return Ok((
                Choice::Refuse(
                    None,
                    ErrorCode::FailMountDataDisk,
                    format!(
                        "{} is already mounted from device {} that this agent did not choose",
                        config.mount_target, entry.dev_id
                    ),
                ),
                vec![],
                None,
            ));
        }
        let binds_ok = RUNTIME_DIRS.iter().all(|(dir, _)| {
            mounted_at(&ctx.host.host_path(dir)).is_some_and(|m| m.dev_id == entry.dev_id)
        });
        let fstab_ok = ctx
            .host
            .read("/etc/fstab")
            .is_some_and(|t| t.contains(FSTAB_BEGIN));
        if copy_pending(ctx) {
            return Ok((Choice::Complete(entry, true), vec![], None));
        }
        return Ok(if binds_ok && fstab_ok {
            (
                Choice::Done(format!(
                    "{} mounted at {}",
                    entry.dev_id, config.mount_target
                )),
                vec![],
                None,
            )
        } else {
            (Choice::Complete(entry, false), vec![], None)
        });
    }
    let disks = discover(ctx.host)?;
    let named = config.device.is_some() || config.serial.is_some();
    // An explicit device or serial overrides the selection rule.
    let explicit = match (&config.device, &config.serial) {
        (Some(device), _) => Some((
            disks.iter().find(|d| &d.path == device).cloned(),
            format!("dataDisk.device {device} is not a disk on this node"),
        )),
        (None, Some(serial)) => Some((
            disks
                .iter()
                .find(|d| d.serial.as_deref() == Some(serial.as_str()))
                .cloned(),
            format!("no disk with serial {serial} on this node"),
        )),
        (None, None) => None,
    };
    let chosen = match explicit {
        Some((Some(disk), _)) => Some(disk),
        Some((None, missing)) => {
            let refuse = Choice::Refuse(None, ErrorCode::FailDataDiskNotFound, missing);
            return Ok((refuse, disks, None));
        }
        None => choose(&disks).cloned(),
    };
    let Some(disk) = chosen else {
        let why = if disks.is_empty() {
            "no data disk attached: nothing to mount".to_string()
        } else {
            let passed: Vec<String> = disks
                .iter()
                .map(|d| format!("{} {}", d.path, d.excluded.as_deref().unwrap_or("")))
                .collect();
            format!("no usable data disk ({})", passed.join("; "))
        };
        return Ok((Choice::Skip(why), disks, None));
    };
    if let Some(why) = &disk.excluded {
        let reason = format!("{} {why}", disk.path);
        return Ok((
            Choice::Refuse(Some(disk), ErrorCode::FailDataDiskRefused, reason),
            disks,
            None,
        ));
    }
    let device_path = ctx.host.path(&disk.path);
    let signature = read_signature(&device_path).context(ErrorCode::FailDataDiskRefused, || {
        format!("cannot read {}", disk.path)
    })?;
    let progress = &ctx.journal.data_disk;
    let (resuming, stale) = match stale_intent(progress, &disk) {
        Ok(resuming) => (resuming, None),
        Err(stale) => (false, Some(stale)),
    };
    let policy = config.format;
    let choice = match &signature {
        _ if resuming => Choice::Format(
            disk.clone(),
            "resuming a format this agent started and did not finish".to_string(),
        ),
        Signature::Supported { fs_type, .. } => {
            let note = if *fs_type == config.fs_type.as_str() || (config.fs_type.as_str() == "ext4" && fs_type.starts_with("ext")) {
                String::new()
            } else {
                format!(" (dataDisk.fsType is {}, the disk's filesystem is kept)", config.fs_type.as_str())
            };
            Choice::Mount(disk.clone(), fs_type.to_string(), format!("{} holds {}: mount as is, never wipe{note}", disk.path, signature.describe()))
        }
        Signature::Blank if policy == FormatPolicy::Never => Choice::Refuse(
            Some(disk.clone()),
            ErrorCode::FailDataDiskRefused,
            format!("{} is blank and dataDisk.format is never", disk.path),
        ),
        Signature::Blank => Choice::Format(disk.clone(), format!("{} is blank", disk.path)),
        other if policy == FormatPolicy::Force => Choice::Format(
            disk.clone(),
            format!("{} holds {} and dataDisk.format is force", disk.path, other.describe()),
        ),
        // A disk the selection rule found (not one the config names) that
        // holds a partition table or unknown data is someone's: the seed
        // formats the last disk only when it is uninitialized, so it is
        // left alone and the runtime stays on the system disk; the whole
        // initialization does not fail over it.
        other if !named => Choice::Skip(format!(
            "left alone: {} holds {}, and only a blank disk is formatted; the container runtime stays on the system disk (set dataDisk.format: force to wipe it, dataDisk.device to name another disk, or create {} to manage disks yourself)",
            disk.path,
            other.describe(),
            markers::SKIP_AUTO_FDISK
        )),
        other => Choice::Refuse(
            Some(disk.clone()),
            ErrorCode::FailDataDiskRefused,
            format!(
                "{} holds {}: refusing to format it (set dataDisk.format: force to wipe it, or create {} to manage disks yourself)",
                disk.path,
                other.describe(),
                markers::SKIP_AUTO_FDISK
            ),
        ),
    };
    let choice = match stale {
        None => choice,
        Some(stale) => match choice {
            Choice::Format(d, r) => Choice::Format(d, format!("{r}; {stale}")),
            Choice::Mount(d, fs, r) => Choice::Mount(d, fs, format!("{r}; {stale}")),
            Choice::Refuse(d, code, r) => Choice::Refuse(d, code, format!("{r}; {stale}")),
            other => other,
        },
    };
    Ok((choice, disks, Some(signature)))
}

/// Whether the journal's unfinished format is this disk's (`Ok(true)`: resume
/// it), no format is pending for this `major:minor` (`Ok(false)`), or the
/// pending one was another disk that had the same `major:minor` (`Err`, the
/// stale intent described: this disk is treated as new).
fn stale_intent(
    progress: &crate::journal::DataDiskProgress,
    disk: &BlockDisk,
) -> std::result::Result<bool, String> {
    if !progress.format_started
        || progress.format_completed
        || progress.dev_id.as_deref() != Some(disk.dev_id().as_str())
    {
        return Ok(false);
    }
    let stale = |why: String| {
        format!(
            "stale format intent ignored: the journal's unfinished format was of another disk at {} ({why}), so {} is treated as a new disk",
            disk.dev_id(),
            disk.path
        )
    };
    match &progress.identity {
        None => Err(stale(
            "the journal did not record which disk it was".to_string(),
        )),
        Some(recorded) => recorded
            .same_disk(&disk.identity())
            .map(|()| true)
            .map_err(stale),
    }
}

/// The journal's disk is this one: same `major:minor` and same identity.
fn journal_disk_is(progress: &crate::journal::DataDiskProgress, disk: &BlockDisk) -> bool {
    progress.dev_id.as_deref() == Some(disk.dev_id().as_str())
        && progress
            .identity
            .as_ref()
            .is_some_and(|id| id.same_disk(&disk.identity()).is_ok())
}

/// `/var/.keep-container-data` asked for a copy onto the disk this agent
/// formatted, and the copy has not finished (e.g. the agent was killed).
fn copy_pending(ctx: &Ctx) -> bool {
    let progress = &ctx.journal.data_disk;
    markers::present(ctx.host, markers::KEEP_CONTAINER_DATA)
        && progress.formatted_here
        && progress.format_completed
        && !progress.copy_completed
}

pub fn plan(ctx: &Ctx) -> Result<DiskPlan> {
    let (choice, disks, signature) = decide(ctx)?;
    let (device, action, reason) = match choice {
        Choice::Skip(r) => (None, "skip", r),
        Choice::Done(r) => (ctx.journal.data_disk.device.clone(), "done", r),
        Choice::Complete(m, copy) => (
            ctx.journal.data_disk.device.clone(),
            "mount",
            if copy {
                format!("{} mounted; resume the copy of container data", m.dev_id)
            } else {
                format!("{} mounted; bind mounts or fstab entry missing", m.dev_id)
            },
        ),
        Choice::Format(d, r) => (Some(d.path), "format", r),
        Choice::Mount(d, _, r) => (Some(d.path), "mount", r),
        Choice::Refuse(d, _, r) => (d.map(|d| d.path), "refuse", r),
    };
    Ok(DiskPlan {
        device,
        action,
        reason,
        signature: signature.map(|s| s.describe()),
        mount_target: ctx.config.data_disk.mount_target.clone(),
        candidates: disks
            .into_iter()
            .map(|d| CandidateView {
                device: d.path,
                size_bytes: d.size_bytes,
                excluded: d.excluded,
            })
            .collect(),
    })
}

pub struct DataDisk;

impl Phase for DataDisk {
    fn name(&self) -> PhaseName {
        PhaseName::DataDisk
    }

    fn inspect(&self, ctx: &Ctx) -> Result<Decision> {
        Ok(match decide(ctx)?.0 {
            Choice::Skip(r) => Decision::Skip(r),
            Choice::Done(r) => Decision::Done(r),
            Choice::Complete(_, true) => Decision::Run(format!(
                "the copy for {} did not finish: resume it",
                markers::KEEP_CONTAINER_DATA
            )),
            Choice::Complete(_, false) => {
                Decision::Run("bind mounts or fstab entry missing".to_string())
            }
            Choice::Format(_, r) => Decision::Run(format!("format: {r}")),
            Choice::Mount(_, _, r) => Decision::Run(format!("mount: {r}")),
            // Refusals surface as failures when the phase runs.
            Choice::Refuse(_, _, r) => Decision::Run(format!("refuse: {r}")),
        })
    }

    fn run(&self, ctx: &mut Ctx) -> Result<String> {
        let (choice, _, _) = decide(ctx)?;
        let reason = match &choice {
            Choice::Format(_, r) | Choice::Mount(_, _, r) | Choice::Refuse(_, _, r) => r.as_str(),
            _ => "",
        };
        if let Some(stale) = reason
            .split("; ")
            .find(|p| p.starts_with("stale format intent"))
        {
            ctx.host.log.line("data-disk", stale);
            ctx.journal.data_disk = Default::default();
            ctx.save_journal()?;
        }
        let fs_type = ctx.config.data_disk.fs_type.as_str();
        let summary = match choice {
            Choice::Skip(r) | Choice::Done(r) => r,
            Choice::Refuse(_, code, reason) => return Err(AgentError::new(code, reason)),
            Choice::Complete(entry, copy) => {
                if copy {
                    resume_copy(ctx, &entry.dev_id)?;
                }
                finish_mounts(ctx, &entry.dev_id)?;
                if copy {
                    format!("resumed the copy of container data onto {}", entry.dev_id)
                } else {
                    format!("completed bind mounts for {}", entry.dev_id)
                }
            }
            Choice::Format(disk, reason) => {
                format_disk(ctx, &disk, fs_type)?;
                mount_disk(ctx, &disk, fs_type)?;
                keep_container_data(ctx)?;
                finish_mounts(ctx, &disk.dev_id())?;
                format!(
                    "{reason}: formatted {} as {fs_type} and mounted at {}",
                    disk.path, ctx.config.data_disk.mount_target
                )
            }
            Choice::Mount(disk, found_fs, reason) => {
                // A disk this agent formatted (killed before the copy ended)
                // is the same filesystem it made: finish the copy on it.
                let ours = journal_disk_is(&ctx.journal.data_disk, &disk)
                    && ctx.journal.data_disk.format_completed
                    && ctx.journal.data_disk.formatted_here;
                if !ours {
                    ctx.journal.data_disk = Default::default();
                }
                ctx.journal.data_disk.device = Some(disk.path.clone());
                ctx.journal.data_disk.dev_id = Some(disk.dev_id());
                ctx.journal.data_disk.identity = Some(disk.identity());
                ctx.save_journal()?;
                mount_disk(ctx, &disk, &found_fs)?;
                if ours {
                    keep_container_data(ctx)?;
                } else if markers::present(ctx.host, markers::KEEP_CONTAINER_DATA) {
                    ctx.host.log.line(
                        "data-disk",
                        &format!(
                            "marker {} ignored: the disk already holds data, which wins",
                            markers::KEEP_CONTAINER_DATA
                        ),
                    );
                }
                finish_mounts(ctx, &disk.dev_id())?;
                format!("{reason}; mounted at {}", ctx.config.data_disk.mount_target)
            }
        };
        Ok(summary)
    }
}

/// Test hook: pause (forever) at a named checkpoint so that a test can kill
/// the agent there with SIGKILL. Only with the crate's `fault-injection`
/// feature (the test build's); the release agent never reads the variable.
fn checkpoint(name: &str) {
    if cfg!(feature = "fault-injection")
        && std::env::var("KNIT_AGENT_PAUSE_AT").is_ok_and(|v| v == name)
    {
        eprintln!("knit-agent: paused at checkpoint {name}");
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
}

fn format_disk(ctx: &mut Ctx, disk: &BlockDisk, fs_type: &str) -> Result<()> {
    // Intent first: a rerun after a crash knows this disk is ours to format.
    let progress = &mut ctx.journal.data_disk;
    progress.device = Some(disk.path.clone());
    progress.dev_id = Some(disk.dev_id());
    progress.identity = Some(disk.identity());
    progress.format_started = true;
    progress.format_completed = false;
    progress.formatted_here = true;
    progress.copy_completed = false;
    ctx.save_journal()?;
    checkpoint("format-intent");
    let device = ctx.host.host_path(&disk.path);
    let timeout = Duration::from_secs(600);
    match fs_type {
        "xfs" => ctx.host.run(
            ErrorCode::FailFormatDataDisk,
            "mkfs.xfs",
            &["-f", "-q", "-L", "knit-data", &device],
            timeout,
        )?,
        _ => {
            let lazy = if ctx.config.data_disk.lazy_init {
                "1"
            } else {
                "0"
            };
            let ext_opts = format!("lazy_itable_init={lazy},lazy_journal_init={lazy}");
            ctx.host.run(
                ErrorCode::FailFormatDataDisk,
                "mkfs.ext4",
                &["-F", "-q", "-L", "knit-data", "-E", &ext_opts, &device],
                timeout,
            )?
        }
    };
    let uuid = match read_signature(std::path::Path::new(&device)) {
        Ok(Signature::Supported { uuid, .. }) => uuid,
        Ok(other) => {
            return Err(AgentError::new(
                ErrorCode::FailFormatDataDisk,
                format!("after mkfs, {} shows {}", disk.path, other.describe()),
            ))
        }
        Err(e) => {
            return Err(AgentError::new(
                ErrorCode::FailFormatDataDisk,
                format!("cannot read {} after mkfs: {e}", disk.path),
            ))
        }
    };
    ctx.journal.data_disk.format_completed = true;
    ctx.journal.data_disk.fs_uuid = Some(uuid);
    ctx.save_journal()?;
    checkpoint("after-format");
    Ok(())
}

fn mount_disk(ctx: &mut Ctx, disk: &BlockDisk, fs_type: &str) -> Result<()> {
    let target = ctx.host.host_path(&ctx.config.data_disk.mount_target);
    ctx.host
        .ledger()
        .note_dir(&ctx.config.data_disk.mount_target)?;
    std::fs::create_dir_all(&target)
        .context(ErrorCode::FailMountDataDisk, || format!("create {target}"))?;
    ctx.host
        .ledger()
        .note_mount(&ctx.config.data_disk.mount_target)?;
    let device = ctx.host.host_path(&disk.path);
    let fs_type = if fs_type.starts_with("ext") {
        "ext4"
    } else {
        fs_type
    };
    ctx.host.log.line(
        "data-disk",
        &format!("mount {device} on {target} ({fs_type})"),
    );
    mount(
        Some(device.as_str()),
        target.as_str(),
        Some(fs_type),
        MsFlags::empty(),
        None::<&str>,
    )
    .context(ErrorCode::FailMountDataDisk, || {
        format!(
            "mount {} on {}",
            disk.path, ctx.config.data_disk.mount_target
        )
    })?;
    if ctx.journal.data_disk.fs_uuid.is_none() {
        if let Ok(Signature::Supported { uuid, .. }) = read_signature(std::path::Path::new(&device))
        {
            ctx.journal.data_disk.fs_uuid = Some(uuid);
            ctx.save_journal()?;
        }
    }
    Ok(())
}

/// Resumes an unfinished copy on the mounted disk. The source is what the
/// runtime directories hold underneath; once the bind mounts are in place
/// they hide it, so the copy cannot be resumed then (not a state the agent
/// leaves: it binds only after the copy completed).
fn resume_copy(ctx: &mut Ctx, dev_id: &str) -> Result<()> {
    let hidden: Vec<&str> = RUNTIME_DIRS
        .iter()
        .map(|(dir, _)| *dir)
        .filter(|dir| mounted_at(&ctx.host.host_path(dir)).is_some_and(|m| m.dev_id == dev_id))
        .collect();
    if !hidden.is_empty() {
        return Err(AgentError::new(
            ErrorCode::FailKeepContainerData,
            format!(
                "the copy for {} did not finish, and {} is already bound from the data disk, hiding the data to copy: unmount it (umount {}) and rerun",
                markers::KEEP_CONTAINER_DATA,
                hidden.join(", "),
                hidden.join(" ")
            ),
        ));
    }
    ctx.host.log.line(
        "data-disk",
        "resuming the copy of container data an earlier run did not finish",
    );
    keep_container_data(ctx)
}

/// `/var/.keep-container-data`: copy what the runtime directories held onto
/// the freshly formatted disk, before the bind mounts hide it. `cp -a`
/// keeps owners, modes, timestamps, xattrs, symlinks and hard links;
/// `--sparse=always` keeps holes.
fn keep_container_data(ctx: &mut Ctx) -> Result<()> {
    if !markers::present(ctx.host, markers::KEEP_CONTAINER_DATA)
        || ctx.journal.data_disk.copy_completed
    {
        return Ok(());
    }
    let target = ctx.config.data_disk.mount_target.clone();
    for (dir, sub) in RUNTIME_DIRS {
        let source = ctx.host.path(dir);
        let has_content = std::fs::read_dir(&source).is_ok_and(|mut d| d.next().is_some());
        if !has_content {
            continue;
        }
        let dest = ctx.host.host_path(&format!("{target}/{sub}"));
        std::fs::create_dir_all(&dest).context(ErrorCode::FailKeepContainerData, || {
            format!("create {dest}")
        })?;
        let from = format!("{}/.", source.display());
        ctx.host.run(
            ErrorCode::FailKeepContainerData,
            "cp",
            &["-a", "--sparse=always", &from, &dest],
            Duration::from_secs(3600),
        )?;
        checkpoint("during-copy");
    }
    ctx.journal.data_disk.copy_completed = true;
    ctx.save_journal()?;
    ctx.host.log.line(
        "data-disk",
        &format!(
            "kept container data (marker {})",
            markers::KEEP_CONTAINER_DATA
        ),
    );
    Ok(())
}

/// Bind the runtime directories from the disk and persist everything in fstab.
fn finish_mounts(ctx: &mut Ctx, dev_id: &str) -> Result<()> {
    let target = ctx.config.data_disk.mount_target.clone();
    for (dir, sub) in RUNTIME_DIRS {
        let source = ctx.host.host_path(&format!("{target}/{sub}"));
        let dest = ctx.host.host_path(dir);
        std::fs::create_dir_all(&source)
            .context(ErrorCode::FailMountDataDisk, || format!("create {source}"))?;
        ctx.host.ledger().note_dir(dir)?;
        std::fs::create_dir_all(&dest)
            .context(ErrorCode::FailMountDataDisk, || format!("create {dest}"))?;
        if mounted_at(&dest).is_some_and(|m| m.dev_id == dev_id) {
            continue;
        }
        ctx.host.ledger().note_mount(dir)?;
        mount(
            Some(source.as_str()),
            dest.as_str(),
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .context(ErrorCode::FailMountDataDisk, || {
            format!("bind {target}/{sub} on {dir}")
        })?;
    }
    write_fstab(ctx)
}

fn write_fstab(ctx: &mut Ctx) -> Result<()> {
    let data_disk = &ctx.config.data_disk;
    let uuid = ctx.journal.data_disk.fs_uuid.clone().ok_or_else(|| {
        AgentError::new(
            ErrorCode::FailMountDataDisk,
            "the data disk's filesystem UUID is unknown",
        )
    })?;
    let fs_type = match read_signature(
        &ctx.host.path(
            ctx.journal
                .data_disk
                .device
                .as_deref()
                .unwrap_or("/dev/null"),
        ),
    ) {
        Ok(Signature::Supported { fs_type, .. }) if fs_type.starts_with("ext") => "ext4",
        Ok(Signature::Supported { fs_type, .. }) => fs_type,
        _ => data_disk.fs_type.as_str(),
    };
    let existing = ctx.host.read("/etc/fstab").unwrap_or_default();
    let mut lines = Vec::new();
    let mut inside = false;
    for line in existing.lines() {
        match line {
            FSTAB_BEGIN => inside = true,
            FSTAB_END => inside = false,
            _ if !inside => lines.push(line.to_string()),
            _ => {}
        }
    }
    let target = &data_disk.mount_target;
    lines.push(FSTAB_BEGIN.to_string());
    lines.push(format!(
        "UUID={uuid} {target} {fs_type} defaults,nofail 0 2"
    ));
    for (dir, sub) in RUNTIME_DIRS {
        lines.push(format!("{target}/{sub} {dir} none bind,nofail 0 0"));
    }
    lines.push(FSTAB_END.to_string());
    let text = lines.join("\n") + "\n";
    ctx.host.write_file("/etc/fstab", text.as_bytes(), 0o644)
}
