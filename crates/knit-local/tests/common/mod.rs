//! A local cloud of its own per test: unique state directory, bridge and
//! subnet; `down` on drop (success, failure and panic alike).

#![allow(dead_code)]

use knit_local::{Cloud, Config, Instance, Template};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

pub const BIN: &str = env!("CARGO_BIN_EXE_knit-local");

pub struct TestCloud {
    pub cloud: Cloud,
    pub dir: PathBuf,
    pub bridge: String,
    pub subnet: String,
    _tmp: tempfile::TempDir,
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A bridge name and a /24 unique to this process and call: the subnet
/// starts from a per-call guess and skips any that a host route already uses.
pub fn unique() -> (String, String) {
    let n = SEQ.fetch_add(1, Ordering::SeqCst);
    let pid = std::process::id();
    let bridge = format!("kt{pid:x}{n}");
    let routes = Command::new("ip")
        .args(["-4", "route", "show", "table", "all"])
        .output()
        .expect("ip route");
    let routes = String::from_utf8_lossy(&routes.stdout).into_owned();
    const SPACE: u32 = 150 * 256;
    let start = (pid.wrapping_mul(64).wrapping_add(n)) % SPACE;
    let subnet = (0..SPACE)
        .map(|i| (start + i) % SPACE)
        .map(|c| format!("10.{}.{}.", 100 + c / 256, c % 256))
        .find(|prefix| !routes.contains(prefix.as_str()))
        .expect("no free 10.x.y.0/24 left");
    (bridge, format!("{subnet}0/24"))
}

impl TestCloud {
    pub fn new() -> TestCloud {
        ensure_node_image();
        let (bridge, subnet) = unique();
        let tmp = tempfile::Builder::new()
            .prefix("knit-local-test-")
            .tempdir()
            .expect("tempdir");
        let dir = tmp.path().join("state");
        let cloud = Cloud::open(Config {
            state_dir: dir.clone(),
            bridge: bridge.clone(),
            subnet: subnet.clone(),
            metadata_port: 80,
            helper: Some(PathBuf::from(BIN)),
        })
        .expect("open cloud (are we root?)");
        TestCloud {
            cloud,
            dir,
            bridge,
            subnet,
            _tmp: tmp,
        }
    }

    pub fn gateway(&self) -> String {
        let base = self.subnet.trim_end_matches(".0/24");
        format!("{base}.1")
    }

    pub fn create(&self, yaml: &str) -> Instance {
        self.cloud
            .create(&Template::parse(yaml).expect("template"))
            .expect("create")
    }

