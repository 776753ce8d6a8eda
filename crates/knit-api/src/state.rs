//! Every state knit records and shows as a word: an instance's lifecycle, an
//! intent's action and status, a node's Ready status, an event's type, a
//! snapshot build's status, a data disk's interface, a repair action (and
//! the phase outcome of [`crate::events`]; the phase names of
//! [`crate::phase`] are declared with the same `word_enum!`, its error
//! codes parse from their stored words here).
//!
//! Each word is written once here: the serde name is the one on the wire
//! and the one stored in the control plane's database, so a value written
//! by an older knit reads back as the same variant. Never rename one.

use crate::error::FieldError;
use crate::events::PhaseOutcome;
use crate::phase::ErrorCode;
use crate::word::{unknown_word, word_enum};
use serde::Deserialize;
use std::fmt;
use std::str::FromStr;

word_enum! {
    /// An instance's lifecycle as the control plane sees it.
    InstanceState, field = "instance.state" {
        /// Intent written, not yet sent to the provider.
        Pending = "Pending",
        /// Provider call in flight; on restart the provider is asked whether
        /// it exists. Also an added instance being re-imaged.
        Creating = "Creating",
        Running = "Running",
        /// Creation failed more times than allowed, or its node never
        /// joined; kept for inspection.
        Failed = "Failed",
        Deleting = "Deleting",
        /// Removed from its pool with the instance kept (`--release=false`,
        /// or an attach undone).
        Detached = "Detached",
    }
}

impl InstanceState {
    /// Whether the instance counts in its pool: not being deleted and not
    /// detached from it.
    pub fn is_member(self) -> bool {
        matches!(
            self,
            InstanceState::Pending
                | InstanceState::Creating
                | InstanceState::Running
                | InstanceState::Failed
        )
    }
}

word_enum! {
    /// What an intent asks the reconciler to do with an instance.
    IntentAction, field = "intent.action" {
        Create = "create",
        Delete = "delete",
        /// An existing machine added to a pool (attach).
        Attach = "attach",
    }
}

word_enum! {
    /// An intent's status: pending until the reconciler ends it.
    IntentStatus, field = "intent.status" {
        Pending = "pending",
        Done = "done",
        Failed = "failed",
        /// Superseded (a delete of a not yet created instance) or its
        /// instance or pool went away.
        Cancelled = "cancelled",
    }
}

word_enum! {
    /// A node's Ready condition as the cluster reports it.
    NodeStatus, field = "node.status" {
        Ready = "Ready",
        NotReady = "NotReady",
        /// The node stopped reporting (its kubelet's lease expired).
        Unknown = "Unknown",
    }
}

word_enum! {
    /// An event's type, as in Kubernetes.
    EventType, field = "event.type" {
        Normal = "Normal",
        Warning = "Warning",
    }
}

word_enum! {
    /// A snapshot build's status.
    BuildStatus, field = "build.status" {
        Running = "Running",
        Succeeded = "Succeeded",
        Failed = "Failed",
    }
}

word_enum! {
    /// A data disk's interface (`spec.dataDisks[].interface`).
    DiskInterface, field = "dataDisks.interface" {
        Virtio = "virtio",
        Nvme = "nvme",
    }
}

word_enum! {
    /// A node repair action (`spec.repair.actions[]`), and the one a
    /// repair episode took last.
    RepairAction, field = "repair.action" {
        RestartServices = "restart-services",
        Reboot = "reboot",
        Replace = "replace",
    }
}

word_enum! {
    /// Where the drain of a node being removed stands.
    DrainState, field = "drain.state" {
        /// Cordoned; evicting its pods or waiting for them to go.
        Draining = "Draining",
        /// An eviction was refused (a PodDisruptionBudget): retried with
        /// backoff, the removal pending.
        Blocked = "Blocked",
        /// The timeout passed with `onTimeout: force`: the pods left are
        /// being deleted.
        Forcing = "Forcing",
        /// No pod that blocks is left: the machine may go.
        Drained = "Drained",
    }
}

word_enum! {
    /// What an API token may do (`knit token create --role`): each role
    /// may do everything the one before it may. The order is the
    /// declaration order (viewer < operator < admin).
    TokenRole, field = "role" {
        /// Reads everything: the API's lists and documents, `/metrics`,
        /// the console.
        Viewer = "viewer",
        /// Also changes pools and the cluster: scale, attach, snapshots,
        /// rollouts, node removal.
        Operator = "operator",
        /// Also runs `knit exec`, reads node logs, manages tokens and
        /// issues client certificates.
        Admin = "admin",
    }
}

impl PhaseOutcome {
    /// Every outcome, in the order a phase goes through them.
    pub const ALL: &'static [PhaseOutcome] = &[
        PhaseOutcome::Started,
        PhaseOutcome::Done,
        PhaseOutcome::Skipped,
        PhaseOutcome::Failed,
    ];

    /// The word on the wire (its serde name) and in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            PhaseOutcome::Started => "started",
            PhaseOutcome::Done => "done",
            PhaseOutcome::Skipped => "skipped",
            PhaseOutcome::Failed => "failed",
        }
    }

    /// Whether the phase ended without failing.
    pub fn is_success(self) -> bool {
        matches!(self, PhaseOutcome::Done | PhaseOutcome::Skipped)
    }
}

