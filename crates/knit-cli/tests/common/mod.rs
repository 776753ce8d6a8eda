//! What every end-to-end suite of the `knit` binary shares: where the
//! binaries are, a free loopback port, whether we run as root.

#![allow(dead_code)] // each suite uses its own part

use std::path::PathBuf;

pub fn knit() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_knit"))
}

/// A workspace binary installed beside `knit` (knit-agent, knit-local, …).
pub fn sibling(name: &str) -> PathBuf {
    let p = knit().with_file_name(name);
    assert!(
        p.is_file(),
        "{} is missing: build the workspace first (cargo build --workspace)",
        p.display()
    );
    p
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}
