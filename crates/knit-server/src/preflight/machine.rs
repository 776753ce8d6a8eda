//! The machine itself: swap, its OS (manual mode keeps it: the table of
//! supported releases per Kubernetes version), its instance type.

use super::*;

pub(super) fn run(
    o: &mut Out,
    cluster: &Cluster,
    pool: &NodePool,
    i: &InstanceFacts,
    ctx: &Context,
) {
    let spec = &cluster.spec;
    let ps = &pool.spec;
    let pool_name = &pool.metadata.name;

    // Swap off.
    o.require(
        SWAP_OFF,
        !i.swap,
        "swap is off",
        failure(
            format!(
                "instance {} has swap enabled: the kubelet refuses to run with swap",
                i.id
            ),
            "turn swap off (swapoff -a and remove it from /etc/fstab)",
        ),
    );

    // OS.
    check_os(o, spec.kubernetes_version.as_str(), i, ctx.mode);

    // Instance type.
    let family = |list: &[&str]| {
        list.iter().any(|f| {
            i.instance_type == *f
                || i.instance_type
                    .strip_prefix(f)
                    .is_some_and(|r| r.starts_with('.'))
        })
    };
    let unsupported = family(UNSUPPORTED_FAMILIES);
    if family(MIG_RESET_FAMILIES) && !unsupported {
        let what = match ctx.mode {
            Mode::Automatic => "the re-image replaces the system disk and reboots the machine, and MIG GPU and compute instances do not survive a reboot: they are gone once it joins",
            Mode::Manual => "the MIG layout stays as long as the machine does not reboot (MIG GPU and compute instances do not survive one)",
        };
        o.warn(INSTANCE_TYPE_MIG, failure(
            format!("instance type {} is a bare-metal GPU family with MIG: knit does not configure or reset MIG (its agent installs no GPU driver and runs no nvidia-smi), but {what}; a bare-metal boot is also slow enough to hit the join timeout", i.instance_type),
            "raise the pool's joinTimeoutSeconds, and create the MIG instances again after the node joins (nvidia-smi mig, e.g. from the pool's userData)",
        ));
    } else {
        o.require(
            INSTANCE_TYPE,
            !unsupported,
            format!("instance type {}", i.instance_type),
            failure(
                format!(
                    "instance type {} is not supported for nodes",
                    i.instance_type
                ),
                "change the instance type, or use another instance",
            ),
        );
    }

    // The pool manages several instance types; an added instance's type
    // must be one of them (the add-existing seed's precondition).
    o.require(
        INSTANCE_TYPE_IN_POOL,
        ps.instance_types.contains(&i.instance_type),
        format!("instance type {} is in pool {pool_name}'s instance types", i.instance_type),
        failure(
            format!(
                "instance type {} is not in pool {pool_name}'s instance types ({})",
                i.instance_type,
                ps.instance_types.join(", ")
            ),
            format!(
                "add {} to the pool's spec.instanceTypes (knit apply -f), or add an instance of one of the listed types",
                i.instance_type
            ),
        ),
    );
}

/// `MAJOR.MINOR` of a version string, `(0, 0)` when unreadable.
fn minor(version: &str) -> (u32, u32) {
    let mut it = version
        .trim_start_matches('v')
        .split('.')
        .map(|p| p.parse::<u32>().unwrap_or(0));
    (it.next().unwrap_or(0), it.next().unwrap_or(0))
}
/// One supported OS release and the Kubernetes minors it runs (inclusive;
/// `None`: no bound). Used for instances added in manual mode (their OS is
/// kept).
struct OsSupport {
    /// os-release `ID` values of the distribution.
    ids: &'static [&'static str],
    /// os-release `VERSION_ID`: equal, or this followed by `.` (`2` takes
    /// `2.1903`).
    version: &'static str,
    name: &'static str,
    oldest: Option<(u32, u32)>,
    newest: Option<(u32, u32)>,
}

const fn os(
    ids: &'static [&'static str],
    version: &'static str,
    name: &'static str,
    oldest: Option<(u32, u32)>,
    newest: Option<(u32, u32)>,
) -> OsSupport {
    OsSupport {
        ids,
        version,
        name,
        oldest,
        newest,
    }
}

const ALINUX: &[&str] = &["alinux", "aliyun"];
const RHEL_LIKE: &[&str] = &["rhel", "rocky", "almalinux"];

