//! Test support: a bridge and subnet of the test's own, a state directory,
//! the node OS image (built once by `knit image build`; built here when
//! missing), and a clean-up that runs on success, failure and panic.

#![allow(dead_code)]

use knit_qemu::{Config, Machines};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

static SEQ: AtomicU32 = AtomicU32::new(0);

/// Why the VM tests cannot run here, if they cannot.
pub fn skip_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root (taps, bridges and QEMU need it)".into());
    }
    if knit_qemu::run::find_program("qemu-system-x86_64").is_none() {
        return Some(
            "qemu-system-x86_64 is not installed (scripts/setup.sh installs qemu-system-x86)"
                .into(),
        );
    }
    None
}

#[macro_export]
macro_rules! skip_unless_able {
    () => {
        if let Some(why) = common::skip_reason() {
            return knit_test_support::missing(why);
        }
    };
}

/// The node OS image directory (`knit image build`'s `debian-12`).
pub fn image() -> PathBuf {
    let dir = knit_local::image::images_dir();
    if let Some(built) = knit_local::image::current(&dir).expect("read the images directory") {
        return built.dir;
    }
    eprintln!("building the node OS image into {} (once)", dir.display());
    knit_local::image::build(&dir, &mut |l| eprintln!("{l}"))
        .expect("knit image build")
        .dir
}

pub struct Env {
    pub machines: Machines,
    pub bridge: String,
    pub subnet: String,
    pub gateway: std::net::Ipv4Addr,
    pub state: tempfile::TempDir,
}

impl Env {
    pub fn new() -> Env {
        let n = SEQ.fetch_add(1, Ordering::SeqCst);
        let pid = std::process::id();
        let bridge = format!("kqt{}{n}", pid % 100_000);
        // A /24 of 10.232.0.0/13 chosen by pid and sequence, skipping any
        // the host already routes.
        let (subnet, parsed) = (0..64)
            .map(|i| {
                let k = (pid + n * 7 + i * 13) % 2048;
                format!("10.{}.{}.0/24", 232 + k / 256, k % 256)
            })
            .find_map(|s| {
                knit_local::net::check_network(&bridge, &s)
                    .ok()
                    .map(|p| (s, p))
            })
            .expect("a free /24 for the test bridge");
        let gateway = parsed.host(1).unwrap();
        knit_local::net::create_bridge(&bridge, gateway, parsed.prefix)
            .expect("create the test bridge");
        let state = tempfile::Builder::new()
            .prefix("knit-qemu-test")
            .tempdir_in("/var/tmp")
            .unwrap();
        let machines = Machines::open(Config {
            state_dir: state.path().join("qemu"),
            bridge: bridge.clone(),
            subnet: subnet.clone(),
            stop_timeout: Duration::from_secs(180),
            ..Config::default()
        })
        .expect("open the machines");
        Env {
            machines,
            bridge,
            subnet,
            gateway,
            state,
        }
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Err(e) = self.machines.down() {
            eprintln!("down: {e}");
        }
        let _ = knit_local::net::delete_link(&self.bridge);
        // The VMs' guards share one table per bridge, which outlives them.
        let _ = knit_local::net::guard_table_del(&self.bridge);
    }
}

pub fn argv(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}