    /// `sh -c script` inside; panics with the output unless it succeeds.
    pub fn sh(&self, id: &str, script: &str) -> String {
        let out = self.sh_out(id, script);
        assert!(
            out.status.success(),
            "`{script}` in {id} failed ({}):\nstdout: {}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn sh_out(&self, id: &str, script: &str) -> Output {
        self.cloud
            .exec(id, &["/bin/sh".into(), "-c".into(), script.into()])
            .expect("exec")
    }

    /// The CLI against this cloud's state directory.
    pub fn cli(&self, args: &[&str]) -> Output {
        cli_env(&self.dir, &self.bridge, &self.subnet)
            .args(args)
            .output()
            .expect("run knit-local")
    }
}

/// Templates without `baseRoot` run on the node image: built here once if
/// scripts/test.sh did not (minutes; concurrent builds wait on its lock).
pub fn ensure_node_image() {
    static IMAGE: std::sync::Once = std::sync::Once::new();
    IMAGE.call_once(|| {
        let dir = knit_local::image::images_dir();
        if knit_local::image::current(&dir).unwrap().is_none() {
            knit_local::image::build(&dir, &mut |line| eprintln!("{line}"))
                .expect("knit image build");
        }
    });
}

pub fn cli_env(dir: &Path, bridge: &str, subnet: &str) -> Command {
    let mut c = Command::new(BIN);
    c.env("KNIT_LOCAL_STATE_DIR", dir)
        .env("KNIT_LOCAL_BRIDGE", bridge)
        .env("KNIT_LOCAL_SUBNET", subnet);
    c
}

impl Drop for TestCloud {
    fn drop(&mut self) {
        match self.cloud.down() {
            Ok(r) if r.errors.is_empty() => {}
            Ok(r) => eprintln!("down left errors: {:?}", r.errors),
            Err(e) => eprintln!("down failed: {e}"),
        }
    }
}

/// What a state directory may have left on the host; all must be empty.
#[derive(Debug, Default, PartialEq)]
pub struct Leftovers {
    pub loop_devices: Vec<String>,
    pub mounts: Vec<String>,
    pub links: Vec<String>,
    pub netns: Vec<String>,
    /// The links still guarded (elements of a guard table's port set).
    pub guard_ports: Vec<String>,
    pub processes: Vec<String>,
    pub state_dir_exists: bool,
}

pub fn leftovers(dir: &Path, links: &[String], netns: &[String]) -> Leftovers {
    let mut l = Leftovers::default();
    for (dev, file) in knit_local::loopdev::backed_under(dir) {
        l.loop_devices
            .push(format!("{} {}", dev.display(), file.display()));
    }
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for line in info.lines() {
        if line.contains(&*dir.to_string_lossy()) {
            l.mounts.push(line.to_string());
        }
    }
    for link in links {
        if Path::new("/sys/class/net").join(link).exists() {
            l.links.push(link.clone());
        }
    }
    let guarded = guarded_ports();
    for link in links {
        if guarded.contains(link) {
            l.guard_ports.push(link.clone());
        }
    }
    for ns in netns {
        if Path::new("/run/netns").join(ns).exists() {
            l.netns.push(ns.clone());
        }
    }
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmd) = std::fs::read(entry.path().join("cmdline")) {
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if cmd.contains(&*dir.to_string_lossy()) && !cmd.contains("cargo") {
                l.processes
                    .push(format!("{} {cmd}", entry.file_name().to_string_lossy()));
            }
        }
    }
    l.state_dir_exists = dir.exists();
    l
}

/// Every port guarded on the host, in any bridge's guard table.
pub fn guarded_ports() -> Vec<String> {
    knit_local::net::guard_tables()
        .iter()
        .filter_map(|t| t.strip_prefix("knit_guard_"))
        .flat_map(knit_local::net::guarded_ports)
        .map(|(port, _)| port)
        .collect()
}

/// [`leftovers`] without the block store's mount and loop device, which live
/// as long as the state directory, not an instance.
pub fn leftovers_but_store(dir: &Path) -> Leftovers {
    let store = dir.join("store").to_string_lossy().into_owned();
    let backing = format!(" {}", dir.join("store.img").display());
    let mut l = leftovers(dir, &[], &[]);
    l.mounts
        .retain(|m| m.split_whitespace().nth(4) != Some(store.as_str()));
    l.loop_devices.retain(|d| !d.ends_with(&backing));
    l
}

/// A small image directory (a base root): dash, env and their libraries,
/// `sh` and `bin` links, and `os_release` as its /etc/os-release.
pub fn build_image(dir: &Path, os_release: &str) {
    for bin in ["/usr/bin/dash", "/usr/bin/env"] {
        let out = Command::new("ldd").arg(bin).output().unwrap();
        let libs = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut files: Vec<String> = libs
            .split_whitespace()
            .filter(|w| w.starts_with('/'))
            .map(str::to_string)
            .collect();
        files.push(bin.to_string());
        for f in files {
            let to = dir.join(f.trim_start_matches('/'));
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(&f, &to).unwrap();
        }
    }
    std::os::unix::fs::symlink("dash", dir.join("usr/bin/sh")).unwrap();
    std::os::unix::fs::symlink("usr/bin", dir.join("bin")).unwrap();
    std::fs::create_dir_all(dir.join("etc")).unwrap();
    std::fs::write(dir.join("etc/os-release"), os_release).unwrap();
}
