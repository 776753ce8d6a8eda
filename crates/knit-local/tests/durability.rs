//! Records survive a host crash: what `state::write_durable` (every record
//! of the state directory) returned from is on disk. The "crash" is a copy
//! of an ext4's backing file taken while it is still mounted, before the
//! kernel wrote anything back on its own (`commit=600`): the copy holds
//! exactly what reached the disk, and mounting it replays the journal as
//! a reboot would. Run as root.

use knit_local::state::{self, StateDir};
use knit_local::NetworkRecord;
use std::path::{Path, PathBuf};
use std::process::Command;

fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// An ext4 on a loop device over a sparse file of ours, mounted on a
/// directory of ours; unmounted and detached on drop (also on panic).
struct Ext4 {
    mount: PathBuf,
    dev: String,
}

impl Ext4 {
    fn mount(image: &Path, mount: &Path, format: bool) -> Ext4 {
        if format {
            std::fs::File::create(image)
                .unwrap()
                .set_len(64 << 20)
                .unwrap();
            run("mkfs.ext4", &["-q", "-F", image.to_str().unwrap()]);
        }
        std::fs::create_dir_all(mount).unwrap();
        let dev = run("losetup", &["-f", "--show", image.to_str().unwrap()]);
        let fs = Ext4 {
            mount: mount.to_path_buf(),
            dev,
        };
        // Nothing is written back on a timer during the test.
        run(
            "mount",
            &["-o", "commit=600", &fs.dev, mount.to_str().unwrap()],
        );
        fs
    }
}

impl Drop for Ext4 {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mount).status();
        let _ = Command::new("losetup").args(["-d", &self.dev]).status();
    }
}

#[test]
fn a_record_written_is_on_disk_when_the_write_returns() {
    let tmp = tempfile::Builder::new()
        .prefix("knit-local-durable-")
        .tempdir()
        .unwrap();
    let image = tmp.path().join("fs.img");
    let crashed = tmp.path().join("crashed.img");
    let record = NetworkRecord {
        bridge: "kb-durable".into(),
        subnet: "10.99.0.0/24".into(),
        gateway: "10.99.0.1".into(),
        metadata_port: 80,
        metadata: None,
        overflow: Vec::new(),
    };
    {
        let fs = Ext4::mount(&image, &tmp.path().join("mnt"), true);
        let root = fs.mount.join("state");
        let st = StateDir::open(&root).unwrap();
        // Everything so far is on disk: only the writes below are tested.
        run("sync", &["-f", root.to_str().unwrap()]);
        st.put_network(&record).unwrap();
        state::write_durable(&root.join("instances/blob"), &[7u8; 100_000]).unwrap();
        // The power cut: what the disk holds now, the fs still mounted.
        run(
            "cp",
            &[
                "--sparse=always",
                image.to_str().unwrap(),
                crashed.to_str().unwrap(),
            ],
        );
    }
    let after = Ext4::mount(&crashed, &tmp.path().join("after"), false);
    let st = StateDir::open(&after.mount.join("state")).unwrap();
    assert_eq!(
        st.network().unwrap(),
        Some(record),
        "network.json lost in the crash"
    );
    let blob = std::fs::read(after.mount.join("state/instances/blob")).unwrap_or_default();
    assert_eq!(blob.len(), 100_000, "a durable write lost in the crash");
    assert!(blob.iter().all(|b| *b == 7));
    // No temporary file is left beside the records.
    let names: Vec<String> = std::fs::read_dir(after.mount.join("state"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!names.iter().any(|n| n.contains("tmp")), "{names:?}");
}
