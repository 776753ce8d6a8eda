//! The ECS instance type catalog: the size of each instance type knit's users
//! run (vCPUs, memory, GPUs), so that the local cloud can make a machine the
//! size its type says and the autoscaler can shape a template node for a pool
//! that has no node yet.
//!
//! Pure data, no I/O. The figures are Alibaba Cloud's published specifications
//! (the "Instance families" pages of the ECS documentation); memory is in MiB
//! (GiB × 1024, so 0.5 GiB is 512). On ECS the authority is
//! DescribeInstanceTypes; this catalog is what knit knows without asking, and
//! the local cloud's only source: an instance type not in it cannot be made
//! there ([`lookup`] answers `None`).

/// One instance type: its name and size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstanceType {
    /// The full name, as ECS spells it: `ecs.g7.large`.
    pub name: &'static str,
    /// Virtual CPUs.
    pub vcpus: u32,
    /// Memory in MiB.
    pub memory_mib: u64,
    /// GPUs attached (0 for the general, compute and memory families).
    pub gpus: u32,
    /// The GPU model, when `gpus > 0` (`"NVIDIA A10"`, `"NVIDIA T4"`).
    pub gpu_type: Option<&'static str>,
}

impl InstanceType {
    /// Memory in bytes.
    pub fn memory_bytes(&self) -> u64 {
        self.memory_mib * 1024 * 1024
    }

    /// The family: the name without `ecs.` and the size (`g7`, `t6-c1m1`,
    /// `gn7i-c8g1`).
    pub fn family(&self) -> &'static str {
        let rest = self.name.strip_prefix("ecs.").unwrap_or(self.name);
        match rest.rfind('.') {
            Some(dot) => &rest[..dot],
            None => rest,
        }
    }
}

const GIB: u64 = 1024;

const fn cpu(name: &'static str, vcpus: u32, memory_gib: u64) -> InstanceType {
    InstanceType {
        name,
        vcpus,
        memory_mib: memory_gib * GIB,
        gpus: 0,
        gpu_type: None,
    }
}

const fn cpu_mib(name: &'static str, vcpus: u32, memory_mib: u64) -> InstanceType {
    InstanceType {
        name,
        vcpus,
        memory_mib,
        gpus: 0,
        gpu_type: None,
    }
}

const fn gpu(
    name: &'static str,
    vcpus: u32,
    memory_gib: u64,
    gpus: u32,
    gpu_type: &'static str,
) -> InstanceType {
    InstanceType {
        name,
        vcpus,
        memory_mib: memory_gib * GIB,
        gpus,
        gpu_type: Some(gpu_type),
    }
}

const A10: &str = "NVIDIA A10";
const T4: &str = "NVIDIA T4";
const A100: &str = "NVIDIA A100 80GB";

