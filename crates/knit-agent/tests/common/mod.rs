//! A node tree for the agent's `--root`, with real loop-device disks exposed
//! under cloud names. Everything it creates is undone on drop, including
//! after a failed assertion.

#![allow(dead_code)] // each test file uses a different part

use std::fs;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub struct Node {
    pub dir: tempfile::TempDir,
    loops: Vec<String>,
    backing: Vec<PathBuf>,
}

fn sh(program: &str, args: &[&str]) -> Output {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

impl Node {
    pub fn new() -> Node {
        let dir = tempfile::Builder::new()
            .prefix("knit-agent-test-")
            .tempdir()
            .expect("tempdir");
        for d in ["dev", "etc", "var/lib", "var/log"] {
            fs::create_dir_all(dir.path().join(d)).expect("mkdir");
        }
        Node {
            dir,
            loops: Vec::new(),
            backing: Vec::new(),
        }
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    pub fn path(&self, abs: &str) -> PathBuf {
        self.root().join(abs.trim_start_matches('/'))
    }

    /// A sparse file on a loop device, exposed as `<root>/dev/<name>`.
    /// Returns the loop device path.
    pub fn add_disk(&mut self, name: &str, size_mb: u64) -> String {
        let backing = std::env::temp_dir().join(format!(
            "knit-agent-test-{}-{name}-{}.img",
            std::process::id(),
            self.root()
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default()
        ));
        let file = fs::File::create(&backing).expect("create backing file");
        file.set_len(size_mb << 20).expect("size backing file");
        self.backing.push(backing.clone());
        let out = sh(
            "losetup",
            &["--find", "--show", "--partscan", &backing.to_string_lossy()],
        );
        let loop_dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
        self.loops.push(loop_dev.clone());
        let meta = fs::metadata(&loop_dev).expect("stat loop device");
        use std::os::unix::fs::MetadataExt;
        let rdev = meta.rdev();
        assert!(meta.file_type().is_block_device());
        let node = self.path(&format!("/dev/{name}"));
        nix::sys::stat::mknod(
            &node,
            nix::sys::stat::SFlag::S_IFBLK,
            nix::sys::stat::Mode::from_bits_truncate(0o660),
            rdev,
        )
        .expect("mknod");
        loop_dev
    }

    /// Detaches `loop_dev` and attaches `backing` to the same loop device:
    /// another disk with the same `major:minor`, as after a detach/attach.
    pub fn replace_disk_backing(&mut self, loop_dev: &str, backing: &Path) {
        sh("losetup", &["-d", loop_dev]);
        // The kernel may take a moment to release the device.
        let mut tries = 0;
        loop {
            let out = Command::new("losetup")
                .args([loop_dev, &backing.to_string_lossy()])
                .output()
                .expect("losetup");
            if out.status.success() {
                break;
            }
            tries += 1;
            assert!(
                tries < 50,
                "cannot attach {} to {loop_dev}: {}",
                backing.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    pub fn write_config(&self, yaml: &str) -> PathBuf {
        let path = self.path("/etc/knit/node.yaml");
        fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        fs::write(&path, yaml).expect("write config");
        path
    }

    pub fn agent(&self, args: &[&str]) -> Output {
        self.agent_cmd(args).output().expect("run knit-agent")
    }

    pub fn agent_cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_knit-agent"));
        cmd.arg("--root").arg(self.root()).args(args);
        cmd
    }

    pub fn log(&self) -> String {
        fs::read_to_string(self.path("/var/log/knit-deploy.log")).unwrap_or_default()
    }

    pub fn journal(&self) -> serde_json::Value {
        let text = fs::read_to_string(self.path("/var/lib/knit/journal.json")).expect("journal");
        serde_json::from_str(&text).expect("journal json")
    }

    /// Mount points under this node's tree, deepest first.
    pub fn mounts(&self) -> Vec<String> {
        let root = self.root().to_string_lossy().into_owned();
        let text = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut points: Vec<String> = text
            .lines()
            .filter_map(|l| l.split_whitespace().nth(4).map(str::to_string))
            .filter(|p| p.starts_with(&root))
            .collect();
        points.reverse();
        points
    }

    pub fn mounted_at(&self, abs: &str) -> bool {
        let want = self.path(abs).to_string_lossy().into_owned();
        self.mounts().contains(&want)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        for point in self.mounts() {
            let _ = nix::mount::umount2(point.as_str(), nix::mount::MntFlags::MNT_DETACH);
        }
        for dev in &self.loops {
            let _ = Command::new("losetup").args(["-d", dev]).output();
        }
        for file in &self.backing {
            let _ = fs::remove_file(file);
        }
    }
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Config for data-disk tests: everything after data-disk is irrelevant.
pub fn disk_config(extra: &str) -> String {
    format!("apiVersion: knit.dev/v1alpha1\nkind: NodeConfig\nnode: {{region: test, instanceId: i-1, ip: 10.0.0.5}}\ndataDisk:\n  enabled: true\n{extra}")
}
