//! The journal: what each phase did, written atomically after every change
//! so that an agent killed at any point can be rerun and finish.

use crate::error::{AgentError, Result};
use crate::files::write_atomic;
use crate::host::Host;
use knit_api::{ErrorCode, PhaseName, PhaseOutcome};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

pub const JOURNAL_FILE: &str = "/var/lib/knit/journal.json";
const JOURNAL_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PhaseRecord {
    pub outcome: PhaseOutcome,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<ErrorCode>,
    pub started_at_ms: u64,
    #[serde(default)]
    pub duration_ms: u64,
    /// Time spent in external commands during the phase.
    #[serde(default)]
    pub command_ms: u64,
}

/// The data-disk phase's own progress, so a rerun never formats a disk whose
/// formatting completed, and never formats one it did not decide to format.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DataDiskProgress {
    /// The device chosen, node-absolute (e.g. `/dev/nvme1n1`).
    pub device: Option<String>,
    /// `major:minor` of the chosen device: identifies it across renames.
    pub dev_id: Option<String>,
    /// Serial, WWID, by-id link and size of the chosen device: a format is
    /// resumed only on the disk that has them (`major:minor` is reused by
    /// whatever disk is attached next).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<crate::disk::DiskIdentity>,
    pub format_started: bool,
    pub format_completed: bool,
    pub fs_uuid: Option<String>,
    /// The disk was formatted by this agent (not mounted as found).
    pub formatted_here: bool,
    /// `/var/.keep-container-data`: the copy onto the disk finished.
    pub copy_completed: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Journal {
    pub version: u32,
    #[serde(default)]
    pub node_name: Option<String>,
    #[serde(default)]
    pub phases: BTreeMap<PhaseName, PhaseRecord>,
    #[serde(default)]
    pub data_disk: DataDiskProgress,
    /// The hardening profile applied at first run; it cannot change later.
    #[serde(default)]
    pub hardening_profile: Option<String>,
    /// Kubernetes components: whether the cache was used, and bytes downloaded.
    #[serde(default)]
    pub package_cache_hit: Option<bool>,
    #[serde(default)]
    pub package_bytes_downloaded: u64,
}

impl Default for Journal {
    fn default() -> Self {
        Journal {
            version: JOURNAL_VERSION,
            node_name: None,
            phases: BTreeMap::new(),
            data_disk: DataDiskProgress::default(),
            hardening_profile: None,
            package_cache_hit: None,
            package_bytes_downloaded: 0,
        }
    }
}

impl Journal {
    pub fn path(host: &Host) -> PathBuf {
        host.path(JOURNAL_FILE)
    }

    /// Loads the journal; a missing one is empty, a corrupt one is an error
    /// that says how to recover (the agent never guesses past it).
    pub fn load(host: &Host) -> Result<Journal> {
        let path = Journal::path(host);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Journal::default()),
            Err(e) => {
                return Err(AgentError::new(
                    ErrorCode::FailJournal,
                    format!("cannot read journal {}: {e}", path.display()),
                ))
            }
        };
        let journal: Journal = serde_json::from_str(&text).map_err(|e| {
            AgentError::new(
                ErrorCode::FailJournal,
                format!(
                    "journal {} is corrupt ({e}); inspect it, then run `knit-agent reset` to start over \
                     (a data disk that already holds a filesystem is mounted, never reformatted)",
                    path.display()
                ),
            )
        })?;
        if journal.version != JOURNAL_VERSION {
            return Err(AgentError::new(
                ErrorCode::FailJournal,
                format!(
                    "journal {} has version {}, this agent reads version {JOURNAL_VERSION}",
                    path.display(),
                    journal.version
                ),
            ));
        }
        Ok(journal)
    }

    pub fn save(&self, host: &Host) -> Result<()> {
        let text = serde_json::to_vec_pretty(self).map_err(|e| {
            AgentError::new(
                ErrorCode::FailJournal,
                format!("cannot encode journal: {e}"),
            )
        })?;
        write_atomic(&Journal::path(host), &text, 0o600)
            .map_err(|e| AgentError::new(ErrorCode::FailJournal, e.message))
    }

    pub fn is_done(&self, phase: PhaseName) -> bool {
        self.phases
            .get(&phase)
            .is_some_and(|r| matches!(r.outcome, PhaseOutcome::Done | PhaseOutcome::Skipped))
    }
}