/// Every instance type knit knows, by family and size.
pub static CATALOG: &[InstanceType] = &[
    // g7: general purpose, 1 vCPU : 4 GiB.
    cpu("ecs.g7.large", 2, 8),
    cpu("ecs.g7.xlarge", 4, 16),
    cpu("ecs.g7.2xlarge", 8, 32),
    cpu("ecs.g7.3xlarge", 12, 48),
    cpu("ecs.g7.4xlarge", 16, 64),
    cpu("ecs.g7.6xlarge", 24, 96),
    cpu("ecs.g7.8xlarge", 32, 128),
    cpu("ecs.g7.16xlarge", 64, 256),
    cpu("ecs.g7.32xlarge", 128, 512),
    // g8i: general purpose, 1 : 4.
    cpu("ecs.g8i.large", 2, 8),
    cpu("ecs.g8i.xlarge", 4, 16),
    cpu("ecs.g8i.2xlarge", 8, 32),
    cpu("ecs.g8i.3xlarge", 12, 48),
    cpu("ecs.g8i.4xlarge", 16, 64),
    cpu("ecs.g8i.6xlarge", 24, 96),
    cpu("ecs.g8i.8xlarge", 32, 128),
    cpu("ecs.g8i.12xlarge", 48, 192),
    cpu("ecs.g8i.16xlarge", 64, 256),
    cpu("ecs.g8i.24xlarge", 96, 384),
    cpu("ecs.g8i.48xlarge", 192, 768),
    // c7: compute optimized, 1 : 2.
    cpu("ecs.c7.large", 2, 4),
    cpu("ecs.c7.xlarge", 4, 8),
    cpu("ecs.c7.2xlarge", 8, 16),
    cpu("ecs.c7.3xlarge", 12, 24),
    cpu("ecs.c7.4xlarge", 16, 32),
    cpu("ecs.c7.6xlarge", 24, 48),
    cpu("ecs.c7.8xlarge", 32, 64),
    cpu("ecs.c7.16xlarge", 64, 128),
    cpu("ecs.c7.32xlarge", 128, 256),
    // c8i: compute optimized, 1 : 2.
    cpu("ecs.c8i.large", 2, 4),
    cpu("ecs.c8i.xlarge", 4, 8),
    cpu("ecs.c8i.2xlarge", 8, 16),
    cpu("ecs.c8i.3xlarge", 12, 24),
    cpu("ecs.c8i.4xlarge", 16, 32),
    cpu("ecs.c8i.6xlarge", 24, 48),
    cpu("ecs.c8i.8xlarge", 32, 64),
    cpu("ecs.c8i.12xlarge", 48, 96),
    cpu("ecs.c8i.16xlarge", 64, 128),
    cpu("ecs.c8i.24xlarge", 96, 192),
    cpu("ecs.c8i.48xlarge", 192, 384),
    // r7: memory optimized, 1 : 8.
    cpu("ecs.r7.large", 2, 16),
    cpu("ecs.r7.xlarge", 4, 32),
    cpu("ecs.r7.2xlarge", 8, 64),
    cpu("ecs.r7.3xlarge", 12, 96),
    cpu("ecs.r7.4xlarge", 16, 128),
    cpu("ecs.r7.6xlarge", 24, 192),
    cpu("ecs.r7.8xlarge", 32, 256),
    cpu("ecs.r7.16xlarge", 64, 512),
    cpu("ecs.r7.32xlarge", 128, 1024),
    // r8i: memory optimized, 1 : 8.
    cpu("ecs.r8i.large", 2, 16),
    cpu("ecs.r8i.xlarge", 4, 32),
    cpu("ecs.r8i.2xlarge", 8, 64),
    cpu("ecs.r8i.3xlarge", 12, 96),
    cpu("ecs.r8i.4xlarge", 16, 128),
    cpu("ecs.r8i.6xlarge", 24, 192),
    cpu("ecs.r8i.8xlarge", 32, 256),
    cpu("ecs.r8i.12xlarge", 48, 384),
    cpu("ecs.r8i.16xlarge", 64, 512),
    cpu("ecs.r8i.24xlarge", 96, 768),
    cpu("ecs.r8i.48xlarge", 192, 1536),
    // t6: burstable; the name says the ratio (c4m1 = 4 vCPUs to 1 GiB).
    cpu_mib("ecs.t6-c4m1.large", 2, 512),
    cpu("ecs.t6-c2m1.large", 2, 1),
    cpu("ecs.t6-c1m1.large", 2, 2),
    cpu("ecs.t6-c1m2.large", 2, 4),
    cpu("ecs.t6-c1m4.large", 2, 8),
    cpu("ecs.t6-c1m4.xlarge", 4, 16),
    cpu("ecs.t6-c1m4.2xlarge", 8, 32),
    // t1: the first shared generation (knit refuses its family for nodes;
    // attach tests make one to see the refusal).
    cpu("ecs.t1.small", 1, 1),
    // ebmgn7e: bare metal, NVIDIA A100 80 GB (MIG-capable).
    gpu("ecs.ebmgn7e.32xlarge", 128, 1024, 8, A100),
    // gn7i: NVIDIA A10 (24 GiB each).
    gpu("ecs.gn7i-c8g1.2xlarge", 8, 30, 1, A10),
    gpu("ecs.gn7i-c16g1.4xlarge", 16, 60, 1, A10),
    gpu("ecs.gn7i-c32g1.8xlarge", 32, 188, 1, A10),
    gpu("ecs.gn7i-c48g1.12xlarge", 48, 310, 1, A10),
    gpu("ecs.gn7i-c56g1.14xlarge", 56, 346, 1, A10),
    gpu("ecs.gn7i-c32g1.16xlarge", 64, 376, 2, A10),
    gpu("ecs.gn7i-c32g1.32xlarge", 128, 752, 4, A10),
    gpu("ecs.gn7i-2x.8xlarge", 32, 128, 2, A10),
    gpu("ecs.gn7i-4x.8xlarge", 32, 128, 4, A10),
    gpu("ecs.gn7i-4x.16xlarge", 64, 256, 4, A10),
    gpu("ecs.gn7i-8x.16xlarge", 64, 256, 8, A10),
    gpu("ecs.gn7i-8x.32xlarge", 128, 512, 8, A10),
    // gn6i: NVIDIA T4 (16 GiB each).
    gpu("ecs.gn6i-c4g1.xlarge", 4, 15, 1, T4),
    gpu("ecs.gn6i-c8g1.2xlarge", 8, 31, 1, T4),
    gpu("ecs.gn6i-c16g1.4xlarge", 16, 62, 1, T4),
    gpu("ecs.gn6i-c24g1.6xlarge", 24, 93, 1, T4),
    gpu("ecs.gn6i-c40g1.10xlarge", 40, 155, 1, T4),
    gpu("ecs.gn6i-c24g1.12xlarge", 48, 186, 2, T4),
    gpu("ecs.gn6i-c24g1.24xlarge", 96, 372, 4, T4),
];

