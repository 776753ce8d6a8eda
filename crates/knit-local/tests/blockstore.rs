//! The copy-on-write block store: snapshots and disks from them are reflink
//! clones (same bytes, shared extents, no new space), writes to a clone
//! never reach the snapshot, opening again is idempotent, `down` removes the
//! store's mount and loop device, and a host without room or without
//! mkfs.xfs gets a clear error. Run as root.

mod common;

use common::{cli_env, leftovers, unique, TestCloud};
use knit_local::blockstore::{BlockStore, StoreKind};
use knit_local::{Cloud, Config, DiskInterface, DiskSpec, Quantity};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

fn spec(name: &str, size: Option<&str>, snapshot: Option<&str>) -> DiskSpec {
    DiskSpec {
        name: name.into(),
        size: size.map(|s| Quantity::Text(s.into())),
        interface: DiskInterface::Virtio,
        snapshot: snapshot.map(String::from),
        format: None,
    }
}

fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    assert!(out.status.success(), "sha256sum {}", path.display());
    String::from_utf8_lossy(&out.stdout)[..64].to_string()
}

/// Bytes free in the filesystem holding `path`.
fn free_bytes(path: &Path) -> u64 {
    let s = nix::sys::statvfs::statvfs(path).unwrap();
    s.blocks_available() as u64 * s.fragment_size() as u64
}

/// Extents `filefrag -v` marks shared (FIEMAP_EXTENT_SHARED).
fn shared_extents(path: &Path) -> usize {
    let out = Command::new("filefrag")
        .arg("-v")
        .arg(path)
        .output()
        .unwrap();
    assert!(out.status.success(), "filefrag -v {}", path.display());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("shared"))
        .count()
}

fn fstype(dir: &Path) -> String {
    let out = Command::new("findmnt")
        .args(["-n", "-o", "FSTYPE", "--target"])
        .arg(dir)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn a_disk_from_a_snapshot_is_a_reflink_clone() {
    let t = TestCloud::new();
    let store = BlockStore::new(&t.dir);
    let disk = t
        .cloud
        .disk_create(&spec("src", Some("256Mi"), None))
        .unwrap();
    let rec = store
        .record()
        .unwrap()
        .expect("the first disk makes the store");
    match rec.kind {
        // The test's temporary directory is on ext4 on this host's CI.
        StoreKind::XfsLoop => {
            assert!(store.mounted());
            assert_eq!(fstype(&store.dir()), "xfs");
        }
        StoreKind::Native => assert!(!store.mounted()),
    }
    // The record's link points into the store.
    let link = t.dir.join("disks").join(&disk.id).join("disk.img");
    let file = std::fs::read_link(&link).unwrap();
    assert!(file.starts_with(store.dir()), "{}", file.display());

    // 32 MiB of random bytes, written from the host as an instance would.
    let mut data = vec![0u8; 32 << 20];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut data)
        .unwrap();
    {
        let mut f = std::fs::File::options().write(true).open(&link).unwrap();
        f.seek(SeekFrom::Start(16 << 20)).unwrap();
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
    }
    let before = sha256(&link);

    let free0 = free_bytes(&store.dir());
    let snap = t.cloud.snapshot_create(&disk.id).unwrap();
    assert_eq!(snap.method, "reflink");
    let clone = t
        .cloud
        .disk_create(&spec("clone", None, Some(&snap.id)))
        .unwrap();
    assert_eq!(clone.size, 256 << 20);
    let snap_file = t.dir.join("snapshots").join(&snap.id).join("snapshot.img");
    let clone_file = t.dir.join("disks").join(&clone.id).join("disk.img");
    assert_eq!(sha256(&snap_file), before);
    assert_eq!(sha256(&clone_file), before);
    // Two more 32 MiB files, yet (almost) no new space: the blocks are shared.
    let used = free0.saturating_sub(free_bytes(&store.dir()));
    assert!(used < 8 << 20, "snapshot + clone took {used} bytes");
    assert!(
        shared_extents(&snap_file) > 0,
        "snapshot has no shared extent"
    );
    assert!(
        shared_extents(&clone_file) > 0,
        "clone has no shared extent"
    );

    // Writing the clone leaves the snapshot (and the source disk) as they were.
    {
        let mut f = std::fs::File::options()
            .write(true)
            .open(&clone_file)
            .unwrap();
        f.seek(SeekFrom::Start(20 << 20)).unwrap();
        f.write_all(&[0x5a; 1 << 20]).unwrap();
        f.sync_all().unwrap();
    }
    assert_ne!(sha256(&clone_file), before);
    assert_eq!(sha256(&snap_file), before);
    assert_eq!(sha256(&link), before);

    // Deleting removes the files in the store, not only the records.
    let clone_target = std::fs::read_link(&clone_file).unwrap();
    let snap_target = std::fs::read_link(&snap_file).unwrap();
    t.cloud.disk_delete(&clone.id).unwrap();
    t.cloud.snapshot_delete(&snap.id).unwrap();
    assert!(!clone_target.exists() && !snap_target.exists());
}