/// Supported OS releases per Kubernetes version, in one place
/// (docs/add-existing.md shows it). CentOS 7 and Alibaba Cloud Linux 2 end
/// at 1.30 (the add-existing seed); the other bounds are knit's, from each
/// release's kernel, cgroup and glibc support and its end of life.
const OS_SUPPORT: &[OsSupport] = &[
    os(&["centos"], "7", "CentOS 7", None, Some((1, 30))),
    os(ALINUX, "2", "Alibaba Cloud Linux 2", None, Some((1, 30))),
    os(ALINUX, "3", "Alibaba Cloud Linux 3", Some((1, 20)), None),
    os(
        RHEL_LIKE,
        "8",
        "Red Hat Enterprise Linux 8 family",
        Some((1, 22)),
        None,
    ),
    os(
        RHEL_LIKE,
        "9",
        "Red Hat Enterprise Linux 9 family",
        Some((1, 26)),
        None,
    ),
    os(&["anolis"], "8", "Anolis OS 8", Some((1, 22)), None),
    os(&["kylin"], "v10", "Kylin V10", Some((1, 22)), None),
    os(&["ubuntu"], "20.04", "Ubuntu 20.04", None, Some((1, 30))),
    os(&["ubuntu"], "22.04", "Ubuntu 22.04", Some((1, 24)), None),
    os(&["ubuntu"], "24.04", "Ubuntu 24.04", Some((1, 30)), None),
    os(&["debian"], "11", "Debian 11", Some((1, 22)), Some((1, 32))),
    os(&["debian"], "12", "Debian 12", Some((1, 26)), None),
];

fn os_row(id: &str, version: &str) -> Option<&'static OsSupport> {
    OS_SUPPORT.iter().find(|r| {
        r.ids.contains(&id)
            && version
                .strip_prefix(r.version)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
    })
}

fn range_text(r: &OsSupport) -> String {
    match (r.oldest, r.newest) {
        (Some((a, b)), Some((c, d))) => format!("Kubernetes {a}.{b} to {c}.{d}"),
        (Some((a, b)), None) => format!("Kubernetes {a}.{b} and newer"),
        (None, Some((c, d))) => format!("Kubernetes up to {c}.{d}"),
        (None, None) => "every Kubernetes version".into(),
    }
}

