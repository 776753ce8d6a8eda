//! Names every part of knit agrees on: initialization phases and error codes.

use crate::word::word_enum;
use serde::{Deserialize, Serialize};
use std::fmt;

word_enum! {
    /// The agent's phases, declared in the order they run (docs/spec.md
    /// §1.3.1–§1.3.7; the OS configuration is applied in §1.3.1 and again in
    /// §1.3.6). This is the one list: the words (serde, `as_str`, `FromStr`),
    /// the run order (`ALL`, and `Ord`) and the last phase ([`PhaseName::LAST`])
    /// all come from it; the agent runs `ALL` in order, the server and the
    /// console read the order and the last phase from here. The copies that
    /// must stay (docs/agent.md's phase table) are held to it by
    /// crates/knit-api/tests/lists.rs.
    PhaseName, field = "phase.name" {
        TimeSync = "time-sync",
        NodeIdentity = "node-identity",
        DataDisk = "data-disk",
        /// The pool's OS parameters applied before the kubelet starts (forwarding
        /// and bridge settings matter to it); `OsConfig` applies them again at the end.
        OsConfigInitial = "os-config-initial",
        KubernetesComponents = "kubernetes-components",
        OptionalComponents = "optional-components",
        Join = "join",
        BasePackages = "base-packages",
        OsConfig = "os-config",
        Hardening = "hardening",
    }
}

impl PhaseName {
    /// The phase the agent runs last: once it is done (or skipped) the node
    /// is initialized.
    pub const LAST: PhaseName = PhaseName::ALL[PhaseName::ALL.len() - 1];

    /// The phase named `name`, if it is one (`FromStr` says which are).
    pub fn parse(name: &str) -> Option<PhaseName> {
        name.parse().ok()
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