/// Kills (SIGKILL) and reaps the child when dropped, also on panic.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A snapshot whose maker is killed before the clone (as the knit server
/// can be while the provider call runs): its record already carries the
/// caller's name, so the caller finds it by name without its id, and
/// deleting it leaves nothing in the store.
#[test]
fn a_snapshot_cut_off_before_its_clone_carries_its_name_and_deletes_clean() {
    use std::io::BufRead;
    let t = TestCloud::new();
    let disk = t
        .cloud
        .disk_create(&spec("src", Some("64Mi"), None))
        .unwrap();
    let mut child = KillOnDrop(
        cli_env(&t.dir, &t.bridge, &t.subnet)
            .env("KNIT_LOCAL_PAUSE_AFTER", "snapshot-record")
            .args(["snapshot", "create", &disk.id, "--name", "build-cut"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stderr = child.0.stderr.take().unwrap();
    let mut seen = String::new();
    for line in std::io::BufReader::new(stderr).lines() {
        let line = line.unwrap();
        seen.push_str(&line);
        seen.push('\n');
        if line.contains("paused after snapshot-record") {
            break;
        }
    }
    assert!(seen.contains("paused after snapshot-record"), "{seen}");
    drop(child);

    let named: Vec<_> = t
        .cloud
        .snapshots()
        .unwrap()
        .into_iter()
        .filter(|s| s.name.as_deref() == Some("build-cut"))
        .collect();
    assert_eq!(named.len(), 1, "{named:?}");
    assert_eq!(named[0].method, "pending");
    assert_eq!(named[0].source_disk, disk.id);
    t.cloud.snapshot_delete(&named[0].id).unwrap();
    assert!(t.cloud.snapshots().unwrap().is_empty());
    let store = BlockStore::new(&t.dir);
    let left: Vec<_> = std::fs::read_dir(store.dir().join("snapshots"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");

    // A snapshot made whole keeps its name.
    let whole = t
        .cloud
        .snapshot_create_named(&disk.id, Some("build-whole"))
        .unwrap();
    assert_eq!(whole.name.as_deref(), Some("build-whole"));
    assert_eq!(
        t.cloud.snapshots().unwrap()[0].name.as_deref(),
        Some("build-whole")
    );
    t.cloud.snapshot_delete(&whole.id).unwrap();
}

#[test]
fn open_is_idempotent_and_down_removes_the_store() {
    let t = TestCloud::new();
    let store = BlockStore::new(&t.dir);
    assert!(store.record().unwrap().is_none(), "made lazily");
    t.cloud.disk_create(&spec("a", Some("64Mi"), None)).unwrap();
    let kind = store.record().unwrap().unwrap().kind;
    let count = || {
        let l = leftovers(&t.dir, &[], &[]);
        (l.mounts.len(), l.loop_devices.len())
    };
    let made = count();
    if kind == StoreKind::XfsLoop {
        assert_eq!(made, (1, 1), "one mount, one loop device");
    }
    // A second provider on the same state directory (the CLI next to the
    // server) mounts nothing more.
    let again = Cloud::open(Config {
        state_dir: t.dir.clone(),
        bridge: t.bridge.clone(),
        subnet: t.subnet.clone(),
        metadata_port: 80,
        helper: Some(PathBuf::from(common::BIN)),
    })
    .unwrap();
    again.disk_create(&spec("b", Some("64Mi"), None)).unwrap();
    assert_eq!(count(), made);
    let out = t.cli(&["disk", "list"]);
    assert!(out.status.success());
    assert_eq!(count(), made);

    let report = t.cloud.down().unwrap();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(leftovers(&t.dir, &[], &[]), common::Leftovers::default());
}

/// Unmounts on drop (success, failure, panic).
struct Tmpfs(PathBuf);
impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

#[test]
fn too_little_room_or_no_mkfs_xfs_is_a_clear_error() {
    // A 1 GiB tmpfs (no reflink, under the 2 GiB rule) as the state
    // directory's filesystem: memory, not a host disk.
    let tmp = tempfile::Builder::new()
        .prefix("knit-local-store-")
        .tempdir()
        .unwrap();
    let small = Tmpfs(tmp.path().join("small"));
    std::fs::create_dir(&small.0).unwrap();
    nix::mount::mount(
        Some("tmpfs"),
        &small.0,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("size=1g,mode=0700"),
    )
    .unwrap();
    let dir = small.0.join("state");
    let (bridge, subnet) = unique();
    let out = cli_env(&dir, &bridge, &subnet)
        .args(["disk", "create", "--name", "x", "--size", "64Mi"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("error[LocalInvalid]")
            && err.contains(&format!("stateDir: value \"{}\"", dir.display()))
            && err.contains("needs at least 2 GiB free"),
        "{err}"
    );
    assert!(!dir.join("store.img").exists());
    assert!(knit_local::loopdev::backed_under(&dir).is_empty());
    let down = cli_env(&dir, &bridge, &subnet)
        .arg("down")
        .output()
        .unwrap();
    assert!(down.status.success());
    drop(small);

    // No mkfs.xfs on PATH (it lives in sbin): the tool and the reason named.
    let dir = tmp.path().join("state");
    let out = cli_env(&dir, &bridge, &subnet)
        .env("PATH", "/usr/bin:/bin")
        .args(["disk", "create", "--name", "x", "--size", "64Mi"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let native = BlockStore::new(&dir)
        .record()
        .unwrap()
        .is_some_and(|r| r.kind == StoreKind::Native);
    if !native {
        assert!(!out.status.success());
        assert!(
            err.contains("error[LocalCommand]")
                && err.contains("mkfs.xfs (xfsprogs) is not installed")
                && err.contains(&*dir.to_string_lossy()),
            "{err}"
        );
    }
    let down = cli_env(&dir, &bridge, &subnet)
        .arg("down")
        .output()
        .unwrap();
    assert!(down.status.success());
    assert_eq!(leftovers(&dir, &[], &[]), common::Leftovers::default());
}