impl fmt::Display for PhaseOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PhaseOutcome {
    type Err = FieldError;

    fn from_str(word: &str) -> Result<Self, FieldError> {
        PhaseOutcome::ALL
            .iter()
            .copied()
            .find(|o| o.as_str() == word)
            .ok_or_else(|| {
                let allowed: Vec<&str> = PhaseOutcome::ALL.iter().map(|o| o.as_str()).collect();
                unknown_word("phase.outcome", word, &allowed)
            })
    }
}

/// An agent's error code as stored: its serde name, the one word per code.
impl FromStr for ErrorCode {
    type Err = FieldError;

    fn from_str(word: &str) -> Result<Self, FieldError> {
        use serde::de::IntoDeserializer;
        let de: serde::de::value::StrDeserializer<'_, serde::de::value::Error> =
            word.into_deserializer();
        ErrorCode::deserialize(de).map_err(|_| FieldError {
            field: "phase.errorCode".to_string(),
            value: format!("{word:?}"),
            rule: "must be an error code the agent reports (FailConfig, FailJoin, ...)".to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::phase::PhaseName;
    use serde::Serialize;

    /// Each variant's serde name is the word given, `as_str` agrees, and
    /// the word parses back to it.
    fn pins<T>(all: &[T], words: &[&str])
    where
        T: Copy + fmt::Debug + PartialEq + Serialize + FromStr + fmt::Display,
        for<'de> T: Deserialize<'de>,
        <T as FromStr>::Err: fmt::Debug,
    {
        assert_eq!(all.len(), words.len(), "a variant without a pinned word");
        for (v, word) in all.iter().zip(words) {
            assert_eq!(serde_json::to_value(v).unwrap(), serde_json::json!(word));
            assert_eq!(
                serde_json::from_value::<T>(serde_json::json!(word)).unwrap(),
                *v
            );
            assert_eq!(v.to_string(), *word);
            assert_eq!(word.parse::<T>().unwrap(), *v);
        }
    }

    #[test]
    fn serde_names_are_pinned() {
        pins(
            InstanceState::ALL,
            &[
                "Pending", "Creating", "Running", "Failed", "Deleting", "Detached",
            ],
        );
        pins(IntentAction::ALL, &["create", "delete", "attach"]);
        pins(
            IntentStatus::ALL,
            &["pending", "done", "failed", "cancelled"],
        );
        pins(NodeStatus::ALL, &["Ready", "NotReady", "Unknown"]);
        pins(EventType::ALL, &["Normal", "Warning"]);
        pins(BuildStatus::ALL, &["Running", "Succeeded", "Failed"]);
        pins(DiskInterface::ALL, &["virtio", "nvme"]);
        pins(
            DrainState::ALL,
            &["Draining", "Blocked", "Forcing", "Drained"],
        );
        pins(PhaseOutcome::ALL, &["started", "done", "skipped", "failed"]);
        pins(
            RepairAction::ALL,
            &["restart-services", "reboot", "replace"],
        );
        pins(
            PhaseName::ALL,
            &[
                "time-sync",
                "node-identity",
                "data-disk",
                "os-config-initial",
                "kubernetes-components",
                "optional-components",
                "join",
                "base-packages",
                "os-config",
                "hardening",
            ],
        );
        for code in [
            ErrorCode::FailConfig,
            ErrorCode::FailJoin,
            ErrorCode::FailCommand,
        ] {
            assert_eq!(code.as_str().parse::<ErrorCode>().unwrap(), code);
        }
    }

    #[test]
    fn an_unknown_word_names_field_value_and_rule() {
        let err = "running".parse::<InstanceState>().unwrap_err();
        assert_eq!(err.field, "instance.state");
        assert_eq!(err.value, "\"running\"");
        assert_eq!(
            err.rule,
            "must be one of Pending, Creating, Running, Failed, Deleting, Detached"
        );
        let err = "ok".parse::<PhaseOutcome>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "phase.outcome: value \"ok\" must be one of started, done, skipped, failed"
        );
        let err = "Join".parse::<PhaseName>().unwrap_err();
        assert_eq!(err.field, "phase.name");
        assert!(err
            .rule
            .starts_with("must be one of time-sync, node-identity"));
        let err = "FailNothing".parse::<ErrorCode>().unwrap_err();
        assert_eq!(err.field, "phase.errorCode");
        assert_eq!(err.value, "\"FailNothing\"");
    }

    #[test]
    fn members_of_a_pool() {
        let members: Vec<InstanceState> = InstanceState::ALL
            .iter()
            .copied()
            .filter(|s| s.is_member())
            .collect();
        assert_eq!(
            members,
            vec![
                InstanceState::Pending,
                InstanceState::Creating,
                InstanceState::Running,
                InstanceState::Failed
            ]
        );
    }
}
