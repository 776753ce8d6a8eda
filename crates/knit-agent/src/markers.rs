//! Marker files that pre-user-data drops to steer initialization (docs/spec.md §1.3).
//!
//! Precedence (documented in docs/agent.md):
//! 1. `/var/.skip-auto-fdisk` wins over everything about the data disk: no
//!    format, no mount, and `/var/.keep-container-data` is then ignored.
//! 2. `/var/.keep-container-data` applies only to a disk formatted in this
//!    run; a disk that already holds a filesystem (a snapshot) is mounted as
//!    is and its content wins.
//! 3. `/var/.skip-yum` skips all of base-packages, security fixes included,
//!    whatever `/var/.skip-security-fix` says.
//! 4. `/var/.skip-security-fix` skips only the security fixes.

use crate::host::Host;

pub const SKIP_AUTO_FDISK: &str = "/var/.skip-auto-fdisk";
pub const KEEP_CONTAINER_DATA: &str = "/var/.keep-container-data";
pub const SKIP_YUM: &str = "/var/.skip-yum";
pub const SKIP_SECURITY_FIX: &str = "/var/.skip-security-fix";

pub fn present(host: &Host, marker: &str) -> bool {
    host.path(marker).exists()
}
