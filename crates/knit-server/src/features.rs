//! The optional parts of knit, as cargo features of knit-server (and
//! knit-cli, which forwards them): every build has them by default; the
//! main job's build (scripts/up.sh) leaves them out, which saves an eighth
//! of its compile time (docs/benchmarks.md). A binary built without one
//! refuses what needs it with [`FeatureMissing`], naming the feature and
//! the command that builds it — never a silent fallback.

/// A part of knit that a build may leave out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feature {
    /// `--provider ecs` (knit-ecs).
    Ecs,
    /// `--provider qemu` (knit-qemu).
    Qemu,
    /// `--datastore postgres://…` and `knit up --ha` (tokio-postgres).
    Postgres,
    /// A Cluster with `apiServer: external` (kube, k8s-openapi).
    ExternalCluster,
}

impl Feature {
    pub const ALL: [Feature; 4] = [
        Feature::Ecs,
        Feature::Qemu,
        Feature::Postgres,
        Feature::ExternalCluster,
    ];

    /// The cargo feature's name (knit-cli's and knit-server's).
    pub fn name(self) -> &'static str {
        match self {
            Feature::Ecs => "ecs",
            Feature::Qemu => "qemu",
            Feature::Postgres => "postgres",
            Feature::ExternalCluster => "external-cluster",
        }
    }

    /// Whether this binary was built with it.
    pub fn built_in(self) -> bool {
        match self {
            Feature::Ecs => cfg!(feature = "ecs"),
            Feature::Qemu => cfg!(feature = "qemu"),
            Feature::Postgres => cfg!(feature = "postgres"),
            Feature::ExternalCluster => cfg!(feature = "external-cluster"),
        }
    }

    /// The command that builds `knit` as scripts/up.sh does, plus this
    /// feature (the defaults, without `--no-default-features`, are all).
    pub fn build_command(self) -> String {
        format!(
            "cargo build --release --locked -p knit-cli --no-default-features --features {}",
            self.name()
        )
    }
}

/// Something was asked for that this binary was built without.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{asked} needs the cargo feature `{feature}`, which this knit was built without (scripts/up.sh builds only what the main job runs): build knit with it: `{command}` (add the other features you need to --features; `cargo build --release --locked -p knit-cli` builds every one)"
)]
pub struct FeatureMissing {
    /// What was asked, as the user said it (`--provider qemu`).
    pub asked: String,
    /// The cargo feature's name.
    pub feature: &'static str,
    /// The exact command that builds a knit with it.
    pub command: String,
}

impl FeatureMissing {
    /// Stable code (CLI and API).
    pub const CODE: &'static str = "FeatureMissing";
}

/// `Ok` when `feature` is in this binary, else the error naming `asked`.
pub fn require(feature: Feature, asked: &str) -> Result<(), FeatureMissing> {
    check(feature, feature.built_in(), asked)
}

/// [`require`] with whether the feature is built in given: the rule,
/// testable for both answers in any build.
pub fn check(feature: Feature, built_in: bool, asked: &str) -> Result<(), FeatureMissing> {
    if built_in {
        return Ok(());
    }
    Err(FeatureMissing {
        asked: asked.to_string(),
        feature: feature.name(),
        command: feature.build_command(),
    })
}

/// The feature a `--datastore` value needs (`None`: SQLite, always there).
pub fn for_datastore(datastore: &str) -> Option<Feature> {
    let d = datastore.trim();
    (d.starts_with("postgres://") || d.starts_with("postgresql://")).then_some(Feature::Postgres)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_feature_names_itself_and_the_command_that_builds_it() {
        let e = check(Feature::Qemu, false, "--provider qemu").unwrap_err();
        assert_eq!(e.feature, "qemu");
        assert_eq!(
            e.command,
            "cargo build --release --locked -p knit-cli --no-default-features --features qemu"
        );
        let text = e.to_string();
        assert!(
            text.starts_with("--provider qemu needs the cargo feature `qemu`"),
            "{text}"
        );
        assert!(text.contains(
            "`cargo build --release --locked -p knit-cli --no-default-features --features qemu`"
        ));
        assert!(check(Feature::Qemu, true, "--provider qemu").is_ok());
    }

    #[test]
    fn every_feature_maps_to_its_cargo_name_and_choices_to_features() {
        let names: Vec<&str> = Feature::ALL.iter().map(|f| f.name()).collect();
        assert_eq!(names, ["ecs", "qemu", "postgres", "external-cluster"]);
        assert_eq!(
            for_datastore(" postgresql://knit@db/knit"),
            Some(Feature::Postgres)
        );
        assert_eq!(for_datastore("postgres://db/knit"), Some(Feature::Postgres));
        assert_eq!(for_datastore("sqlite:/var/lib/knit.db"), None);
        assert_eq!(for_datastore("sqlite"), None);
    }

    /// The test build has every feature (the defaults): `require` agrees
    /// with `check` there, and with `built_in`.
    #[test]
    fn the_default_build_has_every_feature() {
        for f in Feature::ALL {
            assert!(f.built_in(), "{} not built in", f.name());
            assert!(require(f, "x").is_ok());
        }
    }
}