fn check_os(o: &mut Out, version: &str, i: &InstanceFacts, mode: Mode) {
    let id = i.os_id.to_ascii_lowercase();
    let name = if i.os_name.is_empty() {
        format!("{} {}", i.os_id, i.os_version)
    } else {
        i.os_name.clone()
    };
    if mode == Mode::Automatic {
        // The system disk is replaced by the pool's image: the OS is the pool's.
        o.pass(
            OS_ALLOWED,
            format!("{name} is replaced by the pool's image"),
        );
        return;
    }
    let windows = id.contains("windows");
    let container_os = id == "lifsea" || id.contains("containeros");
    if windows || container_os {
        o.fail(
            OS_ALLOWED,
            failure(
                format!("{name} cannot be added manually (Windows and ContainerOS are refused)"),
                "use automatic mode (the pool's image replaces the OS) or another instance",
            ),
        );
        return;
    }
    let Some(row) = os_row(&id, i.os_version.trim()) else {
        o.warn(OS_UNLISTED, failure(
            format!("{name} (ID {}, VERSION_ID {}) is not in knit's table of supported OS releases; it may work with Kubernetes {version}, untested", i.os_id, i.os_version),
            "use automatic mode (the pool's image replaces the OS), or an OS release listed in docs/add-existing.md",
        ));
        return;
    };
    let cluster = minor(version);
    let too_old = row.oldest.is_some_and(|m| cluster < m);
    let too_new = row.newest.is_some_and(|m| cluster > m);
    if too_old || too_new {
        o.fail(OS_ALLOWED, failure(
            format!("{} is supported with {}; the cluster runs {version}", row.name, range_text(row)),
            "use automatic mode (the pool's image replaces the OS) or an OS release that supports the cluster's version",
        ));
    } else {
        o.pass(
            OS_ALLOWED,
            format!("{name}: {} supports {}", row.name, range_text(row)),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preflight::tests::*;

    #[test]
    fn swap_off() {
        pair(
            "swap-off",
            PreflightStatus::Error,
            "PreflightSwapOn",
            |_, _, i, _| i.swap = true,
        );
    }
    #[test]
    fn os_allowed_in_manual_mode() {
        let manual = |ctx: &mut Context| ctx.mode = Mode::Manual;
        pair(
            "os-allowed",
            PreflightStatus::Error,
            "PreflightOsNotAllowed",
            |_, _, i, ctx| {
                manual(ctx);
                i.os_id = "windows".into();
            },
        );
        pair(
            "os-allowed",
            PreflightStatus::Error,
            "PreflightOsNotAllowed",
            |_, _, i, ctx| {
                manual(ctx);
                i.os_id = "lifsea".into();
            },
        );
        // CentOS 7: refused on 1.31, allowed on 1.30.
        pair(
            "os-allowed",
            PreflightStatus::Error,
            "PreflightOsNotAllowed",
            |_, _, i, ctx| {
                manual(ctx);
                i.os_id = "centos".into();
                i.os_version = "7".into();
            },
        );
        let mut c = terway();
        c.spec.kubernetes_version = "1.30.7".into();
        let i = InstanceFacts {
            os_id: "aliyun".into(),
            os_version: "2.1903".into(),
            ..good()
        };
        let ctx = Context {
            mode: Mode::Manual,
            ..Context::default()
        };
        assert_eq!(
            result(&c, &pool(), &i, &ctx, "os-allowed").status,
            PreflightStatus::Pass
        );
        // Automatic mode replaces the OS: Windows is fine there.
        let i = InstanceFacts {
            os_id: "windows".into(),
            ..good()
        };
        assert_eq!(
            result(&terway(), &pool(), &i, &Context::default(), "os-allowed").status,
            PreflightStatus::Pass
        );
    }
    #[test]
    fn instance_type() {
        // Each family is listed in the pool: only the family check speaks.
        let set = |p: &mut NodePool, i: &mut InstanceFacts, t: &str| {
            i.instance_type = t.into();
            p.spec.instance_types.push(t.into());
        };
        pair(
            "instance-type",
            PreflightStatus::Error,
            "PreflightInstanceTypeUnsupported",
            |_, p, i, _| set(p, i, "ecs.t5.small"),
        );
        pair(
            "instance-type",
            PreflightStatus::Warning,
            "PreflightMigReset",
            |_, p, i, _| set(p, i, "ecs.ebmgn7e.32xlarge"),
        );
        // Issue 27 (7): the text says what knit really does with MIG.
        let mut p = pool();
        let mut i = good();
        set(&mut p, &mut i, "ecs.ebmgn7.32xlarge");
        let r = result(&terway(), &p, &i, &Context::default(), "instance-type");
        assert!(
            r.message.contains("does not configure or reset MIG"),
            "{r:?}"
        );
        assert!(!r.message.contains("are reset at initialization"), "{r:?}");
        assert!(r.fix.contains("create the MIG instances again"), "{r:?}");
    }
    #[test]
    fn instance_type_in_pool() {
        // The seed's precondition: an instance of a type the pool does not
        // list is refused (before, it was accepted).
        pair(
            "instance-type-in-pool",
            PreflightStatus::Error,
            "PreflightInstanceTypeNotInPool",
            |_, _, i, _| i.instance_type = "ecs.c7.xlarge".into(),
        );
        let mut p = pool();
        p.spec.instance_types = vec!["ecs.g7.large".into(), "ecs.c7.xlarge".into()];
        let i = InstanceFacts {
            instance_type: "ecs.c7.xlarge".into(),
            ..good()
        };
        let r = result(
            &terway(),
            &p,
            &i,
            &Context::default(),
            "instance-type-in-pool",
        );
        assert_eq!(r.status, PreflightStatus::Pass, "{r:?}");
        let bad = result(
            &terway(),
            &pool(),
            &i,
            &Context::default(),
            "instance-type-in-pool",
        );
        assert!(
            bad.message.contains("ecs.c7.xlarge") && bad.fix.contains("spec.instanceTypes"),
            "{bad:?}"
        );
    }
    #[test]
    fn os_table_per_kubernetes_version() {
        let manual = Context {
            mode: Mode::Manual,
            ..Context::default()
        };
        let at = |k8s: &str, id: &str, v: &str| {
            let mut c = terway();
            c.spec.kubernetes_version = k8s.into();
            let i = InstanceFacts {
                os_id: id.into(),
                os_version: v.into(),
                os_name: String::new(),
                ..good()
            };
            result(&c, &pool(), &i, &manual, "os-allowed")
        };
        // Beyond the seed's one example: the table's bounds, both ways.
        let r = at("1.31.5", "ubuntu", "20.04");
        assert_eq!(
            (r.status, r.code.as_str()),
            (PreflightStatus::Error, "PreflightOsNotAllowed"),
            "{r:?}"
        );
        assert!(
            r.message.contains("up to 1.30") && r.message.contains("1.31.5"),
            "{r:?}"
        );
        assert_eq!(
            at("1.30.7", "ubuntu", "20.04").status,
            PreflightStatus::Pass
        );
        let r = at("1.22.3", "debian", "12");
        assert_eq!(r.status, PreflightStatus::Error, "{r:?}");
        assert!(r.message.contains("1.26 and newer"), "{r:?}");
        assert_eq!(at("1.33.1", "debian", "11").status, PreflightStatus::Error);
        assert_eq!(at("1.31.5", "rocky", "9.4").status, PreflightStatus::Pass);
        assert_eq!(at("1.31.5", "alinux", "3").status, PreflightStatus::Pass);
        assert_eq!(
            at("1.31.5", "aliyun", "2.1903").status,
            PreflightStatus::Error
        );
        // A release the table does not list: a warning, not a pass.
        let r = at("1.31.5", "debian", "13");
        assert_eq!(
            (r.status, r.code.as_str()),
            (PreflightStatus::Warning, "PreflightOsUnlisted"),
            "{r:?}"
        );
        let r = at("1.31.5", "gentoo", "2.15");
        assert_eq!(r.status, PreflightStatus::Warning, "{r:?}");
        // Every row's bounds are ordered and its name is in the docs.
        let doc = include_str!("../../../../docs/add-existing.md");
        for row in OS_SUPPORT {
            if let (Some(a), Some(b)) = (row.oldest, row.newest) {
                assert!(a <= b, "{}", row.name);
            }
            assert!(
                doc.contains(row.name),
                "{} is not in docs/add-existing.md",
                row.name
            );
        }
    }
}
