//! Names every part of knit agrees on: initialization phases and error codes.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The agent's phases, in the order they run (docs/spec.md §1.3.1–§1.3.7; the
/// OS configuration is applied in §1.3.1 and again in §1.3.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PhaseName {
    TimeSync,
    NodeIdentity,
    DataDisk,
    /// The pool's OS parameters applied before the kubelet starts (forwarding
    /// and bridge settings matter to it); `OsConfig` applies them again at the end.
    OsConfigInitial,
    KubernetesComponents,
    OptionalComponents,
    Join,
    BasePackages,
    OsConfig,
    Hardening,
}

impl PhaseName {
    pub const ALL: [PhaseName; 10] = [
        PhaseName::TimeSync,
        PhaseName::NodeIdentity,
        PhaseName::DataDisk,
        PhaseName::OsConfigInitial,
        PhaseName::KubernetesComponents,
        PhaseName::OptionalComponents,
        PhaseName::Join,
        PhaseName::BasePackages,
        PhaseName::OsConfig,
        PhaseName::Hardening,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PhaseName::TimeSync => "time-sync",
            PhaseName::NodeIdentity => "node-identity",
            PhaseName::DataDisk => "data-disk",
            PhaseName::OsConfigInitial => "os-config-initial",
            PhaseName::KubernetesComponents => "kubernetes-components",
            PhaseName::OptionalComponents => "optional-components",
            PhaseName::Join => "join",
            PhaseName::BasePackages => "base-packages",
            PhaseName::OsConfig => "os-config",
            PhaseName::Hardening => "hardening",
        }
    }

    pub fn parse(name: &str) -> Option<PhaseName> {
        PhaseName::ALL.into_iter().find(|p| p.as_str() == name)
    }
}

impl fmt::Display for PhaseName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Stable error codes written to the error-code file and reported to the
/// control plane. ACK-style names (`Fail…`) so existing tooling that greps
/// `ack-deploy-error-code.log` keeps working. Never rename a variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ErrorCode {
    FailConfig,
    FailJournal,
    FailSyncTime,
    FailSetNodeIdentity,
    FailDataDiskNotFound,
    FailDataDiskRefused,
    FailFormatDataDisk,
    FailMountDataDisk,
    FailKeepContainerData,
    FailGetKubeVersion,
    FailDownloadKubernetes,
    FailChecksumMismatch,
    FailInstallComponents,
    FailOptionalComponents,
    FailJoin,
    FailBasePackages,
    FailOsConfig,
    FailHardening,
    FailCommand,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::FailConfig => "FailConfig",
            ErrorCode::FailJournal => "FailJournal",
            ErrorCode::FailSyncTime => "FailSyncTime",
            ErrorCode::FailSetNodeIdentity => "FailSetNodeIdentity",
            ErrorCode::FailDataDiskNotFound => "FailDataDiskNotFound",
            ErrorCode::FailDataDiskRefused => "FailDataDiskRefused",
            ErrorCode::FailFormatDataDisk => "FailFormatDataDisk",
            ErrorCode::FailMountDataDisk => "FailMountDataDisk",
            ErrorCode::FailKeepContainerData => "FailKeepContainerData",
            ErrorCode::FailGetKubeVersion => "FailGetKubeVersion",
            ErrorCode::FailDownloadKubernetes => "FailDownloadKubernetes",
            ErrorCode::FailChecksumMismatch => "FailChecksumMismatch",
            ErrorCode::FailInstallComponents => "FailInstallComponents",
            ErrorCode::FailOptionalComponents => "FailOptionalComponents",
            ErrorCode::FailJoin => "FailJoin",
            ErrorCode::FailBasePackages => "FailBasePackages",
            ErrorCode::FailOsConfig => "FailOsConfig",
            ErrorCode::FailHardening => "FailHardening",
            ErrorCode::FailCommand => "FailCommand",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
