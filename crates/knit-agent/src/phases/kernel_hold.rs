//! The kernel is not part of a security upgrade (docs/spec.md §1.3.5: `yum update-minimal
//! --security --exclude kernel*`). yum and dnf take the exclusion as a flag;
//! apt has none, so the installed kernel packages are held (`apt-mark
//! hold`) for the upgrade and released after. Only the holds knit added are
//! released: a hold the node already had stays. The list knit holds is
//! written to [`HELD_FILE`] before the first hold, so an agent killed
//! mid-upgrade releases them on its next run.

use crate::error::Result;
use crate::phase::Ctx;
use knit_api::ErrorCode;
use std::time::Duration;

/// The kernel packages knit holds while it upgrades.
pub const HELD_FILE: &str = "/var/lib/knit/held-kernel-packages";

/// Debian and Ubuntu kernel package families: the images, their modules
/// and headers, the build helpers and the meta packages that pull a new
/// kernel in (`linux-image-amd64`, `linux-generic`, …). The apt form of
/// yum's `kernel*`.
const KERNEL_PREFIXES: &[&str] = &[
    "linux-image",
    "linux-headers",
    "linux-modules",
    "linux-kbuild",
    "linux-generic",
    "linux-virtual",
    "linux-signed",
    "linux-kernel",
    "kernel",
];

/// The installed kernel packages in `dpkg-query -W -f='${Package}\t${Status}\n'`
/// output, sorted.
pub fn kernel_packages(dpkg_list: &str) -> Vec<String> {
    let mut names: Vec<String> = dpkg_list
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .filter(|(_, status)| status.trim() == "install ok installed")
        .map(|(name, _)| name.trim())
        .filter(|name| KERNEL_PREFIXES.iter().any(|p| name.starts_with(p)))
        .map(str::to_string)
        .collect();
    names.sort();
    names.dedup();
    names
}

/// What knit must hold: the kernel packages the node has not held itself.
pub fn to_hold(kernels: &[String], already_held: &str) -> Vec<String> {
    let held: Vec<&str> = already_held.split_whitespace().collect();
    kernels
        .iter()
        .filter(|k| !held.contains(&k.as_str()))
        .cloned()
        .collect()
}

const SHORT: Duration = Duration::from_secs(60);

fn apt_mark(ctx: &Ctx, verb: &str, names: &[String]) -> Result<()> {
    let mut args = vec![verb];
    args.extend(names.iter().map(String::as_str));
    ctx.host
        .run(ErrorCode::FailBasePackages, "apt-mark", &args, SHORT)?;
    Ok(())
}

/// Releases the holds a previous, interrupted run left (see [`HELD_FILE`]).
pub fn release_leftover(ctx: &Ctx) -> Result<()> {
    let Some(list) = ctx.host.read(HELD_FILE) else {
        return Ok(());
    };
    let names: Vec<String> = list.split_whitespace().map(str::to_string).collect();
    if !names.is_empty() {
        apt_mark(ctx, "unhold", &names)?;
    }
    remove_record(ctx)
}

fn remove_record(ctx: &Ctx) -> Result<()> {
    match std::fs::remove_file(ctx.host.path(HELD_FILE)) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(crate::error::AgentError::new(
            ErrorCode::FailBasePackages,
            format!("remove {HELD_FILE}: {e}"),
        )),
    }
}

/// Runs `upgrade` with the node's kernel packages held; the packages held
/// (empty when the node has none, or held them all already). The holds are
/// released whatever `upgrade` returns.
pub fn with_kernel_held<T>(
    ctx: &Ctx,
    upgrade: impl FnOnce() -> Result<T>,
) -> Result<(T, Vec<String>)> {
    release_leftover(ctx)?;
    let listed = ctx.host.run(
        ErrorCode::FailBasePackages,
        "dpkg-query",
        &["-W", "-f=${Package}\t${Status}\n"],
        SHORT,
    )?;
    let shown = ctx.host.run(
        ErrorCode::FailBasePackages,
        "apt-mark",
        &["showhold"],
        SHORT,
    )?;
    let ours = to_hold(&kernel_packages(&listed.stdout), &shown.stdout);
    if ours.is_empty() {
        return upgrade().map(|t| (t, ours));
    }
    // The record first: an agent killed after the hold releases it next run.
    crate::files::write_atomic(
        &ctx.host.path(HELD_FILE),
        format!("{}\n", ours.join("\n")).as_bytes(),
        0o644,
    )?;
    apt_mark(ctx, "hold", &ours)?;
    let result = upgrade();
    let released = apt_mark(ctx, "unhold", &ours).and_then(|()| remove_record(ctx));
    let value = result?;
    released?;
    Ok((value, ours))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_installed_kernel_packages_are_named() {
        let list = "linux-image-6.1.0-18-amd64\tinstall ok installed\n\
                    linux-image-amd64\tinstall ok installed\n\
                    linux-headers-6.1.0-18-amd64\tdeinstall ok config-files\n\
                    linux-base\tinstall ok installed\n\
                    libc6\tinstall ok installed\n\
                    kernel-tools\tinstall ok installed\n\
                    linux-modules-extra-6.5.0-1-generic\tinstall ok installed\n\
                    broken line without a tab\n";
        assert_eq!(
            kernel_packages(list),
            vec![
                "kernel-tools",
                "linux-image-6.1.0-18-amd64",
                "linux-image-amd64",
                "linux-modules-extra-6.5.0-1-generic"
            ]
        );
    }

    #[test]
    fn a_hold_the_node_already_had_is_not_ours() {
        let kernels = vec![
            "linux-image-amd64".to_string(),
            "linux-image-6.1".to_string(),
        ];
        assert_eq!(
            to_hold(&kernels, "linux-image-amd64\nzlib1g\n"),
            vec!["linux-image-6.1"]
        );
        assert!(to_hold(&kernels, "linux-image-6.1 linux-image-amd64").is_empty());
    }
}