/// The instance type named `name` (the full ECS name, `ecs.g7.large`), or
/// `None` when knit does not know it.
pub fn lookup(name: &str) -> Option<&'static InstanceType> {
    CATALOG.iter().find(|t| t.name == name)
}

/// Every instance type knit knows.
pub fn all() -> &'static [InstanceType] {
    CATALOG
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn the_issue_type_is_two_cpus_and_two_gib() {
        let t = lookup("ecs.t6-c1m1.large").expect("in the catalog");
        assert_eq!((t.vcpus, t.memory_mib, t.gpus), (2, 2048, 0));
        assert_eq!(t.memory_bytes(), 2 << 30);
        assert_eq!(t.family(), "t6-c1m1");
    }

    #[test]
    fn default_pool_type_is_known() {
        let t = lookup("ecs.g7.large").expect("the default pool's type");
        assert_eq!((t.vcpus, t.memory_mib), (2, 8192));
        assert_eq!(t.family(), "g7");
    }

    #[test]
    fn gpu_types_say_their_gpu() {
        let t = lookup("ecs.gn7i-c8g1.2xlarge").expect("known");
        assert_eq!((t.gpus, t.gpu_type), (1, Some("NVIDIA A10")));
        let t = lookup("ecs.gn6i-c4g1.xlarge").expect("known");
        assert_eq!((t.vcpus, t.memory_mib, t.gpus), (4, 15 * 1024, 1));
        assert_eq!(t.gpu_type, Some("NVIDIA T4"));
    }

    #[test]
    fn unknown_names_are_none() {
        assert!(lookup("ecs.g7.huge").is_none());
        assert!(lookup("g7.large").is_none());
        assert!(lookup("").is_none());
    }

    #[test]
    fn catalog_is_consistent() {
        let mut seen = BTreeSet::new();
        for t in all() {
            assert!(seen.insert(t.name), "{} listed twice", t.name);
            assert!(t.name.starts_with("ecs."), "{}", t.name);
            assert!(t.vcpus > 0 && t.memory_mib > 0, "{}", t.name);
            assert_eq!(t.gpus > 0, t.gpu_type.is_some(), "{}", t.name);
            // Names pass pool validation's syntax.
            assert!(t
                .name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-'));
        }
        // The CPU families keep their ratio at every size.
        for (family, gib_per_vcpu) in [
            ("g7", 4),
            ("g8i", 4),
            ("c7", 2),
            ("c8i", 2),
            ("r7", 8),
            ("r8i", 8),
        ] {
            let mut n = 0;
            for t in all().iter().filter(|t| t.family() == family) {
                n += 1;
                assert_eq!(
                    t.memory_mib,
                    t.vcpus as u64 * gib_per_vcpu * 1024,
                    "{}",
                    t.name
                );
            }
            assert!(n >= 5, "{family} has its sizes");
        }
    }
}
