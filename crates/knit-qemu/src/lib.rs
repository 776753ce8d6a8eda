//! knit's QEMU machines: each instance is a QEMU VM booted from the node OS
//! image (`knit image build`), with qcow2 disks (system overlay on the
//! image's disk; data disks as virtio-blk or NVMe), a tap on a bridge, the
//! user data through cloud-init's NoCloud seed, control through QMP and
//! commands through qemu-guest-agent (no SSH keys). KVM when `/dev/kvm`
//! runs guests, TCG otherwise. See docs/providers.md.
//!
//! Blocking API (processes, sockets, files): callers in async code run it
//! on a blocking pool. Needs root.

pub mod agent;
pub mod base;
pub mod confine;
pub mod error;
pub mod run;
pub mod state;
mod vm;

pub use agent::ExecOutput;
pub use error::{QemuError, Result};
pub use state::{DiskRecord, Interface, SnapshotRecord, VmRecord, VmState};
pub use vm::{Accel, Config, DiskSpec, Machines, Vm, VmTemplate};

pub(crate) fn require_root() -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(QemuError::NotRoot);
    }
    Ok(())
}
